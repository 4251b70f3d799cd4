"""Deliveries and their receipts, on SQLite and PostgreSQL: one receipt per delivery (not
per attempt), so a retried step does not dispatch again and several deliveries in one step
each dispatch once; receipts settled by hand; the errors a misuse gets."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from waiting import wait_for

import ratchet
from ratchet.model import NewRun, idempotency_key
from ratchet.store import make_store
from ratchet.store.queries import load_migrations

FAST_RETRY = ratchet.Retry(max_attempts=3, backoff_ms=1, retry_on=["any"])


def derived(attempt_key: str, delivery: str) -> str:
    return hashlib.sha256(f"{attempt_key}|{delivery}".encode()).hexdigest()


def step_events(app: ratchet.Ratchet, run_id: str, kind: str) -> list[ratchet.Event]:
    return [e for e in app.events(run_id) if e.kind == kind]


# -- one receipt per delivery ------------------------------------------------------------


def test_a_retried_step_does_not_dispatch_a_settled_delivery_again_and_keeps_its_key(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[str] = []

    @app.step(retry=FAST_RETRY)
    async def notify() -> dict[str, Any]:
        response = await ratchet.deliver(lambda key: sent.append(key) or {"n": len(sent)})
        if ratchet.current_step().attempt == 1:
            raise ratchet.ConnectorError("the bookkeeping after the delivery failed")
        return {"response": response, "attempt": ratchet.current_step().attempt}

    @app.workflow()
    async def wf() -> dict[str, Any]:
        return await notify()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == {"response": {"n": 1}, "attempt": 2}
    first_key = idempotency_key(run_id, "1:notify", 1)
    assert sent == [first_key]  # dispatched once, under attempt 1's key
    [receipt] = app.receipts(run_id)
    assert (
        receipt.idempotency_key,
        receipt.step_id,
        receipt.delivery,
        receipt.attempt,
        receipt.status,
        receipt.response,
        receipt.settled_by,
    ) == (first_key, "1:notify", "#1", 1, "settled", {"n": 1}, "worker")
    assert [e.attempt for e in step_events(app, run_id, "step_started")] == [1, 2]


def test_each_delivery_in_a_step_is_its_own_receipt_dispatched_once(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[tuple[str, str]] = []

    def to(target: str) -> Callable[[str], Any]:
        def dispatch(key: str) -> Any:
            sent.append((target, key))
            return {"to": target}

        return dispatch

    @app.step(retry=FAST_RETRY)
    async def fan_out() -> list[Any]:
        out = [
            await ratchet.deliver(to("a")),
            await ratchet.deliver(to("b")),
            await ratchet.deliver(to("audit"), name="audit"),
            await ratchet.deliver(to("c")),
        ]
        if ratchet.current_step().attempt == 1:
            raise RuntimeError("fail after delivering, so the step is retried")
        return out

    @app.workflow()
    async def wf() -> list[Any]:
        return await fan_out()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == [
        {"to": "a"},
        {"to": "b"},
        {"to": "audit"},
        {"to": "c"},
    ]
    k1 = idempotency_key(run_id, "1:fan_out", 1)
    expected = [
        ("a", k1),
        ("b", derived(k1, "#2")),
        ("audit", derived(k1, "audit")),
        ("c", derived(k1, "#3")),
    ]
    assert sent == expected  # each once, none again on attempt 2
    receipts = {r.delivery: r for r in app.receipts(run_id)}
    assert sorted(receipts) == ["#1", "#2", "#3", "audit"]
    assert {d: (r.idempotency_key, r.attempt, r.status) for d, r in receipts.items()} == {
        "#1": (k1, 1, "settled"),
        "#2": (derived(k1, "#2"), 1, "settled"),
        "#3": (derived(k1, "#3"), 1, "settled"),
        "audit": (derived(k1, "audit"), 1, "settled"),
    }


def test_deliveries_in_separate_steps_and_runs_do_not_share_receipts(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[str] = []

    @app.step()
    async def send(text: str) -> Any:
        return await ratchet.deliver(lambda key: sent.append(key) or text)

    @app.workflow()
    async def wf() -> list[Any]:
        return [await send("x"), await send("y")]

    app.launch()
    runs = [app.start(wf) for _ in range(2)]
    assert [app.result(r, timeout_s=15) for r in runs] == [["x", "y"], ["x", "y"]]
    assert sorted(sent) == sorted(
        idempotency_key(r, s, 1) for r in runs for s in ("1:send", "2:send")
    )


def test_a_resend_in_a_later_attempt_reuses_the_key_of_the_attempt_that_claimed_it(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[str] = []

    def dispatch(key: str) -> Any:
        sent.append(key)
        if len(sent) == 1:  # the request went out; the answer never came back
            raise ratchet.ConnectorError("connection reset while reading the answer")
        return {"arrivals": len(sent)}

    @app.step(retry=FAST_RETRY)
    async def notify() -> Any:
        return await ratchet.deliver(dispatch, policy="resend")

    @app.workflow()
    async def wf() -> Any:
        return await notify()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == {"arrivals": 2}
    key = idempotency_key(run_id, "1:notify", 1)
    assert sent == [key, key]  # the receiver can dedupe: one key across both attempts
    [receipt] = app.receipts(run_id)
    assert (receipt.idempotency_key, receipt.attempt, receipt.status) == (key, 1, "settled")


def test_sync_steps_number_their_deliveries_the_same_way(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[str] = []

    @app.step(retry=FAST_RETRY)
    def send_both() -> list[Any]:
        out = [
            ratchet.deliver_sync(lambda key: sent.append(key) or 1),
            ratchet.deliver_sync(lambda key: sent.append(key) or 2),
        ]
        if ratchet.current_step().attempt == 1:
            raise RuntimeError("retry me")
        return out

    @app.workflow()
    async def wf() -> list[Any]:
        return await send_both()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == [1, 2]
    k1 = idempotency_key(run_id, "1:send_both", 1)
    assert sent == [k1, derived(k1, "#2")]


# -- at most once, and settling by hand --------------------------------------------------


def unresolved_app(
    make_app: Callable[..., ratchet.Ratchet],
) -> tuple[ratchet.Ratchet, list[str], str, str]:
    """A run whose at_most_once delivery raised after it may have gone out: the retry
    refuses to send it again and the run is dead-lettered. The app, the dispatches, the run
    id and the receipt's key."""
    app = make_app()
    sent: list[str] = []

    def dispatch(key: str) -> Any:
        sent.append(key)
        if len(sent) == 1:
            raise ratchet.ConnectorError("timed out waiting for the answer")
        return {"sent": len(sent)}

    @app.step(retry=FAST_RETRY)
    async def charge() -> Any:
        return await ratchet.deliver(dispatch, policy="at_most_once")

    @app.workflow()
    async def wf() -> Any:
        return {"charge": await charge()}

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="ReceiptUnresolved"):
        app.result(run_id, timeout_s=15)
    key = idempotency_key(run_id, "1:charge", 1)
    assert sent == [key]  # attempt 2 found the receipt claimed and did not dispatch
    return app, sent, run_id, key


def test_at_most_once_is_at_most_once_across_retries_and_a_person_settles_it(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, sent, run_id, key = unresolved_app(make_app)
    rec = app.get(run_id)
    assert rec.error is not None and f"receipt {key}" in rec.error
    assert f"ratchet receipts settle {key}" in rec.error and f"ratchet retry {run_id}" in rec.error
    [failed] = step_events(app, run_id, "step_failed")
    assert (failed.attempt, failed.payload["error_type"]) == (2, "ReceiptUnresolved")

    settled = app.settle_receipt(key, response={"charge_id": "ch_1"})
    assert (settled.status, settled.response, settled.settled_by) == (
        "settled",
        {"charge_id": "ch_1"},
        "hand",
    )
    app.retry(run_id)
    assert app.result(run_id, timeout_s=15) == {"charge": {"charge_id": "ch_1"}}
    assert sent == [key]  # never dispatched a second time


def test_a_receipt_settled_as_failed_fails_the_step_without_dispatching(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, sent, run_id, key = unresolved_app(make_app)
    r = app.settle_receipt(key, failed=True)
    assert (r.status, r.response, r.settled_by) == ("failed", None, "hand")
    app.retry(run_id)
    with pytest.raises(ratchet.RunFailed, match="DeliveryFailed") as raised:
        app.result(run_id, timeout_s=15)
    assert "settled by hand as failed" in str(raised.value)
    assert sent == [key]
    last = step_events(app, run_id, "step_failed")[-1]
    assert (last.attempt, last.payload["error_type"]) == (3, "DeliveryFailed")
    assert [e.attempt for e in step_events(app, run_id, "step_retrying")] == [1]  # no retry


def test_settling_refuses_bad_input_and_changes_nothing(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, _, run_id, key = unresolved_app(make_app)
    with pytest.raises(ratchet.UnknownReceipt, match="unknown receipt key 'nope'"):
        app.settle_receipt("nope", response=1)
    with pytest.raises(ratchet.InvalidInput, match="not both"):
        app.settle_receipt(key, response=1, failed=True)
    with pytest.raises(ratchet.InvalidInput, match="not neither"):
        app.settle_receipt(key)
    with pytest.raises(ratchet.NotSerializable):
        app.settle_receipt(key, response={object()})  # a set pydantic cannot encode
    [r] = app.receipts(run_id)
    assert (r.status, r.response, r.settled_at) == ("claimed", None, None)

    app.settle_receipt(key, response=None)  # a JSON null is an answer
    with pytest.raises(ratchet.ReceiptSettled, match="already settled by hand"):
        app.settle_receipt(key, failed=True)
    [r] = app.receipts(run_id)
    assert (r.status, r.response) == ("settled", None)


def test_a_receipt_being_dispatched_by_a_live_worker_cannot_be_settled(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    release = threading.Event()
    dispatching = threading.Event()

    def dispatch(key: str) -> Any:
        dispatching.set()
        release.wait(15)
        return "delivered"

    @app.step()
    def slow_send() -> Any:
        return ratchet.deliver_sync(dispatch, policy="at_most_once")

    @app.workflow()
    async def wf() -> Any:
        return await slow_send()

    app.launch()
    try:
        run_id = app.start(wf)
        wait_for(dispatching.is_set, what="the dispatch to begin")
        key = idempotency_key(run_id, "1:slow_send", 1)
        with pytest.raises(ratchet.ReceiptBusy, match="being driven by worker"):
            app.settle_receipt(key, response="by hand")
    finally:
        release.set()
    assert app.result(run_id, timeout_s=15) == "delivered"
    [r] = app.receipts(run_id)
    assert (r.status, r.response, r.settled_by) == ("settled", "delivered", "worker")


def test_receipts_of_an_unknown_run_is_an_error(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    with pytest.raises(ratchet.UnknownRun):
        app.receipts("nope")

    async def both() -> None:
        with pytest.raises(ratchet.UnknownRun):
            await app.receipts_async("nope")
        with pytest.raises(ratchet.UnknownReceipt):
            await app.settle_receipt_async("nope", failed=True)

    asyncio.run(both())


# -- misuse ------------------------------------------------------------------------------


def test_deliver_sync_in_an_async_step_is_a_clear_error_not_a_deadlock(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    sent: list[str] = []

    @app.step()
    async def wrong() -> Any:
        return ratchet.deliver_sync(lambda key: sent.append(key))

    @app.workflow()
    async def wf() -> Any:
        return await wrong()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match=r"await ratchet\.deliver\(\.\.\.\)"):
        app.result(run_id, timeout_s=15)
    assert sent == [] and app.receipts(run_id) == []


@pytest.mark.parametrize("name", ["", "#2", "a\x00b", 7])
def test_an_invalid_delivery_name_is_refused_before_anything_is_claimed(
    make_app: Callable[..., ratchet.Ratchet], name: Any
) -> None:
    app = make_app()

    @app.step()
    async def send() -> Any:
        return await ratchet.deliver(lambda key: "x", name=name)

    @app.workflow()
    async def wf() -> Any:
        return await send()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="invalid delivery name"):
        app.result(run_id, timeout_s=15)
    assert app.receipts(run_id) == []


# -- receipts written before deliveries had identities ----------------------------------


def _database_at_001_with_a_legacy_receipt(db_url: str, key: str) -> None:
    """The schema as migration 001 left it, holding a settled receipt keyed per attempt."""
    [(_, _, sql)] = [
        m
        for m in load_migrations("sqlite" if db_url.startswith("sqlite") else "postgres")
        if m[0] == 1
    ]
    receipt = (
        "INSERT INTO side_effect_receipts (idempotency_key, run_id, step_id, status, "
        "response, epoch, claimed_at, settled_at) VALUES "
        f"('{key}', 'r1', '1:send', 'settled', '{{\"ok\": 1}}', 1, 1.0, 2.0)"
    )
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        try:
            conn.executescript(sql)
            conn.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            conn.execute("INSERT INTO schema_migrations VALUES (1, 'init', 0)")
            conn.execute(receipt)
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect(db_url) as pg:
        pg.execute(sql.encode())
        pg.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text "
            "NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        pg.execute("INSERT INTO schema_migrations (version, name) VALUES (1, 'init')")
        pg.execute(receipt.encode())


async def test_a_receipt_from_before_the_migration_is_found_again_by_its_key(db_url: str) -> None:
    key = idempotency_key("r1", "1:send", 1)
    _database_at_001_with_a_legacy_receipt(db_url, key)
    store = make_store(db_url)
    await store.open()
    try:
        [old] = await store.receipts("r1")
        assert (old.delivery, old.attempt, old.status, old.response, old.settled_by) == (
            f"#legacy:{key}",
            None,
            "settled",
            {"ok": 1},
            "worker",
        )
        await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
        [claimed] = await store.claim("w1", 10.0, 1, ["default"], {("wf", "1")})
        # A re-drive of the attempt that wrote it claims the same key: the stored answer.
        found = await store.claim_receipt(claimed.lease, key, "1:send", delivery="#1", attempt=1)
        assert found == old
        assert await store.receipts("r1") == [old]
    finally:
        await store.close()
