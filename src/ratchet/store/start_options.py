"""Starts with a dedup id, a debounce or a time to begin at (:class:`StartPlan`).

The database decides, never a read followed by a write: a dedup id is held by the one
run of its tenant and workflow that is not terminal (the partial unique index
``runs_dedup``, which the transaction ending the run leaves in the same commit), and a
debounce key by the one run of its tenant and workflow that has not begun
(``runs_debounce``). A start looks first, so the common case answers without an error;
two starts racing past that look both insert, the index refuses the second's row, and
its transaction is tried again, when it sees the first's run.

A run that may not begin yet is ``waiting`` with a ``not_before`` and no wait key (a
parked run always has one): the timers make it ``queued`` at its time, as they do a
sleeping run, so no claim sees it before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ratchet.errors import BatchItemInvalid, DuplicateStart, InvalidInput, StoreConflict
from ratchet.model import NewRun, RunRecord, RunStatus, dumps
from ratchet.model.starts import StartPlan
from ratchet.store.dialect import Dialect
from ratchet.store.idempotency import check_same_run
from ratchet.store.rows import record_from_row
from ratchet.store.runs import insert_run
from ratchet.store.transaction import Tx

__all__ = ["check_dedup_free", "create_planned_run", "create_planned_runs"]

T = TypeVar("T")

# Tries of a start whose insert lost a race on runs_dedup or runs_debounce: the next try
# sees the winner. More than one loss in a row needs a debounced run to begin between two
# tries, each time.
_TRIES = 5


async def _decided(d: Dialect, body: Callable[[Tx], T]) -> T:
    for attempt in range(_TRIES):
        try:
            return await d._run(body)
        except StoreConflict as e:
            # A unique index refused the row (the errors mapped from the driver's integrity
            # error are this class exactly); anything more particular is not a race.
            if type(e) is not StoreConflict or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


def check_dedup_free(tx: Tx, run_id: str) -> None:
    """Within ``tx``, before a terminal run is queued again (a retry, a resume): raise
    :class:`DuplicateStart` if another run not terminal holds its dedup id, which the run
    gave up when it ended."""
    row = tx.one("dedup_holder_of", {"run_id": run_id})
    if row is not None:
        raise DuplicateStart(
            row["run_id"],
            f"run {run_id!r} cannot be queued again: run {row['run_id']!r} holds its dedup "
            "id and is not ended yet",
        )


def _place(
    d: Dialect, tx: Tx, new: NewRun, plan: StartPlan, redact: bool, where: str = ""
) -> tuple[RunRecord, bool]:
    now = float(tx.one("now", {})["now"])
    scope = {"tenant_id": new.tenant_id, "workflow": new.workflow}
    not_before = plan.not_before(now)
    if plan.debounce_key is not None:
        row = tx.one("debounce_pending", scope | {"debounce_key": plan.debounce_key})
        if row is not None:
            params = {"run_id": row["run_id"], "input": dumps(new.input), "not_before": not_before}
            tx.send("debounce_push", params)
            return record_from_row(tx.one("run_get", {"run_id": row["run_id"]})), False
    if plan.dedup_id is not None:
        row = tx.one("dedup_holder", scope | {"dedup_id": plan.dedup_id})
        if row is not None and row["run_id"] != new.run_id:
            raise DuplicateStart(
                row["run_id"],
                f"{where}a run of {new.workflow!r} with dedup id {plan.dedup_id!r} is not "
                f"ended yet: run {row['run_id']!r}",
            )
    rec, created = insert_run(d, tx, new)
    if not created:
        check_same_run(rec, new, redact)
        return rec, False
    tx.send(
        "run_start_options",
        {
            "run_id": new.run_id,
            "dedup_id": plan.dedup_id,
            "debounce_key": plan.debounce_key,
            "not_before": not_before,
        },
    )
    return record_from_row(tx.one("run_get", {"run_id": new.run_id})), True


async def create_planned_run(
    d: Dialect, new: NewRun, plan: StartPlan, redact: bool = False
) -> tuple[RunRecord, bool]:
    """One run started by ``plan`` (see ``Store.create_planned_run``)."""
    return await _decided(d, lambda tx: _place(d, tx, new, plan, redact))


async def create_planned_runs(
    d: Dialect, items: Sequence[tuple[NewRun, StartPlan | None]], redact: bool = False
) -> list[tuple[str, RunStatus, bool]]:
    """Many top-level runs in one transaction, each started by its plan (see
    ``Store.create_planned_runs``)."""

    def body(tx: Tx) -> list[tuple[str, RunStatus, bool]]:
        out = []
        for i, (new, plan) in enumerate(items):
            try:
                rec, created = _place(d, tx, new, plan or StartPlan(), redact, f"item {i}: ")
            except InvalidInput as e:
                raise BatchItemInvalid(i, e.field or "run_id", str(e)) from e
            out.append((rec.run_id, rec.status, created))
        return out

    return await _decided(d, body)
