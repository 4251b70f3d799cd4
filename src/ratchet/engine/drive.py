"""What code built on a drive may call: the :class:`Drive` protocol.

LLM calls, tools, graph nodes, deliveries, approvals and guards are built on a drive, and
this is all of it they see (``require_run()`` returns it): allocate the next step, run a
step or take its journaled outcome, wait (sleep, signal, child run, approval), journal an
event of their own, hold a step open while the workflow reads it. How the drive writes its
journal, parks, stops and replays stays behind it (:mod:`ratchet.engine.driver`), so those
can change without touching what is built on top.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ratchet.engine.definitions import StepDef, WorkflowDef
    from ratchet.engine.guards.policy import Guards
    from ratchet.engine.values import Codec
    from ratchet.model import Decision, DeliveryReceipt, RunRecord, RunState, StepState
    from ratchet.store.base import StoredGraph


class HeldStep(Protocol):
    """A step the workflow holds open while it reads it (a stream): it ends before the
    branch that opened it journals anything else (``Drive.close_held``)."""

    #: The workflow has let it go (closed it, or dropped its iterator).
    released: bool

    async def end(self, *, workflow_done: bool) -> None:
        """End the step (``workflow_done``: the workflow returned or raised) and return
        once its end is journaled."""
        ...


class DriveGuards(Protocol):
    """What code built on a drive uses of its guards
    (:class:`ratchet.engine.guards.run.RunGuards` is the one)."""

    @property
    def g(self) -> Guards:
        """The guards in force: the workflow's, the run's overrides and its grants."""
        ...

    async def trip(
        self,
        kind: str,
        key: str,
        step_id: str | None,
        evidence: dict[str, Any],
        action: str | None = None,
    ) -> None:
        """Journal anomaly ``key`` (unless the journal has it) and apply its action."""
        ...

    def nested_call(
        self, step_id: str, tokens: int, usd: float | None, held_tokens: int, held_usd: float
    ) -> None:
        """Check a model call made inside step ``step_id`` against the budgets."""
        ...

    def replayed_step(
        self,
        name: str,
        step_id: str,
        output: Any,
        call: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> None:
        """Count a replayed step in the runaway-loop streak."""
        ...


class Drive(Protocol):
    """One drive of one run, as the code built on it sees it."""

    @property
    def run_id(self) -> str:
        """The run being driven."""
        ...

    @property
    def record(self) -> RunRecord:
        """The run's row as the drive claimed it (workflow, version, queue, ...)."""
        ...

    @property
    def state(self) -> RunState:
        """The run's journal, folded (read it; the drive alone changes it)."""
        ...

    @property
    def guards(self) -> DriveGuards:
        """The run's guards, checked at every step boundary."""
        ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the drive runs on (a ``def`` step's thread calls back on it)."""
        ...

    # -- steps -----------------------------------------------------------------------------

    def next_step(self, name: str) -> tuple[str, StepState | None]:
        """Take the workflow's next step position for a step ``name``: its step id and
        what the journal holds for it (None: nothing yet)."""
        ...

    def upcoming(self) -> StepState | None:
        """What the journal holds at the next step position, without taking it."""
        ...

    def call_step(
        self,
        sd: StepDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        started: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """``sd`` called as the workflow's next step (its position taken now)."""
        ...

    async def run_step(
        self,
        sd: StepDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        step_id: str,
        step: StepState | None,
        started: dict[str, Any] | None = None,
    ) -> Any:
        """Run the step at a position taken by :meth:`next_step`: its journaled outcome,
        else its code under its retry policy."""
        ...

    def take_completed(self, name: str) -> StepState | None:
        """The next step, its position taken, when the journal holds it as ``name``
        completed and its output may go back to the workflow at once; else None."""
        ...

    def take_completed_groups(self, names: Iterable[str], size: int) -> list[StepState]:
        """:meth:`take_completed` for the steps ``names`` in a row, by whole groups of
        ``size``."""
        ...

    def replayed_failure(self, step: StepState) -> BaseException:
        """The error a step the journal holds as failed raises again."""
        ...

    def journal(
        self,
        kind: str,
        step_id: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """Add an event to the run's journal; it is committed with the drive's next
        write."""
        ...

    def patched(self, name: str, deprecated: bool = False) -> bool:
        """Whether the run takes patch ``name``'s new path (``ratchet.patched``): True when
        it reaches this point first under code that has the patch (a ``patch_marked``
        event is journaled, taking no step position) or its journal holds that marker;
        False when its journal went past this point the old way (nothing journaled).
        ``deprecated``: ``ratchet.deprecate_patch``."""
        ...

    def configure_guards(self, guards: Guards) -> None:
        """Guard the run with ``guards`` (and the run's own overrides and grants) from
        here on, instead of its workflow's."""
        ...

    # -- steps held open -------------------------------------------------------------------

    def hold(self, step: HeldStep) -> None:
        """Keep ``step`` open while the workflow reads it (a stream)."""
        ...

    def release(self, step: HeldStep) -> None:
        """``step`` has ended (its end is journaled)."""
        ...

    async def close_held(self, workflow_done: bool = False) -> None:
        """End the held steps this branch opened or let go, before it journals more."""
        ...

    # -- waits -----------------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Sleep durably, as the workflow's next step."""
        ...

    async def wait_for_signal(
        self, name: str, timeout_s: float | None, codec: Codec | None = None
    ) -> Any:
        """The data of signal ``name`` once it arrives (the workflow's next step)."""
        ...

    async def child(
        self, wf: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any], queue: str | None
    ) -> Any:
        """Run ``wf`` as a child run and return its result (the workflow's next step)."""
        ...

    async def await_approval(
        self,
        step_id: str,
        step: StepState | None,
        name: str,
        data: Any,
        timeout_s: float | None,
    ) -> Decision:
        """Ask approval ``name`` at the position :meth:`next_step` took, and wait for the
        decision."""
        ...

    # -- the outside world -----------------------------------------------------------------

    async def get_graph(self, name: str, version: str | None = None) -> StoredGraph | None:
        """A registered graph version, or the latest one (None: not registered)."""
        ...

    async def claim_receipt(
        self, key: str, step_id: str, *, delivery: str, attempt: int
    ) -> DeliveryReceipt | None:
        """Claim the receipt of a delivery under this drive's lease; None when claimed
        afresh, else the receipt found (settled, or claimed by an earlier attempt)."""
        ...

    async def reclaim_receipt(self, key: str) -> None:
        """Take over a receipt claimed earlier, to dispatch again under its key."""
        ...

    async def settle_receipt(self, key: str, response: Any) -> None:
        """Store the delivery's response on its receipt."""
        ...
