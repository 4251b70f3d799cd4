"""Graph runs under SIGKILL, with real worker processes (tests/support/graph_app.py) on SQLite and
PostgreSQL: killed after every node of the example graph, the run still succeeds with each
node run once and the webhook delivered once; killed inside iteration k of a loop, it
resumes at k; a parent killed while its subagent works finds that child again; killed
again and again in a graph of loops and branches, it takes the route an uncrashed run
takes."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import graph_app
import pytest
from proc import Harness
from receivers import HttpReceiver
from waiting import wait_for

from ratchet.llm.server import LocalProvider
from ratchet.model import EventKind, RunStatus

pytestmark = [
    pytest.mark.crash,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WORKER = "w-graph"  # every worker takes this id, so each reclaims the last one's runs at once


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, graph_app)
    try:
        yield harness
    finally:
        harness.close()
        gc.collect()


def completed(h: Harness, run_id: str) -> Counter[str]:
    return Counter(
        e.step_id for e in h.app.events(run_id) if e.kind == EventKind.STEP_COMPLETED and e.step_id
    )


def test_killed_after_every_node_the_example_graph_runs_each_node_once(
    h: Harness, provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    with HttpReceiver() as receiver:
        run_id = h.app.start(
            "enrich-accounts", {"accounts": ["Acme", "Globex"], "webhook": receiver.url + "/hook"}
        )
        kills = 0
        for i in range(20):
            # Each worker dies right after it commits its first step_completed: the next
            # one must take the run from there.
            h.spawn(
                f"w{i}",
                worker_id=WORKER,
                crash_at="after_step_completed:1",
                env_extra={"CRASH_LLM_URL": base},
            )

            def moved() -> str | None:
                rec = h.app.get(run_id)
                if rec.status == RunStatus.FAILED:
                    raise AssertionError(f"run failed: {rec.error}\n{h.worker_logs()}")
                if rec.status == RunStatus.SUCCEEDED:
                    return "succeeded"
                if not h.procs[-1].alive():
                    return "killed"
                if rec.status == RunStatus.WAITING and h.app.approvals(run_id):
                    return "asked"
                return None

            what = wait_for(
                moved, timeout=30, what=f"worker w{i} to move the run", detail=h.worker_logs
            )
            h.procs[-1].kill()
            if what == "succeeded":
                break
            if what == "killed":
                kills += 1
            else:  # parked on the approval: decided while no worker runs
                (asked,) = h.app.approvals(run_id)
                assert asked.data["top"] in ("Acme", "Globex")
                h.app.approve(run_id, asked.step_id, by="ana")
        out = h.app.result(run_id, timeout_s=5)
        assert out == {"top": asked.data["top"], "approved": True, "delivered": True}
        steps = completed(h, run_id)
        assert list(steps) == [
            "1:load",
            "2:each#0/enrich",
            "3:each#1/enrich",
            "4:rank",
            "5:summarize",
            "6:approval:approve",
            "7:forecast",
            "8:notify",
        ]
        assert set(steps.values()) == {1}
        # A kill after each step node but the approval (decided here, by no worker) and the
        # webhook, whose completion commits with the run's end.
        assert kills == 6
        # Each node's code ran once: the tools by the invocation log, the model calls by
        # the provider (one request and one bill per step key), the webhook by the
        # receiver (one request).
        assert h.calls() == {"1:load": 1, "4:rank": 1}
        keys = [r["idempotency_key"] for r in server.requests()]
        assert len(keys) == 4 and len(set(keys)) == 4
        assert server.stats()["billed_calls"] == 4
        assert len(receiver.requests) == 1
        assert [r.status for r in h.app.receipts(run_id)] == ["settled"]


def test_a_crash_in_iteration_k_of_a_loop_resumes_at_k(
    h: Harness, provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    env = {"CRASH_LLM_URL": base}
    run_id = h.app.start(
        "enrich-accounts",
        {"accounts": ["Acme", "Globex", "Initech"], "webhook": "http://127.0.0.1:9/never"},
    )
    # The fourth step_started is iteration 2's (after load, each#0, each#1): the worker
    # dies with it journaled and its request not yet sent.
    a = h.spawn("a", worker_id=WORKER, crash_at="after_step_started:4", env_extra=env)
    a.wait_exit()
    assert list(completed(h, run_id)) == ["1:load", "2:each#0/enrich", "3:each#1/enrich"]
    sent = len(server.requests())
    assert sent == 2
    h.spawn("b", worker_id=WORKER, env_extra=env)
    wait_for(lambda: h.app.approvals(run_id), timeout=30, what="the approval", detail=h.worker_logs)
    started = [e.step_id for e in h.app.events(run_id) if e.kind == EventKind.STEP_STARTED]
    # Iteration 2 started twice (once per drive); 0 and 1 were not started again.
    assert started == [
        "1:load",
        "2:each#0/enrich",
        "3:each#1/enrich",
        "4:each#2/enrich",
        "4:each#2/enrich",
        "5:rank",
        "6:summarize",
    ]
    keys = [r["idempotency_key"] for r in server.requests()]
    assert len(keys) == 4 and len(set(keys)) == 4  # each#2 sent once, then the summary
    assert h.calls() == {"1:load": 1, "5:rank": 1}


def test_a_reclaimed_parent_finds_its_subagent_instead_of_spawning_another(h: Harness) -> None:
    run_id = h.app.start("parent", {"name": "x"})
    a = h.spawn("a", worker_id=WORKER)
    # The child's tool is running (its gate closed) when the worker dies with parent and
    # child both in flight.
    h.wait_invoked("1:work")
    a.kill()
    h.open_gate("kid")
    h.spawn("b", worker_id=WORKER)
    assert h.wait_status(run_id, "succeeded", 30).status == "succeeded"
    assert h.app.result(run_id, timeout_s=5) == ["done x", "done after"]
    children = [r for r in h.app.runs() if r.parent_run_id == run_id]
    assert [c.workflow for c in children] == ["kid"]
    # The child's tool ran again (it never completed), the parent's own steps once.
    assert h.calls() == {"1:work": 2, "2:after": 1}


ROUTES_INPUT = {"same": [7] * 8, "items": [1, 2, 3, 4]}


def decided(h: Harness, run_id: str) -> list[tuple[str, str | None, Any]]:
    """What the drives of a run decided, in step order: each step completed with its
    output, each anomaly by its key after its step. Step order, not journal order: the
    fan-out's branches run side by side and may complete in either order in any run."""
    events = [
        (
            e.kind,
            e.step_id,
            e.payload.get("output" if e.kind == EventKind.STEP_COMPLETED else "key"),
        )
        for e in h.app.events(run_id)
        if e.kind in (EventKind.STEP_COMPLETED, EventKind.ANOMALY_DETECTED)
    ]
    # A stable sort by ordinal keeps an anomaly after the step it was detected at.
    return sorted(events, key=lambda d: int((d[1] or "0").split(":", 1)[0]))


def test_a_graph_killed_again_and_again_takes_the_route_of_an_uncrashed_run(h: Harness) -> None:
    crashed = h.app.start("routes", ROUTES_INPUT)
    kills = 0
    for i in range(15):
        # Each worker replays what the last ones finished, then dies after its third
        # fresh step: in loops (taken from the journal whole), in the fan-out, in a loop
        # with a branch in its body.
        h.spawn(f"w{i}", worker_id=WORKER, crash_at="after_step_completed:3")

        def moved() -> str | None:
            rec = h.app.get(crashed)
            if rec.status == RunStatus.FAILED:
                raise AssertionError(f"run failed: {rec.error}\n{h.worker_logs()}")
            if rec.status == RunStatus.SUCCEEDED:
                return "succeeded"
            return None if h.procs[-1].alive() else "killed"

        what = wait_for(
            moved, timeout=30, what=f"worker w{i} to move the run", detail=h.worker_logs
        )
        h.procs[-1].kill()
        if what == "succeeded":
            break
        kills += 1
    # 23 steps, three a worker; the eighth's second commits with the run's end.
    assert kills == 7
    clean = h.app.start("routes", ROUTES_INPUT)
    h.spawn("clean", worker_id=WORKER)
    assert h.wait_status(clean, "succeeded", 30).status == "succeeded"
    assert (
        h.app.result(crashed, timeout_s=5)
        == h.app.result(clean, timeout_s=5)
        == {
            "same": [7] * 8,
            "each": [2, 5, 8, 11],
            "both": {"left": 11, "right": 8},
            "tries": [0, 3, 4],
        }
    )
    route = decided(h, crashed)
    assert route == decided(h, clean)
    # The runaway-loop streak of the first loop counts the steps a drive took from the
    # journal: the fourth echo trips it (in the second drive) as in the uncrashed run, and
    # the seventh (the third drive's first, after six replayed) does not trip it again.
    assert [(kind, step) for kind, step, _ in route if kind == EventKind.ANOMALY_DETECTED] == [
        (EventKind.ANOMALY_DETECTED, "4:same#3/echo")
    ]
    assert [step for _, step, _ in route][-6:] == [
        "18:right",
        "19:big",
        "20:tries#0/probe",
        "21:tries#1/probe",
        "22:tries#1/odd",
        "23:tries#2/probe",
    ]
    # Every step's code ran once, though the run was driven eight times.
    ran = Counter(r["step_id"] for r in h.invocations() if r["run_id"] == crashed)
    assert len(ran) == 23 and set(ran.values()) == {1}
