"""A traced worker process for the tracing tests (``python tests/support/trace_app.py``, configured
like ``crash_app``'s, plus ``TRACE_FILE``, where every span is appended as one JSON line
as it ends, and ``CRASH_LLM_URL``, the local model provider).

The application sets its own tracer provider before its worker starts, as an application
that already traces would; spans are written one by one (not batched), so what a drive
ended before a SIGKILL is on disk.

The workflow: a plain step, a model call, a step that waits for the test's ``blocker``
gate (the test kills the worker there), a park on signal ``go``, and a last step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from crash_app import LLM_SECRET, gate, main, record

import ratchet

MODEL = "gpt-4.1-mini"


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.step
    async def one() -> int:
        record("invoke")
        return 1

    @app.step
    async def blocker() -> int:
        record("invoke")
        await gate("blocker")
        return 2

    @app.step
    async def last() -> int:
        record("invoke")
        return 3

    @app.workflow()
    async def traced() -> list[Any]:
        import openai

        client = ratchet.llm.wrap(
            openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET)
        )
        first = await one()
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}]
        )
        second = await blocker()
        await ratchet.wait_for_signal("go")
        return [first, chat.choices[0].message.content, second, await last()]

    return app


def _install_file_tracer(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                ctx = span.get_span_context()
                assert ctx is not None
                line = (
                    json.dumps(
                        {
                            "name": span.name,
                            "trace_id": format(ctx.trace_id, "032x"),
                            "span_id": format(ctx.span_id, "016x"),
                            "parent": format(span.parent.span_id, "016x") if span.parent else None,
                            "links": [
                                {
                                    "trace_id": format(link.context.trace_id, "032x"),
                                    "span_id": format(link.context.span_id, "016x"),
                                }
                                for link in span.links
                            ],
                            "attributes": dict(span.attributes or {}),
                        }
                    )
                    + "\n"
                )
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


if __name__ == "__main__":
    _install_file_tracer(os.environ["TRACE_FILE"])
    main(build)
