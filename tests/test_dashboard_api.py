"""What the dashboard reads through the API, on both backends and a real uvicorn: a run's
state at any seq is the engine's fold over the journal cut there, its waterfall and a step's
detail; and the browser sessions behind the pages (expiry, revocation, sign-out)."""

from __future__ import annotations

from collections.abc import Iterator

import crash_app
import httpx
import pytest
from proc import Harness
from serving import serving

from ratchet.model import fold, idempotency_key
from ratchet.store import Store, sessions, tokens


@pytest.fixture
def client(h: Harness) -> Iterator[httpx.Client]:
    app = crash_app.build(h.db_url)
    try:
        with serving(app, workers=0) as base:
            _, secret = h.app.portal.call(
                tokens.create_token(h.app.store, "acme", ("runs:read", "runs:write"))
            )
            with httpx.Client(
                base_url=base, timeout=30, headers={"Authorization": f"Bearer {secret}"}
            ) as c:
                yield c
    finally:
        app.shutdown()


def test_state_at_each_seq_is_the_engines_fold(h: Harness, client: httpx.Client) -> None:
    r = client.post(
        "/v1/runs", json={"workflow": "retrier", "input": {"succeed_on": 2, "block_on": 0}}
    )
    run_id = r.json()["run_id"]
    engine_id = f"acme~{run_id}"  # the API speaks the tenant's ids, the engine its own
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(engine_id, "succeeded")
    journal = h.app.events(engine_id)
    for k in range(len(journal) + 1):
        state = client.get(f"/v1/runs/{run_id}/state", params={"at_seq": k}).json()
        folded = fold(engine_id, journal[:k])
        assert state["last_seq"] == folded.last_seq == k
        assert state["status"] == str(folded.status) and state["drives"] == folded.drives
        assert [(s["step_id"], s["status"], s["attempt"], s["output"]) for s in state["steps"]] == [
            (s.step_id, s.status, s.attempt, s.output) for s in folded.steps.values()
        ]
        wf = client.get(f"/v1/runs/{run_id}/waterfall", params={"at_seq": k}).json()
        assert wf["last_seq"] == k
        assert [row["step_id"] for row in wf["rows"]] == list(folded.steps)
    whole = client.get(f"/v1/runs/{run_id}/state").json()
    assert whole["status"] == "succeeded" and whole["output"] == "ok on attempt 2"
    assert whole["last_seq"] == len(journal)
    bad = client.get(f"/v1/runs/{run_id}/state", params={"at_seq": -1})
    assert bad.status_code == 422 and bad.json()["details"][0]["field"] == "at_seq"

    detail = client.get(f"/v1/runs/{run_id}/step", params={"step_id": "1:flaky"}).json()
    assert detail["run_id"] == run_id
    assert detail["idempotency_key"] == idempotency_key(engine_id, "1:flaky", 2)
    assert detail["lease_epoch"] == h.lease(engine_id)[1]
    assert detail["state"]["attempts_used"] == 2
    assert [e["kind"] for e in detail["events"]] == [
        "step_started",
        "step_retrying",
        "step_started",
        "step_completed",
    ]
    missing = client.get(f"/v1/runs/{run_id}/step", params={"step_id": "9:nope"})
    assert missing.status_code == 404 and "9:nope" in missing.json()["message"]

    spec = client.get("/openapi.json").json()
    assert {
        "/v1/runs/{run_id}/state",
        "/v1/runs/{run_id}/waterfall",
        "/v1/runs/{run_id}/step",
    } <= set(spec["paths"])
    assert {"RunStateOut", "WaterfallOut", "StepDetail"} <= set(spec["components"]["schemas"])
    assert not any(p.startswith(("/runs", "/signin", "/ui")) for p in spec["paths"])


def test_another_tenant_gets_404_from_every_dashboard_route(
    h: Harness, client: httpx.Client
) -> None:
    run_id = client.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}}).json()["run_id"]
    _, other = h.app.portal.call(tokens.create_token(h.app.store, "globex", ("admin",)))
    for path in ("state", "waterfall", "step?step_id=1:work"):
        r = client.get(f"/v1/runs/{run_id}/{path}", headers={"Authorization": f"Bearer {other}"})
        assert r.status_code == 404, r.text


async def test_sessions_expire_end_with_their_token_and_on_sign_out(store: Store) -> None:
    token, _ = await tokens.create_token(store, "acme", ("runs:read",))
    secret = await sessions.open_session(store, token, ttl_s=60)
    assert await sessions.session_token(store, secret) == token
    assert await sessions.session_token(store, secret + "x") is None
    store.clock.advance(61)
    assert await sessions.session_token(store, secret) is None  # expired

    again = await sessions.open_session(store, token)
    assert await sessions.session_token(store, again) == token
    await sessions.close_session(store, again)
    assert await sessions.session_token(store, again) is None  # signed out

    third = await sessions.open_session(store, token)
    await tokens.revoke_token(store, token.token_id)
    assert await sessions.session_token(store, third) is None  # its token was revoked
    assert sessions.csrf_matches(third, sessions.csrf_token(third))
    assert not sessions.csrf_matches(third, None)
    assert not sessions.csrf_matches(third, sessions.csrf_token(secret))


# -- a run's story ---------------------------------------------------------------------------


def test_a_run_tells_its_story_input_drives_duration_and_the_steps_arguments(
    h: Harness, client: httpx.Client
) -> None:
    given = {"succeed_on": 2, "block_on": 0}
    run_id = client.post("/v1/runs", json={"workflow": "retrier", "input": given}).json()["run_id"]
    engine_id = f"acme~{run_id}"
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(engine_id, "succeeded")
    run = client.get(f"/v1/runs/{run_id}").json()
    assert run["input"] == given  # as it was given, not the stored {"args", "kwargs"}
    assert run["output"] == "ok on attempt 2" and run["traceback"] is None
    assert run["duration_s"] > 0 and run["llm"]["calls"] == 0
    [drive] = run["drives"]
    assert (drive["drive"], drive["worker_id"], drive["reason"], drive["ended"]) == (
        1,
        "w",
        "claim",
        "succeeded",
    )
    assert drive["label"] == "drive 1 by w: succeeded"
    # The step's input: what it was called with, by parameter name.
    detail = client.get(f"/v1/runs/{run_id}/step", params={"step_id": "1:flaky"}).json()
    assert detail["args"] == given and detail["args_journaled"] is True
    assert detail["input"]["args"] == given  # the step_started payload, as before
    retrying = [e for e in detail["events"] if e["kind"] == "step_retrying"]
    assert "ToolError: attempt 1 failed" in retrying[0]["payload"]["traceback"]
    assert "in flaky" in retrying[0]["payload"]["traceback"]
    wf = client.get(f"/v1/runs/{run_id}/waterfall").json()
    assert [d["label"] for d in wf["drives"]] == ["drive 1 by w: succeeded"]


def test_a_failed_run_gives_its_traceback_and_a_cancel_names_who_asked(
    h: Harness, client: httpx.Client
) -> None:
    failing = {"succeed_on": 9, "block_on": 0}
    run_id = client.post("/v1/runs", json={"workflow": "retrier", "input": failing}).json()[
        "run_id"
    ]
    parked = client.post("/v1/runs", json={"workflow": "listener"}).json()["run_id"]
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(f"acme~{run_id}", "failed")
    run = client.get(f"/v1/runs/{run_id}").json()
    assert run["failed_step"] == "1:flaky"
    assert "in flaky" in run["traceback"]
    assert run["traceback"].rstrip().endswith("ToolError: attempt 3 failed")
    assert run["drives"][0]["ended"] == "failed, dead-lettered (step_failed)"
    step = client.get(f"/v1/runs/{run_id}/step", params={"step_id": "1:flaky"}).json()
    assert step["state"]["traceback"] == run["traceback"]

    h.wait_status(f"acme~{parked}", "waiting")
    _, ana = h.app.portal.call(
        tokens.create_token(h.app.store, "acme", ("runs:read", "runs:write"), "ana")
    )
    r = client.post(f"/v1/runs/{parked}/cancel", headers={"Authorization": f"Bearer {ana}"})
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    [ended] = [e for e in h.app.events(f"acme~{parked}") if e.kind == "run_cancelled"]
    assert ended.payload == {"by": "ana"}
    drives = client.get(f"/v1/runs/{parked}").json()["drives"]
    assert drives[-1]["ended"] == "parked (signal), cancelled by ana"
