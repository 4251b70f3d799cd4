"""Prometheus metrics of one server process, in a registry of its own (so several servers
in one test process do not collide). Queue depth and run counts by status are read from
the database at scrape time; counters and the subscriber gauge live in the process."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from ratchet.engine.stats import STATS, STEP_BUCKETS, EngineStats
from ratchet.model import RunStatus
from ratchet.store import Store


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.runs_started = Counter(
            "ratchet_api_runs_started", "Runs created through the API.", registry=self.registry
        )
        self.sse_subscribers = Gauge(
            "ratchet_sse_subscribers", "Open event streams.", registry=self.registry
        )
        self.runs = Gauge(
            "ratchet_runs", "Runs in the database by status.", ["status"], registry=self.registry
        )
        self.queue_depth = Gauge(
            "ratchet_queue_depth", "Runs queued and not yet claimed.", registry=self.registry
        )
        self.dead_letters = Gauge(
            "ratchet_dead_letters", "Runs in the dead-letter queue.", registry=self.registry
        )
        self.registry.register(EngineCollector(STATS))

    async def render(self, store: Store) -> tuple[bytes, str]:
        for status in RunStatus:
            self.runs.labels(str(status)).set(await store.count_runs(str(status)))
        self.queue_depth.set(await store.count_runs(str(RunStatus.QUEUED)))
        self.dead_letters.set(await store.count_dead_letters())
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class EngineCollector(Collector):
    """This process's engine counters (:data:`ratchet.engine.stats.STATS`), read at scrape."""

    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        claimed = CounterMetricFamily(
            "ratchet_runs_claimed", "Runs this process's workers claimed from the queue."
        )
        claimed.add_metric([], s.runs_claimed)
        finished = CounterMetricFamily(
            "ratchet_runs_finished",
            "Runs this process's workers finished, by status.",
            labels=["status"],
        )
        for status, n in sorted(s.runs_finished.items()):
            finished.add_metric([status], n)
        steals = CounterMetricFamily(
            "ratchet_sweep_lease_steals",
            "Orphaned runs (lease expired or missing) the recovery sweep found and took over.",
        )
        steals.add_metric([], s.lease_steals)
        reclaimed = CounterMetricFamily(
            "ratchet_runs_reclaimed",
            "A restarted worker's own runs, taken back without waiting for the lease.",
        )
        reclaimed.add_metric([], s.runs_reclaimed)
        steps = HistogramMetricFamily(
            "ratchet_step_duration_seconds",
            "Step code run time (replayed steps excluded), by outcome.",
            labels=["outcome"],
        )
        for outcome, h in sorted(s.step_seconds.items()):
            bounds = [*(str(b) for b in STEP_BUCKETS), "+Inf"]
            cumulative = list(itertools.accumulate(h.buckets))
            steps.add_metric([outcome], list(zip(bounds, cumulative, strict=True)), h.total)
        anomalies = CounterMetricFamily(
            "ratchet_anomalies",
            "Anomalies this process's workers journaled (each once per occurrence), by kind.",
            labels=["kind"],
        )
        for kind, n in sorted(s.anomalies.items()):
            anomalies.add_metric([kind], n)
        yield from (claimed, finished, steals, reclaimed, steps, anomalies)
