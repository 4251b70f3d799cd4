"""The tutorial (docs/tutorial.md), followed as written in a fresh folder: its shell
commands in the page's order, ``support.py`` as the page shows it, then the closing script
after the walk-through, beside it, with the walk-through's worker still running.

Two things differ from a reader's machine, each for a reason: the install step is checked
rather than run (the page installs Ratchet from a clone; this environment is that install,
``pip install -e`` of this checkout, so the test uses it instead of building another), and
the local provider listens on a free port rather than 8089 (``--port 0``; the scripts are
pointed at it with ``OPENAI_BASE_URL``, which ``support.py`` reads), so tests never fight
over a port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from waiting import wait_for

import ratchet
from ratchet.extras import installed_from

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
_FENCE = re.compile(
    r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>sh|python)\n(?P<code>.*?)```",
    re.DOTALL,
)


def blocks() -> list[tuple[str, str]]:
    """The page's code blocks in order: ("sh", code), ("python", code) or ("file NAME",
    code) for a file the page asks to save."""
    out = []
    for m in _FENCE.finditer(TUTORIAL.read_text(encoding="utf-8")):
        mark = (m.group("mark") or "").strip()
        out.append((mark if mark.startswith("file ") else m.group("lang"), m.group("code")))
    return out


def commands(code: str) -> list[str]:
    """A shell block's command lines, without their comments."""
    return [line for line in code.splitlines() if line.split("#", 1)[0].strip()]


class Reader:
    """Someone following the page: a folder, a shell environment, the processes left
    running in other terminals."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        # The venv the page activates: this environment's, where Ratchet is installed.
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env["PYTHONUNBUFFERED"] = "1"
        self.background: list[tuple[subprocess.Popen[str], IO[str]]] = []
        self.run_id = ""

    def line(self, command: str) -> str:
        return command.replace("RUN_ID", self.run_id) if self.run_id else command

    def run(self, command: str, expect: tuple[int, ...] = (0,), timeout: float = 60) -> str:
        proc = subprocess.run(
            ["bash", "-c", self.line(command)],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode in expect, (command, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def start(self, command: str, log: str) -> Path:
        """A command left running in a terminal of its own; its output goes to ``log``."""
        path = self.folder.parent / log
        out = path.open("w")
        proc = subprocess.Popen(
            ["bash", "-c", self.line(command)],
            cwd=self.folder,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its process group, stopped as a whole at the end
        )
        self.background.append((proc, out))
        return path

    def stop(self) -> None:
        for proc, out in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            out.close()


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    r = Reader(tmp_path)
    try:
        yield r
    finally:
        r.stop()


def test_a_fresh_tutorial_run_as_written(reader: Reader) -> None:
    page = blocks()
    kinds = [k for k, _ in page]
    assert kinds == ["sh", "sh", "file support.py", "sh", "sh", "sh", "sh", "sh", "python"]
    install, provider, support, start, crash, look, resume, approve, story = (c for _, c in page)

    # 1. Install, in a fresh folder, from the clone: this environment is that install.
    [mkdir, venv, pip] = commands(install)
    assert mkdir == "mkdir ratchet-tutorial && cd ratchet-tutorial"
    assert venv == "python3 -m venv .venv && . .venv/bin/activate"
    assert pip == "pip install '/path/to/ratchet[server,openai]'"
    clone = installed_from()
    assert clone is not None and Path(clone[0]).resolve() == ROOT
    reader.run("mkdir ratchet-tutorial")
    reader.folder = reader.folder / "ratchet-tutorial"

    # 2. The model, in a terminal of its own (on a free port; see the module's docstring).
    [serve] = commands(provider)
    assert "--port 8089" in serve
    log = reader.start(serve.replace("--port 8089", "--port 0"), "provider.out")
    url = wait_for(
        lambda: re.search(r"listening on (http://\S+)", log.read_text()), what="the provider"
    ).group(1)
    reader.env["OPENAI_BASE_URL"] = url + "/v1"

    # 3. The workflow, saved as the page shows it.
    (reader.folder / "support.py").write_text(support, encoding="utf-8")

    # 4. A run, queued.
    [queue, runs] = commands(start)
    reader.run_id = reader.run(queue).strip().splitlines()[-1]
    assert reader.run_id in reader.run(runs)
    app = ratchet.Ratchet(f"sqlite:///{reader.folder}/.ratchet/ratchet.db")
    try:
        assert app.get(reader.run_id).status == "queued"

        # 5. A worker killed with SIGKILL as step 3 starts (as bash's own child: 128 + 9).
        [crashing] = commands(crash)
        said = reader.run(crashing, expect=(-signal.SIGKILL, 128 + signal.SIGKILL))
        assert "fetching ticket T-1" in said and "saving the draft" not in said
        show, events = commands(look)
        assert "running" in reader.run(show)
        assert "step_started" in reader.run(events)

        # 6. A worker under the same id, left running: it parks the run on the approval.
        [resuming] = commands(resume)
        worker = reader.start(resuming, "worker.out")
        wait_for(
            lambda: app.get(reader.run_id).status == "waiting",
            timeout=60,
            what="the run parked on its approval",
            detail=worker.read_text,
        )
        assert "fetching ticket" not in worker.read_text()
        assert len((reader.folder / "provider.jsonl").read_text().splitlines()) == 1

        # 7. Approved: the reply goes out once.
        approvals, decide, shown = commands(approve)
        assert "send_reply" in reader.run(approvals)
        reader.run(decide)
        wait_for(
            lambda: app.get(reader.run_id).status == "succeeded",
            timeout=60,
            what="the run succeeded",
            detail=worker.read_text,
        )
        assert "succeeded" in reader.run(shown)
        assert len((reader.folder / "sent.log").read_text().splitlines()) == 1
    finally:
        app.shutdown()

    # The closing script, saved as story.py beside support.py, after the walk-through and
    # with its worker still running, as the page says it may be.
    assert "python story.py" in TUTORIAL.read_text(encoding="utf-8")
    (reader.folder / "story.py").write_text(story, encoding="utf-8")
    out = reader.run("python story.py", timeout=120)
    assert "first worker: -9" in out and "you" in out.splitlines()
    assert len((reader.folder / "sent.log").read_text().splitlines()) == 2
    # And again: the script needs nothing the walk-through or its last run left behind.
    reader.run("python story.py", timeout=120)
