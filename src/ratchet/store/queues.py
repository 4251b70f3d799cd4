"""Queues with limits the database enforces across every worker.

A queue's limits live in the ``queues`` table (migration 021/022), so every worker and API
node of the fleet reads the same ones: ``concurrency`` (runs in flight: running, and parked
too with ``hold_while_parked``), ``per_key_concurrency`` (runs in flight sharing a run's
``concurrency_key``) and a rate (first drives per window of ``per_s`` seconds). A claim
of a limited queue locks its row (PostgreSQL: FOR UPDATE; SQLite serialises writers
anyway), counts what is in flight and picks within the room left, in one transaction:
two claimers of a queue take turns, so no process's counter is ever trusted. Queues
without limits are claimed as before, by the claim statement alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ratchet.errors import InvalidInput, UnknownQueue
from ratchet.model import ClaimedRun
from ratchet.names import MAX_QUEUE, check_length
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.transaction import Tx

__all__ = [
    "QUEUES_ENV",
    "QueueLimits",
    "QueueView",
    "Rate",
    "check_limits",
    "declare",
    "limited_in",
    "list_queues",
    "mark_started",
    "parse_env",
    "pick_limited",
    "set_limits",
]

QUEUES_ENV = "RATCHET_QUEUES"
_FIELDS = ("concurrency", "per_key_concurrency", "rate", "hold_while_parked")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` first drives of a queue's runs per window of ``per_s`` seconds:
    ``ratchet.Rate(50, per_s=60)``."""

    limit: int
    per_s: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise InvalidInput(f"invalid rate limit {self.limit!r}: expected an integer >= 1")
        per_s = self.per_s
        if (
            isinstance(per_s, bool)
            or not isinstance(per_s, int | float)
            or not math.isfinite(per_s)
            or per_s <= 0
        ):
            raise InvalidInput(f"invalid rate window per_s={per_s!r}: expected seconds > 0")


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits; None is no limit."""

    name: str
    concurrency: int | None = None
    per_key_concurrency: int | None = None
    rate: Rate | None = None
    hold_while_parked: bool = False

    @property
    def limited(self) -> bool:
        return (
            self.concurrency is not None
            or self.per_key_concurrency is not None
            or self.rate is not None
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "per_key_concurrency": self.per_key_concurrency,
            "rate": None
            if self.rate is None
            else {"limit": self.rate.limit, "per_s": self.rate.per_s},
            "hold_while_parked": self.hold_while_parked,
        }


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue as ``GET /v1/queues`` and ``ratchet queues`` show it."""

    limits: QueueLimits
    depth: int  # runs queued
    in_flight: int  # runs running (and parked, with hold_while_parked)
    set_by: str  # "code" or "api"

    def as_dict(self) -> dict[str, Any]:
        return self.limits.as_dict() | {
            "depth": self.depth,
            "in_flight": self.in_flight,
            "set_by": self.set_by,
        }


def _count(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"invalid {field} {value!r}: expected an integer >= 1 or null")
    return value


def check_limits(
    name: Any, changes: Mapping[str, Any], base: QueueLimits | None = None
) -> QueueLimits:
    """``base`` (or no limits) with ``changes`` applied, every field checked; an unknown
    field or a bad value raises :class:`InvalidInput` naming it. ``rate`` is a
    :class:`Rate`, ``{"limit": K, "per_s": S}`` or None."""
    if not isinstance(name, str):
        raise InvalidInput(f"invalid queue name {name!r}: expected a string")
    if not name or "\x00" in name:
        raise InvalidInput(f"invalid queue name {name!r}: expected a non-empty string, no NUL")
    check_length(name, "queue", MAX_QUEUE)
    unknown = sorted(set(changes) - set(_FIELDS))
    if unknown:
        raise InvalidInput(
            f"unknown queue field {unknown[0]!r}: expected one of {', '.join(_FIELDS)}"
        )
    limits = base if base is not None else QueueLimits(name)
    fields: dict[str, Any] = {}
    if "concurrency" in changes:
        fields["concurrency"] = _count(changes["concurrency"], "concurrency")
    if "per_key_concurrency" in changes:
        fields["per_key_concurrency"] = _count(
            changes["per_key_concurrency"], "per_key_concurrency"
        )
    if "rate" in changes:
        rate = changes["rate"]
        if isinstance(rate, Mapping):
            extra = sorted(set(rate) - {"limit", "per_s"})
            if extra or "limit" not in rate:
                raise InvalidInput(
                    f'invalid rate {dict(rate)!r}: expected {{"limit": K, "per_s": S}}'
                )
            rate = Rate(rate["limit"], rate.get("per_s", 1.0))
        elif rate is not None and not isinstance(rate, Rate):
            raise InvalidInput(f"invalid rate {rate!r}: expected ratchet.Rate(limit, per_s=S)")
        fields["rate"] = rate
    if "hold_while_parked" in changes:
        hold = changes["hold_while_parked"]
        if not isinstance(hold, bool):
            raise InvalidInput(f"invalid hold_while_parked {hold!r}: expected true or false")
        fields["hold_while_parked"] = hold
    return replace(limits, name=name, **fields)


def parse_env(text: str | None) -> dict[str, dict[str, Any]]:
    """``RATCHET_QUEUES``: a JSON object of queue name to the fields it overrides
    (``{"research": {"concurrency": 5, "rate": {"limit": 10, "per_s": 60}}}``)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InvalidInput(f"{QUEUES_ENV} is not JSON: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InvalidInput(
            f"{QUEUES_ENV} must be a JSON object of queue names to objects of limits"
        )
    for name, changes in data.items():
        check_limits(name, changes)
    return data


def _params(q: QueueLimits, set_by: str) -> dict[str, Any]:
    return {
        "name": q.name,
        "concurrency": q.concurrency,
        "per_key_concurrency": q.per_key_concurrency,
        "rate_limit": None if q.rate is None else q.rate.limit,
        "rate_per_s": None if q.rate is None else float(q.rate.per_s),
        "hold_while_parked": q.hold_while_parked,
        "set_by": set_by,
    }


def _limits(row: Any) -> QueueLimits:
    rate = None if row["rate_limit"] is None else Rate(row["rate_limit"], row["rate_per_s"])
    return QueueLimits(
        row["name"],
        row["concurrency"],
        row["per_key_concurrency"],
        rate,
        bool(row["hold_while_parked"]),
    )


async def declare(d: Dialect, queues: Iterable[QueueLimits]) -> None:
    """Write the queues an app declares (with its configuration over them); a queue whose
    limits were last changed through the API keeps them."""
    # In name order, as claims lock queue rows: a worker starting beside claiming workers
    # never waits on them in the opposite order (a deadlock).
    rows = [_params(q, "code") for q in sorted(queues, key=lambda q: q.name)]
    if rows:
        await d._run(lambda tx: tx.send_many("queue_declare", rows))


async def set_limits(d: Dialect, name: str, changes: Mapping[str, Any]) -> QueueLimits:
    """Change a known queue's limits at run time (``PATCH /v1/queues/{name}``): the fields
    in ``changes``, checked before anything is written. Raises :class:`NotFound` for a
    queue nobody declared."""
    check_limits(name, changes)  # the shape, before the row is read
    if not changes:
        raise InvalidInput(
            f"nothing to change for queue {name!r}: give one of {', '.join(_FIELDS)}"
        )

    def body(tx: Tx) -> QueueLimits:
        row = tx.one("queue_lock", {"name": name})
        if row is None:
            raise UnknownQueue(f"unknown queue {name!r}: declare it with app.queue({name!r}, ...)")
        q = check_limits(name, changes, _limits(row))
        tx.send("queue_set", _params(q, "api"))
        return q

    return await d._run(body)


async def list_queues(d: Dialect) -> list[QueueView]:
    """Every declared queue, by name, with its depth and runs in flight."""

    def body(tx: Tx) -> list[QueueView]:
        return [
            QueueView(_limits(r), int(r["depth"]), int(r["in_flight"]), r["set_by"])
            for r in tx.all("queues_list", {})
        ]

    return await d._read(body)


def limited_in(d: Dialect, tx: Tx, names: Sequence[str]) -> list[str]:
    """Within ``tx``: which of ``names`` have limits."""
    return [r["name"] for r in tx.all("queues_limited", {"queues": d._ids(list(names))})]


def slot_freed(d: Dialect, tx: Tx, queue: str) -> None:
    """Within the transaction that ends or parks a run of ``queue``: if the queue has
    limits, a run held back by them may be claimable now, so wake the workers at once
    rather than at their next poll (a second on PostgreSQL). A read of the queues table,
    never a lock on its row: claims lock the queue's row before runs rows, this
    transaction holds a runs row already."""
    if limited_in(d, tx, [queue]):
        d._announce(tx, READY)


def _in_flight(q: QueueLimits) -> list[str]:
    return ["running", "waiting"] if q.hold_while_parked else ["running"]


def pick_limited(
    d: Dialect,
    tx: Tx,
    names: Sequence[str],
    limit: int,
    served: Collection[tuple[str, str]],
) -> list[Any]:
    """Within ``tx``: lock each limited queue of ``names`` (in name order, so claimers
    never deadlock) and pick its ready runs within its limits, up to ``limit`` in all;
    rows of (run_id, priority, created_at). The caller takes them in this transaction and
    marks their first drive (:func:`mark_started`)."""
    picked: list[Any] = []
    for name in sorted(set(names)):
        if len(picked) >= limit:
            break
        row = tx.one("queue_lock", {"name": name})
        if row is None:
            continue
        q = _limits(row)
        statuses = d._ids(_in_flight(q))
        use = tx.one(
            "queue_usage",
            {
                "queue": name,
                "statuses": statuses,
                "per_s": 0.0 if q.rate is None else float(q.rate.per_s),
            },
        )
        room = limit - len(picked)  # what the other queues left of this claim
        if q.concurrency is not None:
            room = min(room, q.concurrency - int(use["in_flight"]))
        fresh = room  # first drives allowed
        if q.rate is not None:
            fresh = min(room, q.rate.limit - int(use["started"]))
        if room <= 0:
            continue
        rows = tx.all(
            "queue_pick",
            {
                "queue": name,
                "statuses": statuses,
                "per_key": q.per_key_concurrency,
                "fresh": fresh > 0,
                "limit": room,
                **d._served(served),
            },
        )
        for r in rows:
            if not r["started"]:
                if fresh <= 0:
                    continue
                fresh -= 1
            picked.append(r)
    if not picked:
        return []
    # Lock the picks still queued (a cancel may have ended one meanwhile), in pick order.
    held = {
        r["run_id"]
        for r in tx.all("queue_lock_runs", {"ids": d._ids([r["run_id"] for r in picked])})
    }
    return [r for r in picked if r["run_id"] in held]


def mark_started(d: Dialect, tx: Tx, taken: Sequence[ClaimedRun]) -> None:
    """Within ``tx``: the runs just taken from limited queues had their first drive now
    (those that had none before); the rate counts these."""
    if taken:
        tx.send("runs_mark_started", {"ids": d._ids([c.record.run_id for c in taken])})
