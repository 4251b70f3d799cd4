"""Ratchet: a durable execution engine for AI-agent workflows.

What users may import is listed in ``__all__``; a test pins the list.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ratchet._version import __version__ as __version__  # the release
from ratchet.app import Ratchet
from ratchet.effects.deliver import deliver, deliver_sync
from ratchet.engine.context import StepInfo, current_step, require_run, workflow_run
from ratchet.engine.definitions import StepKey, WorkflowDef, check_name
from ratchet.engine.guards import Guards
from ratchet.engine.retry import Retry
from ratchet.engine.start_options import Debounce
from ratchet.engine.starts import Start
from ratchet.engine.values import codec_for
from ratchet.errors import (
    ApprovalAlreadyDecided,
    ApprovalNotPending,
    ApprovalRejected,
    ApprovalTimeout,
    BatchItemInvalid,
    ChildRunFailed,
    ConfigError,
    ConnectorError,
    DeliveryFailed,
    DuplicateStart,
    GateRejected,
    GuardTripped,
    InvalidInput,
    InvalidRetryPolicy,
    JournalPruned,
    LeaseLost,
    LLMError,
    LLMRequestError,
    LLMTimeout,
    MissingExtra,
    NonDeterminismError,
    NotDeadLettered,
    NotSerializable,
    RatchetError,
    ReceiptBusy,
    ReceiptSettled,
    ReceiptUnresolved,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunIdConflict,
    RunNotFinished,
    RunTimeout,
    SignalTimeout,
    StepFailed,
    StepTimeout,
    StorageError,
    ToolError,
    UnknownApproval,
    UnknownReceipt,
    UnknownRun,
    UnknownWorkflow,
)
from ratchet.model import Approval, Decision, Event, RunRecord, RunStatus
from ratchet.names import MAX_STEP_NAME, check_length
from ratchet.sandbox.spec import Sandbox
from ratchet.store.queues import Rate

if TYPE_CHECKING:
    from ratchet import llm  # noqa: F401  (ratchet.llm, loaded on first use)
    from ratchet.engine.drive import Drive
    from ratchet.llm.agent import Agent, AgentMaxTurns, AgentResult
    from ratchet.llm.gate import Gate

__all__ = [
    "Agent",
    "AgentMaxTurns",
    "AgentResult",
    "Approval",
    "ApprovalAlreadyDecided",
    "ApprovalNotPending",
    "ApprovalRejected",
    "ApprovalTimeout",
    "BatchItemInvalid",
    "ChildRunFailed",
    "ConfigError",
    "ConnectorError",
    "Debounce",
    "Decision",
    "DeliveryFailed",
    "DuplicateStart",
    "Event",
    "Gate",
    "GateRejected",
    "GuardTripped",
    "Guards",
    "InvalidInput",
    "InvalidRetryPolicy",
    "JournalPruned",
    "LLMError",
    "LLMRequestError",
    "LLMTimeout",
    "LeaseLost",
    "MissingExtra",
    "NonDeterminismError",
    "NotDeadLettered",
    "NotSerializable",
    "Ratchet",
    "RatchetError",
    "Rate",
    "ReceiptBusy",
    "ReceiptSettled",
    "ReceiptUnresolved",
    "ResultTimeout",
    "Retry",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunIdConflict",
    "RunNotFinished",
    "RunRecord",
    "RunStatus",
    "RunTimeout",
    "Sandbox",
    "SignalTimeout",
    "Start",
    "StepFailed",
    "StepInfo",
    "StepKey",
    "StepTimeout",
    "StorageError",
    "ToolError",
    "UnknownApproval",
    "UnknownReceipt",
    "UnknownRun",
    "UnknownWorkflow",
    "WorkflowDef",
    "approval",
    "child",
    "current_step",
    "deliver",
    "deliver_sync",
    "deprecate_patch",
    "patched",
    "sleep",
    "wait_for_signal",
]


_T = TypeVar("_T")

# The LLM layer (ratchet.llm, the agent loop) loads on first use: a worker of plain
# workflows never imports the SDKs, pydantic or the price table for it.
_LAZY = {
    "Agent": "ratchet.llm.agent",
    "AgentResult": "ratchet.llm.agent",
    "AgentMaxTurns": "ratchet.llm.agent",
    "Gate": "ratchet.llm.gate",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "llm":
        return importlib.import_module("ratchet.llm")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ratchet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def patched(name: str) -> bool:
    """Whether this run takes patch ``name``'s new path, for a change to a workflow that
    runs in flight must not see (``if ratchet.patched("fix-refund-prompt"): <new> else:
    <old>``). True for a run that reaches this point first under the code that has the
    patch (a ``patch_marked`` event is journaled; it takes no step position, so later step
    ids do not move), and on every replay of it; False for a run whose journal already
    went past this point the old way (nothing is journaled), on every replay alike. Called
    in a workflow's code, outside any step. See docs/how-to/upgrading.md."""
    check_length(check_name(name, "patch name"), "patch name", MAX_STEP_NAME)
    return _workflow_code("ratchet.patched()").patched(name)


def deprecate_patch(name: str) -> None:
    """Patch ``name`` has no old path any more: call it where ``ratchet.patched(name)``
    was, once no run that went past that point the old way remains, and keep only the new
    code. Runs whose journal holds the patch's marker replay as before; a run reaching
    this point journals the marker too (``deprecated``), so a worker still on the code
    with ``patched`` takes the new path for it. It checks nothing and raises nothing for a
    run: remove the call altogether in a later deploy. See docs/how-to/upgrading.md."""
    check_length(check_name(name, "patch name"), "patch name", MAX_STEP_NAME)
    _workflow_code("ratchet.deprecate_patch()").patched(name, deprecated=True)


def _workflow_code(what: str) -> Drive:
    ctx = workflow_run()
    if ctx is None:
        raise RatchetError(f"{what} must be called in a workflow's code, outside any step")
    return ctx


async def sleep(seconds: float) -> None:
    """A durable sleep: the run parks and its worker is free until the time comes, even
    across restarts."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidInput(f"ratchet.sleep: seconds must be a number >= 0, got {seconds!r}")
    await require_run("ratchet.sleep()").sleep(float(seconds))


@overload
async def wait_for_signal(name: str, timeout_s: float | None = None) -> Any: ...
@overload
async def wait_for_signal(name: str, timeout_s: float | None = None, *, type: type[_T]) -> _T: ...
@overload
async def wait_for_signal(name: str, timeout_s: float | None = None, *, type: Any) -> Any: ...


async def wait_for_signal(name: str, timeout_s: float | None = None, *, type: Any = None) -> Any:
    """Park until signal ``name`` arrives (``app.signal``); return its data, as ``type``
    where one is given (any type pydantic reads: a model, a dataclass, ``Decision``,
    ``list[Item]``; data that does not fit raises :class:`NotSerializable`, on every
    replay alike), else as the JSON data that was sent. After ``timeout_s`` raise
    :class:`SignalTimeout`."""
    check_name(name, "signal name")
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0
    ):
        raise InvalidInput(
            f"ratchet.wait_for_signal: timeout_s must be positive, got {timeout_s!r}"
        )
    codec = None if type is None else codec_for(type)
    return await require_run("ratchet.wait_for_signal()").wait_for_signal(name, timeout_s, codec)


def approval(name: str, data: Any = None, *, timeout_s: float | None = None) -> Awaitable[Decision]:
    """Ask a person to approve ``name`` (showing them ``data``) and park until someone
    decides (``app.approve`` / ``app.reject``, ``ratchet approve`` / ``ratchet reject``);
    return their :class:`Decision`. After ``timeout_s`` without one raise
    :class:`ApprovalTimeout`. Listed by ``app.approvals()`` and ``ratchet approvals``
    while pending; decided once, whatever restarts in between."""
    from ratchet.engine import approvals

    ctx = require_run("ratchet.approval()")
    return approvals.approval(ctx, name, approvals.check_request(name, data, timeout_s), timeout_s)


async def child(
    workflow: WorkflowDef, /, *args: Any, queue: str | None = None, **kwargs: Any
) -> Any:
    """Run ``workflow`` as a child run and return its result. The child's id derives from
    the parent and the step, so a re-driven parent finds its child instead of starting
    another."""
    if not isinstance(workflow, WorkflowDef):
        raise InvalidInput(f"ratchet.child: {workflow!r} is not a workflow")
    if queue is not None:
        check_name(queue, "queue")
    return await require_run("ratchet.child()").child(workflow, args, kwargs, queue)
