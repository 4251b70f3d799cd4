"""The store as one drive sees it.

Every call a drive makes goes through here, for two reasons:
* a storage failure (the database restarted, a connection cut) abandons the drive with
  :class:`DriveAborted` rather than surfacing in the workflow as the error of whichever step
  was writing, which would fail the run; the worker then drives the run again; a write the
  database refuses for good raises :class:`DriveRefused`, and the run fails with it;
* a write is never interrupted half-way: if the task awaiting it is cancelled (a step under
  ``asyncio.wait_for``, a cancel request), the write still completes, and the cancellation
  is delivered after it (the store's answers are firm futures, see
  :func:`ratchet.store.base.settled`), so the drive always knows whether its events landed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from ratchet.errors import DriveAborted, DriveRefused, StorageError, StoreConflict, ValueRefused
from ratchet.model import Approval, DeliveryReceipt, Event, Lease, NewRun, RunRecord, RunStatus
from ratchet.store.base import Store

T = TypeVar("T")


class DriveStore:
    """The store calls a drive makes, guarded (see the module docstring). ``on_call`` and
    ``on_return`` let the drive count the calls in flight, so it can tell a branch that is
    waiting on the database from one that waits for the outside world."""

    __slots__ = ("_on_call", "_on_return", "_run_id", "raw")

    def __init__(
        self, store: Store, run_id: str, on_call: Callable[[], None], on_return: Callable[[], None]
    ) -> None:
        self.raw = store
        self._run_id = run_id
        self._on_call = on_call
        self._on_return = on_return

    async def _guard(self, aw: Awaitable[T]) -> T:
        self._on_call()
        try:
            return await aw
        except StorageError as e:
            raise DriveAborted(f"run {self._run_id}: {e}") from e
        except (StoreConflict, ValueRefused) as e:
            raise DriveRefused(f"{type(e).__name__}: {e}") from e
        finally:
            self._on_return()

    @contextlib.contextmanager
    def watching(self, channel: str, key: str = "") -> Iterator[asyncio.Event]:
        with self.raw.watching(channel, key) as event:
            yield event

    # -- reads -----------------------------------------------------------------------------

    async def now(self) -> float:
        return await self._guard(self.raw.now())

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._guard(self.raw.get_run(run_id))

    async def finished_among(self, run_ids: Sequence[str]) -> list[str]:
        return await self._guard(self.raw.finished_among(run_ids))

    async def pending_signal(self, run_id: str, name: str) -> tuple[int, Any] | None:
        return await self._guard(self.raw.pending_signal(run_id, name))

    async def load_requests(self, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        return await self._guard(self.raw.load_requests(run_id))

    async def get_approval(self, run_id: str, step_id: str) -> Approval | None:
        return await self._guard(self.raw.get_approval(run_id, step_id))

    # The guards' reads of the workflow's history: a connection cut there abandons the
    # drive too, rather than failing the run whose step was retrying.
    async def recent_retries(self, workflow: str, window_s: float) -> int:
        return await self._guard(self.raw.recent_retries(workflow, window_s))

    async def llm_history(
        self, workflow: str, limit: int
    ) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        return await self._guard(self.raw.llm_history(workflow, limit))

    # -- the holder's writes ---------------------------------------------------------------

    async def ask_approval(
        self,
        lease: Lease,
        events: Sequence[Event],
        step_id: str,
        attempt: int,
        name: str,
        data: Any,
        deadline: float | None,
    ) -> None:
        await self._guard(
            self.raw.ask_approval(lease, events, step_id, attempt, name, data, deadline)
        )

    async def expire_approval(self, lease: Lease, step_id: str, attempt: int) -> Approval:
        return await self._guard(self.raw.expire_approval(lease, step_id, attempt))

    async def append(self, lease: Lease, events: Sequence[Event]) -> None:
        await self._guard(self.raw.append(lease, events))

    async def start_child(self, lease: Lease, events: Sequence[Event], child: NewRun) -> RunRecord:
        return await self._guard(self.raw.start_child(lease, events, child))

    async def consume_signal(self, lease: Lease, events: Sequence[Event], signal_id: int) -> None:
        await self._guard(self.raw.consume_signal(lease, events, signal_id))

    async def park(
        self, lease: Lease, events: Sequence[Event], waits: Sequence[str], not_before: float | None
    ) -> tuple[str, list[str]]:
        return await self._guard(self.raw.park(lease, events, waits, not_before))

    async def hand_back(self, lease: Lease, events: Sequence[Event]) -> None:
        await self._guard(self.raw.hand_back(lease, events))

    async def finish(
        self,
        lease: Lease,
        events: Sequence[Event],
        status: RunStatus,
        output: Any = None,
        error: str | None = None,
        dead_letter: str | None = None,
        receipt: dict[str, Any] | None = None,
    ) -> None:
        await self._guard(
            self.raw.finish(lease, events, status, output, error, dead_letter, receipt)
        )

    # -- receipts (deliveries inside a step) ------------------------------------------------

    async def claim_receipt(
        self, lease: Lease, key: str, step_id: str, *, delivery: str, attempt: int
    ) -> DeliveryReceipt | None:
        return await self._guard(
            self.raw.claim_receipt(lease, key, step_id, delivery=delivery, attempt=attempt)
        )

    async def reclaim_receipt(self, lease: Lease, key: str) -> None:
        await self._guard(self.raw.reclaim_receipt(lease, key))

    async def settle_receipt(self, lease: Lease, key: str, response: Any) -> None:
        await self._guard(self.raw.settle_receipt(lease, key, response))
