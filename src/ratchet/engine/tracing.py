"""OpenTelemetry traces of drives: each drive of a run is one trace.

A drive (the first, a resume after a park, a takeover by the sweep or a reclaim) opens a
root span; every step attempt it executes is a child span; a step replayed from the
journal runs no code and gets no span. The drive's trace context is journaled in its
``run_started``/``run_resumed`` payload (``trace``), so the next drive links to it and a
run's traces can be followed from one to the next.

Tracing is on when OpenTelemetry is installed (``pip install 'ratchet-engine[otel]'``) and
either the application set a tracer provider before its workers started, or the standard
variables ask for an exporter (``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); then Ratchet sets up the SDK from them. Otherwise
every hook here is a check against None: no import, no span, no cost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from ratchet._version import __version__
from ratchet.extras import install_line

log = logging.getLogger("ratchet.tracing")

_UNSET: Any = object()
_tracer: Any = _UNSET


def tracer() -> Any | None:
    """The tracer drives use, or None when tracing is off (decided once per process)."""
    global _tracer
    if _tracer is _UNSET:
        _tracer = _make_tracer()
    return _tracer


def _make_tracer() -> Any | None:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    # An application that set a tracer provider has imported the API; otherwise only the
    # OTEL_* variables can ask for traces. Neither: OpenTelemetry is not even imported.
    if "opentelemetry.trace" not in sys.modules and not _asked_by_env():
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        log.warning(
            "action=tracing_off reason=%r",
            "OTEL_* variables ask for traces, but "
            f"the otel extra is missing: {install_line('otel')}",
        )
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        provider = _provider_from_env()  # nobody set one: the OTEL_* variables may ask
        if provider is None:
            return None
        trace.set_tracer_provider(provider)
    return trace.get_tracer("ratchet", __version__)


def _asked_by_env() -> bool:
    return bool(
        os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _provider_from_env() -> Any | None:
    if not _asked_by_env():
        return None
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    exporters = [n.strip() for n in (names or "otlp").split(",") if n.strip()]
    if exporters == ["none"]:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "action=tracing_off reason=%r",
            "OTEL_* variables ask for traces, but the "
            f"otel extra is missing: {install_line('otel')}",
        )
        return None
    attributes = {}
    if "service.name" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "") and not os.environ.get(
        "OTEL_SERVICE_NAME"
    ):
        attributes["service.name"] = "ratchet"
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in exporters:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter: Any = OTLPSpanExporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("action=tracing_exporter_unknown name=%r (otlp, console, none)", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class DriveTrace:
    """The root span of one drive, and the spans of the steps it executes."""

    def __init__(
        self,
        tracer: Any,
        run_id: str,
        workflow: str,
        version: str,
        drive: int,
        reason: str,
        worker_id: str,
        previous: Any,
    ) -> None:
        from opentelemetry import context, trace

        self._trace = trace
        links = []
        ctx = _span_context(previous)
        if ctx is not None:
            links.append(trace.Link(ctx, {"ratchet.link": "previous_drive"}))
        # An empty context: the drive is a root, whatever the worker's own context holds.
        self.span = tracer.start_span(
            f"drive {workflow}",
            context=context.Context(),
            kind=trace.SpanKind.INTERNAL,
            links=links,
            attributes={
                "ratchet.run_id": run_id,
                "ratchet.workflow": workflow,
                "ratchet.workflow_version": version,
                "ratchet.drive": drive,
                "ratchet.drive.reason": reason,
                "ratchet.worker_id": worker_id,
            },
        )
        self.context = trace.set_span_in_context(self.span)
        self.tracer = tracer

    def ids(self) -> dict[str, str]:
        """The drive's trace context, as journaled for the next drive to link to."""
        sc = self.span.get_span_context()
        return {"trace_id": format(sc.trace_id, "032x"), "span_id": format(sc.span_id, "016x")}

    def step(
        self, step_id: str, attempt: int, key: str, kind: str | None, started: dict[str, Any] | None
    ) -> Any:
        attributes: dict[str, Any] = {
            "ratchet.step_id": step_id,
            "ratchet.attempt": attempt,
            "ratchet.idempotency_key": key,
        }
        name = f"step {step_id}"
        if kind == "llm":
            provider = (started or {}).get("provider")
            model = (started or {}).get("model")
            attributes["gen_ai.operation.name"] = "chat"
            if provider:
                attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = provider
            if model:
                attributes["gen_ai.request.model"] = model
                name = f"chat {model}"
        elif kind:
            attributes["ratchet.step.kind"] = kind
        return self.tracer.start_span(name, context=self.context, attributes=attributes)

    def end(self, outcome: str) -> None:
        self.span.set_attribute("ratchet.drive.outcome", outcome)
        if outcome in ("failed", "aborted"):
            self.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome))
        self.span.end()


def _span_context(previous: Any) -> Any | None:
    """The journaled ``{"trace_id", "span_id"}`` of the previous drive, as a SpanContext."""
    if not isinstance(previous, dict):
        return None
    from opentelemetry import trace

    try:
        return trace.SpanContext(
            int(previous["trace_id"], 16),
            int(previous["span_id"], 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    except (KeyError, TypeError, ValueError):
        return None


def start_drive(
    run_id: str, workflow: str, version: str, drive: int, reason: str, worker_id: str, previous: Any
) -> DriveTrace | None:
    t = tracer()
    if t is None:
        return None
    return DriveTrace(t, run_id, workflow, version, drive, reason, worker_id, previous)


def end_step(
    span: Any, outcome: str, error: str | None = None, llm: dict[str, Any] | None = None
) -> None:
    """End a step's span (None: tracing is off) with its outcome: completed, retrying,
    failed, interrupted (the drive stopped) or abandoned (its workflow stopped waiting)."""
    if span is None:
        return
    span.set_attribute("ratchet.step.outcome", outcome)
    if llm:
        usage = llm.get("usage") or {}
        if llm.get("model"):
            span.set_attribute("gen_ai.response.model", llm["model"])
        for field in ("input_tokens", "output_tokens"):
            if isinstance(usage.get(field), int):
                span.set_attribute(f"gen_ai.usage.{field}", usage[field])
    if error is not None:
        from opentelemetry import trace

        span.set_attribute("error.type", error.split(":", 1)[0])
        if outcome == "failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR, error[:200]))
    span.end()


@contextlib.contextmanager
def active(span: Any) -> Iterator[None]:
    """The step's span as the current one while its code runs, so spans the step's own code
    makes (an instrumented HTTP client) nest under it."""
    if span is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield
