"""The names users may import from ``ratchet``: adding or removing one is a decision."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import ratchet

EXPECTED = {
    "ChildRunFailed",
    "ConfigError",
    "ConnectorError",
    "Event",
    "InvalidInput",
    "InvalidRetryPolicy",
    "LLMError",
    "LeaseLost",
    "NonDeterminismError",
    "NotDeadLettered",
    "NotSerializable",
    "Ratchet",
    "RatchetError",
    "ReceiptUnresolved",
    "ResultTimeout",
    "Retry",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunRecord",
    "RunStatus",
    "SignalTimeout",
    "StepFailed",
    "StepInfo",
    "StepTimeout",
    "StorageError",
    "ToolError",
    "UnknownRun",
    "UnknownWorkflow",
    "WorkflowDef",
    "child",
    "current_step",
    "deliver",
    "deliver_sync",
    "sleep",
    "wait_for_signal",
    "Sandbox",
    "RunIdConflict",
    "DeliveryFailed",
    "ReceiptBusy",
    "ReceiptSettled",
    "UnknownReceipt",
    "LLMTimeout",
    "LLMRequestError",
    "Agent",
    "AgentResult",
    "AgentMaxTurns",
    "StepKey",
    "approval",
    "Approval",
    "Decision",
    "ApprovalTimeout",
    "ApprovalRejected",
    "ApprovalAlreadyDecided",
    "ApprovalNotPending",
    "UnknownApproval",
    "MissingExtra",
    "Guards",
    "GuardTripped",
    "GateRejected",
    "Gate",
    "JournalPruned",
    "RunNotFinished",
    "Start",
    "Rate",
    "BatchItemInvalid",
    "Debounce",
    "DuplicateStart",
    "RunTimeout",
    "patched",
    "deprecate_patch",
}


def test_exports_are_pinned() -> None:
    assert set(ratchet.__all__) == EXPECTED
    for name in ratchet.__all__:
        assert getattr(ratchet, name) is not None


def test_control_flow_signals_cannot_be_swallowed_by_except_exception() -> None:
    from ratchet.errors import Parked

    assert not issubclass(ratchet.LeaseLost, Exception)
    assert not issubclass(Parked, Exception)


def test_every_public_name_has_a_docstring() -> None:
    for name in ratchet.__all__:
        obj = getattr(ratchet, name)
        assert (obj.__doc__ or "").strip(), name


# Every blocking call on Ratchet and its awaitable twin; the twin takes the same parameters.
BLOCKING = [
    "start",
    "start_many",
    "get",
    "result",
    "signal",
    "cancel",
    "retry",
    "events",
    "runs",
    "count_runs",
    "dead_letters",
    "count_dead_letters",
    "receipts",
    "live_workers",
    "launch",
    "shutdown",
    "settle_receipt",
    "llm_totals",
    "approve",
    "reject",
    "approvals",
    "graph",
    "run_receipt",
    "prune",
    "sandboxes",
    "fork",
    "resume",
    "diff",
    "schedules",
    "pause_schedule",
    "resume_schedule",
    "trigger_schedule",
    "add_schedule",
    "change_schedule",
    "delete_schedule",
    "queues",
    "set_queue_limits",
]


# Async calls with no blocking twin, and why: the HTTP API's starts and forks, which return
# what a blocking caller has no use for (the record and whether it was created, per item).
ASYNC_ONLY = {"start_run_async", "start_runs_async", "fork_run_async"}


def _members(cls: type) -> dict[str, Any]:
    """The attributes of ``cls`` and its bases (the app is assembled from one class per job),
    as defined: the nearest definition of each name, the way attribute lookup finds it."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass))
    return found


def _parameters(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    """What a caller sees of ``fn``'s parameters: name, kind, default, annotation."""
    return [
        (p.name, p.kind, p.default, p.annotation) for p in inspect.signature(fn).parameters.values()
    ]


def test_every_blocking_call_has_an_async_twin() -> None:
    public = {
        name
        for name, value in _members(ratchet.Ratchet).items()
        if callable(value) and not name.startswith("_") and not name.endswith("_async")
    }
    # Not client calls: the decorators, a worker object, running a worker on a given loop,
    # the model clients graph ai-steps use, the interpreter graph runs are driven with, a
    # queue's declaration.
    assert public - {
        "workflow",
        "step",
        "tool",
        "schedule",
        "worker",
        "run_worker",
        "llm_client",
        "llm_client_for",
        "graph_interpreter",
        "queue",
    } == set(BLOCKING)
    for name in BLOCKING:
        blocking = getattr(ratchet.Ratchet, name)
        twin = getattr(ratchet.Ratchet, f"{name}_async", None)
        assert twin is not None and inspect.iscoroutinefunction(twin), name
        assert (twin.__doc__ or "").strip() and (blocking.__doc__ or "").strip(), name


def test_every_async_call_has_a_blocking_twin_with_the_same_parameters() -> None:
    # The twins are written by hand: this keeps them from drifting apart, in either
    # direction (a parameter added to one only, a default changed, a keyword made
    # positional, an async call with no blocking one).
    asyncs = {
        name
        for name, value in _members(ratchet.Ratchet).items()
        if inspect.iscoroutinefunction(value)
        and not name.startswith("_")
        and name.endswith("_async")
    }
    assert asyncs - ASYNC_ONLY == {f"{name}_async" for name in BLOCKING}
    for name in BLOCKING:
        blocking = getattr(ratchet.Ratchet, name)
        twin = getattr(ratchet.Ratchet, f"{name}_async")
        assert _parameters(blocking) == _parameters(twin), name
        assert inspect.signature(blocking).return_annotation == (
            inspect.signature(twin).return_annotation
        ), name


def test_blocking_code_runs_the_apps_coroutines_through_its_portal(tmp_path: Path) -> None:
    app = ratchet.Ratchet(f"sqlite:///{tmp_path}/portal.db")
    try:

        async def on_the_portal() -> bool:
            return asyncio.get_running_loop() is app.portal.current

        assert app.portal.call(on_the_portal())
        assert app.portal.call(app.count_runs_async()) == 0
    finally:
        app.shutdown()


def test_importing_ratchet_leaves_the_llm_layer_for_first_use() -> None:
    # A worker of plain workflows never pays for the SDKs or the price table.
    import subprocess
    import sys

    code = (
        "import sys, ratchet; print('ratchet.llm' in sys.modules); "
        "ratchet.llm.wrap; ratchet.Agent; print('ratchet.llm' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True"]


def test_a_worker_starts_without_loading_the_graph_format_or_the_sandbox_harness(
    tmp_path: Path,
) -> None:
    # A restart's latency is the worker's start: pydantic's graph models, the template
    # engine and the harness's HTTP client load when a graph is compiled or a sandbox
    # spawned, not before; the graph package's names still resolve on first use.
    import subprocess
    import sys

    heavy = [
        "ratchet.graphs.validate",
        "ratchet.graphs.spec",
        "ratchet.sandbox.harness",
        "ratchet.sandbox.isolated",
    ]
    code = (
        "import asyncio, sys, ratchet\n"
        f"app = ratchet.Ratchet('sqlite:///{tmp_path / 'w.db'}')\n"
        "async def main():\n"
        "    worker = app.worker()\n"
        "    stop = asyncio.Event()\n"
        "    task = asyncio.create_task(worker.run(stop))\n"
        "    await worker.started.wait()\n"
        f"    print([m for m in {heavy!r} if m in sys.modules])\n"
        "    stop.set()\n"
        "    await task\n"
        "asyncio.run(main())\n"
        "import ratchet.graphs as g\n"
        "print(g.Graph.__module__, callable(g.load), 'ratchet.graphs.validate' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == ["[]", "ratchet.graphs.validate True True"]
