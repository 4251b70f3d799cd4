"""``ratchet runs``, ``show``, ``events`` and ``dlq``: runs and their journals, read
without the user's workflows (the database is opened read-only)."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import (
    DbOption,
    JsonOption,
    RunArg,
    client,
    die,
    make_console,
    tag_option,
)
from ratchet.cli._format import (
    compact,
    cost_text,
    duration_text,
    echo_json,
    more_note,
    shorten,
    status_text,
    waiting_text,
    when,
)
from ratchet.model import (
    Event,
    LLMTotals,
    RunRecord,
    RunStatus,
    StepState,
    answer_text,
    drives,
    duration,
    failure,
    fold,
    given_input,
)
from ratchet.store import WorkerInfo

# How much of a value `show` prints unless --full is given.
SHOW_LIMIT = 2000
STEP_LIMIT = 100


def runs(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(
            metavar="STATUS",
            help="Only runs with this status: " + ", ".join(s.value for s in RunStatus),
        ),
    ] = None,
    workflow: Annotated[
        str | None, typer.Option(metavar="NAME", help="Only runs of this workflow (its name).")
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TAG",
            help="Only runs with this tag, as KEY=VALUE; repeat it for runs with all of them.",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, metavar="N", help="At most this many, newest first.")
    ] = 50,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """List runs, newest first."""
    if status is not None and status not in {s.value for s in RunStatus}:
        die(f"unknown status {status!r}: expected one of {', '.join(s.value for s in RunStatus)}")
    tags = tag_option(tag)
    what = _described(status, workflow, tags)
    with client(ctx, db, read_only=True) as app:
        # One more than asked for tells whether there are more, without counting each time.
        records = app.runs(status, limit + 1, workflow=workflow, tags=tags)
        more = len(records) > limit
        records = records[:limit]
        total = app.count_runs(status, workflow=workflow, tags=tags) if more else len(records)
        queued = [r for r in records if r.status == RunStatus.QUEUED]
        notes = _unserved_notes(queued, app.live_workers()) if queued else []
        totals = app.llm_totals([r.run_id for r in records]) if records else {}
    note = more_note(len(records), total, "runs" + what)
    if as_json:
        echo_json([{**r.as_dict(), "llm": _totals_dict(totals.get(r.run_id))} for r in records])
        if more:
            typer.echo(note, err=True)
        return
    # A tags column only when a run shown has tags.
    tagged = any(r.tags for r in records)
    columns = ["run_id", "workflow", "status", "created", "updated", "tokens", "cost"]
    table = Table(*columns, *(["tags"] if tagged else []), title=None)
    table.columns[0].no_wrap = True
    for r in records:
        t = totals.get(r.run_id)
        table.add_row(
            Text(r.run_id),
            Text(f"{r.workflow} v{r.workflow_version}"),
            status_text(r.status, waiting_text(r)),
            when(r.created_at),
            when(r.updated_at),
            f"{t.tokens:,}" if t else "-",
            _cost(t) if t else "-",
            *([Text(" ".join(f"{k}={v}" for k, v in sorted(r.tags.items())))] if tagged else []),
        )
    console = make_console()
    if not records:
        console.print("no runs" + what)
        return
    console.print(table)
    if more:
        console.print(note)
    for line in notes:
        console.print(Text(line, style="yellow"))


def _described(status: str | None, workflow: str | None, tags: dict[str, str]) -> str:
    """What a listing holds, for its notes: `` with status failed of workflow x ...``."""
    parts = [f"with status {status}"] if status else []
    if workflow is not None:
        parts.append(f"of workflow {workflow}")
    if tags:
        parts.append("tagged " + " ".join(f"{k}={v}" for k, v in tags.items()))
    return "".join(" " + p for p in parts)


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
    """The run's cost, exact (rounded only for display); None when none of its calls has
    a price."""
    return None if t.unpriced_calls == t.calls else t.cost_usd


def _cost(t: LLMTotals) -> str:
    value = _cost_value(t)
    text = "unpriced" if value is None else cost_text(value)
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
        "answer": answer_text(step.output) if step.kind == "llm" and step.finished_at else None,
        "error": step.error,
        "traceback": step.traceback,
        "kind": step.kind,
        "llm": step.llm,
    }


def show(
    ctx: typer.Context,
    run_id: RunArg,
    full: Annotated[
        bool,
        typer.Option("--full", help="Print inputs, outputs and errors whole, not shortened."),
    ] = False,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """A run's story: its status, input as it was given, output or error with the
    failure's traceback, duration, tokens and cost, each drive (who drove it and why it
    ended), and each step from its journal (a model call's answer as text).

    Long inputs and outputs are shortened (ending in …); --full prints them whole.
    """
    head_limit = None if full else SHOW_LIMIT
    with client(ctx, db, read_only=True) as app:
        rec = app.get(run_id)
        journal = app.events(run_id)
    state = fold(run_id, journal)
    told = drives(journal)
    failed_step, trace = failure(journal)
    took = duration(journal)
    given = given_input(rec.input)
    steps = [_step_dict(s) for s in sorted(state.steps.values(), key=lambda s: s.ordinal)]
    if as_json:
        echo_json(
            {
                **rec.as_dict(),
                "input": given,
                "drives": state.drives,
                "drive_log": [d.as_dict() for d in told],
                "duration_s": took,
                "failed_step": failed_step,
                "traceback": trace,
                "events": state.last_seq,
                "llm": _totals_dict(state.llm if state.llm.calls else None),
                "steps": steps,
            }
        )
        return
    console = make_console()
    rows: list[tuple[str, Text]] = [
        ("run", Text(rec.run_id)),
        ("workflow", Text(f"{rec.workflow} v{rec.workflow_version}")),
        ("queue", Text(rec.queue)),
        *(
            [("forked from", Text(f"{rec.forked_from} at step {rec.forked_at}"))]
            if rec.forked_from is not None
            else []
        ),
        ("status", status_text(rec.status)),
        ("created", Text(when(rec.created_at))),
        ("updated", Text(when(rec.updated_at))),
        ("input", Text(compact(given, head_limit))),
    ]
    if rec.status == RunStatus.SUCCEEDED:
        rows.append(("output", Text(compact(rec.output, head_limit))))
    if rec.error:
        rows.append(("error", Text(shorten(rec.error, head_limit), style="red")))
    if took is not None:
        rows.append(("duration", Text(duration_text(took))))
    waits = waiting_text(rec)
    if rec.waiting_for or waits:
        rows.append(("waiting", Text(waits or rec.waiting_for or "")))
    # Every run journals run_queued: a finished run with no events was pruned.
    pruned = state.last_seq == 0 and rec.status.terminal
    rows.append(("drives", Text(str(state.drives))))
    rows += [("", Text(d.label)) for d in told]  # who drove it, and why each drive ended
    rows += [
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
        _show_traceback(console, failed_step, trace)
        return
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for key, value in rows:
        head.add_row(key, value)
    console.print(head)
    _show_traceback(console, failed_step, trace)
    if not steps:
        console.print("no steps: the journal was pruned" if pruned else "no steps yet")
        return
    table = Table("step", "status", "attempts", "duration", "output / error")
    table.columns[0].no_wrap = True
    shortened = False
    for s in steps:
        if s["error"]:
            text = shorten(s["error"], STEP_LIMIT)
            detail = Text(text, style="red")
        elif s["answer"] is not None:  # a model call: its answer, not its raw response
            text = shorten(s["answer"], STEP_LIMIT)
            detail = Text(text)
        elif s["status"] == "completed":
            text = compact(s["output"], STEP_LIMIT)
            detail = Text(text)
        else:
            text, detail = "-", Text("-")
        shortened = shortened or text.endswith("…")
        table.add_row(
            Text(s["step_id"]),
            status_text(s["status"]),
            str(s["attempts"]),
            duration_text(s["duration_s"]),
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
        line += status_text(s["status"])
        line += Text(f"  attempts {s['attempts']}  {duration_text(s['duration_s'])}")
        console.print(line, soft_wrap=True)
        if s["error"]:
            console.print(Text("  error   ") + Text(s["error"], style="red"), soft_wrap=True)
        elif s["answer"] is not None:
            console.print(Text(f"  answer  {s['answer']}"), soft_wrap=True)
            console.print(Text(f"  output  {compact(s['output'], None)}"), soft_wrap=True)
        elif s["status"] == "completed":
            console.print(Text(f"  output  {compact(s['output'], None)}"), soft_wrap=True)


def _show_traceback(console: Console, step_id: str | None, trace: str | None) -> None:
    """The failure's traceback as journaled, whole (it is bounded when journaled)."""
    if trace is None:
        return
    where = f" of step {step_id}" if step_id else ""
    console.print(Text(f"traceback{where}:", style="bold"))
    console.print(Text(trace.rstrip("\n"), style="red"), soft_wrap=True)


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
    line.append(f"  {ev.step_id or '-':<24} {attempt:>3}  {compact(ev.payload, 160)}")
    return line


def events(
    ctx: typer.Context,
    run_id: RunArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new events until the run finishes."),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(min=0.01, metavar="SECONDS", help="Seconds between polls with --follow."),
    ] = 0.2,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """A run's journal, one event per line: seq, time, kind, step, attempt, payload.

    With --json, one JSON object per line.
    """
    console = make_console()

    def emit(batch: list[Event]) -> None:
        for ev in batch:
            if as_json:
                echo_json(ev.as_dict())
            else:
                console.print(_event_line(ev), soft_wrap=True)
        sys.stdout.flush()

    with client(ctx, db, read_only=True) as app:
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


def dlq(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option(min=1, metavar="N", help="At most this many, newest first.")
    ] = 100,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Dead-lettered runs: failed runs waiting for a person to retry them."""
    with client(ctx, db, read_only=True) as app:
        dead = app.dead_letters(limit + 1)
        more = len(dead) > limit
        dead = dead[:limit]
        total = app.count_dead_letters() if more else len(dead)
    note = more_note(len(dead), total, "dead-lettered runs")
    if as_json:
        echo_json(
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
    console = make_console()
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
            when(d.at),
        )
    console.print(table)
    if more:
        console.print(note)
