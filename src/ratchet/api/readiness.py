"""``/readyz``'s look at the database: bounded in time, and shared by the probes that
arrive while one is under way.

A database that stops answering does not fail a query at once: a PostgreSQL pool waits
for a connection, a packet may be lost. A probe gets its answer within ``timeout_s``
whatever happens, and the look it started goes on in the background, where the next probe
waits on it instead of starting another, so probes during an outage hold one connection
attempt at a time, not one each."""

from __future__ import annotations

import asyncio
import logging

from ratchet.errors import StoreNotReady
from ratchet.store import Store

log = logging.getLogger("ratchet.api")
READY_TIMEOUT_S = 5.0


class Readiness:
    """Checks ``store`` (:meth:`ratchet.store.Store.check_ready`) for ``/readyz``."""

    def __init__(self, store: Store, timeout_s: float = READY_TIMEOUT_S) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._look: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Return when the store is ready; raise :class:`StoreNotReady` saying why not."""
        look = self._look
        if look is None or look.done():
            look = self._look = asyncio.create_task(
                self.store.check_ready(), name="ratchet-readiness"
            )
            # Its outcome is read by the probes awaiting it; one that outlived them all
            # must not be reported as an exception nobody retrieved.
            look.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.wait_for(asyncio.shield(look), self.timeout_s)
        except TimeoutError:
            reason = f"the database did not answer within {self.timeout_s:g}s"
            log.warning("action=not_ready reason=%r", reason)
            raise StoreNotReady(reason) from None
        except StoreNotReady as e:
            log.warning("action=not_ready reason=%r cause=%r", str(e), e.__cause__)
            raise
        except Exception as e:
            log.warning("action=not_ready reason=check_failed cause=%r", e)
            raise StoreNotReady(f"the check failed ({type(e).__name__})") from e

    def close(self) -> None:
        """Stop a look still under way (the server is stopping)."""
        if self._look is not None and not self._look.done():
            self._look.cancel()
        self._look = None


__all__ = ["READY_TIMEOUT_S", "Readiness"]
