"""Open event streams end when their token does.

A request is authenticated once, when it arrives; an event stream then stays open for as
long as its run goes on, hours maybe. So the process watches the tokens its open streams
stand for: one query for all of them every ``interval_s`` (none while no stream is open),
and at the next expiry among them, whichever comes first. A stream whose token was revoked
or has expired is ended (its client, reconnecting, is refused 401).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from ratchet.store import Store, tokens
from ratchet.store.tokens import Token

log = logging.getLogger("ratchet.api")
TOKEN_CHECK_S = 5.0


class Watched:
    """One stream's hold on its token: ``ended`` once the token is revoked or expired."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.ended = False
        self.event = asyncio.Event()
        self._wakers: list[Callable[[], None]] = []

    def on_end(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when the token ends (to wake the stream's wait)."""
        self._wakers.append(wake)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.event.set()
            for wake in self._wakers:
                wake()


class TokenWatch:
    """The tokens of one server process's open streams, looked at together."""

    def __init__(self, store: Store, interval_s: float = TOKEN_CHECK_S) -> None:
        self.store = store
        self.interval_s = interval_s
        self._streams: dict[str, set[Watched]] = {}
        self._task: asyncio.Task[None] | None = None
        self._added = asyncio.Event()

    @contextlib.contextmanager
    def watching(self, token: Token) -> Iterator[Watched]:
        """Watch ``token`` while the block (a stream) lasts."""
        watched = Watched(token)
        self._streams.setdefault(token.token_id, set()).add(watched)
        self._added.set()  # its expiry may come before the next look
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="ratchet-token-watch"
            )
        try:
            yield watched
        finally:
            streams = self._streams.get(token.token_id)
            if streams is not None:
                streams.discard(watched)
                if not streams:
                    del self._streams[token.token_id]

    async def _run(self) -> None:
        while self._streams:
            self._added.clear()
            wait = self.interval_s
            try:
                ended, next_expiry = await tokens.ended_tokens(self.store, list(self._streams))
                for token_id in ended:
                    for watched in list(self._streams.get(token_id, ())):
                        watched.end()
                if next_expiry is not None:
                    # A hair past it: at the expiry itself the token is still live.
                    wait = min(wait, max(0.0, next_expiry - await self.store.now()) + 0.01)
            except Exception as e:
                # The database is away: streams go on (they read nothing meanwhile), and
                # the next look tries again.
                log.warning("action=token_watch_failed error=%s: %s", type(e).__name__, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), wait)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
