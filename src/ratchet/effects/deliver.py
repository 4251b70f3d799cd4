"""Deliver to the outside world once (DESIGN.md invariant 7).

A delivery claims its ``side_effect_receipts`` row before dispatching and settles it with
the response after. A re-drive that finds the receipt settled returns the stored response
and does not dispatch. A receipt left ``claimed`` means a crash fell between dispatch and
settle, and nobody knows whether the receiver got it; the delivery's policy decides:
``resend`` dispatches again under the same idempotency key (for receivers that dedupe on
it), ``at_most_once`` fails the step with an error naming the receipt, for a person.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Literal

from ratchet.engine.context import StepInfo, current_run, current_step
from ratchet.engine.definitions import to_json
from ratchet.engine.faults import crash_point
from ratchet.errors import InvalidInput, RatchetError, ReceiptUnresolved

Policy = Literal["resend", "at_most_once"]
POLICIES = ("resend", "at_most_once")


def _key(policy: str, name: str | None) -> tuple[Any, StepInfo, str]:
    if policy not in POLICIES:
        raise InvalidInput(f"unknown delivery policy {policy!r}: expected one of {POLICIES}")
    info = current_step()
    ctx = current_run.get()
    if ctx is None:
        raise RatchetError("ratchet.deliver() called outside a workflow")
    key = info.idempotency_key
    if name is not None:
        key = hashlib.sha256(f"{key}|{name}".encode()).hexdigest()
    return ctx, info, key


def _unresolved(key: str, info: StepInfo) -> ReceiptUnresolved:
    return ReceiptUnresolved(
        f"receipt {key} (run {info.run_id}, step {info.step_id}) was claimed and never "
        f"settled: the delivery may or may not have happened, and its policy at_most_once "
        f"forbids sending it again; resolve it by hand"
    )


async def deliver(dispatch: Callable[[str], Any], *, policy: Policy = "resend",
                  name: str | None = None) -> Any:
    """Call ``dispatch(idempotency_key)`` at most once per settled receipt; return its
    (JSON-serialisable) response. Use inside a step. ``name`` tells several deliveries of
    one step apart; each gets its own key derived from the step's."""
    ctx, info, key = _key(policy, name)
    store, lease = ctx.store, ctx.lease
    existing = await store.claim_receipt(lease, key, info.step_id)
    if existing is not None:
        if existing.status == "settled":
            return existing.response
        if policy == "at_most_once":
            raise _unresolved(key, info)
        await store.reclaim_receipt(lease, key)
    crash_point("after_receipt_claim")
    response = dispatch(key)
    if inspect.isawaitable(response):
        response = await response
    crash_point("after_dispatch")
    to_json(response, f"the response of the delivery in step {info.step_id}")
    await store.settle_receipt(lease, key, response)
    return response


def deliver_sync(dispatch: Callable[[str], Any], *, policy: Policy = "resend",
                 name: str | None = None) -> Any:
    """:func:`deliver` for a plain ``def`` step, which runs in a thread: the receipt is
    claimed and settled on the worker's loop, the dispatch runs here."""
    ctx, info, key = _key(policy, name)
    store, lease = ctx.store, ctx.lease

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, ctx.loop).result()

    existing = on_loop(store.claim_receipt(lease, key, info.step_id))
    if existing is not None:
        if existing.status == "settled":
            return existing.response
        if policy == "at_most_once":
            raise _unresolved(key, info)
        on_loop(store.reclaim_receipt(lease, key))
    crash_point("after_receipt_claim")
    response = dispatch(key)
    crash_point("after_dispatch")
    to_json(response, f"the response of the delivery in step {info.step_id}")
    on_loop(store.settle_receipt(lease, key, response))
    return response
