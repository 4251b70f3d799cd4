"""Shared plumbing for the peer adapters: options, timing, percentiles and JSON output.

The contract with the benchmark orchestrator is small. An adapter is started as
``python -m bench.peers.<peer> MEASURE [options]`` and prints exactly one JSON object on the
last line of stdout: its results, ``{"skipped": reason}`` when the peer cannot do the measure
faithfully, or ``{"error": reason}``. Every invocation is bounded by ``--timeout``; a watchdog
prints the error object and ends the process when it runs out.

Measures (see each adapter for how the peer does them):

- ``sequential``: N workflows of K no-op steps, one after another, after 3 untimed runs.
- ``concurrent``: N ten-step workflows started at once, wait for all.
- ``recovery-crash`` / ``recovery-resume``: a fixed-id workflow whose step ``--kill-at``
  writes ``--marker`` and blocks until the orchestrator SIGKILLs the process; a fresh
  process then lets the peer's own recovery resume it.
- ``replay``: a workflow with ``--steps`` completed steps and one left, resumed in a fresh
  process (built from the two recovery modes, see :func:`run_replay`).
- ``pickup``: time from the start call returning to the first step starting, idle worker.
- ``takeover``: a second worker, already running, takes over a workflow whose worker was
  SIGKILLed in step ``--kill-at``; time from the kill to that step starting again.
- ``llm-crash`` / ``llm-resume``: the LLM crash-bill measures of
  ``bench/peers/<peer>_llm.py``, driven by ``bench/peers/llm.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

MEASURES = (
    "sequential",
    "concurrent",
    "recovery-crash",
    "recovery-resume",
    "replay",
    "graph-crash",
    "graph-resume",
    "pickup",
    "takeover",
    "claim-backlog",
    "llm-crash",
    "llm-resume",
)
DEFAULT_STEPS = {"sequential": 10, "concurrent": 10, "replay": 10_000}
DEFAULT_N = {"sequential": 100, "concurrent": 1000, "pickup": 50}
WARMUP_RUNS = 3

Result = dict[str, Any]
Measure = Callable[[argparse.Namespace], Result]

clock = time.perf_counter


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        emit({"error": f"bad options: {message}"}, code=2)


def last_json(stdout: str, stderr: str) -> dict[str, Any]:
    """The adapter's answer: the last JSON object it printed, else an error quoting it."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {"error": (stderr or stdout)[-400:] or "no output"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _Parser(description="Run one benchmark measure on a peer engine.")
    parser.add_argument("measure", choices=MEASURES)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--db", required=True, help="sqlite file path or postgres URL")
    parser.add_argument("--variant", default="default")
    parser.add_argument("--steps", type=int, help="steps per workflow")
    parser.add_argument("--n", type=int, help="number of workflows or samples")
    parser.add_argument("--kill-at", type=int, default=5, help="step that blocks (1-based)")
    parser.add_argument("--marker", help="file the blocking step writes (recovery modes)")
    parser.add_argument("--timeout", type=float, default=110.0, help="seconds for the run")
    parser.add_argument("--poll-interval", type=float, help="peer worker polling, seconds")
    parser.add_argument("--lease", type=float, help="peer claim/lease timeout, seconds")
    parser.add_argument("--concurrency", type=int, help="peer worker concurrency")
    parser.add_argument("--workers", type=int, help="peer workers in this process")
    parser.add_argument("--setting", help="peer-specific concurrency setting")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = DEFAULT_STEPS.get(args.measure, 10)
    if args.n is None:
        args.n = DEFAULT_N.get(args.measure, 20)
    if args.measure.startswith("recovery") and not args.marker:
        parser.error(f"{args.measure} needs --marker")
    kills = args.measure.startswith("recovery") or args.measure == "takeover"
    if kills and not 1 <= args.kill_at <= args.steps:
        parser.error("--kill-at must be within 1..--steps")
    return args


_EMITTING = threading.Lock()


def emit(result: Mapping[str, Any], code: int = 0) -> NoReturn:
    """Print ``result`` as the last stdout line and end the process.

    ``os._exit`` skips interpreter teardown, so nothing an engine logs at exit can land
    after the JSON line. The lock is never released: if the watchdog and the measure both
    finish, the first one's line is the only one.
    """
    _EMITTING.acquire()
    sys.stderr.flush()
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    os._exit(code)


def start_watchdog(seconds: float, what: str) -> None:
    def expire() -> None:
        emit({"error": f"timeout: {what} did not finish within {seconds:g} s"}, code=3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def run(peer: str, measures: Mapping[str, Measure], argv: list[str] | None = None) -> NoReturn:
    """Parse options, run one measure under the watchdog and emit its JSON object."""
    args = parse_args(argv)
    start_watchdog(args.timeout, f"{peer} {args.measure}")
    handler = measures.get(args.measure)
    try:
        result = handler(args) if handler else {"skipped": f"{peer} has no {args.measure}"}
    except Exception as exc:  # the orchestrator needs a JSON line, not a traceback
        import traceback

        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {exc}"}, code=1)
    context = {
        "peer": peer,
        "measure": args.measure,
        "backend": args.backend,
        "variant": args.variant,
    }
    emit(context | result, code=2 if "error" in result else 0)


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_summary(latencies_ms: list[float]) -> Result:
    return {
        "p50_ms": round(percentile(latencies_ms, 50), 3),
        "p99_ms": round(percentile(latencies_ms, 99), 3),
        "max_ms": round(max(latencies_ms), 3),
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def pg_durability(url: str) -> dict[str, str]:
    """The server settings that decide whether a Postgres commit is fsynced."""
    import psycopg

    with psycopg.connect(url) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("fsync", "synchronous_commit", "wal_sync_method")
        }


def sqlite_durability(journal_mode: Any, synchronous: Any) -> dict[str, Any]:
    """The effective pragmas, as read back from a connection (synchronous 2 is FULL)."""
    levels = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return {"journal_mode": journal_mode, "synchronous": levels.get(synchronous, synchronous)}


def stable_id(prefix: str, marker: str) -> str:
    """A workflow id fixed by the marker path, so the crash and resume modes agree on it."""
    digest = hashlib.sha1(str(Path(marker).resolve()).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def write_marker(path: str) -> None:
    """Write the wall-clock time atomically, so a reader never sees a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{time.time():.6f}\n")
    os.replace(tmp, path)


def block_forever() -> NoReturn:
    while True:
        time.sleep(3600)


class Probe:
    """Timestamps recorded by workflow code and awaited by the measuring thread."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def _event(self, name: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(name, threading.Event())

    def mark(self, name: str) -> None:
        self.times.setdefault(name, clock())
        self._event(name).set()

    def wait(self, name: str, timeout: float | None = None) -> float:
        if not self._event(name).wait(timeout):
            raise TimeoutError(f"{name} was not reached")
        return self.times[name]

    def reset(self, name: str) -> None:
        """Forget ``name``, so the next ``mark`` records a new time."""
        with self._lock:
            self.times.pop(name, None)
            self._events.pop(name, None)


class CrashedChild:
    """A child running the adapter's ``recovery-crash`` mode, until its blocking step starts.

    ``start`` returns once the marker exists, i.e. the workflow has ``kill_at - 1`` finished
    steps and is blocked in step ``kill_at``; ``kill`` ends it with SIGKILL. Its output goes
    to a log in ``workdir``, quoted in the error when it stops before reaching the step.
    """

    def __init__(self, args: argparse.Namespace, module: str, workdir: str) -> None:
        self.module = module
        self.marker = str(Path(workdir) / "crash.marker")
        self.options = [
            "--backend", args.backend, "--db", args.db, "--variant", args.variant,
            "--steps", str(args.steps), "--kill-at", str(args.kill_at), "--marker", self.marker,
        ]  # fmt: skip
        for flag, value in (("--poll-interval", args.poll_interval), ("--lease", args.lease)):
            if value is not None:
                self.options += [flag, str(value)]
        self.log_path = Path(workdir) / "crash.log"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self, mode: str, timeout: float) -> list[str]:
        return [sys.executable, "-m", self.module, mode, *self.options, "--timeout", str(timeout)]

    def start(self, deadline: float) -> None:
        with open(self.log_path, "w") as log:
            argv = self.argv("recovery-crash", max(deadline - time.monotonic(), 1.0))
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        while not os.path.exists(self.marker):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                tail = self.log_path.read_text()[-500:]
                raise RuntimeError(f"the crash run did not reach its blocking step: {tail}")
            time.sleep(0.005)

    def kill(self) -> float:
        """SIGKILL the child; return when the signal was sent."""
        assert self.process is not None
        killed = clock()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return killed


def run_replay(
    args: argparse.Namespace, module: str, before_resume: Callable[[str], None] | None = None
) -> Result:
    """Build a workflow of ``--steps`` done steps and one left, then resume it fresh.

    Step ``steps + 1`` blocks on its first execution (the ``recovery-crash`` mode of the same
    adapter, in a child process SIGKILLed once the step has started). A second fresh child
    runs ``recovery-resume``: it measures from the start of the engine's recovery to the
    moment the last step starts again, and reports its own peak RSS. The optional
    ``before_resume(marker)`` hook runs between the two (e.g. to wait out a lease).
    """
    deadline = time.monotonic() + args.timeout - 5.0
    steps = args.steps
    args.steps = args.kill_at = steps + 1
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as workdir:
        crashed = CrashedChild(args, module, workdir)
        started = clock()
        try:
            crashed.start(deadline)
        except RuntimeError as exc:
            return {"error": str(exc)}
        crashed.kill()
        build_s = clock() - started
        if before_resume is not None:
            before_resume(crashed.marker)
        remaining = max(deadline - time.monotonic(), 1.0)
        done = subprocess.run(
            crashed.argv("recovery-resume", remaining),
            capture_output=True, text=True, timeout=remaining + 5.0,
        )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    resumed = json.loads(lines[-1]) if lines else {"error": done.stderr[-500:]}
    if "error" in resumed or "skipped" in resumed:
        return resumed
    return {
        "to_last_step_ms": resumed["to_step5_ms"],
        "to_result_ms": resumed["to_result_ms"],
        "peak_rss_mb": resumed["peak_rss_mb"],
        "steps": steps,
        "build_s": round(build_s, 3),
    }
