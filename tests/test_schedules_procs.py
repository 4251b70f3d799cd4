"""Schedules fired by several worker processes, on SQLite and PostgreSQL: exactly one run
per tick, consecutive ticks, and a worker SIGKILLed loses or doubles none. (Downtime and
the missed policies are in test_schedules.py, with the scheduler's clock injected.)"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import schedule_app
from proc import Harness
from serving import serving
from test_server import Api, engine_id, problem
from waiting import wait_for

from ratchet.engine.schedules import tick_run_id

pytestmark = pytest.mark.crash


@pytest.fixture
def sh(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, app=schedule_app)
    try:
        yield harness
    finally:
        harness.close()


def tick_runs(h: Harness) -> list[str]:
    return sorted(r.run_id for r in h.app.runs(limit=1000, workflow="tick"))


def check_one_run_per_tick(ids: list[str]) -> list[float]:
    """Each run is a tick's (its id derived from it), and the ticks are consecutive seconds."""
    ticks = [datetime.fromisoformat(i.removeprefix("sched:tick:")).timestamp() for i in ids]
    assert ids == [tick_run_id("tick", t) for t in ticks]  # nothing but ticks, no double
    assert ticks == [ticks[0] + k for k in range(len(ticks))], f"gaps in {ids}"
    return ticks


def test_three_workers_fire_each_tick_once_and_a_killed_one_loses_none(sh: Harness) -> None:
    h = sh
    workers = [h.spawn(f"w{i}") for i in range(3)]
    for w in workers:
        w.wait_started()
    wait_for(lambda: len(tick_runs(h)) >= 3, timeout=20, what="three ticks")
    workers[0].kill()
    before = len(tick_runs(h))
    wait_for(lambda: len(tick_runs(h)) >= before + 3, timeout=20, what="ticks after the kill")
    for w in workers[1:]:
        w.terminate()
        w.wait_exit()
    ids = tick_runs(h)
    ticks = check_one_run_per_tick(ids)
    assert len(ticks) >= 6
    # Every run was driven to the end by a worker, with the tick's time as its `at`.
    done = [r for r in h.app.runs(limit=1000, workflow="tick") if r.status == "succeeded"]
    assert done, h.worker_logs()
    r = done[0]
    at = h.app.result(r.run_id, timeout_s=0)
    assert tick_run_id("tick", datetime.fromisoformat(at).timestamp()) == r.run_id
    assert datetime.fromisoformat(at).tzinfo is not None
    # The schedule's last fired tick is the newest run's.
    [row] = h.app.schedules()
    assert row["last_fired"] == datetime.fromtimestamp(ticks[-1], UTC).isoformat()


@contextlib.contextmanager
def schedules_api(h: Harness) -> Iterator[Api]:
    """An API-only server of the schedule app, clients of tenants acme and globex (every
    scope) and one of acme that may only read."""
    app = schedule_app.build(h.db_url)
    try:
        with serving(app, workers=0) as base:
            a = Api(base, h, [])
            for tenant in ("acme", "globex"):
                a.client(a.token(tenant))
            a.client(a.token("acme", ("runs:read",)))
            try:
                yield a
            finally:
                for client in a.clients:
                    client.close()
    finally:
        app.shutdown()


def test_schedules_over_the_api_persist_and_stay_in_their_tenant(sh: Harness) -> None:
    h = sh
    with schedules_api(h) as api:
        acme, globex, reader = api.clients
        # Bad specs are refused naming the problem, and nothing is written.
        for body, words in [
            ({"cron": "0 25 * * *"}, "invalid cron"),
            ({"every": "soon"}, "invalid every 'soon'"),
            ({"every": "1s", "tz": "Nowhere/Land"}, "unknown tz 'Nowhere/Land'"),
            ({"every": "1s", "missed": "never"}, "invalid missed 'never'"),
            ({"every": "1s", "workflow": "ghost"}, "unknown workflow 'ghost'"),
        ]:
            sent = {"name": "bad", "workflow": "tick", **body}
            assert (
                words
                in problem(acme.post("/v1/schedules", json=sent), 422, "invalid_input")["message"]
            )
        assert [s["name"] for s in acme.get("/v1/schedules").json()] == []
        problem(
            reader.post("/v1/schedules", json={"name": "x", "workflow": "tick"}), 403, "forbidden"
        )
        made = acme.post("/v1/schedules", json={"name": "fast", "workflow": "tick", "every": "1s"})
        assert made.status_code == 201, made.text
        assert made.json()["source"] == "api" and made.json()["every"] == "1s"
        problem(
            acme.post("/v1/schedules", json={"name": "fast", "workflow": "tick", "every": "2s"}),
            409,
            "conflict",
        )
        # Another tenant neither sees nor touches it.
        assert globex.get("/v1/schedules").json() == []
        problem(globex.post("/v1/schedules/fast/pause"), 404, "not_found")
        problem(globex.delete("/v1/schedules/fast"), 404, "not_found")
        assert reader.get("/v1/schedules/fast").json()["paused"] is False
        paused = acme.post("/v1/schedules/fast/pause").json()
        assert paused["paused"] is True and paused["next_tick"] is None
        triggered = acme.post("/v1/schedules/fast/trigger")
        assert triggered.status_code == 201
        run_id = triggered.json()["run_id"]
        assert run_id.startswith("sched:fast:trigger:")
        assert acme.get(f"/v1/runs/{run_id}").status_code == 200
        assert globex.get(f"/v1/runs/{run_id}").status_code == 404
        changed = acme.patch("/v1/schedules/fast", json={"missed": "skip"}).json()
        assert changed["missed"] == "skip" and changed["every"] == "1s"
        assert acme.post("/v1/schedules/fast/resume").json()["paused"] is False
    # A restart: a new server lists it, and a worker that never saw the API fires it.
    w = h.spawn("w0")
    w.wait_started()
    ours = engine_id("sched:fast:", "acme")
    wait_for(
        lambda: len([r for r in h.app.runs(limit=200) if r.run_id.startswith(ours)]) >= 3,
        timeout=20,
        what="ticks of the added schedule",
        detail=h.worker_logs,
    )
    with schedules_api(h) as api:
        acme = api.clients[0]
        [row] = acme.get("/v1/schedules").json()
        assert row["name"] == "fast" and row["last_fired"] is not None
        listed = acme.get("/v1/runs", params={"limit": 200}).json()["runs"]
        assert any(r["run_id"].startswith("sched:fast:2") for r in listed)
        assert acme.delete("/v1/schedules/fast").status_code == 204
        assert acme.get("/v1/schedules").json() == []


def test_the_dashboard_lists_schedules_and_pauses_one(sh: Harness) -> None:
    h = sh
    app = schedule_app.build(h.db_url)
    try:
        with serving(app, workers=0) as base, httpx.Client(base_url=base, timeout=30) as web:
            api = Api(base, h, [])
            signed = web.post("/signin", data={"token": api.token("default"), "next": "/schedules"})
            assert signed.status_code == 303
            page = web.get("/schedules")
            assert page.status_code == 200
            html = page.text
            assert '<tr data-schedule="tick">' in html and "every 1s" in html
            assert 'data-action="pause" data-name="tick"' in html and "active" in html
            csrf = re.search(r'name="csrf-token" content="([^"]+)"', html)
            assert csrf is not None
            # The buttons' call: the API on the session cookie, with the page's CSRF token.
            paused = web.post("/v1/schedules/tick/pause", headers={"X-CSRF-Token": csrf.group(1)})
            assert paused.status_code == 200, paused.text
            html = web.get("/schedules").text
            assert 'data-action="resume" data-name="tick"' in html and "paused" in html
            assert web.post("/v1/schedules/tick/resume").status_code == 403  # no CSRF token
            # Signed out, the page sends to the sign-in form.
            assert httpx.get(f"{base}/schedules").status_code == 303
    finally:
        app.shutdown()
