"""The official SDK clients, made durable: ``ratchet.llm.wrap(openai.AsyncOpenAI())``.

Inside a workflow (outside any step) each ``create`` of a durable endpoint is one journaled
step of kind ``llm``: the request carries ``Idempotency-Key: <the step's key>`` (the same key
when a crash re-drives the attempt, a new one for each retry), the SDK's own retries are off
(the step's retry policy is the only one), and the step's output is the provider's response
body, from which a replay rebuilds the SDK's typed object without calling the provider.
Called anywhere else, and for everything else on the client, it is the plain SDK.

In an isolated run's sandbox the call goes to the worker outside, which makes it with its
own client made at the same place of the app's code (:mod:`ratchet.llm.routing`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ratchet.engine import connections, nested_spend
from ratchet.engine.context import current_step, step_run, workflow_run
from ratchet.engine.definitions import StepDef
from ratchet.engine.retry import Retry, as_policy
from ratchet.errors import InvalidInput, NotIsolatable
from ratchet.extras import require
from ratchet.llm import routing
from ratchet.llm.endpoints import BY_PROVIDER, Endpoint
from ratchet.llm.gate import Gate
from ratchet.llm.gate import apply as gate_apply
from ratchet.llm.prices import Usage, cost_usd
from ratchet.llm.request_parts import split_request
from ratchet.llm.sdk_errors import as_llm_error
from ratchet.llm.stream import DurableStream
from ratchet.llm.worst_case import worst_case

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive
    from ratchet.model import StepState

C = TypeVar("C")

DEFAULT_RETRY = Retry(max_attempts=3, backoff_ms=1000, retry_on=("llm", "timeout"))
"""An LLM step's retry policy unless ``wrap(client, retry=...)`` says otherwise: three
attempts, 1 s then 2 s apart (longer when the provider's ``retry-after`` says so)."""

_REQUEST_ID_HEADERS = {"openai": "x-request-id", "anthropic": "request-id"}


def wrap(
    client: C, *, retry: Retry | Mapping[str, Any] | None = None, timeout_s: float | None = None
) -> C:
    """A durable stand-in for an async ``openai`` or ``anthropic`` client. ``retry`` is the
    LLM steps' policy (default :data:`DEFAULT_RETRY`); ``timeout_s`` bounds each attempt
    (the SDK's own timeout applies too)."""
    provider = _provider_of(client)
    policy = as_policy(retry, DEFAULT_RETRY)
    return cast(
        C, DurableClient(client, provider, policy, timeout_s, routing.site_of(sys._getframe(1)))
    )


def default_client(provider: str) -> Any:
    """The SDK's default async client for ``provider`` (``anthropic`` or ``openai``), from
    its own environment variables, wrapped."""
    if provider == "anthropic":
        import anthropic

        return wrap(anthropic.AsyncAnthropic())
    import openai

    return wrap(openai.AsyncOpenAI())


def _provider_of(client: Any) -> str:
    cls = type(client)
    provider = cls.__module__.split(".")[0]
    if provider not in BY_PROVIDER:
        raise InvalidInput(
            f"ratchet.llm.wrap: {cls.__module__}.{cls.__qualname__} is not an "
            "openai or anthropic client"
        )
    # The class names an SDK that may not be importable here (a stub, a pickled client):
    # say which extra brings it rather than failing inside importlib.
    require(f"ratchet.llm.wrap({cls.__qualname__})", provider)
    base = importlib.import_module(f"{provider}._base_client")
    if isinstance(client, base.AsyncAPIClient):
        return provider
    if isinstance(client, base.SyncAPIClient):
        raise InvalidInput(
            f"ratchet.llm.wrap: {provider}.{cls.__name__} is synchronous, and workflows are "
            f"async: wrap {provider}.Async{cls.__name__}(...) instead"
        )
    raise InvalidInput(
        f"ratchet.llm.wrap: {cls.__module__}.{cls.__qualname__} is not an "
        "openai or anthropic client"
    )


class _Proxy:
    """One attribute of the client: the durable methods set on it, everything else the
    original's."""

    def __init__(self, target: Any, members: Mapping[str, Any]) -> None:
        self.__dict__["_target"] = target
        self.__dict__.update(members)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_target"], name)

    def __repr__(self) -> str:
        return f"<durable {self.__dict__['_target']!r}>"


class DurableClient(_Proxy):
    """What :func:`wrap` returns: the client, with its model calls made durable."""

    def __init__(
        self, client: Any, provider: str, retry: Retry, timeout_s: float | None, site: str = ""
    ) -> None:
        bare = client.with_options(max_retries=0)  # the step's policy is the only retry
        tree: dict[str, Any] = {}
        calls: dict[str, DurableCall] = {}
        for endpoint in BY_PROVIDER[provider]:
            call = DurableCall(
                endpoint,
                endpoint.resource(client),
                endpoint.resource(bare),
                retry,
                timeout_s,
                connections.http_client_of(bare),
            )
            call.site = site
            calls[endpoint.name] = call
            node = tree
            for attr in endpoint.path:
                node = node.setdefault(attr, {})
            node["create"] = call
        super().__init__(client, _build(client, tree))
        self.__dict__["unwrapped"] = client
        self.__dict__["provider"] = provider
        self.__dict__["calls"] = calls  # by step name, for the worker of an isolated run
        self.__dict__["site"] = site
        routing.register(site, self)


def _build(target: Any, tree: Mapping[str, Any]) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name, sub in tree.items():
        if isinstance(sub, DurableCall):
            members[name] = sub
        else:
            inner = getattr(target, name)
            members[name] = _Proxy(inner, _build(inner, sub))
    return members


@dataclass(frozen=True, slots=True)
class Answer:
    """A provider's answer as a step returns it: the body to journal, and what the journal
    says of the call besides (usage, cost, latency, request id)."""

    body: dict[str, Any]
    meta: dict[str, Any]


def _encode(answer: Answer) -> tuple[Any, dict[str, Any]]:
    return answer.body, {"llm": answer.meta}


class DurableCall:
    """One durable ``create``."""

    def __init__(
        self,
        endpoint: Endpoint,
        plain: Any,
        bare: Any,
        retry: Retry,
        timeout_s: float | None,
        http: Any = None,
    ) -> None:
        self.endpoint = endpoint
        self.site = ""  # where its client was made (see ratchet.llm.routing)
        self._http = http  # its SDK client's HTTP client, whose connections a loop owns
        self._plain = plain.create
        self._plain_raw = plain.with_raw_response.create
        self._raw = bare.with_raw_response.create
        self._bare = bare.create
        # The request is journaled whole (content-addressed: ratchet.model.requests), so
        # the arguments are not journaled again as a step's args.
        self.step = StepDef(
            self._send,
            endpoint.name,
            retry,
            timeout_s,
            kind="llm",
            encode=_encode,
            decode=endpoint.revive,
            worst_case=worst_case,
            journal_args=False,
            request=self._request,
        )
        self.stream_step = StepDef(
            self._send_stream,
            endpoint.name,
            retry,
            timeout_s,
            kind="llm",
            encode=_encode,
            decode=lambda body: body,
            worst_case=worst_case,
            journal_args=False,
            request=self._request,
        )
        self.body_step = dataclasses.replace(self.step, decode=lambda body: body)

    def _request(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        return split_request(self.endpoint, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        gate = kwargs.pop("ratchet_gate", None)
        ctx = workflow_run()
        if ctx is None:
            in_step = step_run()
            if in_step is not None and routing.route is None and not args:
                # Inside a step of a run: a plain SDK call the run's budgets hold.
                return self._in_step(in_step[0], in_step[1].step_id, kwargs)
            # The plain SDK call: nothing is journaled, nothing to gate.
            return cast(Awaitable[Any], self._plain(*args, **kwargs))
        if args:
            raise InvalidInput(
                f"{self.endpoint.name}: pass its arguments by keyword, as the SDK does"
            )
        started = {"provider": self.endpoint.provider, "model": kwargs.get("model")}
        if routing.route is not None and (gate is not None or kwargs.get("stream")):
            raise NotIsolatable(
                f"{self.endpoint.name}: a confidence gate or a stream is not "
                "available in the isolated tier; call it plainly there"
            )
        if gate is not None:
            checked = check_gate(gate, self.endpoint, kwargs)
            # The call's ordinal is taken now, at call time, as for an ungated call.
            return self._gated(ctx, checked, kwargs, started, ctx.next_step(self.endpoint.name))
        if kwargs.get("stream") and self.endpoint.streams:
            step_id, journaled = ctx.next_step(self.endpoint.name)
            stream = DurableStream(
                ctx, self.stream_step, self.endpoint, kwargs, step_id, journaled, started
            )
            return _ready(stream)
        return ctx.call_step(self.step, (), kwargs, started)

    async def _gated(
        self,
        ctx: Drive,
        gate: Gate,
        kwargs: dict[str, Any],
        started: dict[str, Any],
        first: tuple[str, StepState | None],
    ) -> Any:
        async def call(
            kw: dict[str, Any], taken: tuple[str, StepState | None] | None = None
        ) -> tuple[str, dict[str, Any]]:
            step_id, journaled = taken or ctx.next_step(self.endpoint.name)
            body = await ctx.run_step(
                self.body_step, (), kw, step_id, journaled, {**started, "model": kw.get("model")}
            )
            return step_id, body

        async def judge(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
            return await call(judge_call(self.endpoint, model, prompt))

        step_id, body = await call(kwargs, first)
        verdict = await gate_apply(ctx, gate, step_id, body, kwargs, call, judge)
        return self.endpoint.revive(verdict.body)

    async def _in_step(self, ctx: Drive, step_id: str, kwargs: dict[str, Any]) -> Any:
        """The plain SDK call made inside a step: its worst case checked against the run's
        budgets and held before it is sent, its usage kept for the step's end event
        (:mod:`ratchet.engine.nested_spend`). A stream's usage is not read here: it counts
        at its worst case."""
        connections.used(self._http)  # the plain client's too: with_options shares it
        worst = worst_case((), kwargs) if nested_spend.needs_check(ctx) else None
        handle = nested_spend.reserve(ctx, step_id, worst)
        began = time.perf_counter()
        try:
            if kwargs.get("stream"):
                result = await self._plain(**kwargs)
                tokens = (worst or worst_case((), kwargs))[0]
                usage = Usage(input_tokens=0, output_tokens=tokens)
                meta = self.meta({}, kwargs, began, None, usage)
                nested_spend.answered(ctx, step_id, handle, meta)
                return result
            raw = await self._plain_raw(**kwargs)
        except Exception as e:
            # An answered failure spent nothing; one whose outcome is unknown keeps its
            # reservation until the step ends (the provider may have billed it).
            if not getattr(as_llm_error(self.endpoint.provider, e), "outcome_unknown", False):
                nested_spend.answered(ctx, step_id, handle, None)
            raise
        body = json.loads(raw.http_response.content)
        request_id = raw.headers.get(_REQUEST_ID_HEADERS[self.endpoint.provider])
        nested_spend.answered(ctx, step_id, handle, self.meta(body, kwargs, began, request_id))
        return raw.parse()

    def _headers(self, kwargs: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        headers = dict(kwargs.pop("extra_headers", None) or {})
        headers["Idempotency-Key"] = key or current_step().idempotency_key
        return headers

    async def _send(self, **kwargs: Any) -> Answer:
        if routing.route is not None:  # in a sandbox: the worker outside makes the call
            body, meta = await routing.route(self.site, kwargs)
            return Answer(body, meta)
        return await self.send(kwargs, current_step().idempotency_key)

    async def send(self, kwargs: dict[str, Any], key: str) -> Answer:
        """The provider call itself, sent with ``Idempotency-Key: key``: its body and
        what the journal says of it. The worker of an isolated run calls it for the
        step its sandbox runs."""
        connections.used(self._http)
        headers = self._headers(kwargs, key)
        began = time.perf_counter()
        try:
            raw = await self._raw(**kwargs, extra_headers=headers)
        except Exception as e:
            raise as_llm_error(self.endpoint.provider, e) from e
        body = json.loads(raw.http_response.content)
        request_id = raw.headers.get(_REQUEST_ID_HEADERS[self.endpoint.provider])
        return Answer(body, self.meta(body, kwargs, began, request_id))

    async def _send_stream(self, sink: Any, **kwargs: Any) -> Answer:
        """Read the provider's stream into ``sink`` (:class:`ratchet.llm.stream.Sink`),
        which passes its chunks on as they arrive; return the response with its chunks. A
        stream that breaks after chunks arrived completes with them and the error (the
        caller has seen them: a new attempt would show it their beginning again)."""
        connections.used(self._http)
        headers = self._headers(kwargs)
        began = time.perf_counter()
        try:
            stream = await self._bare(**kwargs, extra_headers=headers)
            request_id = stream.response.headers.get(_REQUEST_ID_HEADERS[self.endpoint.provider])
            await sink.read(stream)
        except Exception as e:
            raise as_llm_error(self.endpoint.provider, e) from e
        body = sink.body()
        return Answer(
            sink.output(body), self.meta(body, kwargs, began, request_id, sink.usage(body, kwargs))
        )

    def meta(
        self,
        body: dict[str, Any],
        kwargs: dict[str, Any],
        began: float,
        request_id: str | None,
        estimated: Usage | None = None,
    ) -> dict[str, Any]:
        """The llm meta of a call: its usage as the body reports it, or ``estimated``
        where the provider did not report all of it (``usage_estimated``)."""
        usage = estimated or self.endpoint.usage(body)
        model = body.get("model") or kwargs.get("model")
        meta = {
            "provider": self.endpoint.provider,
            "model": model,
            "usage": usage.as_json(),
            "cost_usd": cost_usd(model, usage),
            "latency_ms": round((time.perf_counter() - began) * 1000, 3),
            "request_id": request_id,
        }
        if estimated is not None:
            meta["usage_estimated"] = True
        return meta


def check_gate(gate: Any, endpoint: Endpoint, kwargs: dict[str, Any]) -> Gate:
    """``gate`` if it can gate this call, else :class:`InvalidInput` saying why."""
    if not isinstance(gate, Gate):
        raise InvalidInput(f"{endpoint.name}: ratchet_gate must be a ratchet.Gate, got {gate!r}")
    if not endpoint.streams or kwargs.get("stream"):
        raise InvalidInput(
            f"{endpoint.name}: a confidence gate needs a whole answer: not "
            "an embedding, nor a stream"
        )
    if gate.on_below == "branch":
        raise InvalidInput(
            f"{endpoint.name}: on_below='branch' is for graph ai-steps; in "
            "code, use on_below='fail' and catch ratchet.GateRejected"
        )
    return gate


def judge_call(endpoint: Endpoint, model: str, prompt: str) -> dict[str, Any]:
    """The arguments of a judge's call on ``endpoint``: ``prompt`` as the user's message,
    a short answer."""
    if endpoint.provider == "anthropic":
        return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}
    if endpoint.path == ("responses",):
        return {"model": model, "input": prompt, "max_output_tokens": 16}
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}


async def _ready(value: Any) -> Any:
    return value
