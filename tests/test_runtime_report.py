"""The report channel a sandbox writes its journal through (POST /v1/runtime/report,
GET /v1/runtime/journal), served by real uvicorn on its Unix socket, on both backends:
what it accepts, and the refusals that write nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ratchet.model import ClaimedRun, Event, EventKind, NewRun, RunStatus
from ratchet.sandbox.channel import ReportChannel
from ratchet.sandbox.remote import event_body
from ratchet.store import Store

TTL = 10.0
RUN = "iso-1"


@pytest.fixture
async def channel(store: Store) -> AsyncIterator[ReportChannel]:
    ch = ReportChannel(store)
    await ch.start()
    yield ch
    await ch.close()


async def _claimed(store: Store, run_id: str = RUN) -> ClaimedRun:
    await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    claimed = [c for c in await store.claim("w1", TTL, 10, ["default"], [("wf", "1")])
               if c.record.run_id == run_id]
    return claimed[0]


def _after(prev: Event, kind: str, step_id: str | None = None,
           payload: dict[str, Any] | None = None, seq: int | None = None) -> Event:
    return Event.chain(prev.run_id, seq or prev.seq + 1, kind, step_id, 1 if step_id else None,
                       payload or {}, 1.5, prev.hash)


class Sandbox:
    """One granted sandbox and its client over the channel's socket."""

    def __init__(self, channel: ReportChannel, claimed: ClaimedRun, last: Event,
                 sandbox_id: str = "sbx-a", ttl_s: float | None = None) -> None:
        self.run_id = claimed.record.run_id
        self.sandbox_id = sandbox_id
        self.grant, self.token = channel.grants.issue(self.run_id, sandbox_id, claimed.lease,
                                                      last.seq, last.hash, ttl_s)
        self.client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=channel.path),
                                        base_url="http://sandbox")

    async def report(self, events: list[Event], op: str = "append", token: str | None = None,
                     **extra: Any) -> httpx.Response:
        body = {"run_id": self.run_id, "sandbox_id": self.sandbox_id, "op": op,
                "events": [event_body(e) for e in events], **extra}
        return await self.client.post("/v1/runtime/report", json=body, headers={
            "Authorization": f"Bearer {token or self.token}"})

    async def close(self) -> None:
        await self.client.aclose()


async def _journal(store: Store, run_id: str = RUN) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in await store.load_events(run_id)]


async def test_reports_append_and_finish_the_run(store: Store, channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    [queued] = await store.load_events(RUN)
    sbx = Sandbox(channel, claimed, queued)
    started = _after(queued, EventKind.RUN_STARTED)
    step = _after(started, EventKind.STEP_STARTED, "1:a", {"idempotency_key": "k"})
    done = _after(step, EventKind.STEP_COMPLETED, "1:a", {"output": 7})
    answer = await sbx.report([started, step])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": 2, "last_seq": 3}
    end = _after(done, EventKind.RUN_SUCCEEDED, payload={"output": 7})
    answer = await sbx.report([done, end], op="finish", status="succeeded", output=7)
    assert answer.status_code == 200, answer.text
    assert await _journal(store) == [(1, "run_queued"), (2, "run_started"),
                                     (3, "step_started"), (4, "step_completed"),
                                     (5, "run_succeeded")]
    rec = await store.get_run(RUN)
    assert rec is not None and rec.status == RunStatus.SUCCEEDED and rec.output == 7
    got = await sbx.client.get("/v1/runtime/journal",
                               headers={"Authorization": f"Bearer {sbx.token}"})
    assert got.status_code == 200 and [e["seq"] for e in got.json()["events"]] == [1, 2, 3, 4, 5]
    await sbx.close()


async def test_refused_reports_write_nothing(store: Store, channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    other = await _claimed(store, "iso-2")
    [queued] = await store.load_events(RUN)
    sbx = Sandbox(channel, claimed, queued)
    started = _after(queued, EventKind.RUN_STARTED)

    async def refused(answer: httpx.Response, status: int, words: str) -> None:
        assert answer.status_code == status, answer.text
        assert words in answer.json()["message"]
        assert await _journal(store) == [(1, "run_queued")]

    # Malformed: not a report, a payload that is not canonical JSON, a hash that lies.
    bad = await sbx.client.post("/v1/runtime/report", json={"events": "x"},
                                headers={"Authorization": f"Bearer {sbx.token}"})
    await refused(bad, 422, "invalid request")
    body = event_body(started) | {"payload_json": '{"b": 1, "a": 2}'}
    bad = await sbx.client.post("/v1/runtime/report", headers={
        "Authorization": f"Bearer {sbx.token}"}, json={
        "run_id": RUN, "sandbox_id": "sbx-a", "op": "append", "events": [body]})
    await refused(bad, 422, "canonical JSON")
    forged = Event(RUN, 2, EventKind.RUN_STARTED, None, None, {}, 1.5, queued.hash,
                   "f" * 64, "{}")
    await refused(await sbx.report([forged]), 422, "hash does not match")
    # A run's end only through finish, and only as its last event.
    end = _after(queued, EventKind.RUN_SUCCEEDED, payload={"output": 1})
    await refused(await sbx.report([end]), 422, "cannot be reported")
    # Tokens: missing, wrong, for another run.
    no_token = await sbx.client.post("/v1/runtime/report", json={})
    await refused(no_token, 401, "missing bearer token")
    await refused(await sbx.report([started], token="not-a-token"), 401, "invalid")
    elsewhere = Sandbox(channel, other, (await store.load_events("iso-2"))[0], "sbx-b")
    await refused(await sbx.report([started], token=elsewhere.token), 403, "this token is for")
    # Out of order: a gap, and a chain that does not continue the journal.
    gap = _after(queued, EventKind.RUN_STARTED, seq=3)
    await refused(await sbx.report([gap]), 409, "out of order")
    stray = Event.chain(RUN, 2, EventKind.RUN_STARTED, None, None, {}, 1.5, "a" * 64)
    await refused(await sbx.report([stray]), 409, "out of order")
    await sbx.close()
    await elsewhere.close()


async def test_expired_tokens_are_refused(store: Store, channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    [queued] = await store.load_events(RUN)
    started = _after(queued, EventKind.RUN_STARTED)
    ended = Sandbox(channel, claimed, queued, "sbx-ended")
    channel.grants.revoke(ended.grant)  # its sandbox is gone
    answer = await ended.report([started])
    assert answer.status_code == 401 and "sandbox has ended" in answer.json()["message"]
    late = Sandbox(channel, claimed, queued, "sbx-late", ttl_s=0.05)
    await asyncio.sleep(0.1)  # the token's own deadline, not a state to wait for
    answer = await late.report([started])
    assert answer.status_code == 401 and "deadline" in answer.json()["message"]
    assert await _journal(store) == [(1, "run_queued")]
    await ended.close()
    await late.close()


async def test_a_sandbox_that_is_no_longer_current_is_fenced(store: Store,
                                                             channel: ReportChannel) -> None:
    claimed = await _claimed(store)
    [queued] = await store.load_events(RUN)
    old = Sandbox(channel, claimed, queued, "sbx-old")
    # The run moves on: a new epoch (what a new owner's claim or a retake does), and a
    # new sandbox under it.
    lease = await store.retake_lease(claimed.lease, TTL)
    assert lease is not None
    new = Sandbox(channel, ClaimedRun(claimed.record, lease, "retry"), queued, "sbx-new")
    started = _after(queued, EventKind.RUN_STARTED)
    answer = await old.report([started])
    assert answer.status_code == 409 and answer.json()["error"] == "fenced"
    assert await _journal(store) == [(1, "run_queued")]
    answer = await new.report([started])
    assert answer.status_code == 200, answer.text
    assert await _journal(store) == [(1, "run_queued"), (2, "run_started")]
    await old.close()
    await new.close()
