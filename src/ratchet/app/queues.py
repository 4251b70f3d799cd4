"""Queues with limits: ``app.queue(...)`` declares them, the store keeps them (so every
worker and API node of the fleet sees the same limits), ``RATCHET_QUEUES`` overrides them
from configuration, and :meth:`Queues.set_queue_limits` changes them at run time."""

from __future__ import annotations

import os
from typing import Any

from ratchet.app.base import AppBase
from ratchet.store.queues import QUEUES_ENV, QueueLimits, QueueView, Rate, check_limits, parse_env


class Queues(AppBase):
    """The queue calls of :class:`ratchet.Ratchet`."""

    def queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        per_key_concurrency: int | None = None,
        rate: Rate | None = None,
        hold_while_parked: bool = False,
    ) -> QueueLimits:
        """Declare the queue ``name`` and its limits, which the database enforces across
        every worker: at most ``concurrency`` of its runs in flight (running; parked ones
        too with ``hold_while_parked``), at most ``per_key_concurrency`` of them per
        ``concurrency_key`` (a start's), and at most ``rate`` first drives per window
        (``ratchet.Rate(50, per_s=60)``). None is no limit. Runs over a limit stay
        queued and are claimed as slots free, in priority then age order.

        Written to the database when the app opens it (at once, if it is open already);
        ``RATCHET_QUEUES`` (JSON: ``{"research": {"concurrency": 5}}``) overrides the
        fields it names, and limits changed through the API since stand over both."""
        declared = check_limits(
            name,
            {
                "concurrency": concurrency,
                "per_key_concurrency": per_key_concurrency,
                "rate": rate,
                "hold_while_parked": hold_while_parked,
            },
        )
        self._queues[name] = declared
        if self._store is not None and not self.read_only:
            self._portal.call(self._store.declare_queues(self._declared_queues()))
        return declared

    def _declared_queues(self) -> list[QueueLimits]:
        """The app's queues with ``RATCHET_QUEUES`` over them (which may name more)."""
        declared = dict(self._queues)
        for name, changes in parse_env(os.environ.get(QUEUES_ENV)).items():
            declared[name] = check_limits(name, changes, declared.get(name))
        return list(declared.values())

    async def queues_async(self) -> list[QueueView]:
        """Every queue the fleet declared: its limits, depth (runs queued) and runs in
        flight."""
        return await (await self._astore()).list_queues()

    def queues(self) -> list[QueueView]:
        """Blocking :meth:`queues_async`."""
        return self._portal.call(self.queues_async())

    async def set_queue_limits_async(self, name: str, **changes: Any) -> QueueLimits:
        """Change a declared queue's limits at run time, for the whole fleet: the fields
        given (``concurrency=5``, ``rate=None``, ...), checked before anything is written.
        They stand over the code's declaration until changed again."""
        return await (await self._astore()).set_queue_limits(name, changes)

    def set_queue_limits(self, name: str, **changes: Any) -> QueueLimits:
        """Blocking :meth:`set_queue_limits_async`."""
        return self._portal.call(self.set_queue_limits_async(name, **changes))
