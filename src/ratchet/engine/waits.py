"""Waiting inside a drive: the run parks only when every branch waits.

A workflow may wait in several places at once (``asyncio.gather`` of a step, a signal and
child runs). Each wait registers a :class:`Wait` and sleeps on it. A settler task watches
the drive: while any step runs or any store call is in flight, some branch can still move,
so nothing is decided. Once the drive is quiet (no call in flight and no progress for a few
turns of the loop), every live branch is waiting on something from outside, and the settler
chooses, in this order:

* a deadline already past: wake that wait (it re-checks and times out or proceeds);
* a deadline within :data:`PARK_MIN_S`: leave it to its timer (every wait with a deadline
  has one, so a short backoff ends on time even while other branches run long steps);
* child runs awaited: wait for their ends in memory for up to :data:`CHILD_LINGER_S`, so a
  fan-out of quick children costs no park, wake and replay;
* otherwise park the run in one transaction, which first checks that nothing awaited has
  already arrived (then those waits wake and the drive goes on).

A run with a deadline parks until it at the latest: the park's wake-up time (``not_before``,
which any worker's claim honours) is the soonest of its waits' deadlines and the run's own,
so a run parked on a signal, an approval, a sleep or a child run is driven again, and
failed, when its deadline comes, with no worker holding it meanwhile.

A branch that cannot know everything the others wait for is never parked on its own, so a
step running beside a wait always finishes and is journaled before the run parks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ratchet.engine.control import Stopped, StopReason
from ratchet.engine.drive_store import DriveStore
from ratchet.errors import Parked
from ratchet.store.base import DONE

log = logging.getLogger("ratchet.engine")

# Waits shorter than this are slept in memory rather than parked.
PARK_MIN_S = 2.0
# How long a drive whose branches all wait on child runs waits for them before parking.
CHILD_LINGER_S = 2.0
# Loop turns without progress after which the drive counts as quiet. Results travel from a
# finished branch to the code awaiting it (gather, a task) in one or two turns.
QUIET_TURNS = 4

ParkFn = Callable[[list[str], float | None], Awaitable[tuple[str, list[str]]]]


@dataclass(eq=False, slots=True)
class Wait:
    """One branch waiting: for ``waiting_for`` (``signal:NAME``, ``child:RUN``,
    ``sleep:STEP``, ``backoff:STEP``), or until ``not_before`` (the database's clock)."""

    waiting_for: str
    not_before: float | None
    woken: asyncio.Future[None] = field(repr=False)

    @property
    def child_id(self) -> str | None:
        kind, _, name = self.waiting_for.partition(":")
        return name if kind == "child" else None

    def wake(self, error: BaseException | None = None) -> None:
        if not self.woken.done():
            if error is None:
                self.woken.set_result(None)
            else:
                self.woken.set_exception(error)


class Waits:
    """The waits of one drive and the settler that parks it."""

    def __init__(
        self, store: DriveStore, park: ParkFn, on_cancel: Callable[[str | None], None]
    ) -> None:
        self._store = store
        self._park = park
        self._on_cancel = on_cancel
        self._waits: list[Wait] = []
        self._busy = 0
        self._progress = 0
        self._settler: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event = asyncio.Event()
        self.stop_reason: StopReason | None = None
        # The run's deadline (time.time()), set by the drive: a park wakes by then.
        self.deadline: float | None = None

    # -- what the drive reports ------------------------------------------------------------

    def busy(self) -> None:
        """A store call or a step began: some branch is moving."""
        self._busy += 1
        self._progress += 1

    def idle(self) -> None:
        """A store call or a step ended."""
        self._busy -= 1
        self._progress += 1
        if self._busy == 0 and self._waits:
            self._settle_soon()

    def stop(self, reason: StopReason) -> None:
        """End every wait now (a stop was requested); new waits end at once."""
        self.stop_reason = reason
        self._stopping.set()
        for w in list(self._waits):
            w.wake(Stopped(reason))

    # -- waiting ---------------------------------------------------------------------------

    async def wait(
        self, waiting_for: str, not_before: float | None = None, now: float | None = None
    ) -> None:
        """Return when this wait may be over (the caller checks again); raise
        :class:`Parked` when the run parked, :class:`Stopped` when the drive stops. A wait
        with a deadline (``not_before``, read against ``now``) also wakes when it comes,
        whatever the other branches do."""
        if self.stop_reason is not None:
            raise Stopped(self.stop_reason)
        loop = asyncio.get_running_loop()
        w = Wait(waiting_for, not_before, loop.create_future())
        timer = None
        if not_before is not None and now is not None:
            timer = loop.call_later(max(0.0, not_before - now), w.wake)
        self._waits.append(w)
        self._progress += 1
        if self._busy == 0:
            self._settle_soon()
        try:
            await w.woken
        finally:
            self._waits.remove(w)
            if timer is not None:
                timer.cancel()

    def _settle_soon(self) -> None:
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle())

    async def _settle(self) -> None:
        try:
            while self._waits and self.stop_reason is None:
                if not await self._quiet():
                    if self._busy:
                        return  # the call in flight calls idle() when it ends
                    continue
                if not await self._decide():
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a failed park (lease lost, storage): the branches learn
            for w in list(self._waits):
                w.wake(e)

    def close(self) -> None:
        """The drive is over: stop settling."""
        if self._settler is not None:
            self._settler.cancel()

    async def _quiet(self) -> bool:
        seen = self._progress
        for _ in range(QUIET_TURNS):
            await asyncio.sleep(0)
            if self._busy or self._progress != seen:
                return False
        return bool(self._waits)

    async def _decide(self) -> bool:
        """Act on a quiet drive. Returns whether to keep settling."""
        now = await self._store.now()
        waits = list(self._waits)
        if not waits or self._busy:
            return False  # a timer fired meanwhile: the branch it woke moves on
        due = [w for w in waits if w.not_before is not None and w.not_before <= now]
        if due:
            for w in due:
                w.wake()
            return False  # the woken branches move; they wait again if they must
        soonest = min((w.not_before for w in waits if w.not_before is not None), default=None)
        if self.deadline is not None:  # on the database's clock, as the waits' deadlines
            due_at = now + (self.deadline - time.time())
            soonest = due_at if soonest is None else min(soonest, due_at)
        if soonest is not None and soonest - now < PARK_MIN_S:
            return False  # its timer wakes it soon; parking would cost more
        children = [cid for w in waits if (cid := w.child_id) is not None]
        if children and await self._wait_in_memory(CHILD_LINGER_S, children):
            return True
        outcome, ready = await self._park([w.waiting_for for w in waits], soonest)
        if outcome == "parked":
            for w in waits:
                w.wake(Parked(w.waiting_for))
            return False
        if outcome == "cancel":  # ready: who asked, if named
            self._on_cancel(ready[0] if ready else None)
            return False
        for w in waits:
            if w.waiting_for in ready:
                w.wake()
        return False

    async def _wait_in_memory(self, seconds: float, children: list[str]) -> bool:
        """Wait up to ``seconds`` for a child in ``children`` to end (or a stop). Returns
        whether one ended; its wait is woken."""
        deadline = time.monotonic() + max(seconds, 0.0)
        with contextlib.ExitStack() as stack:
            ends = [stack.enter_context(self._store.watching(DONE, cid)) for cid in children]
            ended = await self._store.finished_among(children) if children else []
            while children and not ended:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    break
                waiters = [asyncio.ensure_future(e.wait()) for e in (*ends, self._stopping)]
                try:
                    await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in waiters:
                        task.cancel()
                if not any(e.is_set() for e in ends):
                    break  # the linger is over, or the drive stops
                # A wake-up may be spurious (a replaced listening connection wakes every
                # watcher): look, and linger on for the rest of the time if none ended.
                for e in ends:
                    e.clear()
                ended = await self._store.finished_among(children)
        for w in list(self._waits):
            if w.child_id in ended:
                w.wake()
        return bool(ended)
