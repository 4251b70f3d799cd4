"""``ratchet server`` against a real uvicorn on a free port, on both backends: every route,
every error status, tenant isolation for every route, and the journal as Server-Sent
Events (httpx-sse and ``curl -N``) received once and in order across a reconnect and a
worker killed mid-run. The API node here is API-only; runs are driven by worker processes
(tests/support/proc.py), so wake-ups cross processes as they do in production."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import crash_app
import httpx
import pytest
from httpx_sse import aconnect_sse, connect_sse
from proc import Harness
from serving import serving
from waiting import wait_for

from ratchet.store import tokens

ALL = ("runs:read", "runs:write", "admin")


@dataclass
class Api:
    base: str
    h: Harness
    clients: list[httpx.Client]

    def client(self, token: str | None) -> httpx.Client:
        """A client bearing ``token`` (none: anonymous), closed with the fixture."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.base, headers=headers, timeout=30)
        self.clients.append(client)
        return client

    @property
    def acme(self) -> httpx.Client:  # tenant acme, every scope
        return self.clients[0]

    @property
    def other(self) -> httpx.Client:  # tenant globex, every scope
        return self.clients[1]

    def token(
        self,
        tenant: str,
        scopes: tuple[str, ...] = ALL,
        name: str | None = None,
        expires_in: float | None = None,
    ) -> str:
        app = self.h.app
        extra = {} if expires_in is None else {"expires_in": expires_in}
        _, secret = app.portal.call(tokens.create_token(app.store, tenant, scopes, name, **extra))
        return secret

    def start(self, workflow: str, data: dict[str, Any], **extra: Any) -> str:
        r = self.acme.post("/v1/runs", json={"workflow": workflow, "input": data, **extra})
        assert r.status_code == 202, r.text
        return str(r.json()["run_id"])


TENANTS = (("acme", "acme-ops"), ("globex", "globex-ops"))


@contextmanager
def api_of(
    h: Harness, tenants: Sequence[tuple[str, str | None]] = TENANTS, **options: Any
) -> Iterator[Api]:
    """An API-only server on the harness's database (``create_app`` options as given), with
    a client per tenant (a token of each, named as given), closed at the end."""
    app = crash_app.build(h.db_url)
    try:
        with serving(app, workers=0, **options) as base:
            a = Api(base, h, [])
            for tenant, name in tenants:
                a.client(a.token(tenant, name=name))
            try:
                yield a
            finally:
                for client in a.clients:
                    client.close()
    finally:
        app.shutdown()


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h, heartbeat_s=0.3) as a:
        yield a


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The one error shape, with this status and code, and no stack trace."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "message", "details"} and body["error"] == code, body
    assert "Traceback" not in r.text
    return dict(body)


def frames(source: Any) -> Iterator[Any]:
    """The events of an SSE stream. httpx-sse turns a heartbeat comment after the first
    event into an empty "message" (it keeps the last id); browsers dispatch nothing."""
    for sse in source.iter_sse():
        if sse.data or sse.event != "message":
            yield sse


def engine_id(run_id: str, tenant: str = "acme") -> str:
    """The engine's id of a run the API names ``run_id`` for ``tenant`` (its namespace)."""
    return f"{tenant}~{run_id}"


def journal(h: Harness, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in h.app.events(engine_id(run_id))]


# -- starting runs --------------------------------------------------------------------------


def test_start_is_idempotent_by_run_id_and_by_key_and_refuses_bad_input(api: Api) -> None:
    body = {"workflow": "chain", "input": {"n": 2}, "run_id": "r-1"}
    first = api.acme.post("/v1/runs", json=body)
    assert first.status_code == 202 and first.json() == {"run_id": "r-1", "status": "queued"}
    again = api.acme.post("/v1/runs", json=body)
    assert again.status_code == 200 and again.json()["run_id"] == "r-1"
    problem(api.acme.post("/v1/runs", json=body | {"input": {"n": 3}}), 422, "invalid_input")

    key = {"Idempotency-Key": "order-77"}
    a = api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}}, headers=key)
    b = api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}}, headers=key)
    assert (a.status_code, b.status_code) == (202, 200)
    assert a.json()["run_id"] == b.json()["run_id"]
    problem(
        api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 2}}, headers=key),
        422,
        "invalid_input",
    )
    # Another tenant's same key is another run.
    c = api.other.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}}, headers=key)
    assert c.status_code == 202 and c.json()["run_id"] != a.json()["run_id"]

    unknown = problem(
        api.acme.post("/v1/runs", json={"workflow": "nope", "input": {}}), 422, "invalid_input"
    )
    assert "nope" in unknown["message"]
    bad = problem(
        api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": "many"}}),
        422,
        "invalid_input",
    )
    assert "'n'" in bad["message"] or " n" in bad["message"], bad
    missing = problem(api.acme.post("/v1/runs", json={"input": {}}), 422, "invalid_input")
    assert missing["details"][0]["field"] == "workflow"
    guarded = problem(
        api.acme.post(
            "/v1/runs", json={"workflow": "chain", "input": {}, "guards": {"max_steps": "lots"}}
        ),
        422,
        "invalid_input",
    )
    assert "max_steps must be an integer" in guarded["message"]
    # None of the refusals wrote a run.
    assert {r.run_id for r in api.h.app.runs()} == {
        engine_id("r-1"),
        engine_id(a.json()["run_id"]),
        engine_id(c.json()["run_id"], "globex"),
    }
    # Guard overrides go to the run's first event, where every drive reads them.
    run_id = api.start("chain", {"n": 1}, guards={"max_steps": 50})
    assert api.h.app.events(engine_id(run_id))[0].payload["guards"] == {"max_steps": 50}


def test_auth_statuses_and_the_body_limit(api: Api) -> None:
    problem(api.client(None).get("/v1/runs"), 401, "unauthorized")
    problem(api.client("rt_not-a-token").get("/v1/runs"), 401, "unauthorized")
    reader = api.client(api.token("acme", ("runs:read",)))
    assert reader.get("/v1/runs").status_code == 200
    denied = problem(
        reader.post("/v1/runs", json={"workflow": "chain", "input": {}}), 403, "forbidden"
    )
    assert denied["details"]["needed"] == "runs:write"
    problem(reader.get("/v1/dead-letters"), 403, "forbidden")
    big = {"workflow": "chain", "input": {"pad": "x" * (1 << 20)}}
    problem(api.acme.post("/v1/runs", json=big), 413, "payload_too_large")
    # Without a Content-Length (chunked), the body is counted as it arrives.
    chunks = (b"x" * 65536 for _ in range(20))
    problem(
        api.acme.post("/v1/runs", content=chunks, headers={"Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )

    # A revoked token is refused from then on.
    app = api.h.app
    secret = api.token("acme")
    assert api.client(secret).get("/v1/runs").status_code == 200
    found = [t for t in app.portal.call(tokens.list_tokens(app.store))]
    mine = next(t for t in found if app.portal.call(tokens.authenticate(app.store, secret)) == t)
    app.portal.call(tokens.revoke_token(app.store, mine.token_id))
    problem(api.client(secret).get("/v1/runs"), 401, "unauthorized")


# -- reading, waiting, acting -------------------------------------------------------------


def test_every_route_and_another_tenant_sees_none_of_it(api: Api) -> None:
    h = api.h
    done = api.start("chain", {"n": 2})
    parent = api.start("payout_parent", {"amount": 5})
    listening = api.start("listener", {})
    doomed = api.start("retrier", {"succeed_on": 9, "block_on": 0})
    asking = api.start("approver", {"amount": 12})
    h.spawn("w", lease_ttl=3.0, recovery_interval=0.5)

    result = api.acme.get(f"/v1/runs/{done}/result", params={"wait": 30})
    assert result.status_code == 200, result.text
    assert result.json() | {} == {
        "run_id": done,
        "status": "succeeded",
        "done": True,
        "output": ["out-1", "out-2"],
        "error": None,
    }
    detail = api.acme.get(f"/v1/runs/{done}").json()
    assert detail["input"] == {"n": 2} and detail["llm"]["calls"] == 0
    assert detail["children"] == []

    # The child parks on its approval; the parent lists it as a child.
    h.wait_parked(engine_id(parent), "child:")
    children = api.acme.get(f"/v1/runs/{parent}").json()["children"]
    assert [c["workflow"] for c in children] == ["payout"]
    kids = api.acme.get("/v1/runs", params={"parent": parent}).json()["runs"]
    assert [k["run_id"] for k in kids] == [children[0]["run_id"]]

    # Signals wake a waiting run; a finished run refuses them (409).
    h.wait_parked(engine_id(listening), "signal:go")
    sent = api.acme.post(f"/v1/runs/{listening}/signals/go", json={"data": {"k": 1}})
    assert sent.status_code == 202, sent.text
    assert api.acme.get(f"/v1/runs/{listening}/result?wait=30").json()["output"] == [
        "out-1",
        {"k": 1},
        "out-3",
    ]
    problem(api.acme.post(f"/v1/runs/{listening}/signals/go", json={}), 409, "conflict")

    # Approvals: decided once; a second decision conflicts.
    h.wait_parked(engine_id(asking), "approval:")
    step = h.app.approvals(engine_id(asking))[0].step_id
    decided = api.acme.post(
        f"/v1/runs/{asking}/approvals/{step}", json={"approved": True, "by": "ana", "comment": "ok"}
    )
    # Who decided is the token; the body's name is kept as a note.
    assert decided.status_code == 200, decided.text
    assert (decided.json()["by"], decided.json()["note"]) == ("acme-ops", "ana")
    problem(
        api.acme.post(f"/v1/runs/{asking}/approvals/{step}", json={"approved": False, "by": "bo"}),
        409,
        "conflict",
    )
    problem(
        api.acme.post(f"/v1/runs/{asking}/approvals/{step}", json={"by": "bo"}),
        422,
        "invalid_input",
    )
    assert api.acme.get(f"/v1/runs/{asking}/result?wait=30").json()["status"] == "succeeded"

    # Dead letters: listed, retried (it fails again: still a dead letter afterwards).
    h.wait_status(engine_id(doomed), "failed")
    letters = api.acme.get("/v1/dead-letters").json()
    assert [d["run_id"] for d in letters] == [doomed]
    retried = api.acme.post(f"/v1/dead-letters/{doomed}/retry")
    assert retried.status_code == 202 and retried.json()["status"] == "queued", retried.text
    problem(api.acme.post(f"/v1/dead-letters/{done}/retry"), 409, "conflict")

    # Cancel the parked parent (and its child with it).
    cancelled = api.acme.post(f"/v1/runs/{parent}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    child = api.acme.get(f"/v1/runs/{children[0]['run_id']}")
    assert child.json().get("status") == "cancelled", child.text

    names = {w["name"]: w for w in api.acme.get("/v1/workflows").json()}
    assert names["chain"]["parameters"] == ["n", "block_at"]

    # Listing: filters and a cursor that walks every run once.
    page = api.acme.get("/v1/runs", params={"status": "succeeded", "workflow": "chain"})
    assert [r["run_id"] for r in page.json()["runs"]] == [done]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        body = api.acme.get("/v1/runs", params=params).json()
        seen += [r["run_id"] for r in body["runs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(map(engine_id, seen)) == sorted(r.run_id for r in h.app.runs())
    assert len(seen) == 6
    created = [r.created_at for r in h.app.runs()]
    window = api.acme.get(
        "/v1/runs", params={"created_after": max(created), "created_before": max(created) + 1}
    ).json()
    assert len(window["runs"]) >= 1
    problem(api.acme.get("/v1/runs", params={"cursor": "%%%"}), 422, "invalid_input")
    problem(api.acme.get("/v1/runs", params={"status": "sleeping"}), 422, "invalid_input")

    page_events = api.acme.get(f"/v1/runs/{done}/events", params={"after_seq": 1}).json()
    assert [e["seq"] for e in page_events["events"]] == [s for s, _ in journal(h, done)][1:]
    assert page_events["done"] is True

    # Tenant isolation: globex sees none of acme's runs, on every route: 404 as if missing.
    assert api.other.get("/v1/runs").json()["runs"] == []
    assert api.other.get("/v1/dead-letters").json() == []
    for method, path, body in [
        ("GET", f"/v1/runs/{done}", None),
        ("GET", f"/v1/runs/{done}/result", None),
        ("GET", f"/v1/runs/{done}/events", None),
        ("POST", f"/v1/runs/{listening}/signals/go", {}),
        ("POST", f"/v1/runs/{asking}/cancel", None),
        ("POST", f"/v1/runs/{asking}/approvals/{step}", {"approved": True, "by": "eve"}),
        ("POST", f"/v1/dead-letters/{doomed}/retry", None),
    ]:
        theirs = problem(api.other.request(method, path, json=body), 404, "not_found")
        missing = problem(
            api.acme.request(
                method,
                path.replace(done, "nope")
                .replace(listening, "nope")
                .replace(asking, "nope")
                .replace(doomed, "nope"),
                json=body,
            ),
            404,
            "not_found",
        )
        assert theirs["message"].replace(path.split("/")[3], "X") == missing["message"].replace(
            "nope", "X"
        )
    sse = api.other.get(f"/v1/runs/{done}/events", headers={"Accept": "text/event-stream"})
    problem(sse, 404, "not_found")


def test_result_long_poll_answers_202_while_the_run_goes_on(api: Api) -> None:
    run_id = api.start("chain", {"n": 1})  # no worker: stays queued
    r = api.acme.get(f"/v1/runs/{run_id}/result", params={"wait": 0.2})
    assert r.status_code == 202 and r.json()["status"] == "queued" and not r.json()["done"]


def test_health_openapi_and_metrics(api: Api) -> None:
    anon = api.client(None)
    assert anon.get("/healthz").json() == {"status": "ok"}
    assert anon.get("/readyz").json() == {"status": "ready"}
    spec = anon.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/result",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/signals/{name}",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/approvals/{step_id}",
        "/v1/dead-letters",
        "/v1/dead-letters/{run_id}/retry",
        "/v1/workflows",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    assert "Error" in spec["components"]["schemas"]
    api.start("chain", {"n": 1})
    text = anon.get("/metrics").text
    assert "ratchet_api_runs_started_total 1.0" in text
    assert 'ratchet_runs{status="queued"} 1.0' in text
    assert "ratchet_queue_depth 1.0" in text and "ratchet_sse_subscribers 0.0" in text


# -- the journal as Server-Sent Events -----------------------------------------------------


@pytest.mark.crash
def test_sse_delivers_every_event_once_in_order_across_a_reconnect_and_a_worker_kill(
    api: Api,
) -> None:
    h = api.h
    run_id = api.start("chain", {"n": 4, "block_at": [2, 4]})
    a = h.spawn("a", lease_ttl=1.5, recovery_interval=60.0)
    got: list[tuple[int, str, dict[str, Any]]] = []
    headers = {"Accept": "text/event-stream"}
    url = f"/v1/runs/{run_id}/events"

    # First connection: read until step 2 has started (its code blocks on its gate), then
    # drop the connection.
    with connect_sse(api.acme, "GET", url, headers=headers) as source:
        for sse in frames(source):
            data = sse.json()
            got.append((int(sse.id), sse.event, data))
            assert data["seq"] == int(sse.id) and data["kind"] == sse.event
            if sse.event == "step_started" and data["step_id"] == "2:work":
                break
    h.wait_invoked("2:work")
    a.kill()  # SIGKILL mid-step: step 2 is started and not completed
    h.spawn("b", lease_ttl=1.5, recovery_interval=0.2)

    # Second connection resumes after the last id seen; the new worker re-drives step 2.
    with connect_sse(
        api.acme, "GET", url, headers=headers | {"Last-Event-ID": str(got[-1][0])}
    ) as source:
        for sse in frames(source):
            got.append((int(sse.id), sse.event, sse.json()))
            if sse.event == "step_started" and sse.json()["step_id"] == "2:work":
                h.open_gate("step-2")
            if sse.event == "step_started" and sse.json()["step_id"] == "4:work":
                h.open_gate("step-4")
        # The stream ended by itself, after the terminal event.
    assert got[-1][1] == "run_succeeded"
    assert [(s, k) for s, k, _ in got] == journal(h, run_id)  # each once, in order
    assert [s for s, _, _ in got] == list(range(1, len(got) + 1))
    assert any(k == "run_resumed" for _, k, _ in got)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_n_receives_the_whole_journal_and_heartbeats(api: Api) -> None:
    h = api.h
    run_id = api.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(engine_id(run_id), "signal:go")
    token = api.token("acme", ("runs:read",))
    curl = subprocess.Popen(
        [
            "curl",
            "-sS",
            "-N",
            f"{api.base}/v1/runs/{run_id}/events",
            "-H",
            f"Authorization: Bearer {token}",
            "-H",
            "Accept: text/event-stream",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert curl.stdout is not None
    lines: list[str] = []
    # The run is parked: the stream idles with heartbeats (every 0.3 s here) until woken.
    while ": heartbeat" not in lines:
        line = curl.stdout.readline().decode()
        assert line, f"curl ended early: {curl.stderr.read() if curl.stderr else b''!r}"
        lines.append(line.rstrip("\n"))
    assert api.acme.post(f"/v1/runs/{run_id}/signals/go", json={"data": 1}).status_code == 202
    out, err = curl.communicate(timeout=30)
    assert curl.returncode == 0, err
    lines += out.decode().splitlines()
    frames = [ln for ln in lines if ln and not ln.startswith(":")]
    ids = [int(ln[4:]) for ln in frames if ln.startswith("id: ")]
    kinds = [ln[7:] for ln in frames if ln.startswith("event: ")]
    datas = [json.loads(ln[6:]) for ln in frames if ln.startswith("data: ")]
    assert list(zip(ids, kinds, strict=True)) == journal(h, run_id)
    assert [(d["seq"], d["kind"]) for d in datas] == journal(h, run_id)
    assert kinds[-1] == "run_succeeded"


def test_sse_resumes_from_after_seq_and_refuses_a_bad_last_event_id(api: Api) -> None:
    h = api.h
    run_id = api.start("chain", {"n": 1})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(engine_id(run_id), "succeeded")
    with connect_sse(
        api.acme,
        "GET",
        f"/v1/runs/{run_id}/events?after_seq=2",
        headers={"Accept": "text/event-stream"},
    ) as source:
        seqs = [int(sse.id) for sse in frames(source)]
    assert seqs == [s for s, _ in journal(h, run_id)][2:]
    problem(
        api.acme.get(
            f"/v1/runs/{run_id}/events",
            headers={"Accept": "text/event-stream", "Last-Event-ID": "x"},
        ),
        422,
        "invalid_input",
    )
    wait_for(
        lambda: "ratchet_sse_subscribers 0.0" in api.acme.get("/metrics").text,
        what="the stream's subscriber to be gone",
    )


def scrape(client: httpx.Client) -> dict[str, float]:
    """``/metrics`` as {sample line's name and labels: value}."""
    samples = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_embedded_workers_drive_runs_and_count_them_in_metrics(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded worker runs crash_app's steps in this process: they log here.
    monkeypatch.setenv("CRASH_LOG", str(h.invocation_log))
    monkeypatch.setenv("CRASH_GATES", str(h.gates))
    app = crash_app.build(h.db_url)
    _, secret = h.app.portal.call(tokens.create_token(h.app.store, "acme", ALL))
    try:
        with (
            serving(app, workers=1) as base,
            httpx.Client(
                base_url=base, timeout=30, headers={"Authorization": f"Bearer {secret}"}
            ) as client,
        ):
            before = scrape(client)
            run_id = client.post("/v1/runs", json={"workflow": "chain", "input": {"n": 3}}).json()[
                "run_id"
            ]
            assert client.get(f"/v1/runs/{run_id}/result?wait=30").json()["output"] == [
                "out-1",
                "out-2",
                "out-3",
            ]
            after = scrape(client)
    finally:
        app.shutdown()
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 1}

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew('ratchet_runs_finished_total{status="succeeded"}') == 1
    assert grew("ratchet_runs_claimed_total") == 1
    assert grew('ratchet_step_duration_seconds_count{outcome="completed"}') == 3
    assert grew('ratchet_step_duration_seconds_bucket{le="+Inf",outcome="completed"}') == 3
    assert "ratchet_sweep_lease_steals_total" in after
    assert "ratchet_runs_reclaimed_total" in after
    assert grew("ratchet_api_runs_started_total") == 1


async def test_fifty_subscribers_of_one_run_each_receive_every_event_once_in_order(
    api: Api,
) -> None:
    h = api.h
    run_id = api.start("chain", {"n": 5, "block_at": [1]})
    token = api.token("acme", ("runs:read",))
    n = 50
    url = f"/v1/runs/{run_id}/events"
    async with httpx.AsyncClient(
        base_url=api.base,
        timeout=30,
        headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
    ) as client:

        async def subscribe() -> list[tuple[int, str]]:
            got = []
            async with aconnect_sse(client, "GET", url) as source:
                async for sse in source.aiter_sse():
                    if sse.data:
                        got.append((int(sse.id), sse.event))
            return got

        streams = [asyncio.create_task(subscribe()) for _ in range(n)]
        # Every stream is open (and has read the queued event) before the run goes on.
        await asyncio.to_thread(
            wait_for,
            lambda: f"ratchet_sse_subscribers {n}.0" in api.acme.get("/metrics").text,
            what=f"{n} subscribers",
        )
        h.spawn("w", lease_ttl=3.0)
        await asyncio.to_thread(h.wait_invoked, "1:work")
        h.open_gate("step-1")
        results = await asyncio.gather(*streams)
    expected = journal(h, run_id)
    assert expected[-1][1] == "run_succeeded"
    assert all(got == expected for got in results)
