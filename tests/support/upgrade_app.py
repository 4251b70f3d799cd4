"""An app as three deploys of it, for the upgrade tests, and the worker process that serves
one of them (``python tests/support/upgrade_app.py``, configured like ``crash_app``'s, plus
``UPGRADE_CODE``: which deploy it runs).

* ``old``: ``checkout`` version 1; ``refund`` as first written (look, refund_v1, notify);
* ``new``: ``checkout`` versions 1 and 2 side by side; ``refund`` with
  ``ratchet.patched("fix-refund-prompt")`` choosing refund_v2 for runs that reach it
  first, refund_v1 for runs that went past it the old way;
* ``deprecated``: as ``new``, with ``refund``'s old path removed
  (``ratchet.deprecate_patch``).

Every step logs its invocation (``crash_app.record``); a step told to block waits for the
gate named after it and the order (``reserve-<order>``, ``refund-<order>``).
"""

from __future__ import annotations

import os

from crash_app import gate, main, record

import ratchet

CODES = ("old", "new", "deprecated")
PATCH = "fix-refund-prompt"


def build(
    db_url: str,
    *,
    lease_ttl: float = 5.0,
    recovery_interval: float = 30.0,
    code: str | None = None,
) -> ratchet.Ratchet:
    code = code or os.environ.get("UPGRADE_CODE", "new")
    assert code in CODES, code
    app = ratchet.Ratchet(db_url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.step
    async def reserve(order: str, block: bool) -> str:
        record("invoke")
        if block:
            await gate(f"reserve-{order}")
        return f"reserved {order}"

    @app.step
    async def charge(order: str) -> str:
        record("invoke")
        return f"charged {order}"

    @app.workflow(name="checkout", version="1")
    async def checkout_v1(order: str, block: bool = False) -> str:
        return "v1: " + await reserve(order, block)

    if code != "old":

        @app.workflow(name="checkout", version="2")
        async def checkout_v2(order: str, block: bool = False) -> str:
            reserved = await reserve(order, block)
            return f"v2: {reserved}, {await charge(order)}"

    @app.step
    async def look(order: str) -> str:
        record("invoke")
        return order

    @app.step
    async def refund_v1(order: str, block: bool) -> str:
        record("invoke")
        if block:
            await gate(f"refund-{order}")
        return f"refunded {order} with the old prompt"

    @app.step
    async def refund_v2(order: str, block: bool) -> str:
        record("invoke")
        if block:
            await gate(f"refund-{order}")
        return f"refunded {order} with the fixed prompt"

    @app.step
    async def notify(text: str) -> str:
        record("invoke")
        return text

    @app.workflow(name="refund")
    async def refund(order: str, block: bool = False) -> str:
        await look(order)
        if code == "old":
            done = await refund_v1(order, block)
        elif code == "new":
            if ratchet.patched(PATCH):
                done = await refund_v2(order, block)
            else:
                done = await refund_v1(order, block)
        else:
            ratchet.deprecate_patch(PATCH)
            done = await refund_v2(order, block)
        return await notify(done)

    return app


if __name__ == "__main__":
    main(build)
