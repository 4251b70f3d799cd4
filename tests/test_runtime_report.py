"""The report channel a sandbox proposes its journal through (POST /v1/runtime/report, GET
/v1/runtime/journal), served by real uvicorn on its Unix socket, on both backends: the
worker writes what it accepts (its own chain and clock), refuses what the step state
machine does not allow (and writes nothing of it), keeps the kinds that are its own,
sets the run's row from the terminal event, and judges the run's guards."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from serving import serving

import ratchet
from ratchet.errors import ValueRefused
from ratchet.model import ClaimedRun, NewRun, RunStatus, dumps, idempotency_key
from ratchet.model.requests import RequestIndex
from ratchet.sandbox.channel import ReportChannel
from ratchet.sandbox.host import HostJournal
from ratchet.store import Store, tokens

TTL = 10.0
RUN = "iso-1"
KEY = "k" * 64


@pytest.fixture
async def channel(store: Store) -> AsyncIterator[ReportChannel]:
    ch = ReportChannel(store)
    await ch.start()
    yield ch
    await ch.close()


async def _claimed(store: Store, run_id: str = RUN) -> ClaimedRun:
    await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    claimed = [
        c
        for c in await store.claim("w1", TTL, 10, ["default"], [("wf", "1")])
        if c.record.run_id == run_id
    ]
    return claimed[0]


def ev(
    kind: str, step_id: str | None = None, attempt: int | None = None, /, **payload: Any
) -> dict[str, Any]:
    """One proposed event, as a report carries it."""
    return {"kind": kind, "step_id": step_id, "attempt": attempt, "payload_json": dumps(payload)}


def started(step_id: str, attempt: int = 1, /, **more: Any) -> dict[str, Any]:
    return ev("step_started", step_id, attempt, idempotency_key=KEY, **more)


def completed(step_id: str, output: Any, attempt: int = 1, /, **more: Any) -> dict[str, Any]:
    return ev("step_completed", step_id, attempt, output=output, **more)


class Sandbox:
    """One granted sandbox (the host's journal of its run) and its client over the
    channel's socket."""

    def __init__(
        self,
        channel: ReportChannel,
        journal: HostJournal,
        sandbox_id: str = "sbx-a",
        ttl_s: float | None = None,
    ) -> None:
        self.run_id = journal.run_id
        self.sandbox_id = sandbox_id
        self.journal = journal
        self.grant, self.token = channel.grants.issue(journal, sandbox_id, ttl_s)
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=channel.path), base_url="http://sandbox"
        )

    @staticmethod
    async def make(
        channel: ReportChannel,
        store: Store,
        claimed: ClaimedRun,
        sandbox_id: str = "sbx-a",
        ttl_s: float | None = None,
        guards: ratchet.Guards | None = None,
    ) -> Sandbox:
        events = await store.load_events(claimed.record.run_id)
        journal = HostJournal(
            store, claimed.lease, claimed.record, events, guards or ratchet.Guards()
        )
        return Sandbox(channel, journal, sandbox_id, ttl_s)

    async def report(
        self,
        events: list[dict[str, Any]],
        op: str = "append",
        token: str | None = None,
        **extra: Any,
    ) -> httpx.Response:
        body = {
            "run_id": self.run_id,
            "sandbox_id": self.sandbox_id,
            "op": op,
            "events": events,
            **extra,
        }
        return await self.client.post(
            "/v1/runtime/report",
            json=body,
            headers={"Authorization": f"Bearer {token or self.token}"},
        )

    async def close(self) -> None:
        await self.client.aclose()


async def _journal(store: Store, run_id: str = RUN) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in await store.load_events(run_id)]


async def test_reports_are_written_by_the_host_and_the_row_is_the_terminal_events(
    store: Store, channel: ReportChannel, db_url: str
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    answer = await sbx.report([started("1:a")])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": 1, "last_seq": 2}
    # The report's own output field, if a sandbox sends one, is not the run's: the
    # terminal event is.
    answer = await sbx.report(
        [completed("1:a", 7), ev("run_succeeded", output={"n": 7})],
        op="finish",
        status="succeeded",
        output={"n": 999},
    )
    assert answer.status_code == 200, answer.text
    events = await store.load_events(RUN)
    assert [(e.seq, e.kind) for e in events] == [
        (1, "run_queued"),
        (2, "step_started"),
        (3, "step_completed"),
        (4, "run_succeeded"),
    ]
    # One chain, the host's: each event continues the one before and matches its content.
    assert all(e.verify() and e.prev_hash == p.hash for p, e in itertools.pairwise(events))
    rec = await store.get_run(RUN)
    assert rec is not None and rec.status == RunStatus.SUCCEEDED and rec.output == {"n": 7}
    got = await sbx.client.get(
        "/v1/runtime/journal", headers={"Authorization": f"Bearer {sbx.token}"}
    )
    assert got.status_code == 200 and [e["seq"] for e in got.json()["events"]] == [1, 2, 3, 4]
    await sbx.close()
    # What the API shows is the journal's value, too.
    app = ratchet.Ratchet(db_url)
    try:
        _, secret = app.portal.call(tokens.create_token(app.store, "default", ("runs:read",)))
        with serving(app, workers=0) as base:
            shown = httpx.get(
                f"{base}/v1/runs/{RUN}/result",
                timeout=30,
                headers={"Authorization": f"Bearer {secret}"},
            ).json()
        assert shown["output"] == {"n": 7}
    finally:
        app.shutdown()


async def test_a_failed_runs_error_and_dead_letter_come_from_its_terminal_event(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    answer = await sbx.report(
        [
            started("1:a"),
            ev("step_failed", "1:a", 1, error="E: boom", error_type="E"),
            ev("run_failed", error="StepFailed: 1:a", reason="step_failed"),
        ],
        op="finish",
        status="failed",
        error="something else",
        dead_letter="budget_exceeded",
    )
    assert answer.status_code == 200, answer.text
    rec = await store.get_run(RUN)
    assert rec is not None and rec.status == RunStatus.FAILED
    assert rec.error == "StepFailed: 1:a"
    [dead] = await store.dead_letters()
    assert dead.reason == "step_failed"
    await sbx.close()


# (what the sandbox proposes after a step_started of 1:a, what the refusal says)
REFUSED: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "a step that never started, claiming usage and cost",
        [
            completed(
                "2:ghost", "ghost", llm={"usage": {"input_tokens": 10**9}, "cost_usd": 123456.0}
            )
        ],
        "step 2:ghost never started",
    ),
    (
        "a failure of a step that never started",
        [ev("step_failed", "2:b", 1, error="x", error_type="E")],
        "never started",
    ),
    (
        "a retry of a step that never started",
        [ev("step_retrying", "2:b", 1, attempt=1, of=3, error="x", delay_s=0.1)],
        "never started",
    ),
    ("another attempt's end", [completed("1:a", 1, 2)], "no step_started in attempt 2"),
    ("a second end", [completed("1:a", 1), completed("1:a", 2)], "nothing follows"),
    ("a start after the end", [completed("1:a", 1), started("1:a", 2)], "nothing follows"),
    ("an attempt out of turn", [started("2:b", 3)], "goes on with attempt 1"),
    ("the same attempt twice", [started("1:a")], "has started and not ended"),
    ("the next attempt without a retry", [started("1:a", 2)], "has started and not ended"),
    (
        "a sleep that starts",
        [
            ev("step_waiting", "2:sleep", None, reason="sleep", seconds=0.1, until=1.0),
            started("2:sleep"),
        ],
        "it does not start again",
    ),
    (
        "usage and cost on a step's end",
        [completed("1:a", 1, llm={"cost_usd": 1.0})],
        "no field 'llm'",
    ),
    (
        "a model call's end",
        [
            ev(
                "step_started",
                "2:openai.chat.completions.create",
                1,
                kind="llm",
                idempotency_key=idempotency_key(RUN, "2:openai.chat.completions.create", 1),
            ),
            completed("2:openai.chat.completions.create", {"id": "x"}),
        ],
        "is a model call",
    ),
    (
        "a model call under another key",
        [
            ev(
                "step_started",
                "2:openai.chat.completions.create",
                1,
                idempotency_key=KEY,
                kind="llm",
            )
        ],
        "is not the idempotency key",
    ),
    (
        "a park",
        [ev("step_waiting", "2:signal:go", None, reason="signal", name="go")],
        "does not park",
    ),
    (
        "a drift of a step that is not a completed model call",
        [ev("request_drifted", "1:a", None, difference={"message": 0}, message="m")],
        "is not a completed model call",
    ),
    ("two steps at one position", [started("1:b")], "position 1 holds step '1:a'"),
    ("an id that is not a step's", [started("a")], "is not <position>:<name>"),
    ("a run's end in an append", [ev("run_succeeded", output=1)], "last event of a finish"),
    *[
        (
            f"the host's own {kind}",
            [ev(kind, "1:a" if kind.startswith(("step", "anomaly")) else None, None, key="x")],
            "written by the worker",
        )
        for kind in (
            "run_queued",
            "run_started",
            "run_resumed",
            "run_cancelled",
            "anomaly_detected",
            "confidence_evaluated",
            "confidence_gate_bypassed",
            "approval_decided",
            "signal_received",
        )
    ],
    ("a kind that is not one", [ev("step_done", "1:a", 1)], "not a kind of journal event"),
]


@pytest.mark.parametrize(
    ("events", "words"), [(e, w) for _, e, w in REFUSED], ids=[what for what, _, _ in REFUSED]
)
async def test_the_step_state_machine_refuses_and_writes_nothing(
    store: Store, channel: ReportChannel, events: list[dict[str, Any]], words: str
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    assert (await sbx.report([started("1:a")])).status_code == 200
    answer = await sbx.report(events)
    assert answer.status_code == 422, answer.text
    assert words in answer.json()["message"], answer.json()["message"]
    assert await _journal(store) == [(1, "run_queued"), (2, "step_started")]
    # The refusal leaves the journal as it was: the step goes on.
    assert (await sbx.report([completed("1:a", 1)])).status_code == 200
    await sbx.close()


async def test_a_finish_is_refused_with_an_end_the_sandbox_cannot_claim(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    answer = await sbx.report([ev("run_failed", error="x", reason="budget_exceeded")], op="finish")
    assert answer.status_code == 422 and "does not end a run with reason" in answer.text
    answer = await sbx.report([started("1:a")], op="finish")
    assert answer.status_code == 422 and "ends with run_succeeded or run_failed" in answer.text
    assert await _journal(store) == [(1, "run_queued")]
    await sbx.close()


async def test_steps_sleeps_and_retries_the_driver_writes_are_accepted(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    model = "3:openai.chat.completions.create"
    answer = await sbx.report(
        [
            ev("step_waiting", "1:sleep", None, reason="sleep", seconds=0.1, until=1.0),
            ev("step_completed", "1:sleep", None, output=None),
            ev("tool_called", "2:look", 1, name="look", arguments={}, risk="low"),
            started("2:look", kind="tool"),
            ev("step_retrying", "2:look", 1, attempt=1, of=2, error="E: x", delay_s=0.05),
            started("2:look", 2, kind="tool"),
            completed("2:look", 5, 2),
            ev(
                "step_started",
                model,
                1,
                idempotency_key=idempotency_key(RUN, model, 1),
                kind="llm",
                provider="openai",
                model="m",
            ),
        ]
    )
    assert answer.status_code == 200, answer.text
    assert [k for _, k in await _journal(store)] == [
        "run_queued",
        "step_waiting",
        "step_completed",
        "tool_called",
        "step_started",
        "step_retrying",
        "step_started",
        "step_completed",
        "step_started",
    ]
    await sbx.close()


async def test_refused_reports_write_nothing(store: Store, channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    other = await _claimed(store, "iso-2")
    sbx = await Sandbox.make(channel, store, claimed)

    async def refused(answer: httpx.Response, status: int, words: str) -> None:
        assert answer.status_code == status, answer.text
        assert words in answer.json()["message"]
        assert await _journal(store) == [(1, "run_queued")]

    bad = await sbx.client.post(
        "/v1/runtime/report", json={"events": "x"}, headers={"Authorization": f"Bearer {sbx.token}"}
    )
    await refused(bad, 422, "invalid request")
    body = started("1:a") | {"payload_json": '{"b": 1, "a": 2}'}
    await refused(await sbx.report([body]), 422, "canonical JSON")
    await refused(await sbx.report([]), 422, "at least one event")
    no_token = await sbx.client.post("/v1/runtime/report", json={})
    await refused(no_token, 401, "missing bearer token")
    await refused(await sbx.report([started("1:a")], token="not-a-token"), 401, "invalid")
    elsewhere = await Sandbox.make(channel, store, other, "sbx-b")
    await refused(
        await sbx.report([started("1:a")], token=elsewhere.token), 403, "this token is for"
    )
    await sbx.close()
    await elsewhere.close()


async def test_expired_tokens_are_refused(store: Store, channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    ended = await Sandbox.make(channel, store, claimed, "sbx-ended")
    channel.grants.revoke(ended.grant)  # its sandbox is gone
    answer = await ended.report([started("1:a")])
    assert answer.status_code == 401 and "sandbox has ended" in answer.json()["message"]
    late = await Sandbox.make(channel, store, claimed, "sbx-late", ttl_s=0.05)
    await asyncio.sleep(0.1)  # the token's own deadline, not a state to wait for
    answer = await late.report([started("1:a")])
    assert answer.status_code == 401 and "deadline" in answer.json()["message"]
    assert await _journal(store) == [(1, "run_queued")]
    await ended.close()
    await late.close()


async def test_a_sandbox_that_is_no_longer_current_is_fenced(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    old = await Sandbox.make(channel, store, claimed, "sbx-old")
    # The run moves on: a new epoch (what a new owner's claim or a retake does), and a
    # new sandbox under it.
    lease = await store.retake_lease(claimed.lease, TTL)
    assert lease is not None
    new = await Sandbox.make(channel, store, ClaimedRun(claimed.record, lease, "retry"), "sbx-new")
    answer = await old.report([started("1:a")])
    assert answer.status_code == 409 and answer.json()["error"] == "fenced"
    assert await _journal(store) == [(1, "run_queued")]
    answer = await new.report([started("1:a")])
    assert answer.status_code == 200, answer.text
    assert await _journal(store) == [(1, "run_queued"), (2, "step_started")]
    await old.close()
    await new.close()


async def test_the_host_judges_the_guards_and_ends_the_run_they_fail(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed, guards=ratchet.Guards(max_steps=1))
    assert (await sbx.report([started("1:a"), completed("1:a", 1)])).status_code == 200
    answer = await sbx.report([started("2:b")])
    assert answer.status_code == 409 and answer.json()["error"] == "finished", answer.text
    assert sbx.journal.ended.is_set()  # the worker kills the sandbox on this
    events = await store.load_events(RUN)
    assert [e.kind for e in events] == [
        "run_queued",
        "step_started",
        "step_completed",
        "anomaly_detected",
        "run_failed",
    ]
    assert events[3].payload["kind"] == "excessive_steps"
    assert events[4].payload["reason"] == "excessive_steps"
    rec = await store.get_run(RUN)
    assert rec is not None and rec.status == RunStatus.FAILED
    assert (await store.dead_letters())[0].reason == "excessive_steps"
    await sbx.close()


async def test_the_host_journals_what_its_guards_record(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(
        channel,
        store,
        claimed,
        guards=ratchet.Guards(
            max_steps=1,
            runaway_repeats=3,
            actions={"excessive_steps": "record", "runaway_loop": "record"},
        ),
    )

    def same(n: int) -> list[dict[str, Any]]:  # the same call, the same answer
        return [started(f"{n}:poll", call_sha256="c0ffee"), completed(f"{n}:poll", "not yet")]

    answer = await sbx.report([*same(1), *same(2), *same(3)])
    assert answer.status_code == 200, answer.text
    events = await store.load_events(RUN)
    anomalies = [(e.step_id, e.payload["kind"]) for e in events if e.kind == "anomaly_detected"]
    assert anomalies == [("2:poll", "excessive_steps"), ("3:poll", "runaway_loop")]
    # Recorded, not failed: the run goes on.
    assert (await sbx.report([started("4:other", call_sha256="beef")])).status_code == 200
    await sbx.close()


async def test_a_model_call_that_is_not_its_journaled_request_is_refused_before_it_is_sent(
    store: Store, channel: ReportChannel
) -> None:
    claimed = await _claimed(store)
    sbx = await Sandbox.make(channel, store, claimed)
    # Nothing listens there: a call that got past the check would fail otherwise.
    client = ratchet.llm.wrap(openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k"))
    site: str = client.site  # type: ignore[attr-defined]  # wrap() keeps the client's type
    step = "1:openai.chat.completions.create"
    asked = [{"role": "user", "content": "refund 10 EUR"}]
    request = RequestIndex().entry(step, asked, {"model": "gpt-4.1-mini"})
    start = ev(
        "step_started",
        step,
        1,
        kind="llm",
        idempotency_key=idempotency_key(RUN, step, 1),
        request=request,
    )
    assert (await sbx.report([start])).status_code == 200
    other = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "refund 999 EUR"}]}
    with pytest.raises(ValueRefused, match="not the request its step_started journaled: message 0"):
        await sbx.journal.call_model(step, 1, site, other)
    hotter = {"model": "gpt-4.1-mini", "messages": asked, "temperature": 2}
    with pytest.raises(ValueRefused, match="param 'temperature'"):
        await sbx.journal.call_model(step, 1, site, hotter)
    assert await _journal(store) == [(1, "run_queued"), (2, "step_started")]
    await sbx.close()
