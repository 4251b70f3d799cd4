"""Forks with real processes, on SQLite and PostgreSQL: a worker killed with SIGKILL in the
middle of a fork's step leaves the fork to a restarted worker, which resumes it from its
journal and never runs a copied step; and ``ratchet fork``, ``diff`` and ``resume`` through
the installed ``ratchet`` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import ok, refused
from proc import Harness
from waiting import wait_for

from ratchet.model import EventKind, fold
from ratchet.receipts.service import check_chain

SUPPORT = Path(__file__).parent / "support"
RATCHET = str(Path(sys.executable).parent / "ratchet")


def ran_steps(h: Harness) -> list[tuple[str, str]]:
    """``(run_id, step_id)`` of every step code invocation, in order."""
    return [(r["run_id"], r["step_id"]) for r in h.invocations()]


def test_a_fork_killed_mid_step_resumes_from_its_journal_and_never_runs_a_copied_step(
    h: Harness,
) -> None:
    source = h.app.start("chain", n=5)
    a = h.spawn("a", worker_id="w-a")
    h.wait_status(source, "succeeded")
    assert h.calls() == {f"{i}:work": 1 for i in range(1, 6)}

    # Forked at step 3 with other input: step 4 of the fork blocks, and its worker dies there.
    fork = h.app.fork(source, "3:work", input={"n": 5, "block_at": [4]})
    wait_for(
        lambda: (fork, "4:work") in ran_steps(h),
        what="the fork's step 4 to run",
        detail=h.worker_logs,
    )
    a.kill()
    h.open_gate("step-4")
    h.spawn("a-restarted", worker_id="w-a")
    h.wait_status(fork, "succeeded", timeout=30)

    mine = [step for run_id, step in ran_steps(h) if run_id == fork]
    # The copied steps never ran in the fork; step 4 ran twice (killed, then resumed).
    assert mine == ["3:work", "4:work", "4:work", "5:work"]
    assert h.app.result(fork) == h.app.result(source)
    events = h.app.events(fork)
    check_chain(fork, events)
    for step in ("1:work", "2:work"):
        kinds = [e.kind for e in events if e.step_id == step]
        assert kinds == [EventKind.STEP_STARTED, EventKind.STEP_COMPLETED], (step, kinds)
    state = fold(fork, events)
    assert state.drives == 2 and state.status == "succeeded"
    assert h.app.get(fork).forked_from == source


def ratchet_cmd(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [RATCHET, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SUPPORT), "COLUMNS": "200"},
    )
    if check:
        assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def test_the_ratchet_command_forks_diffs_and_resumes(
    h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app a code workflow's fork is checked against: the crash tests' own.
    (tmp_path / "forkapp.py").write_text(
        "import crash_app\n\napp = crash_app.build('sqlite:///unused.db')\n"
    )
    monkeypatch.chdir(tmp_path)
    source = h.app.start("chain", n=4)
    h.spawn("a", worker_id="w-a")
    h.wait_status(source, "succeeded")
    db = ["--db", h.db_url]

    out = ratchet_cmd(
        "fork", source, "--at", "2:work", "--output", '"edited"', "--app", "forkapp:app",
        "--by", "ana", *db, cwd=tmp_path,
    )  # fmt: skip
    fork = out.stdout.strip()
    h.wait_status(fork, "succeeded")
    assert h.app.result(fork) == ["out-1", "edited", "out-3", "out-4"]
    assert (h.app.get(fork).forked_from, h.app.get(fork).forked_at) == (source, "2:work")
    assert [step for run_id, step in ran_steps(h) if run_id == fork] == ["3:work", "4:work"]

    diff = json.loads(ratchet_cmd("diff", source, fork, "--json", *db, cwd=tmp_path).stdout)
    assert [s["status"] for s in diff["steps"]] == ["same", "changed", "same", "same"]
    assert diff["steps"][1]["b"]["output"] == "edited"
    # The rest in this process (the command's code, without the start-up time).
    table = ok("diff", source, fork, *db).stdout
    assert "changed" in table and "1 of 4 steps differ" in table
    assert f"{source} at step 2:work" in ok("show", fork, *db).stdout

    # Refusals are one line, and write nothing.
    runs = len(h.app.runs(limit=100))
    assert "--app APP" in refused(2, "fork", source, "--at", "2:work", *db)
    with_app = ("--app", "forkapp:app")
    assert "has no step '9:work'" in refused(2, "fork", source, "--at", "9:work", *with_app, *db)
    assert "--output" in refused(
        2, "fork", source, "--at", "2:work", "--output", "1", "--input", "{}", *with_app, *db
    )
    assert "not cancelled" in refused(2, "resume", source, *db)
    assert len(h.app.runs(limit=100)) == runs

    # A cancelled run resumes under its own id.
    waiting = h.app.start("listener")
    h.wait_parked(waiting, "signal:")
    assert h.app.cancel(waiting) == "cancelled"
    out = ratchet_cmd("resume", waiting, "--by", "bob", *db, cwd=tmp_path)
    assert waiting in out.stdout
    h.wait_parked(waiting, "signal:")
    queued = [e.payload for e in h.app.events(waiting) if e.kind == EventKind.RUN_QUEUED]
    assert queued[-1] == {"reason": "resume", "by": "bob"}
    h.app.signal(waiting, "go", 7)
    h.wait_status(waiting, "succeeded")
    assert [step for run_id, step in ran_steps(h) if run_id == waiting] == ["1:work", "3:work"]
