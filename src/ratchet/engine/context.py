"""Which run and which step the running code belongs to."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from ratchet.engine.drive import Drive, HeldStep
from ratchet.errors import RatchetError


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a step knows about itself (``ratchet.current_step()``)."""

    run_id: str
    step_id: str
    attempt: int
    lease_epoch: int
    idempotency_key: str
    # Numbers this execution's unnamed deliveries "#1", "#2", ... in call order. A StepInfo
    # lives for one execution of one attempt, so the numbering restarts with every retry and
    # re-drive, and the same delivery gets the same number each time.
    _deliveries: Iterator[int] = field(
        default_factory=lambda: itertools.count(1), init=False, repr=False, compare=False
    )

    def _next_delivery(self) -> str:
        """The identity of this execution's next unnamed delivery (``#n``); for ``deliver``."""
        return f"#{next(self._deliveries)}"


current_run: contextvars.ContextVar[Drive | None] = contextvars.ContextVar(
    "ratchet_run", default=None
)
current_step_info: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "ratchet_step", default=None
)
# The held steps this branch of the workflow opened. A branch started afterwards (a task,
# asyncio.gather) copies the context, and so counts them as its own; one started earlier
# does not see them.
held_here: contextvars.ContextVar[tuple[HeldStep, ...]] = contextvars.ContextVar(
    "ratchet_held", default=()
)


def current_step() -> StepInfo:
    """The step being executed: run id, step id, attempt, lease epoch, idempotency key."""
    info = current_step_info.get()
    if info is None:
        raise RatchetError("ratchet.current_step() called outside a step")
    return info


def workflow_run() -> Drive | None:
    """The drive whose workflow code (outside any step) is running here; None elsewhere
    (outside a workflow, or inside a step, where a durable call is a plain call)."""
    ctx = current_run.get()
    if ctx is None or current_step_info.get() is not None:
        return None
    return ctx


def require_run(what: str) -> Drive:
    """The drive whose workflow code is running here; raises outside a workflow or inside
    a step, where ``what`` cannot be awaited."""
    ctx = current_run.get()
    if ctx is None or current_step_info.get() is not None:
        raise RatchetError(f"{what} must be awaited in a workflow, outside any step")
    return ctx


def step_run() -> tuple[Drive, StepInfo] | None:
    """The drive and the step whose step code runs here, on the drive's own event loop;
    None elsewhere (outside a step, or in a thread of a synchronous step)."""
    info = current_step_info.get()
    if info is None:
        return None
    ctx = current_run.get()
    if ctx is None:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return (ctx, info) if ctx.loop is loop else None
