"""Watching sandboxes from the host for the isolated-tier tests: which are alive (by the
bubblewrap command lines under /proc), and killing one."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def _cmdlines() -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                args = (entry / "cmdline").read_bytes().split(b"\0")
                found[int(entry.name)] = [a.decode(errors="replace") for a in args]
    return found


def live_sandboxes(run_id: str) -> dict[str, list[int]]:
    """The sandboxes of ``run_id`` with a process alive: sandbox id -> pids (bwrap's and
    its init's carry the sandbox's environment on their command line)."""
    alive: dict[str, list[int]] = {}
    for pid, args in _cmdlines().items():
        if "--die-with-parent" not in args or run_id not in args:
            continue
        with contextlib.suppress(ValueError, IndexError):
            if args[args.index("RATCHET_RUN_ID") + 1] != run_id:
                continue
            sandbox_id = args[args.index("RATCHET_SANDBOX_ID") + 1]
            with contextlib.suppress(OSError):
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    alive.setdefault(sandbox_id, []).append(pid)
    return alive


def kill_sandbox(pids: list[int]) -> None:
    """SIGKILL the sandbox (bubblewrap, and with it everything inside)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
