"""What a sandbox may report: one grant per live sandbox, held in the memory of the worker
that spawned it and serves its report channel.

A grant is found by its token's sha256 (the token itself is kept nowhere); it carries the
run's journal as its host writes it (:class:`ratchet.sandbox.host.HostJournal`: the fold
every report is checked against, and the lease the sandbox writes under, its owner's at
the epoch the sandbox was spawned under, so the store's fence refuses it once the run has
moved on). A grant ends with its sandbox, or at its deadline.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from ratchet.sandbox.host import HostJournal

# A sandbox without a timeout still gets a token that ends.
DEFAULT_TTL_S = 24 * 3600.0
# How many ended tokens are remembered, to answer "expired" rather than "unknown".
_ENDED_KEPT = 1024


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class Grant:
    """One live sandbox's right to report on its run."""

    run_id: str
    sandbox_id: str
    journal: HostJournal
    expires_at: float  # time.monotonic()

    @property
    def finished(self) -> str | None:
        """The run's end, once journaled (by the sandbox's report or by the host)."""
        return self.journal.finished


class Grants:
    """The grants of one report channel."""

    def __init__(self) -> None:
        self._by_hash: dict[str, Grant] = {}
        self._ended: dict[str, None] = {}

    def issue(
        self, journal: HostJournal, sandbox_id: str, ttl_s: float | None = None
    ) -> tuple[Grant, str]:
        """A new grant on ``journal`` and its token (shown once, to the sandbox)."""
        token = secrets.token_urlsafe(32)
        grant = Grant(
            journal.run_id, sandbox_id, journal, time.monotonic() + (ttl_s or DEFAULT_TTL_S)
        )
        self._by_hash[token_hash(token)] = grant
        return grant, token

    def find(self, token: str) -> Grant | str:
        """The token's grant, or why there is none."""
        digest = token_hash(token)
        grant = self._by_hash.get(digest)
        if grant is None:
            return (
                "token expired: its sandbox has ended"
                if digest in self._ended
                else ("invalid sandbox token")
            )
        if time.monotonic() >= grant.expires_at:
            self._end(digest)
            return "token expired: its sandbox ran past its deadline"
        return grant

    def revoke(self, grant: Grant) -> None:
        """The sandbox ended: its token is refused from now on, and its model calls still
        being made are given up."""
        grant.journal.close()
        for digest, held in list(self._by_hash.items()):
            if held is grant:
                self._end(digest)

    def _end(self, digest: str) -> None:
        self._by_hash.pop(digest, None)
        self._ended[digest] = None
        while len(self._ended) > _ENDED_KEPT:
            self._ended.pop(next(iter(self._ended)))
