"""``create(stream=True)`` in a workflow: the provider's chunks reach the workflow as they
arrive, and the step journals them (compactly, :mod:`ratchet.llm.chunks`) with the
response they assemble into and its usage; a replay yields the same chunks, boundary for
boundary, without calling the provider.

A stream is one step that stays open while the workflow reads it. It ends, and its
``step_completed`` is journaled, before anything else of the workflow is:

- read to its end, it completes with the whole answer and the usage the provider reported;
- let go (``break`` or an exception out of ``async for``, ``aclose()``, leaving
  ``async with``), the provider's stream is closed at once and the step completes with what
  had arrived, the usage the provider had reported or, where it had not yet, an estimate
  (``usage_estimated`` in its llm meta);
- still held when the workflow goes on to its next step (an iterator kept and read later),
  the rest of the answer is read first, so the stream's end comes before that step.

A stream that breaks after chunks arrived completes too, with what arrived and the error:
the workflow's ``async for`` raises :class:`ratchet.LLMError` after those chunks, on the
first drive and on every replay alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

from ratchet.errors import LLMError
from ratchet.llm import chunks
from ratchet.llm.assemble import ASSEMBLERS, canonical, sdk_chunk
from ratchet.llm.endpoints import CHAT, Endpoint
from ratchet.llm.prices import Usage
from ratchet.llm.sdk_errors import as_llm_error
from ratchet.llm.worst_case import CHARS_PER_TOKEN, worst_case
from ratchet.model import StepStatus

if TYPE_CHECKING:
    from ratchet.engine.definitions import StepDef
    from ratchet.engine.drive import Drive
    from ratchet.model import StepState


class DurableStream:
    """What ``await create(..., stream=True)`` returns in a workflow: iterate it (``async
    for``) as the SDK's stream, optionally inside ``async with``; ``aclose()`` (or
    ``close()``) ends it early."""

    def __init__(
        self,
        ctx: Drive,
        sd: StepDef,
        endpoint: Endpoint,
        kwargs: dict[str, Any],
        step_id: str,
        journaled: StepState | None,
        started: dict[str, Any],
    ) -> None:
        kwargs = dict(kwargs)
        # OpenAI chat reports usage in a last chunk only when asked; it is asked for here,
        # so that the journal has it, and that chunk reaches the caller only if they asked.
        hide_usage = False
        if endpoint is CHAT and not (kwargs.get("stream_options") or {}).get("include_usage"):
            kwargs["stream_options"] = {
                **(kwargs.get("stream_options") or {}),
                "include_usage": True,
            }
            hide_usage = True
        self._live = _Live(ctx, sd, endpoint, kwargs, step_id, journaled, started, hide_usage)
        self._iterating = False

    def __aiter__(self) -> _Reader:
        if self._iterating:
            raise LLMError(f"{self._live.endpoint.name}: a stream can be iterated once")
        self._iterating = True
        return _Reader(self._live)

    async def __aenter__(self) -> DurableStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading: the step completes now with what has arrived."""
        self._live.released = True
        await self._live.end(workflow_done=False)

    close = aclose  # the SDKs' streams are closed with close()


class _Reader:
    """The iterator over a stream's chunks. When the workflow drops it (``break``, an
    exception out of ``async for``), the stream is let go."""

    def __init__(self, live: _Live) -> None:
        self._live = live

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> Any:
        return await self._live.next()

    async def aclose(self) -> None:
        self._live.released = True
        await self._live.end(workflow_done=False)

    def __del__(self) -> None:
        self._live.let_go()


class _Live:
    """One stream's step: started on the first read, held open (``Drive.hold``) while
    the workflow reads it, ended by :meth:`end`."""

    def __init__(
        self,
        ctx: Drive,
        sd: StepDef,
        endpoint: Endpoint,
        kwargs: dict[str, Any],
        step_id: str,
        journaled: StepState | None,
        started: dict[str, Any],
        hide_usage: bool,
    ) -> None:
        self.ctx, self.sd, self.endpoint, self.kwargs = ctx, sd, endpoint, kwargs
        self.step_id, self.journaled, self.started = step_id, journaled, started
        self.hide_usage = hide_usage
        self.released = False  # the workflow let the stream go (see Drive.close_held)
        self.sink = Sink(self)
        self.arrived: deque[Any] = deque()
        self._task: asyncio.Task[Any] | None = None
        # The chunks the journal holds beyond those that arrived here, read from the step's
        # output once its task is done: all of them on a replay, none after a live read.
        self._journaled_chunks: deque[dict[str, Any]] | None = None
        self._error: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- reading -------------------------------------------------------------------------

    async def next(self) -> Any:
        while True:
            if self._task is None:
                self._start()
            assert self._task is not None
            if self.arrived:
                chunk = self.arrived.popleft()
                if self.hide_usage and _usage_only(chunk):
                    continue
                return chunk
            if not self._task.done():
                await self._wait()
                continue
            if self._journaled_chunks is None:
                self._read_output(self._task.result())  # the step's failure is raised here
            assert self._journaled_chunks is not None
            if self._journaled_chunks:
                chunk = sdk_chunk(self.endpoint, self._journaled_chunks.popleft())
                if self.hide_usage and _usage_only(chunk):
                    continue
                return chunk
            if self._error is not None:
                raise LLMError(self._error, provider=self.endpoint.provider)
            raise StopAsyncIteration

    def _start(self) -> None:
        # The step's task runs in a copy of the workflow's context taken now, before the
        # stream is held: its own step boundary does not end it.
        self._task = asyncio.ensure_future(
            self.ctx.run_step(
                self.sd, (self.sink,), dict(self.kwargs), self.step_id, self.journaled, self.started
            )
        )
        self._task.add_done_callback(self._done)
        if self.journaled is None or self.journaled.status != StepStatus.COMPLETED:
            self.ctx.hold(self)

    def _done(self, _: object) -> None:
        # The step's end is in the journal's chain (emitted before its task returned).
        self.ctx.release(self)
        self.wake()

    def _read_output(self, output: Any) -> None:
        if self.sink.ran:  # read live: every chunk the journal holds arrived here
            self._journaled_chunks, self._error = deque(), self.sink.error
        elif isinstance(output, dict) and "chunks" in output and "response" in output:
            self._journaled_chunks = deque(chunks.decode(output["chunks"], output["response"]))
            self._error = output.get("error")
        else:  # journaled by a Ratchet that kept the response alone
            self._journaled_chunks = deque(
                c.to_dict() if hasattr(c, "to_dict") else dict(c)
                for c in canonical(self.endpoint, output, usage=True)
            )

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # -- ending --------------------------------------------------------------------------

    def let_go(self) -> None:
        """The workflow dropped the iterator: stop reading the provider. The step's end is
        journaled by its own task, and waited for at the workflow's next step boundary."""
        if self._task is None or self._task.done() or self.released:
            return
        self.released = True
        try:
            loop = self._task.get_loop()
            loop.call_soon_threadsafe(self.sink.stop)
        except RuntimeError:  # the loop is closed: the drive is over
            pass

    async def end(self, *, workflow_done: bool) -> None:
        """End the step now (the stream was let go, or the workflow is over) or once the
        rest of the answer has arrived (the workflow goes on while it still holds the
        stream); return once its end is journaled."""
        task = self._task
        if task is None:
            return
        if self.released or workflow_done:
            self.sink.stop()
        try:
            # Shielded: a workflow cancelled while it waits here does not abandon the
            # stream's step, whose end is journaled all the same.
            await asyncio.shield(task)
        except Exception:
            pass  # journaled as the step's failure; a reader still there gets it next
        finally:
            self.ctx.release(self)


def _usage_only(chunk: Any) -> bool:
    return not getattr(chunk, "choices", None) and getattr(chunk, "usage", None) is not None


class Sink:
    """What a streaming step's attempt reads the provider's stream into: the response it
    assembles, the chunk log the journal keeps, and the chunks for the workflow."""

    def __init__(self, live: _Live) -> None:
        self._live = live
        self.count = 0
        self._chunks: list[dict[str, Any]] = []
        self._assembler = ASSEMBLERS[live.endpoint.name]()
        self._stopped = False
        self._pump: asyncio.Task[None] | None = None
        self.complete = False
        self.ran = False  # an attempt read the provider's stream in this drive
        self.error: str | None = None

    def stop(self) -> None:
        """Stop reading the provider's stream (the workflow let it go)."""
        self._stopped = True
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    async def read(self, stream: Any) -> None:
        """Read ``stream`` (the SDK's) to its end, or until :meth:`stop`. An attempt starts
        afresh: what an earlier attempt read is not the answer."""
        self.count, self._chunks = 0, []
        self._assembler = ASSEMBLERS[self._live.endpoint.name]()
        self.complete, self.error, self.ran = False, None, True
        try:
            if self._stopped:
                return
            self._pump = asyncio.ensure_future(self._read_all(stream))
            try:
                await self._pump
                self.complete = True
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self._stopped or (task is not None and task.cancelling()):
                    raise  # cancelled from outside (a timeout, the drive stopping)
            except Exception as e:
                if not self.count:
                    raise  # nothing arrived: the step's retry policy decides
                error = as_llm_error(self._live.endpoint.provider, e)
                self.error = (
                    f"{self._live.endpoint.name}: the stream broke after "
                    f"{self.count} chunks: {type(error).__name__}: {error}"
                )
        finally:
            if not self.complete:
                with contextlib.suppress(Exception):
                    await stream.close()

    async def _read_all(self, stream: Any) -> None:
        live = self._live
        async for chunk in stream:
            d = chunk.to_dict(mode="json") if hasattr(chunk, "to_dict") else dict(chunk)
            self._assembler.take(d)
            self._chunks.append(d)
            self.count += 1
            live.arrived.append(chunk)
            live.wake()

    def body(self) -> dict[str, Any]:
        """The response: whole, or as far as it came."""
        return self._assembler.body()

    def output(self, body: dict[str, Any]) -> dict[str, Any]:
        """The step's journaled output: the response, its chunks, whether it came whole."""
        assembler = self._assembler
        out: dict[str, Any] = {
            "response": body,
            "chunks": chunks.encode(self._chunks, body, assembler.texts, assembler.counters),
            "complete": self.complete and self.error is None,
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    def usage(self, body: dict[str, Any], kwargs: dict[str, Any]) -> Usage | None:
        """The call's usage where the provider did not report all of it (a stream cut
        short): what it reported, the rest estimated as the budgets estimate (the prompt's
        JSON, the answer's text, at :data:`CHARS_PER_TOKEN` characters a token). None when
        the reported usage is whole."""
        if self._assembler.usage_final:
            return None
        reported = self._live.endpoint.usage(body)
        prompt, _ = worst_case((), {**kwargs, "max_tokens": 0})
        chars = sum(
            len(str(text))
            for d in self._chunks
            for where, _of in self._assembler.texts(d)
            if isinstance(text := chunks.get(d, where), str)
        )
        return Usage(
            input_tokens=reported.input_tokens or prompt,
            output_tokens=max(reported.output_tokens, -(-chars // CHARS_PER_TOKEN)),
            cached_tokens=reported.cached_tokens,
            cache_write_tokens=reported.cache_write_tokens,
            reasoning_tokens=reported.reasoning_tokens,
        )
