"""Approvals inside a drive: a step that parks until a person decides.

The step journals ``step_waiting`` (reason ``approval``: the name, the data, the timeout and
deadline) in the same commit as the approval's row (see :mod:`ratchet.store.approvals`),
then waits on the drive's usual machinery: in memory while other branches move, parked once
every branch waits. A decision wakes the run; the step then journals ``approval_decided``
and its ``step_completed`` with the :class:`~ratchet.model.Decision` as output, so a replay
returns the decision from the journal without asking the database. A deadline that passes
first fails the step with :class:`ApprovalTimeout`, journaled like a signal's timeout.
That wait is one of the drive's own (``Drive.await_approval``); this module asks it.

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
from ratchet.errors import ApprovalRejected, InvalidInput
from ratchet.model import Decision, EventKind, StepStatus

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive

# Step names of approvals: "<ordinal>:approval:<name>".
STEP_PREFIX = "approval:"


# The names of the guards' pauses (ratchet.engine.guards.run.PAUSE_PREFIX): approving one of a
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
    ctx: Drive, name: str, data: Any, timeout_s: float | None
) -> Coroutine[Any, Any, Decision]:
    """The workflow's next step: an approval. Its ordinal is taken now, at call time, so
    approvals asked together number the same way on every replay."""
    step_id, step = ctx.next_step(STEP_PREFIX + name)
    return ctx.await_approval(step_id, step, name, data, timeout_s)


def approve_then_call(
    ctx: Drive,
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
        decision = await ctx.await_approval(ask_id, ask, name, data, None)
        if not decision.approved:
            if step is not None and step.status == StepStatus.FAILED:
                raise ctx.replayed_failure(step)
            comment = f": {decision.comment}" if decision.comment else ""
            error = (
                f"approval {name!r} ({ask_id}) was rejected by {decision.by} at "
                f"{decision.at.isoformat(timespec='seconds')}{comment}; the step did "
                "not run"
            )
            ctx.journal(
                EventKind.STEP_FAILED,
                step_id,
                None,
                {"error": error, "error_type": ApprovalRejected.__name__},
            )
            raise ApprovalRejected(step_id, error)
        return await ctx.run_step(sd, args, kwargs, step_id, step)

    return go()
