"""``ratchet queues`` and ``ratchet queues set``, and RATCHET_QUEUES over an app's
declarations, on both backends."""

from __future__ import annotations

import json

import pytest
from clirun import ok, refused

import ratchet


def _app(db_url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(db_url)
    app.queue("research", concurrency=20, per_key_concurrency=2, rate=ratchet.Rate(50, per_s=60))

    @app.workflow(queue="research")
    async def research(topic: str) -> str:
        return topic

    return app


def test_queues_are_listed_and_set_from_the_command_line(db_url: str) -> None:
    app = _app(db_url)
    try:
        run_id = app.start("research", "ptfe", concurrency_key="tenant-acme")
        assert app.get(run_id).queue == "research"
        assert app.get(app.start("research", "x", queue="other")).queue == "other"
        many = app.start_many(
            "research",
            [ratchet.Start("a", concurrency_key="k1"), ratchet.Start("b"), ("c",)],
            concurrency_key="k2",
        )
        keys = app.portal.call(
            app.store._read(
                lambda tx: {
                    r["concurrency_key"] for r in tx.all("runs_keys", {"queue": "research"})
                }
            )
        )
        assert keys == {"tenant-acme", "k1", "k2"}
        assert {app.get(r).queue for r in many} == {"research"}
    finally:
        app.shutdown()
    [research] = json.loads(ok("--db", db_url, "queues", "--json").stdout)
    assert research == {
        "name": "research",
        "concurrency": 20,
        "per_key_concurrency": 2,
        "rate": {"limit": 50, "per_s": 60.0},
        "hold_while_parked": False,
        "depth": 4,
        "in_flight": 0,
        "set_by": "code",
    }
    assert "research" in ok("--db", db_url, "queues").stdout
    out = ok(
        "--db", db_url, "queues", "set", "research", "--concurrency", "5", "--rate", "none"
    ).stdout
    assert "concurrency 5" in out and "rate -" in out
    [research] = json.loads(ok("--db", db_url, "queues", "--json").stdout)
    assert (research["concurrency"], research["rate"], research["set_by"]) == (5, None, "api")

    assert "concurrency" in refused(
        2, "--db", db_url, "queues", "set", "research", "--concurrency", "0"
    )
    assert "--rate" in refused(2, "--db", db_url, "queues", "set", "research", "--rate", "x")
    assert "nowhere" in refused(2, "--db", db_url, "queues", "set", "nowhere", "--concurrency", "1")
    assert "nothing to change" in refused(2, "--db", db_url, "queues", "set", "research")
    [after] = json.loads(ok("--db", db_url, "queues", "--json").stdout)
    assert after == research


def test_configuration_overrides_the_code(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "RATCHET_QUEUES",
        json.dumps({"research": {"concurrency": 3}, "batch": {"rate": {"limit": 5, "per_s": 1}}}),
    )
    app = _app(db_url)
    try:
        found = {v.limits.name: v.limits for v in app.queues()}
    finally:
        app.shutdown()
    assert found["research"].concurrency == 3
    assert found["research"].per_key_concurrency == 2  # the code's, not overridden
    assert found["batch"].rate == ratchet.Rate(5, per_s=1)


def test_bad_configuration_is_refused(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_QUEUES", json.dumps({"research": {"concurrency": -2}}))
    app = ratchet.Ratchet(db_url)
    try:
        with pytest.raises(ratchet.InvalidInput, match="concurrency"):
            app.queue("research", concurrency=2)
            _ = app.store
    finally:
        app.shutdown()
