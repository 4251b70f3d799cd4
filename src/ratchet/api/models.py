"""The API's request and response bodies: pydantic models, which are also the OpenAPI
spec's schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Error(BaseModel):
    """Every refusal, whatever the status."""

    error: str = Field(description="A stable code: unauthorized, forbidden, not_found, "
                                   "conflict, payload_too_large, invalid_input, internal.")
    message: str
    details: Any = None


class StartRun(BaseModel):
    workflow: str = Field(min_length=1, description="A workflow's or a graph's name.")
    input: dict[str, Any] = Field(
        default_factory=dict,
        description="The workflow's arguments by parameter name; for a graph, its input.")
    run_id: str | None = Field(default=None, description="Makes the start idempotent.")
    queue: str = "default"


class RunAccepted(BaseModel):
    run_id: str
    status: str


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


class RunDetail(Run):
    llm: LLMUsage
    children: list[ChildRun]


class RunPage(BaseModel):
    runs: list[Run]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null "
                                                "at the end.")


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


class SignalBody(BaseModel):
    data: Any = None


class Decision(BaseModel):
    approved: bool
    by: str = Field(min_length=1)
    comment: str | None = None


class DecisionMade(BaseModel):
    run_id: str
    step_id: str
    approved: bool
    by: str
    comment: str | None


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
    version: str
    parameters: list[str]


class Health(BaseModel):
    status: str


class ReceiptSignature(BaseModel):
    keyid: str = Field(description="sha256 (hex) of the raw Ed25519 public key.")
    sig: str = Field(description="Base64 Ed25519 signature over the DSSE PAE of the payload.")


class RunReceipt(BaseModel):
    """A DSSE envelope whose payload is an in-toto Statement v1 about the run."""

    payloadType: str = Field(description="application/vnd.in-toto+json")
    payload: str = Field(description="The statement, base64.")
    signatures: list[ReceiptSignature]
