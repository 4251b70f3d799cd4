"""Faults queued for the next requests: rate limits, server errors, slow answers, dropped
connections. Each queued fault applies to the next ``times`` requests on its endpoint, in
the order the faults were queued."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ratchet.llm.server.script import FaultSpec


@dataclass
class _Armed:
    spec: FaultSpec
    left: int


class FaultQueue:
    """Faults waiting for requests. Thread-safe: tests queue them from their own thread
    while the server answers on its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []

    def add(self, spec: FaultSpec) -> None:
        """Queue ``spec`` behind the faults already queued."""
        with self._lock:
            self._armed.append(_Armed(spec, spec.times))

    def take(self, endpoint: str) -> FaultSpec | None:
        """The first queued fault for ``endpoint``, used once; None when there is none."""
        with self._lock:
            for armed in self._armed:
                if armed.spec.applies_to(endpoint):
                    armed.left -= 1
                    if armed.left == 0:
                        self._armed.remove(armed)
                    return armed.spec
        return None

    def pending(self) -> list[dict[str, Any]]:
        """The faults still queued, each with the times it has left."""
        with self._lock:
            return [{**a.spec.model_dump(), "times": a.left} for a in self._armed]

    def clear(self) -> None:
        """Drop every queued fault."""
        with self._lock:
            self._armed.clear()
