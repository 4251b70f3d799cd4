"""Pacing the cyclic garbage collector's full collections for a worker of many runs.

CPython starts a full (generation 2) collection whenever the objects that survived the
young collections grow by a quarter of the long-lived heap. A worker that claims thousands
of runs at once grows its heap by that much again and again while it takes them on, and
each full collection walks every live object of every run: with 10,000 runs in flight
that was 16 full collections, 9 s of a 30 s profile, with the event loop stopped (leases,
timers and steps all wait). Nearly all of it is live, so they find almost nothing.

While a worker with at least :data:`PACE_FROM` concurrency runs, full collections happen
when its runs have turned over instead: once the runs finished since the last one number
as many as the most runs in flight meanwhile (a finished run's context holds reference
cycles, so its memory waits for a full collection; this bounds that garbage to about the
peak live heap, where CPython's own rule bounds it to a quarter of the heap), and at least
every :data:`FULL_EVERY_S` while
runs finish. Young collections go on as CPython does them. The previous thresholds come
back when the last pacing worker of the process stops.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("ratchet.worker")

PACE_FROM = 1000  # worker concurrency from which full collections are paced
FULL_EVERY_S = 60.0
_NEVER = 2**30  # a generation-2 threshold the count of young collections never reaches

_pacers = 0
_saved: tuple[int, int, int] | None = None


class GcPacer:
    """Full collections of one worker, paced by its runs' turnover."""

    def __init__(self, concurrency: int) -> None:
        self.enabled = concurrency >= PACE_FROM
        self.finished = 0
        self.peak = 0  # the most runs in flight since the last full collection
        self.last_full = time.monotonic()
        self.collections = 0

    def __enter__(self) -> GcPacer:
        global _pacers, _saved
        if self.enabled:
            if _pacers == 0:
                _saved = gc.get_threshold()
                gc.set_threshold(_saved[0], _saved[1], _NEVER)
            _pacers += 1
        return self

    def __exit__(self, *exc: object) -> None:
        global _pacers, _saved
        if self.enabled:
            _pacers -= 1
            if _pacers == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None

    def run_finished(self, in_flight: int) -> None:
        """A run's drive ended; ``in_flight`` drives are still going."""
        if not self.enabled:
            return
        self.finished += 1
        self.peak = max(self.peak, in_flight + 1)
        now = time.monotonic()
        if self.finished >= max(self.peak, PACE_FROM) or now - self.last_full >= FULL_EVERY_S:
            began = time.perf_counter()
            gc.collect()
            self.collections += 1
            log.debug(
                "action=gc_full finished=%s in_flight=%s ms=%.1f",
                self.finished,
                in_flight,
                (time.perf_counter() - began) * 1000,
            )
            self.finished, self.peak, self.last_full = 0, in_flight, now
