"""The ``ratchet`` command: run a worker, inspect runs and their journals, act on them.

Client commands (``runs``, ``show``, ``events``, ``signal``, ``cancel``, ``dlq``,
``retry``, ``approvals``, ``approve``, ``reject``) need only the database, not the user's
workflows. Every failure is one line, ``error: <message>`` on stderr, with exit code 2
for anything the caller can fix (bad input, an unknown run, a malformed URL) and no
traceback. The reading commands open the
database read-only and never create one.

User data (ids, names, payloads, errors) is printed as it is: the console interprets no
markup and no emoji codes, and every user string goes out as a ``Text``, never as markup,
so ``[/bold]`` or ``:child:`` in a step name prints as typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from ratchet.app import Ratchet
from ratchet.config import DEFAULT_DATABASE_URL, DatabaseURL, parse_duration
from ratchet.engine import faults
from ratchet.errors import ConfigError, RatchetError
from ratchet.extras import require
from ratchet.model import Event, LLMTotals, RunRecord, RunStatus, StepState, dumps, fold
from ratchet.store import WorkerInfo

log = logging.getLogger("ratchet.cli")

cli = typer.Typer(
    name="ratchet",
    help="Ratchet: a durable execution engine for AI-agent workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL (sqlite:///path or postgresql://...); default: "
        f"$RATCHET_DATABASE_URL, else {DEFAULT_DATABASE_URL}.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="A run id.")]

_STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "waiting": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "completed": "green",
    "started": "blue",
    "retrying": "yellow",
    "pending": "dim",
}


# -- plumbing ----------------------------------------------------------------------------


class _Fail(Exception):
    """A clear, expected failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _die(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def _console() -> Console:
    # No markup and no emoji codes: what is printed is user data, shown as typed.
    plain: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
    # Piped output is not cut to 80 columns: a run id must survive `| grep`.
    if sys.stdout.isatty():
        return Console(**plain)
    return Console(**plain, width=int(os.environ.get("COLUMNS") or 200))


def _given_db(ctx: typer.Context, db: str | None) -> str | None:
    """The command's --db, else the one given before the command, else None."""
    root = ctx.find_root().obj
    return db or (root if isinstance(root, str) else None)


def _db_url(ctx: typer.Context, db: str | None) -> str:
    return _given_db(ctx, db) or os.environ.get("RATCHET_DATABASE_URL") or DEFAULT_DATABASE_URL


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn expected failures into one line on stderr and an exit code."""
    try:
        yield
    except _Fail as e:
        _die(str(e), e.code)
    except RatchetError as e:
        _die(str(e))
    except KeyboardInterrupt:
        _die("interrupted", 130)


@contextlib.contextmanager
def _client(ctx: typer.Context, db: str | None, read_only: bool = False) -> Iterator[Ratchet]:
    """A Ratchet client on the chosen database, shut down afterwards. ``read_only`` for
    the commands that only read: they never create a database."""
    with _errors():
        app = Ratchet(_db_url(ctx, db), read_only=read_only)
        try:
            yield app
        finally:
            app.shutdown()


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


# How much of a value `show` prints unless --full is given.
SHOW_LIMIT = 2000
STEP_LIMIT = 100


def _shorten(text: str, limit: int | None) -> str:
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def _compact(value: Any, limit: int | None = 100) -> str:
    return _shorten(dumps(value), limit)


def _status(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ""))


def _more(shown: int, total: int, what: str) -> str:
    return f"showing {shown:,} of {total:,} {what}; --limit to see more"


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, ensure_ascii=False, default=str))


def _redact(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _print_version(value: bool) -> None:
    if value:
        from ratchet import __version__

        typer.echo(f"ratchet {__version__}")
        raise typer.Exit()


@cli.callback()
def _root(
    ctx: typer.Context,
    db: DbOption = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Ratchet: a durable execution engine for AI-agent workflows."""
    ctx.obj = db


# -- worker ------------------------------------------------------------------------------


def load_app(spec: str) -> Ratchet:
    """``module:attribute`` (importable from the current directory) → the Ratchet app."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _Fail(
            f"invalid APP {spec!r}: expected module:attribute, e.g. myproject.workflows:app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise _Fail(
                f"cannot import module {module_name!r} for APP {spec!r}: "
                f"no module named {e.name!r} (looked in the current directory "
                "and on sys.path)"
            ) from e
        raise _Fail(f"importing module {module_name!r} failed: {_where(e)}") from e
    except Exception as e:
        raise _Fail(f"importing module {module_name!r} failed: {_where(e)}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _Fail(f"module {module_name!r} has no attribute {attr!r} (APP {spec!r})")
        obj = getattr(obj, part)
    if not isinstance(obj, Ratchet):
        raise _Fail(f"APP {spec!r} is a {type(obj).__name__}, not a ratchet.Ratchet app")
    return obj


def _where(e: BaseException) -> str:
    """``Type: message (file:line)`` of the innermost frame, so one line says enough."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = ""
    if tb is not None:
        where = f" ({os.path.relpath(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"
    return f"{type(e).__name__}: {e}{where}"


async def _work(app: Ratchet, options: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(sig: signal.Signals) -> None:
        log.info("action=shutdown_requested signal=%s", sig.name)
        stop.set()
        # A second signal takes the default path: stop now, without handing runs back.
        for s in signals:
            loop.remove_signal_handler(s)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        # app.run_worker, with the store also closed on this loop: what the store started
        # here (PostgreSQL's LISTEN task) cannot be stopped once asyncio.run has closed it.
        store = await asyncio.to_thread(lambda: app.store)
        try:
            await app.worker(**options).run(stop)
        finally:
            await store.close()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


@cli.command()
def worker(
    ctx: typer.Context,
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="The app, as module:attribute.")],
    concurrency: Annotated[int, typer.Option(min=1, help="Runs driven at once.")] = 16,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            help="Keep it stable across restarts (e.g. a pod name) so a restarted "
            "worker reclaims its runs at once; default $RATCHET_WORKER_ID, "
            "else unique.",
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", "-q", help="A queue to take runs from (repeatable); default: default."
        ),
    ] = None,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            metavar="DURATION",
            help="On SIGTERM, how long steps in flight may run on before they are interrupted "
            "(e.g. 10s, 500ms, 2m).",
        ),
    ] = "10s",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    db: DbOption = None,
) -> None:
    """Run a worker for APP's workflows until SIGTERM or Ctrl-C.

    On the first signal the worker stops taking runs and starts no new step; steps in
    flight get --grace to finish (then async steps are interrupted), and each run is handed
    back to the queue once its step has stopped. A second signal stops it at once.
    """
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        _die(f"invalid --log-level {log_level!r}: expected DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    with _errors():
        faults.check()
        app = load_app(app_spec)
        url = _given_db(ctx, db)
        if url is not None:
            DatabaseURL.parse(url)
            app.database_url = url
        if not app.workflows:
            log.warning("action=no_workflows app=%s", app_spec)
        try:
            grace_s = parse_duration(grace)
        except ConfigError as e:
            raise _Fail(f"invalid --grace: {e}") from e
        options: dict[str, Any] = {
            "concurrency": concurrency,
            "grace": grace_s,
            "queues": tuple(queue or ("default",)),
        }
        if worker_id:
            options["worker_id"] = worker_id
        log.info(
            "action=worker_boot app=%s db=%s workflows=%s queues=%s pid=%s",
            app_spec,
            _redact(app.database_url),
            ",".join(sorted(app.workflows)) or "-",
            ",".join(options["queues"]),
            os.getpid(),
        )
        try:
            asyncio.run(_work(app, options))
        finally:
            app.shutdown()


# -- reading -----------------------------------------------------------------------------


@cli.command()
def runs(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(help="Only runs with this status: " + ", ".join(s.value for s in RunStatus)),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """List runs, newest first."""
    if status is not None and status not in {s.value for s in RunStatus}:
        _die(f"unknown status {status!r}: expected one of {', '.join(s.value for s in RunStatus)}")
    with _client(ctx, db, read_only=True) as app:
        # One more than asked for tells whether there are more, without counting each time.
        records = app.runs(status, limit + 1)
        more = len(records) > limit
        records = records[:limit]
        total = app.count_runs(status) if more else len(records)
        queued = [r for r in records if r.status == RunStatus.QUEUED]
        notes = _unserved_notes(queued, app.live_workers()) if queued else []
        totals = app.llm_totals([r.run_id for r in records]) if records else {}
    note = _more(len(records), total, "runs" + (f" with status {status}" if status else ""))
    if as_json:
        _echo_json([{**r.as_dict(), "llm": _totals_dict(totals.get(r.run_id))} for r in records])
        if more:
            typer.echo(note, err=True)
        return
    table = Table(
        "run_id", "workflow", "status", "created", "updated", "tokens", "cost", title=None
    )
    table.columns[0].no_wrap = True
    for r in records:
        t = totals.get(r.run_id)
        table.add_row(
            Text(r.run_id),
            Text(f"{r.workflow} v{r.workflow_version}"),
            _status(r.status),
            _when(r.created_at),
            _when(r.updated_at),
            f"{t.tokens:,}" if t else "-",
            _cost(t) if t else "-",
        )
    console = _console()
    if not records:
        console.print("no runs" + (f" with status {status}" if status else ""))
        return
    console.print(table)
    if more:
        console.print(note)
    for line in notes:
        console.print(Text(line, style="yellow"))


def _unserved_notes(queued: list[RunRecord], workers: list[WorkerInfo]) -> list[str]:
    """Why queued runs stay queued: no live worker serves their workflow version, or
    none takes their queue."""
    notes: dict[str, int] = {}
    for r in queued:
        serving = [w for w in workers if (r.workflow, r.workflow_version) in w.serves]
        if not serving:
            why = f"no live worker serves workflow {r.workflow} v{r.workflow_version}"
        elif not any(r.queue in w.queues for w in serving):
            why = (
                f"no live worker of workflow {r.workflow} v{r.workflow_version} takes "
                f"queue {r.queue}"
            )
        else:
            continue
        notes[why] = notes.get(why, 0) + 1
    return [f"note: {n} queued run{'s' if n > 1 else ''}: {why}" for why, n in notes.items()]


def _totals_dict(t: LLMTotals | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        "calls": t.calls,
        "input_tokens": t.input_tokens,
        "output_tokens": t.output_tokens,
        "cached_tokens": t.cached_tokens,
        "reasoning_tokens": t.reasoning_tokens,
        "cost_usd": _cost_value(t),
        "unpriced_calls": t.unpriced_calls,
    }


def _cost_value(t: LLMTotals) -> float | None:
    """The run's cost; None when none of its calls has a price."""
    return None if t.unpriced_calls == t.calls else round(t.cost_usd, 6)


def _cost(t: LLMTotals) -> str:
    value = _cost_value(t)
    text = "unpriced" if value is None else f"${value:.6f}"
    if value is not None and t.unpriced_calls:
        text += f" (+{t.unpriced_calls} unpriced)"
    return text


def _step_dict(step: StepState) -> dict[str, Any]:
    duration = None
    if step.finished_at is not None and step.first_started_at is not None:
        duration = step.finished_at - step.first_started_at
    return {
        "step_id": step.step_id,
        "status": step.status,
        "attempts": step.attempt,
        "duration_s": duration,
        "output": step.output,
        "error": step.error,
        "kind": step.kind,
        "llm": step.llm,
    }


@cli.command()
def show(
    ctx: typer.Context,
    run_id: RunArg,
    full: Annotated[
        bool, typer.Option("--full", help="Print inputs, outputs and errors whole, not shortened.")
    ] = False,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """A run: its status, input, output or error, and each step from its journal.

    Long inputs and outputs are shortened (ending in …); --full prints them whole.
    """
    head_limit = None if full else SHOW_LIMIT
    with _client(ctx, db, read_only=True) as app:
        rec = app.get(run_id)
        state = fold(run_id, app.events(run_id))
    steps = [_step_dict(s) for s in sorted(state.steps.values(), key=lambda s: s.ordinal)]
    if as_json:
        _echo_json(
            {
                **rec.as_dict(),
                "drives": state.drives,
                "events": state.last_seq,
                "llm": _totals_dict(state.llm if state.llm.calls else None),
                "steps": steps,
            }
        )
        return
    console = _console()
    rows: list[tuple[str, Text]] = [
        ("run", Text(rec.run_id)),
        ("workflow", Text(f"{rec.workflow} v{rec.workflow_version}")),
        ("queue", Text(rec.queue)),
        ("status", _status(rec.status)),
        ("created", Text(_when(rec.created_at))),
        ("updated", Text(_when(rec.updated_at))),
        ("input", Text(_compact(rec.input, head_limit))),
    ]
    if rec.status == RunStatus.SUCCEEDED:
        rows.append(("output", Text(_compact(rec.output, head_limit))))
    if rec.error:
        rows.append(("error", Text(_shorten(rec.error, head_limit), style="red")))
    if rec.waiting_for:
        rows.append(("waiting for", Text(rec.waiting_for)))
    # Every run journals run_queued: a finished run with no events was pruned.
    pruned = state.last_seq == 0 and rec.status.terminal
    rows += [
        ("drives", Text(str(state.drives))),
        (
            "events",
            Text("0 (journal pruned; signed receipt kept)" if pruned else str(state.last_seq)),
        ),
    ]
    t = state.llm
    if t.calls:
        rows += [
            ("llm calls", Text(str(t.calls))),
            (
                "tokens",
                Text(
                    f"{t.tokens:,} (input {t.input_tokens:,}, cached "
                    f"{t.cached_tokens:,}, output {t.output_tokens:,}, "
                    f"reasoning {t.reasoning_tokens:,})"
                ),
            ),
            ("cost", Text(_cost(t))),
        ]
    if full:
        _show_full(console, rows, steps)
        return
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for key, value in rows:
        head.add_row(key, value)
    console.print(head)
    if not steps:
        console.print("no steps: the journal was pruned" if pruned else "no steps yet")
        return
    table = Table("step", "status", "attempts", "duration", "output / error")
    table.columns[0].no_wrap = True
    shortened = False
    for s in steps:
        if s["error"]:
            text = _shorten(s["error"], STEP_LIMIT)
            detail = Text(text, style="red")
        elif s["status"] == "completed":
            text = _compact(s["output"], STEP_LIMIT)
            detail = Text(text)
        else:
            text, detail = "-", Text("-")
        shortened = shortened or text.endswith("…")
        table.add_row(
            Text(s["step_id"]),
            _status(s["status"]),
            str(s["attempts"]),
            _duration(s["duration_s"]),
            detail,
        )
    console.print(table)
    if shortened or any(len(v) >= SHOW_LIMIT for _, v in rows):
        console.print("values ending in … are shortened; --full prints them whole")


def _show_full(console: Console, rows: list[tuple[str, Text]], steps: list[dict[str, Any]]) -> None:
    """``show --full``: one value a line, never wrapped or cut by the console, so a whole
    input or output can be copied or piped."""
    for key, value in rows:
        console.print(Text(f"{key:<12}", style="bold") + value, soft_wrap=True)
    for s in steps:
        console.print()
        line = Text(f"step {s['step_id']}  ", style="bold")
        line += _status(s["status"])
        line += Text(f"  attempts {s['attempts']}  {_duration(s['duration_s'])}")
        console.print(line, soft_wrap=True)
        if s["error"]:
            console.print(Text("  error   ") + Text(s["error"], style="red"), soft_wrap=True)
        elif s["status"] == "completed":
            console.print(Text(f"  output  {_compact(s['output'], None)}"), soft_wrap=True)


def _event_line(ev: Event) -> Text:
    at = datetime.fromtimestamp(ev.at).strftime("%H:%M:%S.%f")[:-3]
    style = (
        "green"
        if ev.kind in ("step_completed", "run_succeeded")
        else "red"
        if ev.kind in ("step_failed", "run_failed")
        else "yellow"
        if ev.kind in ("step_retrying", "step_waiting", "run_resumed")
        else ""
    )
    line = Text(f"{ev.seq:>4}  {at}  ")
    line.append(f"{ev.kind:<16}", style=style)
    attempt = f"#{ev.attempt}" if ev.attempt is not None else "-"
    line.append(f"  {ev.step_id or '-':<24} {attempt:>3}  {_compact(ev.payload, 160)}")
    return line


@cli.command()
def events(
    ctx: typer.Context,
    run_id: RunArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help=("Keep printing new events until the run finishes.")),
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.01, help=("Seconds between polls with --follow."))
    ] = 0.2,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """A run's journal, one event per line: seq, time, kind, step, attempt, payload.

    With --json, one JSON object per line.
    """
    console = _console()

    def emit(batch: list[Event]) -> None:
        for ev in batch:
            if as_json:
                _echo_json(ev.as_dict())
            else:
                console.print(_event_line(ev), soft_wrap=True)
        sys.stdout.flush()

    with _client(ctx, db, read_only=True) as app:
        last = 0
        while True:
            # The status is read before the events: a terminal status is committed with the
            # terminal event, so once it is seen here, the read below holds every event.
            finished = app.get(run_id).status.terminal
            batch = app.events(run_id, after=last)
            emit(batch)
            if batch:
                last = batch[-1].seq
            if not follow or finished:
                return
            time.sleep(interval)


@cli.command()
def dlq(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Dead-lettered runs: failed runs waiting for a person to retry them."""
    with _client(ctx, db, read_only=True) as app:
        dead = app.dead_letters(limit + 1)
        more = len(dead) > limit
        dead = dead[:limit]
        total = app.count_dead_letters() if more else len(dead)
    note = _more(len(dead), total, "dead-lettered runs")
    if as_json:
        _echo_json(
            [
                {
                    "run_id": d.run_id,
                    "workflow": d.workflow,
                    "reason": d.reason,
                    "error": d.error,
                    "at": d.at,
                }
                for d in dead
            ]
        )
        if more:
            typer.echo(note, err=True)
        return
    console = _console()
    if not dead:
        console.print("the dead-letter queue is empty")
        return
    table = Table("run_id", "workflow", "reason", "error", "at")
    table.columns[0].no_wrap = True
    for d in dead:
        table.add_row(
            Text(d.run_id),
            Text(d.workflow),
            Text(d.reason),
            Text(d.error, style="red"),
            _when(d.at),
        )
    console.print(table)
    if more:
        console.print(note)


# -- acting ------------------------------------------------------------------------------


@cli.command("signal")
def signal_(
    ctx: typer.Context,
    run_id: RunArg,
    name: Annotated[str, typer.Argument(help="The signal's name.")],
    data: Annotated[
        str | None, typer.Option("--data", metavar="JSON", help="The signal's data, as JSON.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Send a signal to a run; a run waiting for it wakes up."""
    payload: Any = None
    if data is not None:
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as e:
            _die(f"--data is not valid JSON ({e}); nothing was sent")
    with _client(ctx, db) as app:
        app.signal(run_id, name, payload)
        status = app.get(run_id).status
    typer.echo(f"signal {name!r} sent to run {run_id} (status: {status})")


@cli.command()
def cancel(ctx: typer.Context, run_id: RunArg, db: DbOption = None) -> None:
    """Cancel a run and print its status after the request."""
    with _client(ctx, db) as app:
        before = app.get(run_id).status
        status = before if before.terminal else app.cancel(run_id)
    if before.terminal:
        typer.echo(f"run {run_id}: already {status}; nothing to cancel")
    elif status == RunStatus.CANCELLED:
        typer.echo(f"run {run_id}: cancelled")
    else:
        typer.echo(
            f"run {run_id}: {status}, cancel requested (its worker will finish it as cancelled)"
        )


GrantOption = Annotated[
    str | None,
    typer.Option(
        "--grant",
        metavar="JSON",
        help="Limits the run may go over to, e.g. "
        "'{\"budget_tokens\": 5000}' (budget_tokens, budget_usd, budget_steps, budget_wall_s, "
        "max_steps, timeout_s; null for off). Journaled with who granted it.",
    ),
]


def grant_option(text: str | None) -> dict[str, Any] | None:
    """``--grant``'s JSON, or exit 2 naming the problem."""
    if text is None:
        return None
    try:
        grant = json.loads(text)
    except json.JSONDecodeError as e:
        _die(f"--grant is not JSON: {e}")
    if not isinstance(grant, dict):
        _die(f"--grant must be a JSON object of limits to new values, got {text}")
    return grant


@cli.command()
def retry(
    ctx: typer.Context,
    run_id: RunArg,
    grant: GrantOption = None,
    by: Annotated[
        str | None,
        typer.Option("--by", metavar="NAME", help="Who retries it (needed with --grant)."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Re-queue a dead-lettered run; it resumes after its last completed step. It keeps
    its limits (a budget it crossed stops it again) unless --grant moves them."""
    granted = grant_option(grant)
    with _client(ctx, db) as app:
        rec: RunRecord = app.retry(run_id, grant=granted, by=by)
    moved = f", granted {dumps(granted)} by {by}" if granted else ""
    typer.echo(f"run {run_id}: re-queued (status: {rec.status}){moved}")


# -- receipts ----------------------------------------------------------------------------


class _ReceiptsGroup(TyperGroup):
    """``ratchet receipts RUN`` lists (the ``list`` command); ``ratchet receipts settle
    KEY`` settles. A first word that names no command is a run id."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: a click Context
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["list", *args]
        return super().parse_args(ctx, args)


receipts_cli = typer.Typer(
    cls=_ReceiptsGroup,
    no_args_is_help=True,
    help="A run's delivery receipts (one per side effect it sent), and settling one by "
    "hand. For the signed receipt over a run's journal, see `ratchet receipt`.\n\n"
    "`ratchet receipts RUN` lists them (same as `ratchet receipts list RUN`); "
    "`ratchet receipts settle KEY --response JSON | --failed` resolves one a crash "
    "left claimed.",
)
cli.add_typer(receipts_cli, name="receipts")


@receipts_cli.command("list")
def receipts_list(
    ctx: typer.Context, run_id: RunArg, as_json: JsonOption = False, db: DbOption = None
) -> None:
    """A run's receipts: key, step, delivery, status, response, times."""
    with _client(ctx, db, read_only=True) as app:
        found = app.receipts(run_id)
    if as_json:
        _echo_json([r.as_dict() for r in found])
        return
    console = _console()
    if not found:
        console.print(Text(f"run {run_id} has no receipts"))
        return
    table = Table("key", "step", "delivery", "attempt", "status", "response", "claimed", "settled")
    table.columns[0].no_wrap = True
    for r in found:
        status = r.status + (" (by hand)" if r.settled_by == "hand" else "")
        response = _compact(r.response) if r.status == "settled" else "-"
        table.add_row(
            Text(r.idempotency_key),
            Text(r.step_id),
            Text(r.delivery),
            str(r.attempt) if r.attempt is not None else "-",
            Text(status, style=_STATUS_STYLE.get(r.status, "")),
            Text(response),
            _when(r.claimed_at),
            _when(r.settled_at),
        )
    console.print(table)


@receipts_cli.command("settle")
def receipts_settle(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(metavar="KEY", help="The receipt's idempotency key.")],
    response: Annotated[
        str | None,
        typer.Option(
            "--response",
            metavar="JSON",
            help="What the receiver answered, as JSON: the step returns it without dispatching.",
        ),
    ] = None,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed",
            help="The delivery did not happen: the step's deliver raises "
            "DeliveryFailed instead of dispatching.",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Settle a receipt left claimed (by a crash between dispatch and settle) by hand.

    Give exactly one of --response JSON and --failed. The run then goes on without
    dispatching the delivery again; a dead-lettered run after `ratchet retry RUN`.
    """
    if (response is None) == (not failed):
        _die(
            "give either --response JSON or --failed, not "
            + ("both" if failed else "neither")
            + "; nothing was settled"
        )
    value: Any = None
    if response is not None:
        try:
            value = json.loads(response)
        except json.JSONDecodeError as e:
            _die(f"--response is not valid JSON ({e}); nothing was settled")
    with _client(ctx, db) as app:
        if failed:
            r = app.settle_receipt(key, failed=True)
        else:
            r = app.settle_receipt(key, response=value)
        status = app.get(r.run_id).status
    what = "failed (not delivered)" if failed else f"settled with {_compact(value)}"
    typer.echo(f"receipt {key} (run {r.run_id}, step {r.step_id}, delivery {r.delivery}): {what}")
    if status == RunStatus.FAILED:
        typer.echo(
            f"run {r.run_id} is dead-lettered: `ratchet retry {r.run_id}` resumes it "
            "without dispatching this delivery again"
        )
    elif not status.terminal:
        typer.echo(f"run {r.run_id} ({status}) uses it when its step runs again")


@cli.command()
def demo(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Database URL; default sqlite:///.ratchet/demo.db, or "
            ".ratchet/server.db with --serve (wiped first).",
        ),
    ] = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Play it through ratchet server (the HTTP API, one embedded worker), "
            "then keep serving until Ctrl-C: what make run does.",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option(help="With --serve: the interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            envvar="RATCHET_PORT",
            help="With --serve: the port (0: any free one).",
        ),
    ] = 8000,
) -> None:
    """Kill a worker in the middle of a run and watch a new one finish it.

    A 6-step workflow runs in a worker process, which is killed with SIGKILL in the middle
    of step 4, a model call to a local provider; a new worker process finishes the run
    without running steps 1-3 again or being billed twice for the model call. With
    --serve the run is started and followed through the HTTP API, which stays up across
    the kill, and prints a token and curl lines to watch it and start more.
    """
    with _errors():
        # The workers' model call goes through the openai SDK to the local provider.
        require("ratchet demo", "openai", "server")
        if serve:
            from ratchet.demo_server import serve_demo

            code = serve_demo(_given_db(ctx, db), host, port, _console())
        else:
            from ratchet.demo import run_demo

            code = run_demo(_given_db(ctx, db), _console())
    raise typer.Exit(code)


@cli.command("llm-server")
def llm_server(
    host: Annotated[str, typer.Option(help="The interface to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="The port; 0 picks a free one.")
    ] = 8089,
    script: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="A YAML or JSON script: reply rules and queued faults."),
    ] = None,
    log: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Append one JSON line per request to FILE.")
    ] = None,
) -> None:
    """Serve a local model provider speaking OpenAI's and Anthropic's APIs, until SIGTERM
    or Ctrl-C.

    Point the official SDKs at it: OpenAI with base_url http://HOST:PORT/v1, Anthropic
    with base_url http://HOST:PORT. Replies echo the last user message unless --script
    says otherwise. Prints `llm-server listening on http://HOST:PORT` once ready.
    """
    with _errors():
        from ratchet.llm.server import LocalProvider, run_until_signalled

        provider = LocalProvider(script, log)
        try:
            run_until_signalled(provider, host, port)
        except OSError as e:
            raise _Fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from e


# Command groups kept in modules of their own register themselves on `cli`.
from ratchet import (  # noqa: E402, F401
    cli_approvals,
    cli_graphs,
    cli_receipts,
    cli_sandboxes,
    cli_server,
    cli_tokens,
)


def main() -> None:
    """Entry point of the ``ratchet`` console script."""
    cli()


if __name__ == "__main__":
    # As ``python -m ratchet.cli`` this file is __main__, and the command groups above
    # registered themselves on ratchet.cli's `cli`, not on this copy's: run that one.
    from ratchet.cli import main as registered_main

    registered_main()
