"""Values of every kind pydantic reads, through a worker killed mid-run
(tests/test_values_crash.py), in worker processes run as ``python tests/support/values_app.py``
(the worker of tests/support/crash_app.py).

Each field of :class:`Everything` is a step returning :data:`VALUES`' value for it under
that field's annotation. The workflow takes typed arguments, calls every step, waits for a
typed signal, writes down what it got (``repr`` and whether it equals what was returned),
one line a drive, then blocks in a last step until the test opens its gate: the test
kills the worker there, and the re-drive that replays every value writes its own line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import os
import typing
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import crash_app
from crash_app import gate, record
from pydantic import BaseModel, ConfigDict
from typing_extensions import TypedDict  # what pydantic reads on Python < 3.12

import ratchet


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Parcel:
    sent: dt.datetime
    weight: decimal.Decimal
    label: bytes


class Address(TypedDict):
    city: str
    since: dt.date


class Point(NamedTuple):
    x: int
    at: dt.time


class Order(BaseModel):
    # A model's bytes (its dataclasses' too) follow its own configuration: base64 here.
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    id: uuid.UUID
    color: Color
    parcels: list[Parcel]
    wait: dt.timedelta


class Stamp(BaseModel, strict=True):  # strict: in Python mode a string is no datetime
    at: dt.datetime
    color: Color


class Everything(TypedDict):
    moment: dt.datetime
    day: dt.date
    clock: dt.time
    span: dt.timedelta
    uid: uuid.UUID
    amount: decimal.Decimal
    color: Color
    blob: bytes
    parcel: Parcel
    address: Address
    point: Point
    order: Order
    stamp: Stamp
    nested: dict[str, list[Parcel | None]]


WHEN = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
PARCEL = Parcel(WHEN, decimal.Decimal("1.250"), b"\x00\xffbinary\x80")
ORDER = Order(
    id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    color=Color.BLUE,
    parcels=[PARCEL],
    wait=dt.timedelta(days=1, microseconds=7),
)
VALUES: dict[str, Any] = {
    "moment": WHEN,
    "day": dt.date(2024, 2, 29),
    "clock": dt.time(23, 59, 58, 999999),
    "span": dt.timedelta(hours=36, seconds=1, microseconds=5),
    "uid": uuid.UUID("87654321-4321-8765-4321-876543218765"),
    "amount": decimal.Decimal("12345678901234567890.000001"),
    "color": Color.RED,
    "blob": bytes(range(256)),
    "parcel": PARCEL,
    "address": {"city": "Lisbon", "since": dt.date(2020, 1, 1)},
    "point": Point(3, dt.time(1, 2, 3)),
    "order": ORDER,
    "stamp": Stamp(at=WHEN, color=Color.BLUE),
    "nested": {"a": [PARCEL, None], "b": []},
}
# The arguments the runs start with, and the signal the test sends.
ARGS = (PARCEL, WHEN)
SIGNAL = ORDER


def seen_log(invocation_log: Path | str) -> Path:
    """Where the workflow writes what each drive got (beside the invocation log)."""
    return Path(invocation_log).with_suffix(".seen.jsonl")


def _note(values: dict[str, Any], expected: dict[str, Any]) -> None:
    line = json.dumps(
        {
            "pid": os.getpid(),
            "seen": {k: {"repr": repr(v), "equal": v == expected[k]} for k, v in values.items()},
        }
    )
    with seen_log(os.environ["CRASH_LOG"]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _returning(name: str, annotation: Any, value: Any) -> Callable[[], Any]:
    """A step function named ``name`` returning ``value`` under ``annotation``."""

    async def step() -> Any:
        record("invoke")
        return value

    step.__name__ = step.__qualname__ = name
    step.__annotations__ = {"return": annotation}
    return step


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """The app: a step per field of :class:`Everything`, and the workflow ``kinds``."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)
    steps = {
        name: app.step(_returning(name, annotation, VALUES[name]))
        for name, annotation in typing.get_type_hints(Everything).items()
    }

    @app.step
    async def hold() -> None:
        record("invoke")
        await gate("hold")

    @app.workflow()
    async def kinds(parcel: Parcel, when: dt.datetime) -> Everything:
        got: dict[str, Any] = {name: await step() for name, step in steps.items()}
        order = await ratchet.wait_for_signal("order", type=Order)
        _note(
            {**got, "arg:parcel": parcel, "arg:when": when, "signal": order},
            {**VALUES, "arg:parcel": ARGS[0], "arg:when": ARGS[1], "signal": SIGNAL},
        )
        await hold()
        return typing.cast(Everything, got)

    return app


if __name__ == "__main__":
    crash_app.main(build)
