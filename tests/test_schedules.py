"""Schedules, on SQLite and PostgreSQL: ticks, missed ticks after downtime, daylight saving
time, pause, resume and trigger, and bad specs refused. The scheduler's clock is injected,
so downtime is simulated rather than slept through (worker processes: test_schedules_procs.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import ratchet
from ratchet.engine.scheduler import Scheduler
from ratchet.engine.schedules import MAX_MISSED, ScheduleSpec, tick_run_id
from ratchet.errors import InvalidInput, ScheduleExists, UnknownSchedule

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(make_app: Callable[..., ratchet.Ratchet], **schedule: Any) -> ratchet.Ratchet:
    app = make_app()
    if "cron" not in schedule:
        schedule.setdefault("every", "1m")

    @app.schedule(**schedule)
    @app.workflow()
    async def digest(at: datetime) -> str:
        return at.isoformat()

    return app


def scheduler(app: ratchet.Ratchet, clock: FakeClock) -> Scheduler:
    app.wall_clock = clock
    return Scheduler(app.store, app.workflows, list(app.schedule_specs.values()), now=clock)


def fire(app: ratchet.Ratchet, s: Scheduler) -> float:
    return app.portal.call(s.fire_due())


def run_ids(app: ratchet.Ratchet) -> list[str]:
    return sorted(r.run_id for r in app.runs(limit=1000, workflow="digest"))


def ticks(*times: float) -> list[str]:
    return sorted(tick_run_id("digest", t) for t in times)


def test_one_run_per_tick_however_many_schedulers_look(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = build(make_app)
    clock = FakeClock(T0 + 1)
    schedulers = [scheduler(app, clock) for _ in range(3)]
    app.portal.call(schedulers[0].declare())
    for step in range(1, 4):
        clock.now = T0 + 60 * step + 1
        for s in schedulers:
            fire(app, s)
    assert run_ids(app) == ticks(T0 + 60, T0 + 120, T0 + 180)
    assert sum(s.fired for s in schedulers) == 3
    # The workflow receives the tick's time, a timezone-aware datetime, back from the journal.
    rec = app.runs(workflow="digest", limit=1)[0]
    assert rec.tags == {"ratchet.schedule": "digest"}
    [row] = app.schedules()
    assert row["last_fired"] == datetime.fromtimestamp(T0 + 180, UTC).isoformat()
    assert row["next_tick"] is not None and row["every"] == "60s"


def test_the_workflow_gets_the_tick_as_an_aware_datetime(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = build(make_app, cron="0 * * * *", tz="Europe/Berlin")
    clock = FakeClock(T0 - 1)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    clock.now = T0 + 2
    fire(app, s)
    [run_id] = run_ids(app)
    assert run_id == "sched:digest:2026-06-01T12:00:00Z"
    app.launch(concurrency=1)
    assert app.result(run_id, timeout_s=10) == "2026-06-01T14:00:00+02:00"


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        ("skip", [10]),
        ("latest", [10]),
        ("all", list(range(1, 11))),
    ],
)
def test_missed_ticks_after_downtime(
    make_app: Callable[..., ratchet.Ratchet], missed: str, expected: list[int]
) -> None:
    """Down from just after T0 to just after the 10th minute's tick: ticks 1-9 were missed,
    tick 10 is on time."""
    app = build(make_app, missed=missed)
    clock = FakeClock(T0 + 1)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    clock.now = T0 + 9 * 60 + 30  # nobody there: ticks 1..9 pass unfired
    clock.now = T0 + 10 * 60 + 2
    fire(app, s)
    # "latest" adds nothing to a tick on time: see the next test for when it does.
    assert run_ids(app) == ticks(*(T0 + 60 * k for k in expected))


def test_latest_fires_the_newest_missed_tick_when_none_is_on_time(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = build(make_app)  # missed="latest", the default
    clock = FakeClock(T0 + 1)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    clock.now = T0 + 10 * 60 + 30  # tick 10 is 30 s late: missed too
    fire(app, s)
    assert run_ids(app) == ticks(T0 + 600)
    clock.now = T0 + 10 * 60 + 40
    fire(app, s)  # nothing more is owed
    assert run_ids(app) == ticks(T0 + 600)


def test_all_is_bounded(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = build(make_app, every="1s", missed="all")
    clock = FakeClock(T0)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    clock.now = T0 + 10_000.5  # 10 000 ticks: the newest ones fire, at most MAX_MISSED late
    fire(app, s)
    got = run_ids(app)
    assert len(got) == MAX_MISSED + 10  # 10 on time (within LATE_AFTER_S), 100 missed
    assert got[-1] == tick_run_id("digest", T0 + 10_000)


def test_pause_resume_and_trigger(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = build(make_app)
    clock = FakeClock(T0 + 1)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    app.pause_schedule("digest")
    assert app.schedules()[0]["paused"] is True
    assert app.schedules()[0]["next_tick"] is None
    clock.now = T0 + 60 + 1
    fire(app, s)
    assert run_ids(app) == []
    # A trigger runs now, once, paused or not, under an id apart from every tick's.
    run_id = app.trigger_schedule("digest")
    assert run_id.startswith("sched:digest:trigger:")
    assert run_ids(app) == [run_id]
    app.resume_schedule("digest")  # owes nothing of what passed while paused
    clock.now = T0 + 120 + 1
    fire(app, s)
    assert run_ids(app) == sorted([run_id, tick_run_id("digest", T0 + 120)])
    with pytest.raises(UnknownSchedule, match="unknown schedule 'nope'"):
        app.pause_schedule("nope")


def test_dst_in_berlin(make_app: Callable[..., ratchet.Ratchet]) -> None:
    """'30 2 * * *' on the spring-forward day (no 02:30) fires at 03:00, when the clock
    jumps past it; on the fall-back day (02:30 twice) it fires once."""
    spec = ScheduleSpec.make("d", "digest", cron="30 2 * * *", tz="Europe/Berlin")
    spring = datetime(2026, 3, 28, 12, tzinfo=BERLIN).timestamp()
    got = [spec.at(t) for t in spec.newest_ticks(spring, spring + 3 * 86400, 10)]
    assert [d.isoformat() for d in got] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    fall = datetime(2026, 10, 24, 12, tzinfo=BERLIN).timestamp()
    got = [spec.at(t) for t in spec.newest_ticks(fall, fall + 2 * 86400, 10)]
    assert [d.isoformat() for d in got] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    # An hourly schedule fires on both passes of the repeated hour: two instants.
    hourly = ScheduleSpec.make("h", "digest", cron="0 * * * *", tz="Europe/Berlin")
    start = datetime(2026, 10, 25, 0, 30, tzinfo=BERLIN).timestamp()
    shown = [hourly.at(t).isoformat() for t in hourly.newest_ticks(start, start + 4 * 3600, 10)]
    assert shown == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    # Through the scheduler: the spring day's 03:00 run, under its UTC tick id.
    app = build(make_app, cron="30 2 * * *", tz="Europe/Berlin")
    clock = FakeClock(spring)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    clock.now = datetime(2026, 3, 29, 3, 0, 1, tzinfo=BERLIN).timestamp()
    fire(app, s)
    assert run_ids(app) == ["sched:digest:2026-03-29T01:00:00Z"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron '61 \\* \\* \\* \\*': Bad minute"),
        ({"cron": "* * *"}, "invalid cron .*Wrong number of fields"),
        ({"every": "30"}, "invalid every '30'"),
        ({"every": "0s"}, "at least 1s"),
        ({"every": "1m", "tz": "Mars/Olympus"}, "unknown tz 'Mars/Olympus'"),
        ({"every": "1m", "missed": "some"}, "invalid missed 'some'"),
        ({"every": "1m", "cron": "* * * * *"}, "exactly one of cron= and every="),
        ({}, "exactly one of cron= and every="),
    ],
)
def test_bad_specs_are_refused_naming_the_problem_and_write_nothing(
    make_app: Callable[..., ratchet.Ratchet], options: dict[str, Any], message: str
) -> None:
    app = build(make_app)
    with pytest.raises(InvalidInput, match=message):
        app.add_schedule("other", "digest", **options)
    with pytest.raises(InvalidInput, match=message):
        app.schedule(**options)(app.workflows["digest"])
    assert [r["name"] for r in app.schedules()] == ["digest"]


def test_a_workflow_without_at_cannot_be_scheduled(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def plain(n: int) -> None: ...

    with pytest.raises(InvalidInput, match="needs a parameter `at: datetime`"):
        app.schedule(every="1m")(plain)
    with pytest.raises(InvalidInput, match="unknown workflow 'ghost'"):
        app.add_schedule("g", "ghost", every="1m")

    @app.workflow()
    async def counted(at: int) -> None: ...

    with pytest.raises(InvalidInput, match="its `at` must take a datetime"):
        app.schedule(every="1m")(counted)


def test_schedules_added_at_run_time_persist_and_fire(
    db_url: str, make_app: Callable[..., ratchet.Ratchet]
) -> None:
    app = build(make_app)
    added = app.add_schedule("fast", "digest", every="30s", missed="all")
    assert added["source"] == "api" and added["every"] == "30s"
    with pytest.raises(ScheduleExists):
        app.add_schedule("fast", "digest", every="30s")
    changed = app.change_schedule("fast", cron="*/5 * * * *", tz="Europe/Berlin")
    assert (changed["cron"], changed["every"]) == ("*/5 * * * *", None)
    assert changed["tz"] == "Europe/Berlin"
    for bad, words in [({"tz": "Moon/Base"}, "unknown tz"), ({"every": "1w"}, "invalid every")]:
        with pytest.raises(InvalidInput, match=words):
            app.change_schedule("fast", **bad)
    with pytest.raises(InvalidInput, match="unknown schedule field 'queue'"):
        app.change_schedule("fast", queue="q")
    assert app.schedules()[1] == changed  # nothing written
    app.shutdown()
    # Another app on the same database (a restart) finds it and fires it.
    again = build(make_app)
    rows = again.schedules()
    assert [(r["name"], r["source"], r["missed"]) for r in rows] == [
        ("digest", "code", "latest"),
        ("fast", "api", "all"),
    ]
    clock = FakeClock(time.time() + 601)  # two of its */5 ticks at least since it was added
    fire(again, scheduler(again, clock))
    assert len([r for r in again.runs(limit=100) if r.run_id.startswith("sched:fast:")]) >= 2
    again.delete_schedule("fast")
    assert [r["name"] for r in again.schedules()] == ["digest"]
    with pytest.raises(UnknownSchedule):
        again.delete_schedule("fast")


def test_the_schedules_command(db_url: str) -> None:
    from typer.testing import CliRunner

    from ratchet.cli import cli

    def ratchet_(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--db", db_url, "schedules", *args])

    out = ratchet_("--app", "schedule_app:app")
    assert out.exit_code == 0, out.output
    assert "tick" in out.output and "every 1s" in out.output
    assert ratchet_("pause", "tick").output.strip() == "schedule tick is paused"
    out = ratchet_("--json")
    assert '"paused": true' in out.output and '"next_tick": null' in out.output
    out = ratchet_("trigger", "tick", "--app", "schedule_app:app")
    assert out.exit_code == 0 and out.output.startswith("sched:tick:trigger:"), out.output
    assert ratchet_("resume", "tick").exit_code == 0
    out = ratchet_("pause", "nope")
    assert out.exit_code == 2 and "unknown schedule 'nope'" in out.output


def test_a_tick_started_by_a_worker_that_died_before_noting_it_is_neither_lost_nor_doubled(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    """A worker killed between creating a tick's run and noting the tick fired: the run is
    there, the schedule's last fired tick is the one before. The next pass finds the run
    (no second one), notes the tick, and goes on to the next."""
    from ratchet.engine.scheduler import scheduled_run, start_scheduled

    app = build(make_app)
    clock = FakeClock(T0 + 1)
    s = scheduler(app, clock)
    app.portal.call(s.declare())
    spec = app.schedule_specs["digest"]
    tick = T0 + 60
    new = scheduled_run(app.workflows["digest"], spec, tick_run_id("digest", tick), tick, "default")
    app.portal.call(start_scheduled(app.store, "default", new))  # ...and the worker died
    assert app.schedules()[0]["last_fired"] is None
    clock.now = T0 + 60 + 2
    fire(app, s)
    assert s.fired == 0  # found, not created again
    assert run_ids(app) == ticks(T0 + 60)
    assert app.schedules()[0]["last_fired"] == datetime.fromtimestamp(tick, UTC).isoformat()
    clock.now = T0 + 120 + 1
    fire(app, s)
    assert run_ids(app) == ticks(T0 + 60, T0 + 120)
