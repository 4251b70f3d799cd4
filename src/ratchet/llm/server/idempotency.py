"""Answers kept by ``Idempotency-Key``, as a careful provider keeps them.

A key is claimed by the first request that brings it; the answer is stored under it
before that request's response is sent. A later request with the same key and the same
body (path plus canonical JSON) gets the stored answer back; one with another body is a
conflict. A duplicate that arrives while the first is still being answered waits for it.
A claim whose request ends without an answer (a fault, an error) is released, and whoever
was waiting claims the key in turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from ratchet.llm.server.answer import Answer


def fingerprint(path: str, body: Any) -> str:
    """What identifies a request's content: its path and its body's canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{path}\n{canonical}".encode()).hexdigest()


@dataclass
class Claim:
    """A key being answered by one request; ``done`` resolves when it is stored or
    released. Futures belong to the server's event loop, as do the requests."""

    key: str
    fingerprint: str
    done: asyncio.Future[None] = field(repr=False)
    answer: Answer | None = None


@dataclass(frozen=True)
class Replay:
    """The stored answer for a key seen before with the same body."""

    answer: Answer


@dataclass(frozen=True)
class Conflict:
    """The key was used with a different body."""


@dataclass(frozen=True)
class Wait:
    """The key is being answered by another request: wait for ``done``, then look again."""

    done: asyncio.Future[None]


class IdempotencyStore:
    """Claims and stored answers by key. Thread-safe: tests reset it from their thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, Claim] = {}

    def begin(self, key: str, print_: str) -> Claim | Replay | Conflict | Wait:
        """Claim ``key`` for a request with this fingerprint, or say why not."""
        with self._lock:
            claim = self._claims.get(key)
            if claim is None:
                claim = Claim(key, print_, asyncio.get_running_loop().create_future())
                self._claims[key] = claim
                return claim
            if claim.fingerprint != print_:
                return Conflict()
            if claim.answer is not None:
                return Replay(claim.answer)
            return Wait(claim.done)

    def store(self, claim: Claim, answer: Answer) -> None:
        """Keep ``answer`` under the claimed key and wake those waiting for it."""
        with self._lock:
            claim.answer = answer
        if not claim.done.done():
            claim.done.set_result(None)

    def release(self, claim: Claim) -> None:
        """Give the key up without an answer; a waiting duplicate claims it next."""
        with self._lock:
            if self._claims.get(claim.key) is claim and claim.answer is None:
                del self._claims[claim.key]
        if not claim.done.done():
            claim.done.set_result(None)

    def clear(self) -> None:
        """Forget every key (claims in flight still wake their waiters when they end)."""
        with self._lock:
            self._claims.clear()
