"""Forks and resumes in the store.

A fork is a new run whose journal starts with copies of another run's completed steps
(see :mod:`ratchet.app.forking`): :func:`fork_journal` builds that journal, chained
under the fork's own run id, and :func:`create_fork` writes the run row and the whole
journal in one transaction, so a crash leaves either no fork or a whole one. The source
run is only read.

A resume queues a cancelled run again under its own id (:func:`resume`), as a retry
queues a dead-lettered one: a ``run_queued`` with the reason ``resume``, and the drive
goes on from the last completed step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ratchet.errors import NotCancelled, RunIdConflict
from ratchet.model import (
    GENESIS_HASH,
    Event,
    EventKind,
    NewRun,
    QueueReason,
    RunRecord,
    RunStatus,
    StepState,
    dumps,
)
from ratchet.model.requests import RequestIndex, requests_of
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.journal import append_unowned
from ratchet.store.rows import event_params, record_from_row
from ratchet.store.runs import locked_run, queued_payload
from ratchet.store.start_options import check_dedup_free
from ratchet.store.transaction import Tx

__all__ = ["COPIED_KINDS", "create_fork", "fork_journal", "resume"]

# The events of a copied step that come along besides its start and its completion: what
# a replay of it reads (a confidence gate's verdict) or a reader wants to see (the tool
# it called). Retries, failures, waits and guards' anomalies stay with the source: the
# fork did not live through them.
COPIED_KINDS = frozenset(
    {
        EventKind.TOOL_CALLED,
        EventKind.CONFIDENCE_EVALUATED,
        EventKind.CONFIDENCE_GATE_BYPASSED,
    }
)

# Fields of a copied step_started that describe the source's attempt, not the fork's:
# the fork never sent that key, never reserved spend, never resumed anything.
_ATTEMPT_ONLY = ("idempotency_key", "key_attempt", "resumed", "reserve")


def fork_journal(
    new: NewRun,
    source: Sequence[Event],
    copied: Mapping[str, StepState],
    edits: Mapping[str, Any],
    by: str | None = None,
) -> list[Event]:
    """The journal a fork starts with: its ``run_queued`` (naming the source and the
    fork point), then, in the source's order, each step of ``copied`` (completed, kept
    as it is) and of ``edits`` (journaled completed with the edited output), chained
    under the fork's id and stamped now. A step's start goes where the source met the
    step first and its completion where the source finished it, so parallel branches
    replay in the order they first ran."""
    assert new.forked_from is not None
    now = time.time()
    payload = queued_payload(new) | {"forked_from": new.forked_from, "forked_at": new.forked_at}
    if by is not None:
        payload["by"] = by
    out = [Event.chain(new.run_id, 1, EventKind.RUN_QUEUED, None, None, payload, now, GENESIS_HASH)]

    def add(kind: str, step_id: str, attempt: int | None, body: dict[str, Any]) -> None:
        prev = out[-1]
        out.append(
            Event.chain(new.run_id, prev.seq + 1, kind, step_id, attempt, body, now, prev.hash)
        )

    wanted = set(copied) | set(edits)
    # A model call's request is journaled against the run's earlier ones (messages by
    # digest, bodies once per run): the source's latest start of a step may name bodies
    # an earlier attempt or a step the fork does not copy journaled. Each copied request
    # is written again against the fork's own journal, whole in what it references.
    requests = {sid: r for sid, r in requests_of(source).items() if sid in wanted}
    index = RequestIndex()
    started: dict[str, dict[str, Any]] = {}  # each step's latest step_started payload
    first: dict[str, int] = {}  # the seq of each step's first event
    last: dict[str, int] = {}  # ... and of its last
    completion: dict[str, Event] = {}
    attempts: dict[str, int] = {}
    for ev in source:
        sid = ev.step_id
        if sid is None or sid not in wanted:
            continue
        first.setdefault(sid, ev.seq)
        last[sid] = ev.seq
        attempts[sid] = max(attempts.get(sid, 1), ev.attempt or 1)
        if ev.kind == EventKind.STEP_STARTED:
            started[sid] = ev.payload
        elif ev.kind == EventKind.STEP_COMPLETED:
            completion[sid] = ev
    for ev in source:
        sid = ev.step_id
        if sid is None or sid not in wanted:
            continue
        step = copied.get(sid)
        attempt = step.attempt if step is not None else attempts[sid]
        if ev.seq == first[sid]:
            body = {k: v for k, v in started.get(sid, {}).items() if k not in _ATTEMPT_ONLY}
            if sid in requests:
                body["request"] = _copied_request(index, sid, requests[sid], new.forked_from)
            add(EventKind.STEP_STARTED, sid, attempt, body | {"copied_from": new.forked_from})
        if sid in edits:
            if ev.seq == last[sid]:
                add(EventKind.STEP_COMPLETED, sid, attempt, {"output": edits[sid], "edited": True})
        elif ev.kind in COPIED_KINDS:
            add(ev.kind, sid, ev.attempt, ev.payload)
        elif ev is completion.get(sid):
            add(EventKind.STEP_COMPLETED, sid, ev.attempt, ev.payload)
    return out


def _copied_request(
    index: RequestIndex, step_id: str, resolved: Mapping[str, Any], source_run: str
) -> dict[str, Any]:
    """A copied step's ``request``, written against the fork's journal, marked as taken
    from ``source_run`` (a replay of the fork does not hold it to the fork's code)."""
    params = {k: v for k, v in resolved.items() if k != "messages"}
    return index.entry(step_id, list(resolved["messages"]), params) | {"copied_from": source_run}


def _fork_params(new: NewRun) -> dict[str, Any]:
    return {
        "run_id": new.run_id,
        "workflow": new.workflow,
        "workflow_version": new.workflow_version,
        "input": dumps(new.input),
        "queue": new.queue,
        "priority": new.priority,
        "tenant_id": new.tenant_id,
        "tags": dumps(new.tags),
        "forked_from": new.forked_from,
        "forked_at": new.forked_at,
        "concurrency_key": new.concurrency_key,
    }


async def create_fork(d: Dialect, new: NewRun, events: Sequence[Event]) -> RunRecord:
    """Write the fork's row (queued) and its whole first journal (:func:`fork_journal`)
    in one transaction, and wake the workers."""

    def body(tx: Tx) -> RunRecord:
        if tx.one("run_get", {"run_id": new.run_id}) is not None:
            raise RunIdConflict(f"run id {new.run_id!r} is taken")
        tx.send("fork_insert", _fork_params(new))
        tx.send_many("event_insert", [event_params(e) for e in events])
        d._journaled(tx, new.run_id)
        d._announce(tx, READY)
        return record_from_row(tx.one("run_get", {"run_id": new.run_id}))

    return await d._run(body)


async def resume(d: Dialect, run_id: str, by: str | None = None) -> RunRecord:
    """Queue the cancelled run ``run_id`` again: a ``run_queued`` (reason ``resume``,
    and ``by``, who resumed it) in its journal, its row queued. Any other status is
    :class:`NotCancelled`, and nothing is written."""

    def body(tx: Tx) -> RunRecord:
        rec = locked_run(tx, run_id)
        if rec.status != RunStatus.CANCELLED:
            raise NotCancelled(
                f"run {run_id} is {rec.status}, not cancelled: only a cancelled run resumes"
            )
        check_dedup_free(tx, run_id)
        tx.one("lease_row_locked", {"run_id": run_id})
        payload: dict[str, Any] = {"reason": str(QueueReason.RESUME)}
        if by is not None:
            payload["by"] = by
        append_unowned(d, tx, run_id, EventKind.RUN_QUEUED, payload)
        if tx.run("run_resume", {"run_id": run_id}) != 1:
            raise NotCancelled(f"run {run_id} is no longer cancelled; nothing changed")
        d._announce(tx, READY)
        return record_from_row(tx.one("run_get", {"run_id": run_id}))

    return await d._run(body)
