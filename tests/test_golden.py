"""Golden journals: recorded runs replayed against today's code.

Each file in ``tests/golden/`` is the journal of a real run, committed. Loading it into a
fresh database and letting a worker re-drive it must reuse every recorded step output
(no step code runs again), and a workflow whose step order changed must fail the run with
a non-determinism error that names both steps.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

import ratchet
from ratchet.model import Event, RunStatus, dumps
from ratchet.store.base import Tx

GOLDEN = Path(__file__).parent / "golden"


def _load(name: str) -> tuple[dict[str, Any], list[Event]]:
    data = json.loads((GOLDEN / name).read_text())
    events = [
        Event(
            e["run_id"],
            e["seq"],
            e["kind"],
            e["step_id"],
            e["attempt"],
            e["payload"],
            e["at"],
            e["prev_hash"],
            e["hash"],
        )
        for e in data["events"]
    ]
    return data, events


def _to_the_microsecond(events: list[Event]) -> list[Event]:
    return [dataclasses.replace(e, at=round(e.at, 6)) for e in events]


def _install(
    app: ratchet.Ratchet, data: dict[str, Any], events: list[Event], version: str = "1"
) -> str:
    """Write the recorded run and its journal as they were, then mark it ready to drive."""
    run_id = events[0].run_id

    def body(tx: Tx) -> None:
        tx.run(
            "run_insert",
            {
                "run_id": run_id,
                "workflow": data["workflow"],
                "workflow_version": version,
                "input": dumps(data["input"]),
                "parent_run_id": None,
                "parent_step_id": None,
                "queue": "default",
                "priority": 0,
                "tenant_id": "default",
                "tags": "{}",
                "concurrency_key": None,
            },
        )
        app.store._insert_events(tx, events)

    app.portal.call(app.store._run(body))
    return run_id


def _research_app(db_url: str, calls: Counter[str], reorder: bool) -> ratchet.Ratchet:
    app = ratchet.Ratchet(db_url, lease_ttl=3)

    @app.step()
    async def search(q: str) -> list[str]:
        calls["search"] += 1
        return [f"{q}-1", f"{q}-2"]

    @app.step()
    async def read(url: str) -> str:
        calls["read"] += 1
        return f"text of {url}"

    @app.step()
    async def summarize(texts: list[str]) -> str:
        calls["summarize"] += 1
        return " | ".join(texts)

    @app.workflow(name="research")
    async def research(q: str) -> dict[str, str]:
        if reorder:  # the code changed: reading before searching
            texts = [await read(q)]
            await search(q)
        else:
            urls = await search(q)
            texts = [await read(u) for u in urls]
        decision = await ratchet.wait_for_signal("approve")
        return {"summary": await summarize(texts), "by": decision["by"]}

    return app


def test_golden_journal_replays_without_running_recorded_steps(db_url: str) -> None:
    data, events = _load("research_waiting_on_signal.json")
    calls: Counter[str] = Counter()
    app = _research_app(db_url, calls, reorder=False)
    try:
        run_id = _install(app, data, events)
        app.launch()
        app.signal(run_id, "approve", {"by": "ana"})
        result = app.result(run_id, timeout_s=15)
        assert result == {
            "summary": "text of durable engines-1 | text of durable engines-2",
            "by": "ana",
        }
        assert calls == {"summarize": 1}  # search and read came from the journal
        journal = app.events(run_id)
        # The recorded prefix is untouched (PostgreSQL keeps times to the microsecond, the
        # precision the hashes cover).
        assert _to_the_microsecond(journal[: len(events)]) == _to_the_microsecond(events)
        assert [e.seq for e in journal] == list(range(1, len(journal) + 1))
        # The hash chain runs unbroken from the recorded events into today's.
        assert all(e.verify() for e in journal)
        assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(journal))
    finally:
        app.shutdown()


def test_golden_journal_against_reordered_code_is_non_deterministic(db_url: str) -> None:
    data, events = _load("research_waiting_on_signal.json")
    calls: Counter[str] = Counter()
    app = _research_app(db_url, calls, reorder=True)
    try:
        run_id = _install(app, data, events)
        # Sent before a worker is there: the reordered code fails the run at its first
        # replayed step, and a signal to a finished run is refused.
        app.signal(run_id, "approve", {"by": "ana"})
        app.launch()
        with pytest.raises(ratchet.RunFailed) as err:
            app.result(run_id, timeout_s=15)
        message = str(err.value)
        assert "NonDeterminismError" in message
        assert "position 1" in message and "'1:search'" in message and "'1:read'" in message
        assert sum(calls.values()) == 0  # nothing ran on a guess
        wait_for(lambda: app.get(run_id).status == RunStatus.FAILED, what="the run failed")
        assert app.dead_letters()[0].reason == "non_determinism"
    finally:
        app.shutdown()


def test_golden_graph_journal_replays_its_pinned_version_without_running_recorded_nodes(
    db_url: str,
) -> None:
    """A graph run recorded after a loop of two tool nodes (its worker gone before the
    approval node): the graph's content hash is still the version it recorded, and the
    re-drive reads the loop from the journal, asks the approval and finishes, even with
    an edited graph registered since."""
    data, events = _load("graph_scoring_after_loop.json")
    calls: Counter[str] = Counter()
    app = ratchet.Ratchet(db_url, lease_ttl=3)

    @app.tool
    async def score(account: str) -> int:
        """Score."""
        calls["score"] += 1
        return len(account)

    @app.tool
    async def tag(label: str) -> str:
        """Tag."""
        calls["tag"] += 1
        return label.upper()

    try:
        recorded = events[0].payload["version"]
        assert app.graph(data["graph"]) == recorded  # the content hash is stable
        edited = json.loads(json.dumps(data["graph"]))
        edited["nodes"][2]["data"]["args"]["account"] = "{{ account }}!"
        assert app.graph(edited) != recorded
        run_id = _install(app, data, events, version=recorded)
        app.launch()  # the drive replays the loop and asks the approval
        (asked,) = wait_for(lambda: app.approvals(run_id), what="the approval")
        assert (asked.step_id, asked.data) == ("3:approval:ok", {"scores": [2, 4]})
        app.approve(run_id, asked.step_id, by="ana")
        assert app.result(run_id, timeout_s=15) == {"scores": [2, 4], "by": "ANA"}
        assert calls == {"tag": 1}  # the loop's nodes came from the journal
        journal = app.events(run_id)
        assert _to_the_microsecond(journal[: len(events)]) == _to_the_microsecond(events)
        assert [e.step_id for e in journal[len(events) :] if e.kind == "step_completed"] == [
            "3:approval:ok",
            "4:label",
        ]
        assert all(e.verify() for e in journal)
        assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(journal))
    finally:
        app.shutdown()
