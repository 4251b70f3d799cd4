"""JSON values and times as both backends keep them.

On PostgreSQL payloads, inputs and outputs are jsonb and times timestamptz, so an operator
can read runs with psql; jsonb keeps numbers as numeric and refuses NUL. Values are written
as jsonb gives them back, on both backends, so a step's output is the same on its first run,
on replay and in the database, and the journal's hashes verify wherever it is read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from waiting import wait_for

import ratchet
from chaos.check import check_all
from chaos.collect import evidence
from ratchet.model import Event, NewRun, RunStatus, dumps, output_payload
from ratchet.store import make_store
from ratchet.store.queries import load_migrations

# Each value, and what it is once stored: floats of magnitude 1e16 and more are integral,
# and jsonb gives them back as integers; -0.0 comes back as 0.0.
VALUES: list[tuple[Any, Any]] = [
    (1e20, 10**20),
    (1e16, 10**16),
    (-1.5e16, -15 * 10**15),
    (1.7976931348623157e308, int(1.7976931348623157e308)),
    (-0.0, 0.0),
    (0.1, 0.1),
    (1e15, 1e15),
    (1.5e-7, 1.5e-7),
    (5e-324, 5e-324),
    (123456789.12345679, 123456789.12345679),
    (2**70, 2**70),
    (-(2**64), -(2**64)),
    ('ünïcödé ✓ 🧒 \u2028 "q" \\ \n', 'ünïcödé ✓ 🧒 \u2028 "q" \\ \n'),
    ("1e+16 -0.0", "1e+16 -0.0"),  # text that looks like a number stays text
    ({"z": 1, "a": [1e17, -0.0]}, {"a": [10**17, 0.0], "z": 1}),
]


def _typed(value: Any) -> Any:
    """``value`` with every number tagged by its type and sign, so 1e20 != 10**20 and
    -0.0 != 0.0 in comparisons."""
    if isinstance(value, float):
        return ("float", value, math.copysign(1.0, value))
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return value


def test_dumps_writes_numbers_as_jsonb_gives_them_back() -> None:
    assert dumps(1e20) == "100000000000000000000"
    assert dumps([-0.0, 1e-07, 0.5]) == "[0.0,1e-07,0.5]"
    assert dumps({"b": -1e16, "a": "e+ and -0.0 in text"}) == (
        '{"a":"e+ and -0.0 in text","b":-10000000000000000}'
    )
    for value, stored in VALUES:
        assert dumps(value) == dumps(stored)


def test_a_step_output_with_extra_fields_is_written_as_dumps_writes_the_whole() -> None:
    # An LLM step's step_completed: its output's JSON goes in as it is, the rest encoded
    # around it; the text (and so the hash) and the payload are what dumps would give.
    extras: list[dict[str, Any]] = [
        {"llm": {"cost_usd": 1e-05, "usage": {"input_tokens": 3}, "model": "gpt-ü"}},
        {"llm": {"v": [v for v, _ in VALUES]}, "aa": "e+ and -0.0 in text", "Ä": -0.0},
        {"output": "an extra output wins, as in the dict", "llm": None},
    ]
    for output in [v for v, _ in VALUES] + [None, {"choices": [{"text": "é"}]}]:
        text = dumps(output)
        for extra in extras:
            payload, payload_json = output_payload(json.loads(text), text, extra)
            whole = dumps({"output": json.loads(text), **extra})
            assert payload_json == whole
            assert payload == json.loads(whole)


def test_event_times_are_kept_to_the_microsecond_without_changing_the_hash() -> None:
    # The hash reads the time to six decimals; the event keeps it rounded to them, which
    # PostgreSQL stores exactly. 1712345678.2000005 is a float just under a half microsecond.
    for at in (1712345678.2000005, 1712345678.4199095, 0.0, 1.0000005, 1795981821.4401367):
        ev = Event.chain("r", 1, "run_queued", None, None, {}, at, "0" * 64)
        assert ev.at == round(at, 6)
        assert ev.hash == Event.digest("r", 1, "run_queued", None, None, "{}", at, "0" * 64)
        assert ev.verify()


def test_values_round_trip_first_run_replay_and_stored(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    seen: list[tuple[str, Any]] = []
    values = [v for v, _ in VALUES]
    expected = _typed([s for _, s in VALUES])

    @app.step()
    async def produce() -> Any:
        return values

    @app.workflow()
    async def wf(given: Any) -> Any:
        out = await produce()
        seen.append(("input", given))
        seen.append(("output", out))
        signal = await ratchet.wait_for_signal("go")  # the drive ends; the next replays
        seen.append(("signal", signal))
        return out

    app.launch()
    run_id = app.start(wf, values)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "go", values)
    result = app.result(run_id, timeout_s=15)

    assert _typed(result) == expected
    assert _typed(app.get(run_id).output) == expected
    assert _typed(app.get(run_id).input) == _typed({"args": [[s for _, s in VALUES]], "kwargs": {}})
    # First drive (input, output), second drive (input, output replayed, signal).
    assert [what for what, _ in seen] == ["input", "output", "input", "output", "signal"]
    assert all(_typed(v) == expected for _, v in seen)
    journal = app.events(run_id)
    [completed] = [e for e in journal if e.kind == "step_completed" and e.step_id == "1:produce"]
    assert _typed(completed.payload["output"]) == expected
    assert all(e.verify() for e in journal)
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(journal))


def test_a_nul_inside_a_value_is_refused_at_the_door_and_nothing_is_written(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step()
    async def nul_out() -> str:
        return "a\x00b"

    @app.workflow()
    async def echo(x: Any) -> Any:
        return x

    @app.workflow()
    async def steps() -> str:
        return await nul_out()

    with pytest.raises(
        ratchet.NotSerializable, match=r"the input of workflow echo .*NUL character \(\\u0000\)"
    ):
        app.start(echo, {"k\x00": 1})
    assert app.runs() == []
    app.launch()
    run_id = app.start(steps)
    with pytest.raises(ratchet.RunFailed, match=r"the output of step 1:nul_out .*NUL"):
        app.result(run_id, timeout_s=15)
    assert "step_completed" not in [e.kind for e in app.events(run_id)]
    assert all(e.verify() for e in app.events(run_id))


def test_the_chaos_checks_read_both_backends_and_find_the_journal_sound(
    db_url: str, make_app: Callable[..., ratchet.Ratchet]
) -> None:
    app = make_app()

    @app.step()
    async def produce() -> Any:
        return [v for v, _ in VALUES]

    @app.workflow()
    async def wf() -> Any:
        out = await produce()
        await ratchet.wait_for_signal("go")
        return out

    app.launch()
    done, parked = app.start(wf), app.start(wf)
    app.signal(done, "go")
    app.result(done, timeout_s=15)
    wait_for(lambda: app.get(parked).status == RunStatus.WAITING)
    ev = evidence(db_url, [done, parked], [], time.time(), {})
    assert check_all(ev).violations == []
    assert set(ev.events) == {done, parked}
    assert [e.hash for e in ev.events[done]] == [e.hash for e in app.events(done)]
    assert all(e.verify() for run in ev.events.values() for e in run)
    assert ev.runs[parked].status == "waiting"


# -- PostgreSQL, as an operator reads it -------------------------------------------------------


def test_an_operator_reads_runs_with_psql(pg_url: str) -> None:
    app = ratchet.Ratchet(pg_url, lease_ttl=5.0)
    release = threading.Event()

    @app.step()
    def hold() -> int:
        release.wait(10)
        return 1

    @app.step()
    async def broken() -> None:
        raise ValueError("the tool said no")

    @app.workflow()
    async def held(n: int) -> int:
        return n + await hold()

    @app.workflow()
    async def fails() -> None:
        await broken()

    try:
        app.launch()
        failed = app.start(fails)
        with pytest.raises(ratchet.RunFailed):
            app.result(failed, timeout_s=15)
        running = app.start(held, 41)
        wait_for(lambda: "step_started" in [e.kind for e in app.events(running)])
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT seq, kind, step_id FROM journal_events WHERE run_id = %s ORDER BY seq",
                (failed,),
            ).fetchall()
            assert [r[1] for r in rows][-2:] == ["step_failed", "run_failed"]
            assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
            [(error,)] = conn.execute(
                "SELECT payload->>'error' FROM journal_events "
                "WHERE run_id = %s AND kind = 'step_failed'",
                (failed,),
            ).fetchall()
            assert "the tool said no" in error
            # Leases live now, by the server's clock, and what they run.
            live = conn.execute(
                "SELECT l.run_id, r.input->'args'->>0, l.expires_at - now() "
                "FROM run_locks l JOIN runs r USING (run_id) WHERE l.expires_at > now()"
            ).fetchall()
            assert [(r[0], r[1]) for r in live] == [(running, "41")]
            assert 0 < live[0][2].total_seconds() <= 5
            [(recent,)] = conn.execute(
                "SELECT count(*) FROM journal_events WHERE run_id = %s "
                "AND at > now() - interval '1 minute' AND at <= now()",
                (failed,),
            ).fetchall()
            assert recent == len(rows)
            [(status, output)] = conn.execute(
                "SELECT status, output FROM runs WHERE run_id = %s", (failed,)
            ).fetchall()
            assert (status, output) == ("failed", None)
        release.set()
        assert app.result(running, timeout_s=15) == 42
        with psycopg.connect(pg_url, autocommit=True) as conn:
            [(out,)] = conn.execute(
                "SELECT output FROM runs WHERE run_id = %s", (running,)
            ).fetchall()
            assert out == 42  # psycopg reads jsonb as JSON
            assert conn.execute(
                "SELECT count(*) FROM run_locks WHERE expires_at > now()"
            ).fetchone() == (0,)
    finally:
        release.set()
        app.shutdown()


# -- migration 005 converts what is there ------------------------------------------------------


# Floats of Unix seconds whose six decimals a naive to_timestamp() rounds the other way.
_AWKWARD_TIMES = (1712345678.2000005, 1712345678.4199095, 1712345678.7342474, 1712345678.2158625)


def _old_event(run_id: str, seq: int, kind: str, payload_json: str, at: float, prev: str) -> Event:
    """An event as Ratchet wrote it before migration 005: the time unrounded, the payload
    text as the old dumps wrote it (1e+20, -0.0, \\u0000 all stored as they were)."""
    digest = Event.digest(run_id, seq, kind, None, None, payload_json, at, prev)
    return Event(run_id, seq, kind, None, None, {}, at, prev, digest, payload_json)


def test_migration_005_converts_rows_written_before_it(pg_url: str) -> None:
    old = [m for m in load_migrations("postgres") if m[0] <= 4]
    assert [m[0] for m in old] == [1, 2, 3, 4]
    payloads = [
        '{"version":"1","workflow":"wf"}',
        '{"drive":1,"reason":"claim"}',
        '{"output":[1e+20,-0.0,0.1,"a\\u0000b","\\\\u0000",1.5e-07]}',
        '{"error":"it broke","error_type":"ValueError"}',
    ]
    events, prev = [], "0" * 64
    for seq, (text, at) in enumerate(zip(payloads, _AWKWARD_TIMES, strict=True), 1):
        kind = ["run_queued", "run_started", "step_completed", "step_failed"][seq - 1]
        events.append(_old_event("r1", seq, kind, text, at, prev))
        prev = events[-1].hash
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for _, _, sql in old:
            conn.execute(sql.encode())
        conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text "
            "NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, _ in old:
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
            )
        conn.execute(
            "INSERT INTO runs (run_id, workflow, workflow_version, input, status, output, "
            "not_before, created_at, updated_at) VALUES ('r1', 'wf', '1', %s, 'waiting', "
            "%s, 1712345700.5, 1712345678.25, 1712345679.75)",
            ('{"args":[1e+20,"x\\u0000"],"kwargs":{}}', '{"v":-0.0}'),
        )
        for e in events:
            conn.execute(
                "INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, "
                "payload, at, prev_hash, hash) VALUES (%s, %s, %s, NULL, NULL, %s, "
                "%s, %s, %s)",
                (e.run_id, e.seq, e.kind, e.payload_json, e.at, e.prev_hash, e.hash),
            )
        conn.execute("INSERT INTO run_locks VALUES ('r1', 'w1', 3, extract(epoch FROM now()) + 60)")
        conn.execute(
            "INSERT INTO side_effect_receipts (idempotency_key, run_id, step_id, "
            "status, response, epoch, claimed_at, settled_at, delivery, attempt, "
            "settled_by) VALUES ('k1', 'r1', '1:send', 'settled', '{\"ok\":1e+16}', "
            "3, 1712345680.5, 1712345681.5, '#1', 1, 'worker')"
        )
        conn.execute(
            "INSERT INTO signals (run_id, name, payload, sent_at) VALUES "
            "('r1', 'go', '\"hi\"', 1712345682.5)"
        )
        conn.execute("INSERT INTO dead_letters VALUES ('r1', 'step_failed', 'boom', 1712345683.5)")
        conn.execute(
            "INSERT INTO workers VALUES ('w1', 'h', 1, 1712345600.5, 1712345601.5, '[]', '[]', 15)"
        )

    async def read() -> None:
        store = make_store(pg_url)
        await store.open()
        try:
            journal = await store.load_events("r1")
            assert [e.hash for e in journal] == [e.hash for e in events]
            assert [(e.seq, e.payload_json, e.at) for e in journal if not e.verify()] == []
            assert [f"{e.at:.6f}" for e in journal] == [f"{t:.6f}" for t in _AWKWARD_TIMES]
            assert _typed(journal[2].payload) == _typed(
                {"output": [1e20, -0.0, 0.1, "a\x00b", "\\u0000", 1.5e-7]}
            )
            rec = await store.get_run("r1")
            assert rec is not None
            assert (rec.not_before, rec.created_at, rec.updated_at) == (
                1712345700.5,
                1712345678.25,
                1712345679.75,
            )
            assert _typed(rec.input) == _typed({"args": [10**20, "x\ufffd"], "kwargs": {}})
            assert _typed(rec.output) == _typed({"v": 0.0})
            lease = await store.lease("r1")
            assert lease is not None and lease.live and lease.worker_id == "w1"
            [receipt] = await store.receipts("r1")
            assert (receipt.response, receipt.claimed_at, receipt.settled_at) == (
                {"ok": 10**16},
                1712345680.5,
                1712345681.5,
            )
            assert await store.pending_signal("r1", "go") == (1, "hi")
            [dead] = await store.dead_letters()
            assert dead.at == 1712345683.5
            # Written from now on, as jsonb and timestamptz, beside the old rows.
            await store.create_run(NewRun("r2", "wf", "1", {"args": [1e20], "kwargs": {}}))
            [new] = await store.load_events("r2")
            assert new.verify() and abs(new.at - await store.now()) < 60
        finally:
            await store.close()

    asyncio.run(read())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # What psql shows: jsonb with jsonb's numbers and U+FFFD for a NUL.
        [(output,)] = conn.execute(
            "SELECT payload->'output' FROM journal_events WHERE run_id = 'r1' AND seq = 3"
        ).fetchall()
        assert output == [10**20, 0, 0.1, "a\ufffdb", "\\u0000", 1.5e-7]
        [(error,)] = conn.execute(
            "SELECT payload->>'error' FROM journal_events WHERE kind = 'step_failed'"
        ).fetchall()
        assert error == "it broke"
        # Only events whose text jsonb may not give back keep it.
        kept = conn.execute(
            "SELECT seq FROM journal_events WHERE payload_text IS NOT NULL ORDER BY run_id, seq"
        ).fetchall()
        assert kept == [(3,)]
        assert conn.execute(
            "SELECT count(*) FROM run_locks WHERE expires_at > now()"
        ).fetchone() == (1,)


def test_sqlite_keeps_its_schema(sqlite_url: str) -> None:
    # SQLite stays as it was: JSON as text, times as Unix seconds.
    async def open_close() -> None:
        store = make_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(open_close())
    conn = sqlite3.connect(sqlite_url[len("sqlite:///") :])
    try:
        columns = {(r[1], r[2]) for r in conn.execute("PRAGMA table_info(journal_events)")}
    finally:
        conn.close()
    assert {("payload", "TEXT"), ("at", "REAL")} <= columns
