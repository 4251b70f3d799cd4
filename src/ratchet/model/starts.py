"""How a start begins, beside what it runs, as the store applies it (checked by
:mod:`ratchet.engine.start_options`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StartPlan:
    """A start's dedup id, debounce (its key and window), and when it may begin:
    ``start_at`` (Unix seconds), or ``delay_s`` from the database's clock when it is
    written."""

    dedup_id: str | None = None
    debounce_key: str | None = None
    debounce_wait_s: float | None = None
    start_at: float | None = None
    delay_s: float | None = None

    def not_before(self, now: float) -> float | None:
        """When the run may be claimed, ``now`` being the database's clock; None: at once."""
        if self.debounce_wait_s is not None:
            return now + self.debounce_wait_s
        if self.delay_s is not None:
            return now + self.delay_s
        return self.start_at
