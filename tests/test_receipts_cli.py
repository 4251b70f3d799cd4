"""``ratchet receipts``, on SQLite and PostgreSQL: listing a run's receipts, settling one by
hand so that a dead-lettered run goes on without a second dispatch, and the clear errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import clirun
import pytest
from clirun import ok

import ratchet
from ratchet.model import idempotency_key

dispatched: list[str] = []


def refused(*args: str) -> str:
    """A command that must fail with exit 2 and one clean line on stderr."""
    return clirun.refused(2, *args)


def dispatch(key: str) -> Any:
    dispatched.append(key)
    if len(dispatched) == 1:
        raise ratchet.ConnectorError("timed out waiting for the answer")
    return {"sent": len(dispatched)}


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    dispatched.clear()
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step(retry=ratchet.Retry(max_attempts=2, backoff_ms=1, retry_on=["connector"]))
    async def charge() -> Any:
        return await ratchet.deliver(dispatch, policy="at_most_once")

    @app.workflow()
    async def pay() -> Any:
        return {"charge": await charge()}

    @app.workflow()
    async def idle() -> None:
        return None

    app.launch()
    try:
        yield app
    finally:
        app.shutdown()


def dead_lettered(app: ratchet.Ratchet) -> tuple[str, str]:
    """A run stopped on an at_most_once delivery that may have gone out: (run, key)."""
    run_id = app.start("pay")
    with pytest.raises(ratchet.RunFailed, match="ReceiptUnresolved"):
        app.result(run_id, timeout_s=15)
    return run_id, idempotency_key(run_id, "1:charge", 1)


def test_receipts_are_listed_settled_by_hand_and_the_run_goes_on(
    app: ratchet.Ratchet, db_url: str
) -> None:
    run_id, key = dead_lettered(app)
    [row] = json.loads(ok("--db", db_url, "receipts", run_id, "--json").stdout)
    assert {
        k: row[k]
        for k in (
            "idempotency_key",
            "run_id",
            "step_id",
            "delivery",
            "attempt",
            "status",
            "response",
            "settled_by",
            "settled_at",
        )
    } == {
        "idempotency_key": key,
        "run_id": run_id,
        "step_id": "1:charge",
        "delivery": "#1",
        "attempt": 1,
        "status": "claimed",
        "response": None,
        "settled_by": None,
        "settled_at": None,
    }
    assert row["claimed_at"] > 0
    assert json.loads(ok("--db", db_url, "receipts", "list", run_id, "--json").stdout) == [row]
    assert json.loads(ok("receipts", "--json", run_id, "--db", db_url).stdout) == [row]
    table = ok("--db", db_url, "receipts", run_id).stdout
    assert key in table and "1:charge" in table and "#1" in table and "claimed" in table

    out = ok(
        "--db", db_url, "receipts", "settle", key, "--response", '{"charge_id": "ch_1"}'
    ).stdout
    assert f"receipt {key} (run {run_id}, step 1:charge, delivery #1)" in out
    assert 'settled with {"charge_id":"ch_1"}' in out
    assert f"`ratchet retry {run_id}`" in out  # the hint for a dead-lettered run
    [row] = json.loads(ok("--db", db_url, "receipts", run_id, "--json").stdout)
    assert (row["status"], row["response"], row["settled_by"]) == (
        "settled",
        {"charge_id": "ch_1"},
        "hand",
    )
    assert "settled (by hand)" in ok("--db", db_url, "receipts", run_id).stdout
    assert "already settled" in refused("--db", db_url, "receipts", "settle", key, "--failed")

    ok("--db", db_url, "retry", run_id)
    assert app.result(run_id, timeout_s=15) == {"charge": {"charge_id": "ch_1"}}
    assert dispatched == [key]  # one dispatch, ever


def test_a_receipt_settled_as_failed_fails_the_retried_run_without_dispatching(
    app: ratchet.Ratchet, db_url: str
) -> None:
    run_id, key = dead_lettered(app)
    out = ok("--db", db_url, "receipts", "settle", key, "--failed").stdout
    assert "failed (not delivered)" in out
    ok("--db", db_url, "retry", run_id)
    with pytest.raises(ratchet.RunFailed, match="DeliveryFailed"):
        app.result(run_id, timeout_s=15)
    assert dispatched == [key]
    [row] = json.loads(ok("--db", db_url, "receipts", run_id, "--json").stdout)
    assert (row["status"], row["settled_by"]) == ("failed", "hand")


def test_bad_input_is_refused_and_nothing_is_settled(app: ratchet.Ratchet, db_url: str) -> None:
    run_id, key = dead_lettered(app)
    settle = ("--db", db_url, "receipts", "settle")
    assert "not neither" in refused(*settle, key)
    assert "not both" in refused(*settle, key, "--response", "1", "--failed")
    assert "--response is not valid JSON" in refused(*settle, key, "--response", "{yes")
    assert refused(*settle, "nope", "--failed") == "error: unknown receipt key 'nope'"
    assert refused("--db", db_url, "receipts", "nope") == "error: unknown run id 'nope'"
    [row] = json.loads(ok("--db", db_url, "receipts", run_id, "--json").stdout)
    assert row["status"] == "claimed"


def test_a_run_without_receipts_says_so(app: ratchet.Ratchet, db_url: str) -> None:
    run_id = app.start("idle", run_id="order:42")
    app.result(run_id, timeout_s=15)
    assert json.loads(ok("--db", db_url, "receipts", run_id, "--json").stdout) == []
    assert ok("--db", db_url, "receipts", run_id).stdout.strip() == "run order:42 has no receipts"
