"""Ratchet's exceptions.

Every error derives from :class:`RatchetError`; its docstring is its default message.
``retry_class`` names the retry class (docs/concepts/retries.md) a step failure belongs
to, so a retry policy can decide without string matching; ``never`` is never retried.
``outcome_unknown`` says whether the failure leaves open whether the step's effect happened
(a connection dropped after the request was sent, a timeout): its retry then reuses the
attempt's idempotency key, so a receiver that honours the key acts once. Any exception may
carry the attribute; one without it is taken to be answered (a new attempt, a new key).
Control-flow signals that user code must not swallow (a parked run, a lost lease) derive
from ``BaseException``.

What the store raises, and what it means for the caller:

* :class:`StorageError` is transient: the database failed or could not be reached (a
  dropped connection, a restart, a lock timeout, a full disk, a store closed under the
  call). The same operation may well succeed soon: retry it, or drive the run again.
* :class:`StoreConflict` and :class:`ValueRefused` are not: the database answered, and
  the answer contradicts what the operation expected (a constraint violated, a row
  already in a state only this caller should have put it in) or refuses a value it cannot
  store. Retrying the same operation gives the same answer; they are bugs or bad data, to
  be surfaced, never looped on. Neither is a StorageError.
* :class:`LeaseLost`, :class:`RunFinished`, :class:`UnknownRun`, :class:`RunIdConflict`
  and :class:`NotDeadLettered` are answers about the run, not failures of the database.
"""

from __future__ import annotations

from enum import StrEnum


class RetryClass(StrEnum):
    """The retry classes a step failure belongs to (an error's ``retry_class``) and a
    retry policy names (``Retry(retry_on=...)``, ``retryableClasses``)."""

    ANY = "any"  # in a policy: every class but never; on an error: only retried on any
    TIMEOUT = "timeout"
    LLM = "llm"
    CONNECTOR = "connector"
    TOOL = "tool"
    NEVER = "never"  # on an error only: no policy retries it


class RatchetError(Exception):
    """A Ratchet error."""

    retry_class: str = RetryClass.ANY
    outcome_unknown: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(RatchetError, ValueError):
    """Invalid configuration."""


class InvalidInput(RatchetError, ValueError):
    """Invalid input."""

    # The argument at fault (workflow, input, run_id, queue, priority, guards), where the
    # check that raised knows it: a batch start names it with the item's index.
    field: str | None = None


class UnknownWorkflow(InvalidInput):
    """Unknown workflow."""


class UnknownRun(InvalidInput, LookupError):
    """Unknown run id."""


class UnknownSchedule(InvalidInput, LookupError):
    """No schedule of that name (for this tenant)."""


class ScheduleExists(InvalidInput):
    """A schedule of that name exists already."""


class RunIdConflict(InvalidInput):
    """A run with this id already exists with a different workflow, input, queue or
    priority."""


class BatchItemInvalid(InvalidInput):
    """An item of a batch start is invalid; nothing of the batch was written."""

    def __init__(self, index: int, field: str, problem: str, *, taken: bool = False) -> None:
        super().__init__(f"item {index} ({field}): {problem}")
        self.index = index
        self.field = field  # the item's field at fault: workflow, input, run_id, queue, ...
        self.problem = problem
        # The run id belongs to another tenant's run (the HTTP API answers 409, as for one).
        self.taken = taken


class DuplicateStart(RatchetError):
    """A run of this workflow with this dedup id is not terminal yet; ``run_id`` is its id.
    The HTTP API answers 409 with it."""

    retry_class = RetryClass.NEVER

    def __init__(self, run_id: str, message: str | None = None) -> None:
        super().__init__(message or f"a start with this dedup id is run {run_id!r}, not ended yet")
        self.run_id = run_id


class NotSerializable(InvalidInput, TypeError):
    """A value is not JSON-serialisable."""

    retry_class = RetryClass.NEVER


class InvalidRetryPolicy(InvalidInput):
    """Invalid retry policy."""


class MissingExtra(RatchetError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'ratchet-engine[postgres]'``)."""

    retry_class = RetryClass.NEVER


class StorageError(RatchetError):
    """The database refused or failed an operation."""


class StoreNotReady(StorageError):
    """The database cannot serve this process: unreachable, its file gone, or its schema
    behind this code's migrations."""


class WorkerIdInUse(RatchetError):
    """A live worker already runs under this worker id."""

    retry_class = RetryClass.NEVER


class StoreConflict(RatchetError):
    """The database's state contradicts what a store operation expected (a broken
    invariant, not a failing database); retrying will not help."""

    retry_class = RetryClass.NEVER


class SignalAlreadyConsumed(StoreConflict):
    """The signal was already consumed."""


class ValueRefused(RatchetError):
    """The database refused a value it cannot store (out of range, a character its text
    type cannot hold); retrying will not help."""

    retry_class = RetryClass.NEVER


class NonDeterminismError(RatchetError):
    """The workflow's step sequence differs from its journal: the code changed under a
    run in flight. The message names the step, what the journal holds and what the code
    called, and ends with the page that says how to change code safely."""

    retry_class = RetryClass.NEVER
    page = "docs/how-to/upgrading.md"

    def __init__(self, message: str) -> None:
        if not message.endswith(self.page):
            message = f"{message}; see {self.page}"
        super().__init__(message)


class StepFailed(RatchetError):
    """A step failed and will not be retried."""

    def __init__(self, step_id: str, error: str) -> None:
        super().__init__(f"step {step_id} failed: {error}")
        self.step_id = step_id
        self.error = error


class StepCrashLoop(StepFailed):
    """A step's attempt was started again and again and never finished: its worker died
    each time (the step's code most likely kills the process)."""


class StepTimeout(RatchetError):
    """A step ran past its timeout. What the step had sent by then may have landed: its
    retry keeps the attempt's idempotency key."""

    retry_class = RetryClass.TIMEOUT
    outcome_unknown = True


class ConnectorError(RatchetError):
    """A connector call failed."""

    retry_class = RetryClass.CONNECTOR


class LLMError(RatchetError):
    """A model call failed (a rate limit, a provider error, a lost connection): retried
    under the step's policy. After the provider answered (a 429, a 5xx) the next attempt
    has a key of its own; after a lost connection (``outcome_unknown``) it keeps the key."""

    retry_class = RetryClass.LLM

    def __init__(
        self,
        message: str = "",
        *,
        provider: str | None = None,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        request_id: str | None = None,
        outcome_unknown: bool | None = None,
    ) -> None:
        super().__init__(message or None)
        self.provider = provider
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.request_id = request_id
        if outcome_unknown is not None:
            self.outcome_unknown = outcome_unknown


class LLMTimeout(LLMError):
    """A model call ran past its timeout: the provider may have billed it, so its retry
    keeps the attempt's key."""

    retry_class = RetryClass.TIMEOUT
    outcome_unknown = True


class LLMRequestError(LLMError):
    """The provider refused the request (a 4xx other than a rate limit): sending it again
    would be refused again, so it is not retried."""

    retry_class = RetryClass.NEVER


class ToolError(RatchetError):
    """A tool call failed."""

    retry_class = RetryClass.TOOL


class SignalTimeout(RatchetError):
    """No signal arrived before the wait's deadline."""

    retry_class = RetryClass.TIMEOUT


class ApprovalTimeout(RatchetError):
    """No decision on the approval arrived before its deadline."""

    retry_class = RetryClass.TIMEOUT


class ApprovalRejected(StepFailed):
    """A person rejected the approval a step needed (a tool with ``risk="critical"`` or
    ``requires_approval=True``): the step did not run."""

    retry_class = RetryClass.NEVER


class UnknownApproval(InvalidInput, LookupError):
    """The run has no such approval."""


class UnknownQueue(InvalidInput, LookupError):
    """No queue of that name was declared (``app.queue``)."""


class UnknownStep(InvalidInput, LookupError):
    """The run has no such step."""


class UnknownToken(InvalidInput, LookupError):
    """Unknown API token id."""


class ApprovalNotPending(RatchetError):
    """The approval is no longer pending (decided, timed out, or its run has finished);
    nothing was recorded."""


class ApprovalAlreadyDecided(ApprovalNotPending):
    """The approval was already decided; a decision is recorded once."""


class ReceiptUnresolved(RatchetError):
    """A delivery's receipt was left claimed by a crash and its policy forbids a resend."""

    retry_class = RetryClass.NEVER


class DeliveryFailed(RatchetError):
    """A person settled this delivery's receipt as failed: it did not happen, and the step
    may not dispatch it again."""

    retry_class = RetryClass.NEVER


class UnknownReceipt(InvalidInput, LookupError):
    """Unknown receipt key."""


class ReceiptSettled(RatchetError):
    """The receipt is already settled."""


class ReceiptBusy(RatchetError):
    """The receipt's run is being driven by a live worker, which may be dispatching it."""


class ChildRunFailed(RatchetError):
    """A child run ended without succeeding."""


class RunFailed(RatchetError):
    """The run failed."""


class RunTimeout(RunFailed):
    """The run passed its deadline (``timeout_s``, or ``budget_wall_s`` whose action is
    ``fail``): it failed there, wherever it was (in a step, or parked on a signal, an
    approval, a sleep or a child run), with dead-letter reason ``timeout``, and its unfinished
    children were cancelled."""


class RunCancelled(RatchetError):
    """The run was cancelled."""


class ResultTimeout(RatchetError):
    """The run did not finish within the timeout."""


class NotDeadLettered(RatchetError):
    """The run is not in the dead-letter queue."""


class NotCancelled(RatchetError):
    """The run is not cancelled: only a cancelled run resumes."""


class RunFinished(RatchetError):
    """The run has already finished."""


class RunNotFinished(RatchetError):
    """The run has not finished: a receipt is signed when it ends."""


class JournalPruned(RatchetError):
    """The run's journal was pruned; its receipt was kept."""


class ChainBroken(StoreConflict):
    """A stored journal fails its own hash chain: nothing is signed over it."""


class SandboxUnavailable(RatchetError):
    """The isolated tier cannot start a sandbox on this machine (bubblewrap missing, or
    user namespaces refused)."""


class NotIsolatable(ValueRefused):
    """This call is not available inside a sandbox (the isolated tier reports journal
    writes only: no parks, child runs, approvals or signals). A write refused for good,
    as a value the database cannot store is: the run fails with it."""


class LeaseLost(BaseException):
    """This worker no longer holds the run's lease; nothing it writes will land."""

    def __init__(self, run_id: str, message: str | None = None) -> None:
        super().__init__(message or f"lease on run {run_id} lost")
        self.run_id = run_id


class DriveAborted(BaseException):
    """A storage failure interrupted this drive of the run; nothing more is written by it,
    and the run is driven again once its lease expires. Not a step's error: user code
    catching ``Exception`` cannot turn it into one."""


class DriveRefused(BaseException):
    """The database refused one of this drive's writes for good (:class:`StoreConflict`,
    :class:`ValueRefused`): the run fails with that error rather than being driven again
    and again. Like :class:`DriveAborted`, user code catching ``Exception`` cannot hide it."""


class Parked(BaseException):
    """The run is parked (sleep, signal, child run, backoff); the worker lets it go."""


class GuardTripped(BaseException):
    """A guard stopped the run (its action is ``fail``, or a person declined to go on).
    Like :class:`Parked`, user code catching ``Exception`` cannot turn it into a step's
    error: the run fails with ``code`` (the guard's kind) as its dead-letter reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GateRejected(RatchetError):
    """A confidence gate's score was below its threshold and its path is ``fail``."""

    retry_class = RetryClass.NEVER
