"""What both ways of playing the demo share: the workflow's steps, the worker processes
(started, killed in the middle of the model call, stopped), the records the demo reads back
and the checks it prints. See :mod:`ratchet.demo`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ratchet.config import DatabaseURL
from ratchet.llm.server import LocalProvider
from ratchet.model import EventKind, dumps

WORKER_ID = "demo-worker"
STEPS = ("fetch_ticket", "classify", "retrieve_docs", "draft_reply", "review", "send_reply")
CRASH_STEP = 4
#: The journal's step ids; the fourth is the model call, named after the SDK method.
STEP_IDS = tuple(
    f"{n}:{'openai.chat.completions.create' if n == CRASH_STEP else step}"
    for n, step in enumerate(STEPS, 1)
)
#: How long the provider holds the first answer to the model call: the kill lands inside.
HOLD_S = 3.0
WAIT_S = 30.0


class DemoFailed(Exception):
    """The demo could not show what it claims."""


@dataclass
class _Worker:
    number: int
    proc: subprocess.Popen[bytes]
    log_path: str
    log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 15) -> str:
        self.log_file.flush()
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "\n".join(f.read().splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Demo:
    console: Console
    folder: str
    #: Names the worker logs (``.ratchet/PREFIX-worker-N.log``).
    prefix: str = "demo"
    #: More arguments for every ``ratchet worker`` the demo starts.
    worker_args: tuple[str, ...] = ()
    t0: float = field(default_factory=time.monotonic)
    workers: list[_Worker] = field(default_factory=list)

    def say(self, text: str | Text, style: str = "") -> None:
        line = Text(f"[{time.monotonic() - self.t0:5.2f}s] ", style="dim")
        line.append(text if isinstance(text, Text) else Text(text, style=style))
        self.console.print(line, soft_wrap=True)

    def start_worker(self, env: dict[str, str]) -> _Worker:
        number = len(self.workers) + 1
        log_path = os.path.join(self.folder, f"{self.prefix}-worker-{number}.log")

        log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        cmd = [
            sys.executable,
            "-m",
            "ratchet.cli",
            "worker",
            "ratchet.demo.workflow:app",
            "--worker-id",
            WORKER_ID,
            "--concurrency",
            "4",
            *self.worker_args,
        ]
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
        worker = _Worker(number, proc, log_path, log_file)
        self.workers.append(worker)
        return worker

    def failed(self, e: DemoFailed) -> int:
        """Say why the demo failed, with the end of each worker's log; return 1."""
        self.console.print(Text(f"demo failed: {e}", style="bold red"), soft_wrap=True)
        for w in self.workers:
            self.console.print(
                Text(f"--- worker {w.number} log ({w.log_path}), last lines:", style="dim")
            )
            self.console.print(Text(w.tail()), soft_wrap=True)
        return 1

    def kill_mid_call(
        self, w1: _Worker, provider: LocalProvider, journal: Callable[[], Sequence[Journaled]]
    ) -> float:
        """Wait until worker 1's model call (step 4) has reached ``provider``, which holds
        its answer, then kill the worker with SIGKILL; the kill's monotonic time."""
        from ratchet.demo.workflow import MODEL

        crash_step = STEPS[CRASH_STEP - 1]
        self.wait_for(
            f"step {CRASH_STEP} ({crash_step}) to reach the model provider",
            lambda: provider.stats()["received"] >= 1,
            alive=w1,
        )
        done = ", ".join(STEPS[: CRASH_STEP - 1])
        self.say(f"steps 1\N{EN DASH}{CRASH_STEP - 1} ({done}) completed in worker 1")
        key = started_key(journal(), STEP_IDS[CRASH_STEP - 1])
        self.say(
            f"step {CRASH_STEP} {crash_step} in worker 1: a model call ({MODEL}) the "
            f"provider has received, Idempotency-Key {key[:12]}, and holds for "
            f"{HOLD_S:g}s"
        )
        w1.proc.send_signal(signal.SIGKILL)
        w1.proc.wait()
        t_kill = time.monotonic()
        self.say(
            Text(
                f"SIGKILL → worker 1 (pid {w1.pid}) in the middle of step {CRASH_STEP}",
                style="bold red",
            )
        )
        return t_kill

    def stop(self, worker: _Worker) -> None:
        """Stop a worker with SIGTERM, as an operator would; it must exit within 10 s."""
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired as e:
            raise DemoFailed(f"worker {worker.number} did not stop within 10s of SIGTERM") from e
        self.say(f"worker {worker.number} stopped gracefully (exit code {worker.proc.returncode})")

    def stop_all(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            w.log_file.close()

    def wait_for(
        self,
        what: str,
        check: Callable[[], bool],
        alive: _Worker | None = None,
        timeout: float = WAIT_S,
    ) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if alive is not None and alive.proc.poll() is not None:
                raise DemoFailed(
                    f"worker {alive.number} exited (code {alive.proc.returncode}) before {what}"
                )
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.01)


def _wipe(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


def demo_provider(setup: Setup) -> LocalProvider:
    """The local model provider the demo's model calls go to, logging its requests."""
    from ratchet.demo.workflow import REPLY

    return LocalProvider({"rules": [{"reply": {"text": REPLY}}]}, setup.requests_path)


@dataclass(frozen=True)
class Setup:
    """Where a demo keeps its records, wiped fresh, and the database it runs on."""

    folder: str
    url: str
    #: The database as the demo's output names it, and as a URL a user can pass to --db.
    shown: str
    shown_url: str
    #: The plain steps' invocation log and the provider's request log.
    log_path: str
    requests_path: str
    #: The environment of the worker processes the demo starts.
    env: dict[str, str]


def prepare(db: str | None, name: str) -> Setup:
    """A fresh ``.ratchet/NAME.db`` (or the database ``db`` names, as it is) and fresh
    ``.ratchet/NAME-*.jsonl`` record files."""
    folder = os.path.abspath(".ratchet")
    os.makedirs(folder, mode=0o700, exist_ok=True)  # the data directory: its owner's only
    if db is None:
        relative = os.path.join(".ratchet", f"{name}.db")
        path = os.path.abspath(relative)
        _wipe(path)
        url, shown, shown_url = (
            f"sqlite:///{path}",
            f"embedded SQLite at {relative}",
            f"sqlite:///{relative}",
        )
    else:
        DatabaseURL.parse(db)
        url, shown, shown_url = db, "the database given with --db", db
    log_path = os.path.join(folder, f"{name}-invocations.jsonl")
    requests_path = os.path.join(folder, f"{name}-llm-requests.jsonl")
    _wipe(log_path)
    _wipe(requests_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RATCHET_CRASH_AT", "RATCHET_PAUSE_AT", "RATCHET_WORKER_ID")
    }
    env.update(RATCHET_DATABASE_URL=url, RATCHET_DEMO_LOG=log_path, PYTHONUNBUFFERED="1")
    return Setup(folder, url, shown, shown_url, log_path, requests_path, env)


class Journaled(Protocol):
    """What the checks read of a journal event: an engine :class:`~ratchet.model.Event`,
    or one read back through the HTTP API."""

    @property
    def kind(self) -> str: ...
    @property
    def step_id(self) -> str | None: ...
    @property
    def payload(self) -> dict[str, Any]: ...


def started_key(events: Sequence[Journaled], step_id: str) -> str:
    """The idempotency key the journal gave the step's first start."""
    return next(
        (
            str(e.payload.get("idempotency_key"))
            for e in events
            if e.kind == EventKind.STEP_STARTED and e.step_id == step_id
        ),
        "?",
    )


def report(
    console: Console,
    run_id: str,
    events: Sequence[Journaled],
    status: str,
    workers: dict[int, int],
    log: list[dict[str, Any]],
    requests: list[dict[str, Any]],
) -> list[tuple[bool, str]]:
    """Print the step invocations table, from the steps' own log and the provider's, and
    return the demo's claims, each checked against those records and the run's journal
    and status: ``(held, claim)``."""
    mine = [e for e in log if e["run_id"] == run_id]
    by_step = {step: [e for e in mine if e["step"] == step] for step in STEPS}
    started = {
        step: [e for e in events if e.kind == EventKind.STEP_STARTED and e.step_id == step_id]
        for step, step_id in zip(STEPS, STEP_IDS, strict=True)
    }
    crash_step = STEPS[CRASH_STEP - 1]
    crash_journal_keys = {e.payload.get("idempotency_key") for e in started[crash_step]}
    # The model call is counted by the provider: every request it received for this run.
    sent = [r for r in requests if r["idempotency_key"] in crash_journal_keys]
    by_step[crash_step] = [
        {
            "idempotency_key": r["idempotency_key"],
            "pid": None,
            "billed": r["billed"],
            "replayed": r["replayed"],
        }
        for r in sent
    ]

    table = Table(
        "#",
        "step",
        "invocations",
        "idempotency keys",
        "ran in",
        title="step invocations (from the steps' own log and the provider's)",
        title_justify="left",
    )
    for n, step in enumerate(STEPS, 1):
        calls = by_step[step]
        keys = sorted({e["idempotency_key"][:12] for e in calls})
        if n == CRASH_STEP:
            where = "provider: " + ", ".join(
                f"#{i} "
                + (
                    "billed"
                    if e["billed"]
                    else "answered from its store"
                    if e["replayed"]
                    else "not answered"
                )
                for i, e in enumerate(calls, 1)
            )
        else:
            where = ", ".join(
                f"worker {workers.get(e['pid'], '?')} (pid {e['pid']})" for e in calls
            )
        style = "bold yellow" if n == CRASH_STEP else ""
        table.add_row(str(n), step, str(len(calls)), ", ".join(keys), where, style=style)
    console.print()
    console.print(table)

    resumed = [e for e in events if e.kind == EventKind.RUN_RESUMED]
    succeeded = sum(1 for e in events if e.kind == EventKind.RUN_SUCCEEDED)
    w1 = next(pid for pid, n in workers.items() if n == 1)
    w2 = next(pid for pid, n in workers.items() if n == 2)
    crash = by_step[crash_step]
    crash_keys = {e["idempotency_key"] for e in crash}
    key = next(iter(crash_keys)) if len(crash_keys) == 1 else "?"
    billed = sum(1 for r in requests if r["billed"])

    checks: list[tuple[bool, str]] = [
        (
            all(
                len(by_step[s]) == 1 and by_step[s][0]["pid"] == w1 and len(started[s]) == 1
                for s in STEPS[:3]
            ),
            "steps 1\N{EN DASH}3 ran once each, before the crash — not again after it",
        ),
        (
            len(crash) == 2
            and len(crash_keys) == 1
            and crash_journal_keys == crash_keys
            and len(started[crash_step]) == 2,
            f"step {CRASH_STEP} ran twice with the same idempotency key {key}: the model "
            "call was sent before the crash and again after it",
        ),
        (
            billed == 1 and [e["billed"] for e in crash] == [True, False] and crash[1]["replayed"],
            f"the provider billed the model call once ({billed} billed call"
            f"{'s' if billed != 1 else ''}): the re-sent request was answered from its "
            "store",
        ),
        (
            all(len(by_step[s]) == 1 and by_step[s][0]["pid"] == w2 for s in STEPS[4:]),
            "steps 5\N{EN DASH}6 ran once each, after the restart, in worker 2",
        ),
        (
            len(resumed) == 1 and resumed[0].payload.get("reason") == "reclaim",
            "the journal shows one re-drive: run_resumed "
            + (dumps(resumed[0].payload) if resumed else "missing"),
        ),
        (
            succeeded == 1 and status == "succeeded",
            f"run_succeeded written {succeeded} time{'s' if succeeded != 1 else ''}",
        ),
    ]
    return checks


def verdict(demo: Demo, checks: Sequence[tuple[bool, str]], result: Any, hint: str) -> int:
    """Print the claims, each ✓ or ✗, the result and ``hint``; 0 when all held, else 1."""
    console = demo.console
    console.print()
    for ok, text in checks:
        console.print(
            Text("✓ " if ok else "✗ ", style="bold green" if ok else "bold red"),
            Text(text),
            sep="",
            soft_wrap=True,
        )
    console.print(Text(f"result: {dumps(result)}"), soft_wrap=True)
    console.print(Text(f"elapsed: {time.monotonic() - demo.t0:.2f}s"))
    console.print(Text(hint, style="dim"), soft_wrap=True)
    failed = [text for ok, text in checks if not ok]
    if failed:
        console.print(Text(f"demo failed: {len(failed)} check(s) did not hold", style="bold red"))
        return 1
    return 0
