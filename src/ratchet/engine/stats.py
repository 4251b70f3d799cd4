"""What this process's workers did, counted in memory for whoever exports metrics (the
server's ``/metrics``). Plain counters and fixed histogram buckets: the engine depends on no
metrics library, and counting costs a few additions per step."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field

# Upper bounds, in seconds, of the step-duration buckets (the last one is +Inf).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram, the Prometheus way: counts per upper bound, sum, count."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        # The first bucket whose upper bound holds the value (bounds are inclusive); past
        # the last bound, the +Inf bucket.
        self.buckets[bisect.bisect_left(STEP_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


class EngineStats:
    """Counters of this process's workers. Thread-safe: ``def`` steps end on threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs_claimed = 0
        self.runs_finished: Counter[str] = Counter()  # by terminal status
        # Orphans the sweep found (running or queued, lease expired or missing) and took
        # over by stealing the lease; it takes every one it finds, up to its free slots.
        self.lease_steals = 0
        self.runs_reclaimed = 0  # a restarted worker's own runs, taken back at once
        self.step_seconds: dict[str, Histogram] = {}  # by outcome: completed, failed
        self.anomalies: Counter[str] = Counter()  # journaled by a guard, by kind

    def claimed(self, n: int) -> None:
        with self._lock:
            self.runs_claimed += n

    def finished(self, status: str) -> None:
        with self._lock:
            self.runs_finished[status] += 1

    def swept(self, found: int) -> None:
        with self._lock:
            self.lease_steals += found

    def reclaimed(self, n: int) -> None:
        with self._lock:
            self.runs_reclaimed += n

    def anomaly(self, kind: str) -> None:
        with self._lock:
            self.anomalies[kind] += 1

    def step(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self.step_seconds.setdefault(outcome, Histogram()).observe(seconds)


STATS = EngineStats()
