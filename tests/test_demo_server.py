"""``make run`` (``ratchet demo --serve``) as a user meets it: the printed ``curl -N`` line,
run while the demo plays, receives the demo run's whole journal once, in order, across the
worker's SIGKILL; the demo's claims hold; the printed ``curl -X POST`` starts a run the
embedded worker finishes; Ctrl-C stops it with status 0 and no traceback."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = (
    "✓ steps 1\N{EN DASH}3 ran once each, before the crash — not again after it",
    "✓ step 4 ran twice with the same idempotency key ",
    "✓ the provider billed the model call once (1 billed call)",
    "✓ steps 5\N{EN DASH}6 ran once each, after the restart, in worker 2",
    "✓ the journal shows one re-drive: run_resumed ",
    "✓ run_succeeded written 1 time",
    "✓ one event stream (SSE), opened before the kill, received all ",
)


def make_run_command() -> list[str]:
    """What ``make run`` runs, as this interpreter runs it: the Makefile's recipe, checked."""
    recipe = re.search(r"^run:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and "/bin/ratchet demo --serve" in recipe.group(1), recipe
    return [sys.executable, "-m", "ratchet.cli", "demo", "--serve"]


class Lines:
    """A process's stdout, line by line, read in a thread so waits have deadlines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._stdout = proc.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stdout:
            self._q.put(line)
        self._q.put(None)

    def close(self) -> None:
        """Once the process has exited: the reader has met the end of its output."""
        self._reader.join(10)
        self._stdout.close()

    def until(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout:g}s:\n" + "".join(self.seen)
                ) from None
            if line is None:
                raise AssertionError(f"output ended before {pattern!r}:\n" + "".join(self.seen))
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found


def sse_frames(text: str) -> list[tuple[int, str]]:
    frames = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            frames.append((int(fields["id"]), fields["event"]))
    return frames


@pytest.mark.crash
def test_make_run_serves_the_demo_through_the_api_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    env.update(RATCHET_PORT="0", PYTHONUNBUFFERED="1")  # the port: any free one
    err_path = tmp_path / "stderr.txt"
    started = time.monotonic()
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            make_run_command(), cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=err
        )
    curl: subprocess.Popen[str] | None = None
    out = Lines(proc)
    try:
        base = out.until(r"^URL: (http://\S+)").group(1)
        export = out.until(r"^export RATCHET_TOKEN=\S+$").group(0)
        token = export.split("=", 1)[1]
        follow = out.until(r"^\s*(curl -N \S+/events .*)$").group(1)
        # The user's stream, opened as the demo plays: before the kill, ended by the run's end.
        curl = subprocess.Popen(
            ["bash", "-c", f"{export}\n{follow}"],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out.until(r"keeps serving on ")
        post = out.until(r"^\s*(curl -X POST .*)$").group(1)
        streamed, curl_err = curl.communicate(timeout=30)
        assert curl.returncode == 0, curl_err
        printed = "".join(out.seen)
        for claim in CLAIMS:
            assert claim in printed, printed
        assert "✗" not in printed

        run_id = re.search(r"runs/([^/]+)/events", follow)
        assert run_id is not None
        with httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}
        ) as api:
            journal = api.get(f"/v1/runs/{run_id.group(1)}/events", params={"limit": 500}).json()[
                "events"
            ]
            frames = sse_frames(streamed)
            # Every event once, in order, as the journal has it, across the worker's kill.
            assert frames == [(e["seq"], e["kind"]) for e in journal]
            assert [seq for seq, _ in frames] == list(range(1, len(frames) + 1))
            kinds = [kind for _, kind in frames]
            assert kinds.count("run_resumed") == 1 and kinds[-1] == "run_succeeded"
            assert kinds.index("run_resumed") > kinds.index("step_started")

            # The server keeps serving: the printed POST starts a run the embedded worker
            # drives to the end.
            answer = subprocess.run(
                ["bash", "-c", f"{export}\n{post} -s"],
                text=True,
                capture_output=True,
                timeout=30,
                check=True,
            )
            mine = json.loads(answer.stdout)
            assert mine["status"] == "queued", answer.stdout
            result = api.get(f"/v1/runs/{mine['run_id']}/result", params={"wait": 30}).json()
            assert result["status"] == "succeeded", result
            assert result["output"]["ticket"] == "T-1001"
        assert time.monotonic() - started < 40

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        out.until(r"^SIGINT: the server stopped", timeout=5)
    finally:
        for p in (curl, proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        out.close()
    errors = err_path.read_text()
    assert "Traceback" not in errors and token not in errors, errors
    assert (tmp_path / ".ratchet" / "server.db").exists()


def test_make_run_names_a_taken_port_or_a_bad_database_and_touches_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_PORT"}

    def refused(*args: str) -> str:
        proc = subprocess.run(
            [*make_run_command(), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / ".ratchet").exists()
        return proc.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert (
            f"cannot listen on 127.0.0.1:{port}: the port is taken; choose another with "
            "--port N or RATCHET_PORT=N (make run PORT=N)"
        ) in refused("--port", str(port))
    assert "malformed database URL 'nope://x'" in refused("--db", "nope://x", "--port", "0")


@pytest.mark.crash
def test_sigterm_before_the_demo_is_done_stops_everything_it_started(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    env.update(PYTHONUNBUFFERED="1")
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [*make_run_command(), "--port", "0"],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    out = Lines(proc)
    try:
        worker = int(out.until(r"worker 1 launched: .* \(pid (\d+)\)").group(1))
        out.until(r"POST /v1/runs → 202")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        out.until(r"^stopped by SIGTERM before the demo was done", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    with pytest.raises(ProcessLookupError):  # the worker process it started is gone
        os.kill(worker, 0)
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()
