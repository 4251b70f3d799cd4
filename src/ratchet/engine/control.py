"""How a worker steers a drive, and how a drive ends.

A drive is stopped by asking, never by cancelling the task that writes its journal: a stop
request is seen at the next step boundary (no step starts after it), interrupts waits, and
only a cancel, a lost lease or the end of a shutdown's grace period interrupts step code that
is already running. Journal writes are never interrupted, so a stop cannot leave the drive
unsure whether its last write landed.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar


class StopReason(StrEnum):
    """Why the worker asked a drive to stop."""

    CANCEL = "cancel"  # a person asked: finish the run as cancelled
    SHUTDOWN = "shutdown"  # the worker is stopping: let running steps end, then hand it back
    LEASE_LOST = "lease_lost"  # another worker owns the run now: write nothing more
    TIMEOUT = "timeout"  # the run's deadline came: fail it with RunTimeout


class DriveOutcome(StrEnum):
    """How one drive of a run ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARKED = "parked"
    HANDED_BACK = "handed_back"  # stopped for a shutdown; queued again for any worker
    STOPPED = "stopped"  # stopped without writing (a step could not be stopped in time)
    LEASE_LOST = "lease_lost"
    ABORTED = "aborted"  # a storage failure; the drive may be tried again
    NOOP = "noop"  # the run had already finished


class Stopped(BaseException):
    """Raised inside a drive at a step boundary or a wait once a stop was requested; user
    code catching ``Exception`` cannot swallow it."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"drive stopped: {reason}")
        self.reason = reason


class Control:
    """The worker's handle on one drive (and the drive's own, for its deadline). ``stop``
    may be called at any time, more than once; a lost lease overrides any other reason, a
    cancel a deadline, and a deadline a shutdown. ``cancel_by``: who asked for a cancel,
    where the request named them, for the run's ``run_cancelled``."""

    __slots__ = ("_listener", "cancel_by", "interrupt_steps", "reason")

    # A deadline outranks a shutdown (the run ends rather than being handed on), and a
    # person's cancel outranks a deadline.
    _RANK: ClassVar[dict[StopReason, int]] = {
        StopReason.SHUTDOWN: 0,
        StopReason.TIMEOUT: 1,
        StopReason.CANCEL: 2,
        StopReason.LEASE_LOST: 3,
    }

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self.interrupt_steps = False
        self.cancel_by: str | None = None
        self._listener: Callable[[], None] | None = None

    def stop(
        self, reason: StopReason, *, interrupt_steps: bool | None = None, by: str | None = None
    ) -> None:
        """Ask the drive to stop. Running step code is interrupted for a cancel or a lost
        lease, and for a shutdown only when ``interrupt_steps`` (its grace period is over).
        ``by``: who asked for a cancel, where named (the first name given stays)."""
        if self.reason is None or self._RANK[reason] >= self._RANK[self.reason]:
            self.reason = reason
        if reason is StopReason.CANCEL and self.cancel_by is None:
            self.cancel_by = by
        if interrupt_steps is None:
            interrupt_steps = reason is not StopReason.SHUTDOWN
        self.interrupt_steps = self.interrupt_steps or interrupt_steps
        if self._listener is not None:
            self._listener()

    def listen(self, listener: Callable[[], None] | None) -> None:
        """The drive's hook, called on every stop request."""
        self._listener = listener
        if listener is not None and self.reason is not None:
            listener()
