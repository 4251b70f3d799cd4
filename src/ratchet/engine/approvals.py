"""Approvals inside a drive: a step that parks until a person decides.

The step journals ``step_waiting`` (reason ``approval``: the name, the data, the timeout and
deadline) in the same commit as the approval's row (see :mod:`ratchet.store.approvals`),
then waits on the drive's usual machinery: in memory while other branches move, parked once
every branch waits. A decision wakes the run; the step then journals ``approval_decided``
and its ``step_completed`` with the :class:`~ratchet.model.Decision` as output, so a replay
returns the decision from the journal without asking the database. A deadline that passes
first fails the step with :class:`ApprovalTimeout`, journaled like a signal's timeout.

A tool that needs an approval (``risk="critical"`` or ``requires_approval=True``) asks one
as a step of its own, just before its tool step; a rejection fails the tool step, without
running it, with :class:`ApprovalRejected`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ratchet.engine.definitions import StepDef, check_name, to_json
from ratchet.errors import ApprovalRejected, ApprovalTimeout, InvalidInput, RatchetError
from ratchet.model import (
    ApprovalStatus,
    Decision,
    EventKind,
    StepState,
    StepStatus,
    WaitKey,
    WaitKind,
)

if TYPE_CHECKING:
    from ratchet.engine.driver import RunContext

# Step names of approvals: "<ordinal>:approval:<name>".
STEP_PREFIX = "approval:"


# The names of the guards' pauses (ratchet.engine.guarding.PAUSE_PREFIX): approving one of a
# limit moves the run's limits, so a workflow's own approval may not take such a name.
_GUARD_NAMES = "guard:"


def check_request(name: str, data: Any, timeout_s: float | None) -> Any:
    """Validate what an approval asks; return its data as JSON data."""
    check_name(name, "approval name")
    if name.startswith(_GUARD_NAMES):
        raise InvalidInput(
            f"ratchet.approval: the name {name!r} is reserved: approvals named "
            f"{_GUARD_NAMES}... are the guards' pauses"
        )
    if timeout_s is not None and (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise InvalidInput(
            f"ratchet.approval: timeout_s must be a positive number of seconds, got {timeout_s!r}"
        )
    return json.loads(to_json(data, f"the data of approval {name!r}"))


def approval(
    ctx: RunContext, name: str, data: Any, timeout_s: float | None
) -> Coroutine[Any, Any, Decision]:
    """The workflow's next step: an approval. Its ordinal is taken now, at call time, so
    approvals asked together number the same way on every replay."""
    step_id, step = ctx.next_step(STEP_PREFIX + name)
    return run_approval(ctx, step_id, step, name, data, timeout_s)


def approve_then_call(
    ctx: RunContext,
    sd: StepDef,
    name: str,
    data: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Coroutine[Any, Any, Any]:
    """A step that needs an approval first: an approval step named ``name`` asking
    ``data``, then, if approved, the step itself; rejected, the step fails unrun."""
    ask_id, ask = ctx.next_step(STEP_PREFIX + name)
    step_id, step = ctx.next_step(sd.name)

    async def go() -> Any:
        decision = await run_approval(ctx, ask_id, ask, name, data, None)
        if not decision.approved:
            if step is not None and step.status == StepStatus.FAILED:
                raise ctx.replayed_failure(step)
            comment = f": {decision.comment}" if decision.comment else ""
            error = (
                f"approval {name!r} ({ask_id}) was rejected by {decision.by} at "
                f"{decision.at.isoformat(timespec='seconds')}{comment}; the step did "
                "not run"
            )
            ctx.emit(
                EventKind.STEP_FAILED,
                step_id,
                None,
                {"error": error, "error_type": ApprovalRejected.__name__},
            )
            raise ApprovalRejected(step_id, error)
        return await ctx.run_step(sd, args, kwargs, step_id, step)

    return go()


async def run_approval(
    ctx: RunContext,
    step_id: str,
    step: StepState | None,
    name: str,
    data: Any,
    timeout_s: float | None,
) -> Decision:
    await ctx.close_held()
    if step is not None and step.status.finished:
        await ctx.replayed(step)
        if step.status == StepStatus.COMPLETED:
            return Decision.from_dict(step.output)
        raise ctx.replayed_failure(step)
    ctx.check_stop()
    if step is None or step.status == StepStatus.PENDING or step.waiting is None:
        # Not asked yet, or asked afresh after a retry of the run: a new attempt, whose row
        # replaces the expired one.
        attempt = step.attempt + 1 if step is not None else 1
        deadline = await ctx.store.now() + timeout_s if timeout_s is not None else None
        asked = {
            "reason": WaitKind.APPROVAL,
            "name": name,
            "data": data,
            "timeout_s": timeout_s,
            "deadline": deadline,
        }
        ctx.emit(EventKind.STEP_WAITING, step_id, attempt, asked)
        await ctx._write(
            lambda events: ctx.store.ask_approval(
                ctx.lease, events, step_id, attempt, name, data, deadline
            )
        )
    else:
        attempt = step.attempt
        deadline = step.waiting.get("deadline")
        timeout_s = step.waiting.get("timeout_s")
    while True:
        found = await ctx.store.get_approval(ctx.run_id, step_id)
        if found is None or found.attempt != attempt:
            raise RatchetError(
                f"run {ctx.run_id}: approval {step_id} (attempt {attempt}) "
                "is journaled as asked but has no row"
            )
        decision = found.decision
        if decision is not None:
            decided = {"name": name, **decision.as_dict()}
            if found.note is not None:
                decided["note"] = found.note  # the name the client gave, beside the decider
            ctx.emit(EventKind.APPROVAL_DECIDED, step_id, attempt, decided)
            ctx.emit(EventKind.STEP_COMPLETED, step_id, attempt, {"output": decision.as_dict()})
            return decision
        if found.status == ApprovalStatus.EXPIRED:
            error = f"no decision on approval {name!r} arrived within {timeout_s or 0:g}s"
            ctx.emit(
                EventKind.STEP_FAILED,
                step_id,
                attempt,
                {"error": error, "error_type": ApprovalTimeout.__name__},
            )
            raise ApprovalTimeout(error)
        now = await ctx.store.now()
        if deadline is not None and now >= deadline:
            # Claimed in the database, so a decision racing the deadline either lands first
            # (and is taken) or is refused: never both a decision and a timeout.
            await ctx.store.expire_approval(ctx.lease, step_id, attempt)
            continue
        await ctx.waits.wait(str(WaitKey.approval(step_id)), deadline, now)
