"""The API's request and response bodies: pydantic models, which are also the OpenAPI
spec's schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ratchet.engine.start_options import MAX_START_KEY, MAX_WAIT_S
from ratchet.names import (
    MAX_COMMENT,
    MAX_DECIDER,
    MAX_QUEUE,
    MAX_RUN_ID,
    MAX_STEP,
    MAX_TAG_KEY,
    MAX_TAG_VALUE,
    MAX_TAGS,
    MAX_WORKFLOW,
)


class Error(BaseModel):
    """Every refusal, whatever the status."""

    error: str = Field(
        description="A stable code: bad_request, unauthorized, forbidden, not_found, "
        "method_not_allowed, timeout, conflict, payload_too_large, invalid_input, internal, "
        "unavailable."
    )
    message: str
    details: Any = None


class Body(BaseModel):
    """A request body: validated in pydantic's strict mode, so a JSON value is taken only
    as what the field names (``"30"`` is no number, ``1`` no boolean)."""

    model_config = ConfigDict(strict=True)


class DebounceIn(Body):
    key: str = Field(
        min_length=1,
        max_length=MAX_START_KEY,
        description="Starts of this key (per workflow) within the window collapse into one run.",
    )
    wait_s: float = Field(
        gt=0,
        le=MAX_WAIT_S,
        description="The window, in seconds: the run begins this long after the last start.",
    )


class StartRun(Body):
    workflow: str = Field(
        min_length=1, max_length=MAX_WORKFLOW, description="A workflow's or a graph's name."
    )
    input: dict[str, Any] = Field(
        default_factory=dict,
        description="The workflow's arguments by parameter name; for a graph, its input.",
    )
    run_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_RUN_ID,
        description="Makes the start idempotent. The tenant's own: another tenant's run "
        "of the same id is another run.",
    )
    queue: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_QUEUE,
        description="The queue the run joins; default: the workflow's "
        '(@app.workflow(queue=...)), else "default".',
    )
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_QUEUE,
        description="The key its queue's per_key_concurrency counts, within the caller's "
        "tenant (another tenant's runs of the same key are counted apart).",
    )
    guards: dict[str, Any] | None = Field(
        default=None,
        description="Guard overrides for this run (ratchet.Guards fields), "
        'e.g. {"max_steps": 50, "budget_usd": 0.5}. Raising or '
        "switching off a guard needs the admin scope; a "
        "runs:write token may only tighten them.",
    )
    tags: dict[str, str] | None = Field(
        default=None,
        description=f'Kept with the run and its children, e.g. {{"customer": "acme"}}; '
        f"GET /v1/runs?tag=customer=acme finds it. At most {MAX_TAGS}; each key 1-"
        f"{MAX_TAG_KEY} letters, digits and _ . : / - (starting with a letter or digit), "
        f"each value at most {MAX_TAG_VALUE} characters.",
    )
    dedup_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_START_KEY,
        description="While a run of this workflow with this dedup id is not terminal, "
        'another start with it is refused 409, with that run\'s id in details ({"run_id": '
        "...}).",
    )
    debounce: DebounceIn | None = Field(
        default=None,
        description="Collapse the starts of a key within a window into one run, which begins "
        "after the window with the latest input; each start answers that run's id. Takes no "
        "run_id, dedup_id, start_at or delay_s.",
    )
    start_at: str | None = Field(
        default=None,
        description="Queue the run now, claimable from this ISO-8601 time, which must carry "
        "its offset (2026-05-01T09:30:00+02:00, or Z).",
    )
    delay_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_WAIT_S,
        description="Queue the run now, claimable this many seconds from now. Not with start_at.",
    )


class RateIn(Body):
    model_config = ConfigDict(strict=True, extra="forbid")

    limit: int = Field(ge=1, description="First drives allowed per window.")
    per_s: float = Field(gt=0, description="The window, in seconds.")


class QueueLimitsIn(Body):
    """The limits to change; a field left out keeps its value, null removes the limit."""

    model_config = ConfigDict(strict=True, extra="forbid")

    concurrency: int | None = Field(default=None, ge=1)
    per_key_concurrency: int | None = Field(default=None, ge=1)
    rate: RateIn | None = None
    hold_while_parked: bool | None = None


class QueueOut(BaseModel):
    name: str
    depth: int = Field(description="Runs queued.")
    in_flight: int = Field(
        description="Runs running (and parked, when the queue holds their slots)."
    )
    concurrency: int | None
    per_key_concurrency: int | None
    rate: dict[str, float] | None = Field(description='{"limit": K, "per_s": S} or null.')
    hold_while_parked: bool
    set_by: str = Field(description="code (declared, RATCHET_QUEUES over it) or api.")


class RunAccepted(BaseModel):
    run_id: str
    status: str


MAX_BATCH = 10_000  # runs in one POST /v1/runs:batch


class StartRuns(Body):
    runs: list[StartRun] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description=f"The runs to start (1 to {MAX_BATCH:,}), each as POST /v1/runs takes it; "
        "all are written in one transaction, or none.",
    )
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_QUEUE,
        description="The concurrency_key of every item that names none.",
    )


class BatchRunAccepted(RunAccepted):
    created: bool = Field(
        description="False when the run existed already (same run_id or Idempotency-Key)."
    )


class RunsAccepted(BaseModel):
    runs: list[BatchRunAccepted] = Field(description="One per run asked for, in order.")


class LLMUsage(BaseModel):
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None


class ChildRun(BaseModel):
    run_id: str
    workflow: str
    status: str


class Run(BaseModel):
    run_id: str
    workflow: str
    workflow_version: str
    status: str
    input: Any
    output: Any = None
    error: str | None = None
    parent_run_id: str | None = None
    queue: str
    created_at: float
    updated_at: float
    tags: dict[str, str] = Field(default_factory=dict)
    forked_from: str | None = Field(
        default=None, description="A fork's source run (POST /v1/runs/{id}/fork)."
    )
    forked_at: str | None = Field(
        default=None, description="The step of the source run the fork was made at."
    )
    concurrency_key: str | None = Field(
        default=None, description="The key its queue's per_key_concurrency counts it under."
    )


class DriveOut(BaseModel):
    """One drive of a run: who drove it, and why it ended (``ratchet.model.story``)."""

    drive: int
    worker_id: str | None
    reason: str | None = Field(
        description="How it took the run (a ClaimReason: claim, sweep, reclaim, retry, ...)"
    )
    start: float
    start_seq: int
    end: float = Field(description="Its last event's time")
    end_seq: int
    ended: str | None = Field(
        description="Why it ended, e.g. 'worker lost (killed or hung), lease expired, taken "
        "over by w2 after 2.1 s', 'cancelled by ana'; null while it goes on"
    )
    label: str = Field(description="'drive N by WORKER: why it ended', as the run page shows it")


class RunDetail(Run):
    llm: LLMUsage
    children: list[ChildRun]
    duration_s: float | None = Field(
        default=None, description="From its first drive's start to its end (or its last event)."
    )
    drives: list[DriveOut] = Field(default_factory=list)
    failed_step: str | None = Field(
        default=None, description="The step whose failure failed the run, if one did."
    )
    traceback: str | None = Field(
        default=None,
        description="The failure's traceback as journaled (the failed step's, else the "
        "workflow code's); null for journals written before tracebacks were.",
    )


class RunPage(BaseModel):
    runs: list[Run]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end."
    )


class RunResult(BaseModel):
    run_id: str
    status: str
    done: bool
    output: Any = None
    error: str | None = None


class JournalEvent(BaseModel):
    run_id: str
    seq: int
    kind: str
    step_id: str | None
    attempt: int | None
    payload: dict[str, Any]
    at: float


class EventPage(BaseModel):
    events: list[JournalEvent]
    next_after_seq: int = Field(description="The last seq returned (or the one given).")
    done: bool = Field(description="The run's terminal event is in this page.")


class SignalBody(Body):
    data: Any = None


_GRANT = (
    "Limits the run may go over to, for a guard's pause of a budget or of max_steps: "
    '{"budget_tokens": 5000} (budget_tokens, budget_usd, budget_steps, budget_wall_s, '
    "max_steps, timeout_s; null for off). Journaled with who decided."
)


class Decision(Body):
    approved: StrictBool = Field(description="true or false; nothing else is a decision.")
    by: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_DECIDER,
        description="A name to keep as a note: who decided is journaled as the token's name "
        "(its id when it has none).",
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT)
    grant: dict[str, Any] | None = Field(None, description=_GRANT)


class DecisionMade(BaseModel):
    run_id: str
    step_id: str
    approved: bool
    by: str = Field(description="Who decided: the token's name, else its id.")
    comment: str | None
    note: str | None = Field(default=None, description="The body's by, where it differed.")
    grant: dict[str, Any] | None = None


class RetryBody(Body):
    grant: dict[str, Any] | None = Field(
        None,
        description="Limits the retried run may go over to (else it keeps its limits: "
        "a budget it crossed stops it again). Journaled with the token's "
        "name as who granted it.",
    )


class StatusAfter(BaseModel):
    run_id: str
    status: str


class DeadLetterOut(BaseModel):
    run_id: str
    workflow: str
    reason: str
    error: str
    at: float


class WorkflowOut(BaseModel):
    name: str
    kind: str = Field(description="code or graph")
    version: str = Field(description="The version a start of the name takes: the newest.")
    parameters: list[str]
    versions: list[str] = Field(
        default_factory=list,
        description="Every version this server has, newest first (a code workflow's by "
        "natural order, a graph's by registration); start one as `name@version` (code "
        "workflows).",
    )


class Health(BaseModel):
    status: str


class StepStateOut(BaseModel):
    """A step as the fold leaves it (:class:`ratchet.model.StepState`)."""

    step_id: str
    name: str
    status: str
    attempt: int
    attempts_used: int
    output: Any = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    waiting: dict[str, Any] | None = None
    started_at: float | None = None
    finished_at: float | None = None
    child_run_id: str | None = None
    kind: str | None = None
    llm: dict[str, Any] | None = None


class RunStateOut(BaseModel):
    """A run's state as the engine's fold computes it from its journal up to ``last_seq``."""

    run_id: str
    last_seq: int
    status: str
    output: Any = None
    error: str | None = None
    drives: int
    steps: list[StepStateOut]
    llm: LLMUsage


class SegmentOut(BaseModel):
    kind: str = Field(description="attempt, backoff or parked")
    start: float
    end: float | None = Field(description="null while it goes on")
    outcome: str = Field(
        description="running, completed, failed, retrying, interrupted, cancelled, waiting or over"
    )
    attempt: int | None
    start_seq: int
    end_seq: int | None
    reason: str | None = Field(description="why a parked stretch waits")


class RowOut(BaseModel):
    step_id: str
    name: str
    kind: str | None
    status: str
    child_run_id: str | None
    attempts: int
    segments: list[SegmentOut]


class MarkerOut(BaseModel):
    seq: int
    at: float
    kind: str
    step_id: str | None
    label: str


class SandboxSpanOut(BaseModel):
    """One sandbox of an isolated run: its span, and how it ended."""

    sandbox_id: str
    attempt: int = Field(description="1 for the run's first sandbox, and so on")
    start: float
    end: float | None = Field(description="null while it lives")
    status: str = Field(description="starting, running or terminated")
    exit_code: int | None
    signal: int | None = Field(description="the signal that killed it, if one did")
    end_reason: str | None = Field(
        description="finished, crashed, oom, timeout, killed, shutdown or orphaned"
    )
    peak_memory: int | None = Field(description="bytes, where the backend measures it")


class WaterfallOut(BaseModel):
    """A run's journal as rows of segments on a time axis, with markers; an isolated
    run's sandboxes as spans."""

    run_id: str
    last_seq: int
    start: float | None
    end: float | None
    terminal: bool
    now: float = Field(description="The server's clock, to extend what still goes on.")
    rows: list[RowOut]
    markers: list[MarkerOut]
    parked: list[tuple[float, float | None]] = Field(
        description="Stretches when the run was parked, merged; a viewer may compress them."
    )
    sandboxes: list[SandboxSpanOut] = Field(
        default_factory=list, description="An isolated run's sandboxes, by attempt."
    )
    drives: list[DriveOut] = Field(default_factory=list)
    failed_step: str | None = None
    traceback: str | None = None


class StepDetail(BaseModel):
    """One step: its folded state, what its latest attempt was sent with, and its events."""

    run_id: str
    state: StepStateOut
    idempotency_key: str | None
    lease_epoch: int | None = Field(
        description="The fencing epoch of the drive that started the latest attempt."
    )
    input: dict[str, Any] | None = Field(description="The latest step_started payload.")
    args: Any = Field(
        default=None,
        description="What the latest attempt was called with: its arguments by parameter "
        "name, as journaled (bounded; see docs/concepts/journal.md); a model call's, its "
        "request resolved from the journal (messages and params); null when not journaled.",
    )
    args_journaled: bool = Field(
        default=False,
        description="Whether the latest step_started holds the arguments (or the request).",
    )
    answer: str | None = Field(
        default=None,
        description="A completed model call's answer as text (its tool calls as "
        "name(arguments)); the raw response is state.output.",
    )
    tokens: int | None
    cost_usd: float | None
    events: list[JournalEvent]


class ReceiptSignature(BaseModel):
    keyid: str = Field(description="sha256 (hex) of the raw Ed25519 public key.")
    sig: str = Field(description="Base64 Ed25519 signature over the DSSE PAE of the payload.")


class RunReceipt(BaseModel):
    """A DSSE envelope whose payload is an in-toto Statement v1 about the run."""

    payloadType: str = Field(description="application/vnd.in-toto+json")
    payload: str = Field(description="The statement, base64.")
    signatures: list[ReceiptSignature]


class NewToken(Body):
    scopes: list[str] = Field(min_length=1, description="runs:read, runs:write, admin.")
    name: str | None = Field(
        default=None,
        max_length=100,
        description="What the token's decisions are journaled as (approvals, a gate turned "
        "off at start); its id where it has none.",
    )
    expires_in: float | None = Field(
        default=None,
        gt=0,
        le=10 * 366 * 86400,
        allow_inf_nan=False,
        description="Seconds until it expires (null: never); an open event stream ends then.",
    )


class TokenOut(BaseModel):
    id: str
    tenant: str
    scopes: list[str]
    name: str | None
    created_at: float
    revoked_at: float | None
    expires_at: float | None


class TokenCreated(TokenOut):
    token: str = Field(description="The secret, shown once: only its hash is kept.")


class ForkBody(Body):
    at: str = Field(
        min_length=1,
        max_length=MAX_STEP,
        description='The fork point: a step id of the run, e.g. "3:summarize". The fork '
        "starts with copies of the run's completed steps before it and runs from it on.",
    )
    input: Any = Field(
        default=None,
        description="Other input for the fork (a workflow's arguments by parameter name; "
        "for a graph, its input). Absent: the source run's.",
    )
    edit: dict[str, Any] | None = Field(
        default=None,
        description='Outputs to replace, by step id: {"3:summarize": "..."}. The fork '
        "point or a step before it; an edited fork point is journaled completed, and the "
        "fork goes on after it with that output.",
    )


class ForkAccepted(BaseModel):
    run_id: str = Field(description="The fork's run id.")
    forked_from: str
    forked_at: str


class Resumed(BaseModel):
    run_id: str


class StepSideOut(BaseModel):
    status: str
    output: Any = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    duration_ms: float | None = None
    error: str | None = None


class StepDiffOut(BaseModel):
    step_id: str
    status: str = Field(description="same, changed, only_a or only_b.")
    a: StepSideOut | None = None
    b: StepSideOut | None = None


class RunDiffOut(BaseModel):
    a: str
    b: str
    steps: list[StepDiffOut]


class ScheduleOut(BaseModel):
    name: str
    workflow: str
    cron: str | None
    every: str | None = Field(description="The interval, in seconds: '30s'.")
    tz: str
    missed: str
    source: str = Field(description="code (declared with @app.schedule) or api (added here).")
    paused: bool
    last_fired: str | None = Field(description="The newest tick fired (ISO, in its zone).")
    next_tick: str | None = Field(description="The next tick (ISO, in its zone); none paused.")


class NewSchedule(Body):
    name: str = Field(min_length=1, max_length=100)
    workflow: str = Field(
        min_length=1, max_length=MAX_WORKFLOW, description="A workflow of the server's app."
    )
    cron: str | None = Field(default=None, max_length=200, description="'0 * * * *'")
    every: str | None = Field(default=None, max_length=50, description="'30s', '5m', '1h30m'")
    tz: str = Field(default="UTC", max_length=100)
    missed: str = Field(default="latest", description="skip, latest or all.")


class ScheduleChange(Body):
    workflow: str | None = Field(default=None, min_length=1, max_length=MAX_WORKFLOW)
    cron: str | None = Field(default=None, max_length=200)
    every: str | None = Field(default=None, max_length=50)
    tz: str | None = Field(default=None, max_length=100)
    missed: str | None = None


class ScheduleTriggered(BaseModel):
    run_id: str
