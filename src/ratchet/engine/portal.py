"""The portal: an event loop on a thread of its own, where a :class:`ratchet.Ratchet` app
runs its coroutines for blocking callers (``app.get``, ``app.start``, the ``ratchet``
command) and where an embedded worker (``app.launch()``) runs beside the caller's code.

Reach it as :attr:`ratchet.Ratchet.portal`: ``app.portal.call(coro)`` runs ``coro`` there
and returns its result to the blocking caller."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ratchet.engine import connections
from ratchet.errors import RatchetError

T = TypeVar("T")


class Portal:
    """An event loop on a thread of its own, so synchronous callers can use the async
    store and an embedded worker can run beside the caller's code. The loop and its thread
    start on first use and end with :meth:`stop`."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The portal's loop, started (with its thread) if it is not running."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._serve, args=(loop,), name="ratchet-portal", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(connections.release())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal's loop and block until it returns (or raises).

        Refused on the portal's own loop, where blocking would wait for itself: code
        running there awaits ``coro`` instead."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            coro.close()
            raise RatchetError(
                "a blocking Ratchet call was made on the engine's own event loop; "
                "await the *_async variant instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @property
    def current(self) -> asyncio.AbstractEventLoop | None:
        """The portal's loop if it is running, without starting one."""
        return self._loop

    def stop(self) -> None:
        """Stop the loop and wait for its thread (a later call starts a new one)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join()
