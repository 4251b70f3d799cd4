"""Wait keys: what a parked run waits for, written and read back in one form."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ratchet.model.events import dumps
from ratchet.model.states import WaitKind


@dataclass(frozen=True, slots=True)
class WaitKey:
    """What a parked run waits for, as ``runs.waiting_for`` stores it: ``str(key)`` is
    ``"<kind>:<value>"`` (``signal:NAME``, ``child:RUN``, ``sleep:STEP``, ``backoff:STEP``,
    ``approval:STEP``, or ``any:[...]`` for several). Build keys with the constructors and
    read stored ones with :meth:`parse`, so the key a run parks on and the key that wakes
    it cannot drift apart."""

    kind: WaitKind
    value: str

    def __post_init__(self) -> None:
        if not self.value:
            raise ValueError(f"a {self.kind} wait key needs a value")

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    @staticmethod
    def signal(name: str) -> WaitKey:
        return WaitKey(WaitKind.SIGNAL, name)

    @staticmethod
    def child(run_id: str) -> WaitKey:
        return WaitKey(WaitKind.CHILD, run_id)

    @staticmethod
    def sleep(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.SLEEP, step_id)

    @staticmethod
    def backoff(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.BACKOFF, step_id)

    @staticmethod
    def approval(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.APPROVAL, step_id)

    @staticmethod
    def any_of(keys: Iterable[WaitKey | str]) -> WaitKey:
        """The key of a run parked on all of ``keys`` at once (woken by the first); the
        one key itself when they are all the same."""
        texts = sorted({str(k) for k in keys})
        if not texts:
            raise ValueError("a run waits for at least one key")
        if len(texts) == 1:
            return WaitKey.parse(texts[0])
        for text in texts:
            WaitKey.parse(text)  # refuse a malformed member before it is stored
        return WaitKey(WaitKind.ANY, dumps(texts))

    @property
    def members(self) -> tuple[WaitKey, ...]:
        """The keys an ``any`` key waits for; the key itself for any other kind."""
        if self.kind != WaitKind.ANY:
            return (self,)
        return tuple(WaitKey.parse(text) for text in json.loads(self.value))

    @staticmethod
    def parse(text: str) -> WaitKey:
        """The key ``text`` (a stored ``runs.waiting_for``) names; ValueError if it is
        not a wait key."""
        kind, sep, value = text.partition(":")
        if not sep or not value:
            raise ValueError(f"not a wait key: {text!r} (expected KIND:VALUE)")
        try:
            wait_kind = WaitKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in WaitKind)
            raise ValueError(
                f"not a wait key: {text!r} (kind {kind!r} is none of {known})"
            ) from None
        if wait_kind == WaitKind.ANY:
            try:
                members = json.loads(value)
            except ValueError:
                members = None
            if (
                not isinstance(members, list)
                or len(members) < 2
                or not all(isinstance(m, str) for m in members)
            ):
                raise ValueError(f"not a wait key: {text!r} (any: takes a JSON list of keys)")
            for member in members:
                if WaitKey.parse(member).kind == WaitKind.ANY:
                    raise ValueError(f"not a wait key: {text!r} (any: inside any:)")
        return WaitKey(wait_kind, value)


# The payloads the fold reads, one per event kind (the keys :func:`apply` looks at; events
