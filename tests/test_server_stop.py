"""A stopping ``ratchet server`` ends its open event streams at once instead of holding
its shutdown until the graceful timeout and then cutting them with a traceback; a client
resumes with ``Last-Event-ID`` and misses nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse
from test_cli import SHOP, invoke


@pytest.mark.crash
def test_sigterm_ends_open_event_streams_and_the_server_exits_0_at_once(
        sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(SHOP)
    made = invoke("tokens", "create", "--tenant", "acme", "--scopes", "runs:read,runs:write",
                  "--db", sqlite_url)
    token = made.output.strip().splitlines()[-1]
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    # No worker: the run stays queued, its stream open with nothing more to send.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ratchet.cli", "server", "--app", "shop:app", "--db", sqlite_url,
         "--port", "0", "--workers", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err: list[str] = []
    try:
        while not (found := re.search(r"running on (http://\S+)", "".join(err))):
            line = proc.stderr.readline()
            assert line, f"the server exited: {''.join(err)}"
            err.append(line)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=found.group(1), headers=headers, timeout=60) as client:
            r = client.post("/v1/runs", json={"workflow": "checkout", "input": {"sku": "a"}})
            assert r.status_code == 202, r.text
            run_id = r.json()["run_id"]
            seen: list[str] = []
            opened = threading.Event()

            def follow() -> None:
                with connect_sse(client, "GET", f"/v1/runs/{run_id}/events") as source:
                    opened.set()
                    seen.extend(sse.event for sse in source.iter_sse())

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            assert opened.wait(30)
            while not seen:  # the replay reached the client: the stream is open
                time.sleep(0.01)
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            reader.join(20)
            assert not reader.is_alive(), "the stream was not ended"
        err.append(proc.communicate(timeout=30)[1])
        # Well within the 30 s graceful timeout a held stream would have cost.
        assert time.monotonic() - stopped_at < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(err)
    assert proc.returncode == 0, log
    assert seen == ["run_queued"]
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
