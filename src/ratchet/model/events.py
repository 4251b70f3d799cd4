"""The journal's event, its hash chain, and the canonical JSON it is stored in."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The hash a run's first event links to.
GENESIS_HASH = "0" * 64


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """``sha256("runID|stepID|attempt")`` in hex (invariant 6 in docs/concepts/invariants.md)."""
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    # pydantic models (and anything else with the same method) serialise as their JSON form.
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any, default: Callable[[Any], Any] = _jsonable) -> str:
    """Canonical JSON: the form payloads, inputs and outputs are stored in.

    Numbers are written as PostgreSQL's jsonb gives them back, on both backends, so that a
    value reads back the same from either and the journal's hashes hold: a float of
    magnitude 1e16 or more (always integral) is written as the integer it equals, and -0.0
    as 0.0. ``default`` gives the JSON form of what the json module cannot write (by
    default a pydantic model's; values from user code pass pydantic's encoder, see
    :mod:`ratchet.engine.values`), else raises TypeError."""
    text = json.dumps(
        value,
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
        allow_nan=False,
        default=default,
    )
    # Python writes those floats as 1e+16 and -0.0, so any other text needs no second look.
    if "e+" in text or "-0.0" in text:
        text = json.dumps(
            _jsonb_numbers(json.loads(text)),
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
            allow_nan=False,
        )
    return text


def output_payload(
    output: Any, output_json: str, extra: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``{"output": output, **extra}`` and its canonical JSON (as :func:`dumps` writes it),
    with the output's JSON, ``output_json`` (``dumps(output)``, ``output`` as read back from
    it), put in as it is rather than encoded again: a model's answer can be large, the rest
    is small. The extra values come back as the journal gives them (see :func:`dumps`)."""
    if "output" in extra:  # the extra value would win: the plain form says how
        payload = json.loads(dumps({"output": output, **extra}))
        return payload, dumps(payload)
    parts = {"output": output_json}
    payload = {"output": output}
    for key, value in extra.items():
        parts[key] = text = dumps(value)
        payload[key] = json.loads(text)
    body = ",".join(f"{json.dumps(key, ensure_ascii=False)}:{parts[key]}" for key in sorted(parts))
    return payload, "{" + body + "}"


def _jsonb_numbers(value: Any) -> Any:
    """``value`` (plain JSON data) with the floats jsonb would not give back as they are
    replaced by the numbers it does give back (see :func:`dumps`)."""
    if isinstance(value, float):
        if abs(value) >= 1e16:
            return int(value)
        return 0.0 if value == 0 else value
    if isinstance(value, dict):
        return {k: _jsonb_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonb_numbers(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event. ``seq`` starts at 1 and has no gaps within a run.

    ``hash`` chains the run's events: sha256 over the previous hash, the event's header
    and its canonical payload JSON (``payload_json``, the text that is stored)."""

    run_id: str
    seq: int
    kind: str
    step_id: str | None
    attempt: int | None
    payload: dict[str, Any]
    at: float
    prev_hash: str
    hash: str
    payload_json: str = field(default="", compare=False, repr=False)

    @staticmethod
    def digest(
        run_id: str,
        seq: int,
        kind: str,
        step_id: str | None,
        attempt: int | None,
        payload_json: str,
        at: float,
        prev_hash: str,
    ) -> str:
        # run_id cannot hold "|" and kind, seq, attempt and at are fixed forms; the step id
        # may hold anything, so it goes length-prefixed, just before the payload.
        sid = step_id if step_id is not None else ""
        header = f"{run_id}|{seq}|{kind}|{attempt}|{at:.6f}|{len(sid)}:{sid}"
        return hashlib.sha256(f"{prev_hash}|{header}|{payload_json}".encode()).hexdigest()

    @staticmethod
    def chain(
        run_id: str,
        seq: int,
        kind: str,
        step_id: str | None,
        attempt: int | None,
        payload: dict[str, Any],
        at: float,
        prev_hash: str,
        payload_json: str | None = None,
    ) -> Event:
        """Build the event that follows ``prev_hash`` in a run's hash chain.
        ``payload_json`` may be given when the caller already holds ``dumps(payload)``."""
        if payload_json is None:
            text = dumps(payload)
            if "e+" in text or "-0.0" in text:  # dumps may have rewritten a number
                payload = json.loads(text)
        else:
            text = payload_json
        # Whole microseconds, as PostgreSQL keeps a timestamptz; the hash reads ``at`` to
        # six decimals, so rounding changes no hash and the time reads back exactly.
        at = round(at, 6)
        digest = Event.digest(run_id, seq, kind, step_id, attempt, text, at, prev_hash)
        return Event(run_id, seq, kind, step_id, attempt, payload, at, prev_hash, digest, text)

    def verify(self) -> bool:
        """Whether ``hash`` matches the event's content and ``prev_hash``."""
        return self.hash == Event.digest(
            self.run_id,
            self.seq,
            self.kind,
            self.step_id,
            self.attempt,
            self.payload_json or dumps(self.payload),
            self.at,
            self.prev_hash,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "kind": self.kind,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "payload": self.payload,
            "at": self.at,
            "hash": self.hash,
        }

    def export_dict(self) -> dict[str, Any]:
        """The event as ``ratchet export`` writes it: everything its hash covers, with the
        hash it links to, so the chain can be checked from the export alone."""
        return {**self.as_dict(), "prev_hash": self.prev_hash}
