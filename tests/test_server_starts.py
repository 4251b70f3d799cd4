"""Deduplicated, debounced and delayed starts through ``POST /v1/runs`` and
``POST /v1/runs:batch`` against a real uvicorn, and ``ratchet start``, on both backends: a
duplicate is 409 naming the run (the tenant's own id), tenants never meet, bad options are
refused naming the field with nothing written."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirun import ok, refused
from proc import Harness
from test_server import Api, api_of, engine_id, problem

import ratchet
from ratchet.model import RunStatus


@pytest.fixture
def served(h: Harness) -> Iterator[Api]:
    """An API-only server on the harness's database, with clients of two tenants."""
    with api_of(h, (("acme", None), ("globex", None))) as a:
        yield a


def _count(api: Api) -> int:
    return len(api.h.app.runs(limit=1000))


def test_start_options_on_post_runs_and_tenants_never_meet(served: Api) -> None:
    api = served
    order = {"workflow": "chain", "input": {"n": 1}, "dedup_id": "order-7"}
    first = api.acme.post("/v1/runs", json=order)
    assert first.status_code == 202, first.text
    held = first.json()["run_id"]
    dup = problem(api.acme.post("/v1/runs", json=order), 409, "conflict")
    assert dup["details"] == {"run_id": held} and held in dup["message"]
    assert "acme~" not in dup["message"]
    # Another tenant's dedup id of the same text is its own: not blocked, and not shown.
    theirs = api.other.post("/v1/runs", json=order)
    assert theirs.status_code == 202, theirs.text
    assert problem(api.acme.post("/v1/runs", json=order), 409, "conflict")["details"] == {
        "run_id": held
    }
    dup_b = problem(api.other.post("/v1/runs", json=order), 409, "conflict")
    assert dup_b["details"] == {"run_id": theirs.json()["run_id"]}
    assert api.h.app.get(engine_id(theirs.json()["run_id"], "globex")).tenant_id == "globex"

    # Debounced: one run, the latest input, the same id for each start; per tenant.
    doc = {"workflow": "chain", "debounce": {"key": "doc-42", "wait_s": 60}}
    a = api.acme.post("/v1/runs", json=doc | {"input": {"n": 1}})
    b = api.acme.post("/v1/runs", json=doc | {"input": {"n": 2}})
    assert (a.status_code, b.status_code) == (202, 200), (a.text, b.text)
    assert a.json() == b.json() == {"run_id": a.json()["run_id"], "status": "waiting"}
    assert api.h.app.get(engine_id(a.json()["run_id"])).input == {"args": [], "kwargs": {"n": 2}}
    c = api.other.post("/v1/runs", json=doc | {"input": {"n": 3}})
    assert c.status_code == 202 and c.json()["run_id"] != a.json()["run_id"]
    assert api.h.app.get(engine_id(a.json()["run_id"])).input["kwargs"] == {"n": 2}

    # Delayed: stored now, waiting for its time.
    for when in ({"delay_s": 60}, {"start_at": "2030-01-01T09:30:00+02:00"}):
        r = api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}} | when)
        assert r.status_code == 202 and r.json()["status"] == "waiting", r.text
        rec = api.h.app.get(engine_id(r.json()["run_id"]))
        assert rec.status == RunStatus.WAITING and rec.not_before is not None
    assert rec.not_before == 1893483000.0

    # Bad options: refused naming the field, nothing written.
    before = _count(api)
    base: dict[str, Any] = {"workflow": "chain", "input": {"n": 1}}
    bad: dict[str, Any]
    for bad, field in (
        ({"start_at": "2030-01-01T09:30:00"}, "start_at"),
        ({"start_at": "next tuesday"}, "start_at"),
        ({"start_at": "2030-01-01T09:30:00Z", "delay_s": 5}, "start_at"),
        ({"debounce": {"key": "k", "wait_s": 1}, "dedup_id": "d"}, "debounce"),
        ({"debounce": {"key": "k", "wait_s": 1}, "run_id": "r"}, "debounce"),
    ):
        said = problem(api.acme.post("/v1/runs", json=base | bad), 422, "invalid_input")
        assert said["message"].startswith(f"{field}: "), said
    for bad, field in (
        ({"delay_s": "5"}, "delay_s"),
        ({"delay_s": -1}, "delay_s"),
        ({"debounce": {"key": "k", "wait_s": 0}}, "debounce.wait_s"),
        ({"debounce": {"key": "", "wait_s": 1}}, "debounce.key"),
        ({"debounce": {"key": "k"}}, "debounce.wait_s"),
        ({"dedup_id": ""}, "dedup_id"),
        ({"dedup_id": 7}, "dedup_id"),
    ):
        said = problem(api.acme.post("/v1/runs", json=base | bad), 422, "invalid_input")
        assert [d["field"] for d in said["details"]] == [field], said
    assert _count(api) == before


def test_start_options_on_a_batch(served: Api) -> None:
    api = served
    body = {
        "runs": [
            {"workflow": "chain", "input": {"n": 1}, "dedup_id": "b-1"},
            {"workflow": "chain", "input": {"n": 1}, "delay_s": 30},
            {"workflow": "chain", "input": {"n": 1}, "debounce": {"key": "d", "wait_s": 30}},
            {"workflow": "chain", "input": {"n": 2}, "debounce": {"key": "d", "wait_s": 30}},
        ]
    }
    r = api.acme.post("/v1/runs:batch", json=body)
    assert r.status_code == 202, r.text
    runs = r.json()["runs"]
    assert [x["status"] for x in runs] == ["queued", "waiting", "waiting", "waiting"]
    assert [x["created"] for x in runs] == [True, True, True, False]
    assert runs[2]["run_id"] == runs[3]["run_id"]
    before = _count(api)
    dup = {
        "runs": [
            {"workflow": "chain", "input": {"n": 1}, "dedup_id": "b-2"},
            {"workflow": "chain", "input": {"n": 1}, "dedup_id": "b-1"},
        ]
    }
    said = problem(api.acme.post("/v1/runs:batch", json=dup), 409, "conflict")
    assert said["details"] == {"run_id": runs[0]["run_id"]} and "item 1" in said["message"]
    # The other tenant's batch with the same dedup ids is its own.
    assert api.other.post("/v1/runs:batch", json=dup).status_code == 202
    after_other = _count(api)
    assert after_other == before + 2
    bad = {
        "runs": [
            {"workflow": "chain", "input": {"n": 1}, "dedup_id": "b-9"},
            {"workflow": "chain", "input": {"n": 1}, "start_at": "2030-01-01"},
        ]
    }
    said = problem(api.acme.post("/v1/runs:batch", json=bad), 422, "invalid_input")
    assert said["details"][0]["field"] == "runs[1].start_at", said
    assert _count(api) == after_other


SHOP_APP = textwrap.dedent("""
    import ratchet

    app = ratchet.Ratchet("sqlite:///not-this-one.db")

    @app.workflow()
    async def order(sku: str) -> str:
        return sku
""")


def test_ratchet_start_takes_a_dedup_id_a_delay_and_a_time(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "starts_shop.py").write_text(SHOP_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "starts_shop", raising=False)
    start = ("start", "order", "--app", "starts_shop:app", "--db", db_url)
    one = '{"sku": "a-1"}'
    held = ok(*start, "--input", one, "--dedup-id", "order-7").stdout.strip()
    line = refused(2, *start, "--input", one, "--dedup-id", "order-7")
    assert "order-7" in line and held in line, line
    delayed = ok(*start, "--input", one, "--delay", "60").stdout.strip()
    timed = ok(*start, "--input", one, "--start-at", "2030-01-01T00:00:00Z").stdout.strip()
    line = refused(2, *start, "--input", one, "--start-at", "2030-01-01T00:00:00")
    assert "start_at: " in line and "no time zone" in line, line
    line = refused(2, *start, "--input", one, "--start-at", "2030-01-01T00:00:00Z", "--delay", "1")
    assert "not both" in line, line
    assert "starts at 2030-01-01 00:00:00 UTC" in ok("--db", db_url, "show", timed).stdout
    with ratchet.Ratchet(db_url) as client:
        assert client.get(delayed).status == RunStatus.WAITING
        assert client.get(timed).not_before == 1893456000.0
        assert len(client.runs()) == 3


def test_ratchet_start_gives_a_run_its_tags_and_concurrency_key(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tagged_shop.py").write_text(SHOP_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "tagged_shop", raising=False)
    start = ("start", "order", "--app", "tagged_shop:app", "--db", db_url, "--input")
    one = '{"sku": "a-1"}'
    run_id = ok(
        *start, one, "--tag", "team=search", "--tag", "env=prod", "--concurrency-key", "acme"
    ).stdout.strip()
    with ratchet.Ratchet(db_url) as client:
        rec = client.get(run_id)
        assert (rec.tags, rec.concurrency_key) == ({"team": "search", "env": "prod"}, "acme")
    found = ok("--db", db_url, "runs", "--tag", "team=search", "--json").stdout
    assert run_id in found
    # Refused before anything is written, naming the flag.
    assert "--tag" in refused(2, *start, one, "--tag", "no-equals-sign")
    assert "--tag" in refused(2, *start, one, "--tag", "a=1", "--tag", "a=2")
    line = refused(2, *start, one, "--concurrency-key", "x" * 500)
    assert "concurrency key" in line, line
    with ratchet.Ratchet(db_url) as client:
        assert [r.run_id for r in client.runs()] == [run_id]


def test_ratchet_start_through_a_server_sends_tags_and_key(served: Api) -> None:
    secret = served.token("acme")
    run_id = ok(
        "start",
        "chain",
        "--server",
        served.base,
        "--token",
        secret,
        "--input",
        '{"n": 1}',
        "--tag",
        "team=search",
        "--concurrency-key",
        "k1",
    ).stdout.strip()
    shown = served.acme.get(f"/v1/runs/{run_id}").json()
    assert (shown["tags"], shown["concurrency_key"]) == ({"team": "search"}, "k1")
    assert served.h.app.get(engine_id(run_id, "acme")).concurrency_key == "acme/k1"
