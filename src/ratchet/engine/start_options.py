"""How a start begins, beside what it runs: a dedup id, a debounce, a time to begin at.
Checked here, before anything is written, into the
:class:`~ratchet.model.starts.StartPlan` the store applies (:mod:`ratchet.store.start_options`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ratchet.errors import InvalidInput
from ratchet.model.starts import StartPlan

# A dedup id or a debounce key: any text a caller derives from its own data (an order
# number, a document id), bounded like a run id.
MAX_START_KEY = 200
# A debounce window and a delay longer than this are more likely a unit mistake (ms for s)
# than a plan: a start that far out belongs to a schedule.
MAX_WAIT_S = 366 * 86_400.0


def _refuse(field: str, problem: str) -> InvalidInput:
    e = InvalidInput(f"{field}: {problem}")
    e.field = field
    return e


def _check_key(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_START_KEY:
        raise _refuse(field, f"expected a string of 1 to {MAX_START_KEY} characters, got {value!r}")
    return value


def _check_seconds(value: Any, field: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse(field, f"expected a number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0) or value > MAX_WAIT_S:
        low = "more than 0" if positive else "0 or more"
        raise _refuse(field, f"expected {low} and at most {MAX_WAIT_S:.0f} seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Debounce:
    """Collapse the starts of ``key`` (per workflow and tenant) made within ``wait_s``
    seconds of each other into one run, which begins ``wait_s`` after the last of them
    with its input."""

    key: str
    wait_s: float

    def __post_init__(self) -> None:
        _check_key(self.key, "debounce.key")
        object.__setattr__(
            self, "wait_s", _check_seconds(self.wait_s, "debounce.wait_s", positive=True)
        )


def start_options(
    *,
    dedup_id: Any = None,
    debounce: Any = None,
    start_at: Any = None,
    delay_s: Any = None,
    run_id: str | None = None,
) -> StartPlan | None:
    """The options of a start, checked (an :class:`InvalidInput` naming the field); None
    when it has none."""
    if dedup_id is None and debounce is None and start_at is None and delay_s is None:
        return None
    if dedup_id is not None:
        _check_key(dedup_id, "dedup_id")
    if debounce is not None:
        if not isinstance(debounce, Debounce):
            raise _refuse("debounce", f"expected a ratchet.Debounce, got {debounce!r}")
        for other, given in (
            ("dedup_id", dedup_id),
            ("start_at", start_at),
            ("delay_s", delay_s),
            ("run_id", run_id),
        ):
            if given is not None:
                raise _refuse(
                    "debounce",
                    f"a debounced start takes no {other}: the debounce names its run and "
                    "when it begins",
                )
    if start_at is not None and delay_s is not None:
        raise _refuse("start_at", "give start_at or delay_s, not both")
    at = None
    if start_at is not None:
        if not isinstance(start_at, datetime):
            raise _refuse("start_at", f"expected a datetime, got {start_at!r}")
        if start_at.tzinfo is None or start_at.utcoffset() is None:
            raise _refuse(
                "start_at",
                f"{start_at.isoformat()} has no time zone: give an aware datetime "
                "(datetime.now(timezone.utc), or an ISO-8601 time with an offset or Z)",
            )
        at = start_at.timestamp()
    delay = None if delay_s is None else _check_seconds(delay_s, "delay_s", positive=False)
    return StartPlan(
        dedup_id,
        None if debounce is None else debounce.key,
        None if debounce is None else debounce.wait_s,
        at,
        delay,
    )


def parse_start_at(text: Any) -> datetime:
    """An ISO-8601 time with its offset (the API's ``start_at``, the CLI's ``--start-at``)."""
    if not isinstance(text, str):
        raise _refuse("start_at", f"expected an ISO-8601 time, got {text!r}")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise _refuse(
            "start_at", f"{text!r} is not an ISO-8601 time (2026-05-01T09:30:00+02:00)"
        ) from None
