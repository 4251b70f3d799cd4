"""Deliver to the outside world once (invariant 7 in docs/concepts/invariants.md).

A delivery claims its ``side_effect_receipts`` row before dispatching and settles it with
the response after. The receipt belongs to the delivery, not to the attempt: its identity
is (run, step, delivery), the delivery being the ``name=`` given or ``#n`` for the step's
n-th unnamed delivery, counted in call order within the running attempt. So each delivery
of a step is dispatched once, and a later attempt of the step (a retry, or a re-drive after
a crash) that reaches a delivery an earlier one claimed finds that receipt:

* settled: the stored response comes back, nothing is dispatched;
* failed (settled by hand as not delivered): :class:`~ratchet.errors.DeliveryFailed`;
* claimed: a crash fell between dispatch and settle, or the dispatch raised, and nobody
  knows whether the receiver got it. The policy decides: ``resend`` dispatches again
  under the receipt's key (for receivers that dedupe on it); ``at_most_once`` raises
  :class:`~ratchet.errors.ReceiptUnresolved`, for a person (``ratchet receipts settle``).

The key sent out is the one of the attempt that first claimed the receipt: for the first
unnamed delivery exactly the attempt's idempotency key (invariant 6 in
docs/concepts/invariants.md), for the others ``sha256("<attempt key>|<delivery>")``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ratchet.engine.context import StepInfo, current_run, current_step
from ratchet.engine.definitions import to_json
from ratchet.engine.faults import crash_point
from ratchet.errors import DeliveryFailed, InvalidInput, RatchetError, ReceiptUnresolved
from ratchet.model import DeliveryReceipt, DeliveryStatus

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive

Policy = Literal["resend", "at_most_once"]
POLICIES = ("resend", "at_most_once")
FIRST = "#1"


def delivery_key(attempt_key: str, delivery: str) -> str:
    """The key a delivery is sent under when ``attempt_key``'s attempt claims it."""
    if delivery == FIRST:
        return attempt_key
    return hashlib.sha256(f"{attempt_key}|{delivery}".encode()).hexdigest()


def _prepare(policy: str, name: str | None) -> tuple[Drive, StepInfo, str, str]:
    """Check the call; the run, the step, the delivery's identity and its key."""
    if policy not in POLICIES:
        raise InvalidInput(f"unknown delivery policy {policy!r}: expected one of {POLICIES}")
    if name is not None and (
        not isinstance(name, str) or not name or name.startswith("#") or "\x00" in name
    ):
        # "#..." is how unnamed deliveries are numbered; a name must not take one's place.
        raise InvalidInput(
            f"invalid delivery name {name!r}: expected a non-empty string "
            "without NUL that does not start with '#'"
        )
    info = current_step()
    ctx = current_run.get()
    if ctx is None:
        raise RatchetError("ratchet.deliver() called outside a workflow")
    delivery = name if name is not None else info._next_delivery()
    return ctx, info, delivery, delivery_key(info.idempotency_key, delivery)


def _unresolved(r: DeliveryReceipt) -> ReceiptUnresolved:
    return ReceiptUnresolved(
        f"receipt {r.idempotency_key} (run {r.run_id}, step {r.step_id}, delivery "
        f"{r.delivery}) was claimed and never settled: the delivery may or may not have "
        f"happened, and its policy at_most_once forbids sending it again; resolve it by hand "
        f"with `ratchet receipts settle {r.idempotency_key} --response JSON` (or --failed), "
        f"then `ratchet retry {r.run_id}`"
    )


def _failed(r: DeliveryReceipt) -> DeliveryFailed:
    return DeliveryFailed(
        f"delivery {r.delivery} of step {r.step_id} (receipt {r.idempotency_key}) was "
        "settled by hand as failed: it did not happen, and it is not dispatched again"
    )


def _resend(existing: DeliveryReceipt | None, policy: str) -> bool:
    """What a receipt found at claim time means: True to dispatch again under its key,
    False when there is none (a fresh claim: dispatch); raises when the delivery must not
    be dispatched. A settled receipt is handled by the caller."""
    if existing is None:
        return False
    if existing.status == DeliveryStatus.FAILED:
        raise _failed(existing)
    if policy == "at_most_once":
        raise _unresolved(existing)
    return True


async def deliver(
    dispatch: Callable[[str], Any], *, policy: Policy = "resend", name: str | None = None
) -> Any:
    """Call ``dispatch(idempotency_key)`` once per delivery and return its (JSON-
    serialisable) response; a later attempt or drive gets the stored response back. Use
    inside a step. Each call is its own delivery: named by ``name``, else numbered in call
    order within the step."""
    ctx, info, delivery, key = _prepare(policy, name)
    existing = await ctx.claim_receipt(key, info.step_id, delivery=delivery, attempt=info.attempt)
    if existing is not None:
        if existing.status == DeliveryStatus.SETTLED:
            return existing.response
        key = existing.idempotency_key
    if _resend(existing, policy):
        await ctx.reclaim_receipt(key)
    crash_point("after_receipt_claim")
    response = dispatch(key)
    if inspect.isawaitable(response):
        response = await response
    crash_point("after_dispatch")
    await ctx.settle_receipt(key, _stored(response, delivery, info.step_id))
    return response


def deliver_sync(
    dispatch: Callable[[str], Any], *, policy: Policy = "resend", name: str | None = None
) -> Any:
    """:func:`deliver` for a plain ``def`` step, which runs in a thread: the receipt is
    claimed and settled on the worker's loop, the dispatch runs here. An ``async def``
    step must ``await ratchet.deliver(...)`` instead."""
    ctx, info, delivery, key = _prepare(policy, name)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is ctx.loop:
        # Waiting here for the loop to claim the receipt would block that very loop.
        raise RatchetError(
            f"ratchet.deliver_sync() called in step {info.step_id} on the worker's event loop "
            "(an async def step): use `await ratchet.deliver(...)` there"
        )

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, ctx.loop).result()

    existing = on_loop(
        ctx.claim_receipt(key, info.step_id, delivery=delivery, attempt=info.attempt)
    )
    if existing is not None:
        if existing.status == DeliveryStatus.SETTLED:
            return existing.response
        key = existing.idempotency_key
    if _resend(existing, policy):
        on_loop(ctx.reclaim_receipt(key))
    crash_point("after_receipt_claim")
    response = dispatch(key)
    crash_point("after_dispatch")
    on_loop(ctx.settle_receipt(key, _stored(response, delivery, info.step_id)))
    return response


def _stored(response: Any, delivery: str, step_id: str) -> Any:
    """The response as its receipt stores it: its JSON form (pydantic's for what json
    cannot write), which a later drive gets back."""
    return json.loads(to_json(response, f"the response of delivery {delivery} in step {step_id}"))
