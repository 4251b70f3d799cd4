"""Prometheus metrics of one server process, in a registry of its own (so several servers
in one test process do not collide). Queue depth and run counts by status are read from
the database at scrape time; counters and the subscriber gauge live in the process."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from ratchet.model import RunStatus
from ratchet.store import Store


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.runs_started = Counter("ratchet_api_runs_started", "Runs created through the API.",
                                    registry=self.registry)
        self.sse_subscribers = Gauge("ratchet_sse_subscribers", "Open event streams.",
                                     registry=self.registry)
        self.runs = Gauge("ratchet_runs", "Runs in the database by status.", ["status"],
                          registry=self.registry)
        self.queue_depth = Gauge("ratchet_queue_depth", "Runs queued and not yet claimed.",
                                 registry=self.registry)
        self.dead_letters = Gauge("ratchet_dead_letters", "Runs in the dead-letter queue.",
                                  registry=self.registry)

    async def render(self, store: Store) -> tuple[bytes, str]:
        for status in RunStatus:
            self.runs.labels(str(status)).set(await store.count_runs(str(status)))
        self.queue_depth.set(await store.count_runs(str(RunStatus.QUEUED)))
        self.dead_letters.set(await store.count_dead_letters())
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
