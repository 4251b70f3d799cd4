"""Schedules: when a workflow runs by the clock, and which ticks are owed after downtime.

A schedule is a cron expression read in a time zone (``cron="0 * * * *",
tz="Europe/Berlin"``), or a fixed interval (``every="30s"``). Cron expressions are parsed
by ``cronsim``, which follows cron's own rules at daylight saving time changes: a time the
clock skips (02:30 on the spring-forward day in Berlin) fires once, when the clock jumps
past it (03:00); a time the clock shows twice (02:30 on the fall-back day) fires once, at
its first passing; an expression that names every hour (``0 * * * *``) fires on each of
the two passes of the repeated hour, since they are different instants. An interval's
ticks are the multiples of it since the Unix epoch, so every worker computes the same ones.

Each tick is an instant (epoch seconds) and its run's id is derived from the schedule and
the tick (:func:`tick_run_id`): whichever worker starts it first creates the run, the
others find it there.

A tick is *missed* when no worker fired it within :data:`LATE_AFTER_S` of its time (the
fleet was down); ``missed`` says what happens to those: ``"skip"`` drops them,
``"latest"`` (the default) fires the newest one unless a tick on time fires anyway, and
``"all"`` fires them, oldest first, at most :data:`MAX_MISSED` (the newest ones).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ratchet.errors import InvalidInput

MISSED = ("skip", "latest", "all")
# How late a tick may be fired and still be on time, rather than missed: a worker's
# scheduler looks every second or so; past this the fleet was not there to fire it.
LATE_AFTER_S = 10.0
# The most missed ticks ``missed="all"`` fires after downtime (the newest ones).
MAX_MISSED = 100
MAX_SCHEDULE_NAME = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_EVERY = re.compile(r"(?:(\d+)([smhd]))+")
_EVERY_PART = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def check_schedule_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid schedule name {name!r}: use 1-{MAX_SCHEDULE_NAME} characters of "
            "letters, digits and . _ -, starting with a letter or digit"
        )
    return name


def parse_every(every: object) -> int:
    """Seconds in an interval such as ``"30s"``, ``"5m"``, ``"1h30m"``, ``"1d"``."""
    if not isinstance(every, str) or not _EVERY.fullmatch(every):
        raise InvalidInput(
            f"invalid every {every!r}: expected a whole number of s, m, h or d, "
            "such as '30s', '5m', '1h30m'"
        )
    seconds = sum(int(n) * _UNIT_S[u] for n, u in _EVERY_PART.findall(every))
    if seconds < 1:
        raise InvalidInput(f"invalid every {every!r}: the interval must be at least 1s")
    return seconds


def check_tz(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz or "\x00" in tz:
        raise InvalidInput(f"invalid tz {tz!r}: expected an IANA time zone such as 'UTC'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"unknown tz {tz!r}: expected an IANA time zone such as 'Europe/Berlin'"
        ) from None


def check_cron(cron: object) -> str:
    if not isinstance(cron, str) or "\x00" in cron:
        raise InvalidInput(f"invalid cron {cron!r}: expected five fields, '0 * * * *'")
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as e:
        raise InvalidInput(f"invalid cron {cron!r}: {e}") from None
    return cron


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule fires and when; ``every_s`` when it is an interval, ``cron``
    otherwise."""

    name: str
    workflow: str
    cron: str | None
    every_s: int | None
    tz: str
    missed: str

    @classmethod
    def make(
        cls,
        name: object,
        workflow: str,
        *,
        cron: object = None,
        every: object = None,
        tz: object = "UTC",
        missed: object = "latest",
    ) -> ScheduleSpec:
        """Every argument checked: an :class:`InvalidInput` naming the one at fault."""
        check_schedule_name(name)
        if (cron is None) == (every is None):
            raise InvalidInput("a schedule needs exactly one of cron= and every=")
        check_tz(tz)
        if missed not in MISSED:
            raise InvalidInput(f"invalid missed {missed!r}: expected one of {', '.join(MISSED)}")
        return cls(
            str(name),
            workflow,
            check_cron(cron) if cron is not None else None,
            parse_every(every) if every is not None else None,
            str(tz),
            str(missed),
        )

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def every(self) -> str | None:
        """The interval as it is shown: ``"90s"``."""
        return f"{self.every_s}s" if self.every_s is not None else None

    def newest_ticks(self, after: float, now: float, limit: int) -> list[float]:
        """The newest ``limit`` ticks in ``(after, now]``, oldest first."""
        if self.every_s is not None:
            newest = math.floor(now / self.every_s)
            oldest = max(math.floor(after / self.every_s) + 1, newest - limit + 1)
            return [float(k * self.every_s) for k in range(oldest, newest + 1)]
        assert self.cron is not None
        # Ticks are whole seconds: reversed from just past floor(now), cronsim yields the
        # ticks at or before now, newest first.
        start = datetime.fromtimestamp(math.floor(now) + 1, self.zone)
        found: list[float] = []
        for dt in CronSim(self.cron, start, reverse=True):
            t = dt.timestamp()
            if t <= after or len(found) >= limit:
                break
            found.append(t)
        return found[::-1]

    def next_tick(self, now: float) -> float:
        """The first tick after ``now``."""
        if self.every_s is not None:
            return float((math.floor(now / self.every_s) + 1) * self.every_s)
        assert self.cron is not None
        return next(CronSim(self.cron, datetime.fromtimestamp(now, self.zone))).timestamp()

    def due(self, after: float, now: float) -> list[float]:
        """The ticks to fire now, oldest first, when the last one fired was ``after``."""
        ticks = self.newest_ticks(after, now, MAX_MISSED + 64)
        on_time = [t for t in ticks if now - t <= LATE_AFTER_S]
        late = [t for t in ticks if now - t > LATE_AFTER_S]
        if self.missed == "all":
            late = late[-MAX_MISSED:]
        elif self.missed == "latest":
            late = late[-1:] if not on_time else []
        else:
            late = []
        return late + on_time

    def at(self, tick: float) -> datetime:
        """The tick as the workflow receives it: aware, in the schedule's time zone."""
        return datetime.fromtimestamp(tick, self.zone)


def iso_utc(tick: float) -> str:
    return datetime.fromtimestamp(tick, UTC).isoformat().replace("+00:00", "Z")


def tick_run_id(name: str, tick: float) -> str:
    """The run id of ``name``'s tick: the same on every worker, so one run per tick."""
    return f"sched:{name}:{iso_utc(tick)}"


def trigger_run_id(name: str, now: float) -> str:
    """The run id of a trigger (run now, once): apart from every tick's."""
    at = datetime.fromtimestamp(now, UTC)
    return f"sched:{name}:trigger:{at.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"
