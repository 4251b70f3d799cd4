"""Debugging a failure from the journal alone, on SQLite and PostgreSQL: a failed step's
traceback (its chain, bounded, without locals or secrets) and every step's arguments at
``step_started`` (bounded, with a marker where cut; none with ``journal_args=False``);
journals written before either still fold."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

import ratchet
from ratchet.engine.evidence import MAX_ARGS_BYTES, MAX_TRACEBACK_CHARS, traceback_text
from ratchet.model import GENESIS_HASH, Event, drives, failure, fold

SECRET_ENV = "S3cr3t-from-the-environment-42"


def events_of(app: ratchet.Ratchet, run_id: str, kind: str) -> list[Event]:
    return [e for e in app.events(run_id) if e.kind == kind]


def test_a_failed_step_journals_its_traceback_chain_without_locals_or_secrets(
    make_app: Callable[..., ratchet.Ratchet],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("EVIDENCE_TEST_API_KEY", SECRET_ENV)
    app = make_app()

    def parse(text: str) -> int:
        return int(text)

    @app.step(retry=ratchet.Retry(max_attempts=2, backoff_ms=10))
    def charge(order: str) -> int:
        password_local = "hunter2-only-in-a-local"  # noqa: F841 - never journaled
        try:
            return parse(order)
        except ValueError as e:
            key = os.environ["EVIDENCE_TEST_API_KEY"]
            raise RuntimeError(
                f"charge failed (key {key}, token sk-abcdefghijklmnopqrstuvwxyz)"
            ) from e

    @app.workflow()
    async def shop(order: str) -> int:
        return await charge(order)

    app.launch()
    with caplog.at_level(logging.WARNING, logger="ratchet.engine"):
        run_id = app.start(shop, "not-a-number")
        with pytest.raises(ratchet.RunFailed):
            app.result(run_id, timeout_s=20)

    [failed] = events_of(app, run_id, "step_failed")
    trace = failed.payload["traceback"]
    # The chain, cause first, the exception raised last; the user's frames, not Ratchet's.
    assert "ValueError: invalid literal for int()" in trace
    assert "The above exception was the direct cause of the following exception" in trace
    assert trace.rstrip().splitlines()[-1].startswith("RuntimeError: charge failed")
    assert "in charge" in trace and "in parse" in trace and "test_evidence.py" in trace
    assert "ratchet/engine" not in trace and "asyncio" not in trace
    # No locals, no secrets: the environment's secret and a key-like token are redacted.
    assert "hunter2" not in trace
    assert SECRET_ENV not in trace and "sk-abcdefghij" not in trace
    assert "[redacted]" in trace
    # Each failed attempt carries its own; the fold and the run's story read it.
    [retrying] = events_of(app, run_id, "step_retrying")
    assert "RuntimeError: charge failed" in retrying.payload["traceback"]
    state = fold(run_id, app.events(run_id))
    assert state.steps["1:charge"].traceback == trace
    assert failure(app.events(run_id)) == ("1:charge", trace)
    # The worker's log carries it at WARNING.
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("action=step_failed" in m and "in parse" in m for m in logged)


def test_the_workflows_own_error_journals_its_traceback_on_run_failed(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def broken() -> None:
        raise KeyError("missing")

    app.launch()
    run_id = app.start(broken)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=20)
    [ended] = events_of(app, run_id, "run_failed")
    assert "in broken" in ended.payload["traceback"]
    assert ended.payload["traceback"].rstrip().endswith("KeyError: 'missing'")
    assert failure(app.events(run_id)) == (None, ended.payload["traceback"])


def test_a_traceback_is_bounded_keeping_its_start_and_the_exception_raised() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 50_000)
        deep(n - 1)

    try:
        deep(200)
    except ValueError as e:
        trace = traceback_text(e)
    assert len(trace) <= MAX_TRACEBACK_CHARS
    assert "characters cut] ..." in trace
    assert trace.startswith("Traceback (most recent call last):")
    assert trace.rstrip().endswith("x" * 100)


def test_a_steps_arguments_are_journaled_by_name_bounded_and_redacted(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    class Opaque:
        pass

    @app.step()
    async def many(a: int, b: str, *rest: int, k: Any = None, **more: Any) -> str:
        return "ok"

    @app.step()
    async def big(text: str) -> int:
        return len(text)

    @app.step()
    async def opaque(thing: Any, n: int) -> str:
        return "ok"

    @app.step()
    async def call(api_key: str, max_tokens: int, headers: dict[str, str]) -> str:
        return "ok"

    @app.workflow()
    async def wf() -> None:
        await many(1, "x", 3, 4, k={"z": [1.5, None]}, extra=True)
        await big("y" * (MAX_ARGS_BYTES * 3))
        await opaque(Opaque(), 7)
        await call(
            api_key="sk-live-0123456789abcdefghij",
            max_tokens=64,
            headers={"Authorization": "Bearer abc.def.ghi-jkl", "X-Trace": "t1"},
        )

    app.launch()
    run_id = app.start(wf)
    app.result(run_id, timeout_s=20)
    args = {e.step_id: e.payload["args"] for e in events_of(app, run_id, "step_started")}
    assert args["1:many"] == {
        "a": 1,
        "b": "x",
        "rest": [3, 4],
        "k": {"z": [1.5, None]},
        "extra": True,
    }
    cut = args["2:big"]
    assert cut["_truncated"] is True and cut["bytes"] > MAX_ARGS_BYTES
    assert cut["head"].startswith('{"text":"yyy') and len(cut["head"]) < MAX_ARGS_BYTES
    assert args["3:opaque"] == {"thing": "<Opaque>", "n": 7}
    assert args["4:call"] == {
        "api_key": "[redacted]",
        "max_tokens": 64,
        "headers": {"Authorization": "[redacted]", "X-Trace": "t1"},
    }
    # Read back from the store as written: the hash chain holds.
    assert all(e.verify() for e in app.events(run_id))


def test_journal_args_false_keeps_a_steps_and_a_tools_arguments_out(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step(journal_args=False)
    async def login(password: str) -> str:
        return "session"

    @app.tool(journal_args=False)
    async def pay(card: str) -> str:
        return "paid"

    @app.workflow()
    async def wf() -> list[str]:
        return [await login("pw-1234567"), await pay("4111-1111")]

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=20) == ["session", "paid"]
    journal = app.events(run_id)
    assert [e.payload.get("args") for e in journal if e.kind == "step_started"] == [None, None]
    assert all("args" not in e.payload for e in journal if e.kind == "step_started")
    [called] = [e for e in journal if e.kind == "tool_called"]
    assert called.payload == {"name": "pay", "risk": "low"}
    text = " ".join(e.payload_json or str(e.payload) for e in journal)
    assert "pw-1234567" not in text and "4111-1111" not in text

    with pytest.raises(ratchet.InvalidInput, match="journal_args must be True or False"):
        app.step(journal_args="no")(login)  # type: ignore[call-overload]


def _chain(
    run_id: str, specs: list[tuple[str, str | None, int | None, dict[str, Any], float]]
) -> list[Event]:
    out: list[Event] = []
    prev = GENESIS_HASH
    for seq, (kind, step_id, attempt, payload, at) in enumerate(specs, 1):
        ev = Event.chain(run_id, seq, kind, step_id, attempt, payload, at, prev)
        out.append(ev)
        prev = ev.hash
    return out


def test_a_journal_older_than_args_and_tracebacks_folds_and_tells_its_story() -> None:
    journal = _chain(
        "old",
        [
            ("run_queued", None, None, {}, 1.0),
            ("run_started", None, None, {"worker_id": "w1", "epoch": 1, "drive": 1}, 1.1),
            ("step_started", "1:a", 1, {"idempotency_key": "k"}, 1.2),
            ("step_failed", "1:a", 1, {"error": "ValueError: no", "error_type": "ValueError"}, 1.3),
            ("run_failed", None, None, {"error": "step 1:a failed", "reason": "step_failed"}, 1.4),
        ],
    )
    state = fold("old", journal)
    step = state.steps["1:a"]
    assert step.error == "ValueError: no" and step.traceback is None
    assert failure(journal) == ("1:a", None)
    [drive] = drives(journal)
    assert (drive.worker_id, drive.ended) == ("w1", "failed, dead-lettered (step_failed)")


def test_a_sandbox_may_journal_args_and_tracebacks_no_larger_than_a_worker_writes() -> None:
    from ratchet.errors import ValueRefused
    from ratchet.sandbox.report_check import Proposal, check_fields

    def started(args: Any) -> Proposal:
        return Proposal("step_started", "1:a", 1, {"idempotency_key": "k", "args": args}, "")

    check_fields(started({"x": 1}))  # what its own engine writes passes
    check_fields(Proposal("step_failed", "1:a", 1, {"error": "e", "traceback": "t" * 8000}, ""))
    with pytest.raises(ValueRefused, match="step_started: its args is longer than"):
        check_fields(started({"x": "y" * (MAX_ARGS_BYTES * 2)}))
    with pytest.raises(ValueRefused, match="run_failed: its traceback is longer than"):
        check_fields(
            Proposal("run_failed", None, None, {"error": "e", "traceback": "t" * 20_000}, "")
        )
