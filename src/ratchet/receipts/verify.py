"""Offline verification of a run's receipt against its exported journal: no database.

Checks, in order: the envelope's signature with the given public key, the statement's
form, then every event of the export in turn (a JSON object with exactly the export's
fields, each key once, at every depth; its run, its seq, the hash it links to and its own
hash recomputed from its content), and last that the chain's head and length are the ones
the receipt signed. The first failure is the answer, naming the seq it found
wrong or the reason.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ratchet.errors import RatchetError
from ratchet.model import GENESIS_HASH, Event, dumps
from ratchet.receipts.envelope import PAYLOAD_TYPE, PREDICATE_TYPE, STATEMENT_TYPE, pae
from ratchet.receipts.keys import key_id


class VerificationFailed(RatchetError):
    """The receipt does not hold for these events or this key."""

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq  # the first bad seq, when the failure is one event's


@dataclass(frozen=True, slots=True)
class Verified:
    """What a receipt that holds says."""

    run_id: str
    status: str
    event_count: int
    head: str
    key_id: str
    predicate: dict[str, Any]


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise VerificationFailed(f"the receipt's {what} is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise VerificationFailed(f"the receipt's {what} is not valid base64") from e


def check_signature(envelope: Any, public: Ed25519PublicKey) -> dict[str, Any]:
    """The envelope's statement, once a signature by ``public`` verifies over it."""
    if not isinstance(envelope, dict) or envelope.get("payloadType") != PAYLOAD_TYPE:
        raise VerificationFailed(
            f"not a receipt: expected a DSSE envelope with payloadType {PAYLOAD_TYPE}"
        )
    body = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise VerificationFailed("the receipt carries no signature")
    expected = key_id(public)
    message = pae(PAYLOAD_TYPE, body)
    for entry in signatures:
        if not isinstance(entry, dict):
            continue
        try:
            public.verify(_b64(entry.get("sig"), "signature"), message)
        except InvalidSignature:
            continue
        break
    else:
        ids = ", ".join(str(s.get("keyid")) for s in signatures if isinstance(s, dict))
        if expected not in ids:
            raise VerificationFailed(
                f"wrong key: the receipt was signed by key {ids}, not by the given key {expected}"
            )
        raise VerificationFailed("bad signature: the receipt was changed after it was signed")
    try:
        stmt = json.loads(body)
    except ValueError as e:
        raise VerificationFailed("the receipt's payload is not JSON") from e
    if (
        not isinstance(stmt, dict)
        or stmt.get("_type") != STATEMENT_TYPE
        or stmt.get("predicateType") != PREDICATE_TYPE
    ):
        raise VerificationFailed(
            f"the receipt's payload is not an in-toto statement of type {PREDICATE_TYPE}"
        )
    return stmt


def _claims(stmt: dict[str, Any]) -> tuple[str, str, int, dict[str, Any]]:
    try:
        subject = stmt["subject"][0]
        predicate = stmt["predicate"]
        run_id, head = str(subject["name"]), str(subject["digest"]["sha256"])
        count = int(predicate["event_count"])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise VerificationFailed(f"the receipt's statement lacks {e}") from e
    return run_id, head, count, predicate


_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "seq": (int,),
    "kind": (str,),
    "step_id": (str, type(None)),
    "attempt": (int, type(None)),
    "payload": (dict,),
    "at": (int, float),
    "prev_hash": (str,),
    "hash": (str,),
}


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once: with a key twice, two readers of the
    same line could see two different events (one takes the first, another the last),
    and what was checked need not be what is read."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _DuplicateKey(k)
        d[k] = v
    return d


def _event(line: str, number: int) -> Event:
    try:
        d = json.loads(line, object_pairs_hook=_unique)
    except _DuplicateKey as e:
        raise VerificationFailed(
            f"line {number} of the events gives the key {e.args[0]!r} twice"
        ) from e
    except ValueError as e:
        raise VerificationFailed(f"line {number} of the events is not JSON ({e})") from e
    if not isinstance(d, dict):
        raise VerificationFailed(f"line {number} of the events is not a journal event")
    unknown = sorted(set(d) - set(_FIELDS))
    if unknown:
        # Nothing outside the hash may ride along: a reader could take it for the event's.
        raise VerificationFailed(
            f"line {number} of the events is not a journal event (unknown field {unknown[0]!r})"
        )
    for name, types in _FIELDS.items():
        if name not in d:
            raise VerificationFailed(
                f"line {number} of the events is not a journal event (no {name})"
            )
        # bool is an int to Python, never a seq, attempt or time here
        if not isinstance(d[name], types) or isinstance(d[name], bool):
            raise VerificationFailed(
                f"line {number} of the events is not a journal event "
                f"({name} is {type(d[name]).__name__})"
            )
    return Event(
        d["run_id"],
        d["seq"],
        d["kind"],
        d["step_id"],
        d["attempt"],
        d["payload"],
        float(d["at"]),
        d["prev_hash"],
        d["hash"],
        dumps(d["payload"]),
    )


def verify(envelope: Any, lines: Iterable[str], public: Ed25519PublicKey) -> Verified:
    """Check the receipt ``envelope`` against the exported journal ``lines`` (JSON lines,
    as ``ratchet export`` writes them) and ``public``; raise :class:`VerificationFailed`
    naming the first bad seq or the reason."""
    run_id, head, count, predicate = _claims(check_signature(envelope, public))
    prev, seq = GENESIS_HASH, 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ev = _event(line, number)
        seq += 1
        if ev.run_id != run_id:
            raise VerificationFailed(
                f"seq {ev.seq}: an event of run {ev.run_id}, but the receipt is for run {run_id}",
                ev.seq,
            )
        if seq > count:
            raise VerificationFailed(
                f"seq {ev.seq}: the journal goes on past the {count} events the receipt covers", seq
            )
        if ev.seq != seq:
            raise VerificationFailed(
                f"seq {seq}: found seq {ev.seq} where seq {seq} should "
                "be (an event was removed, inserted or reordered)",
                seq,
            )
        if ev.prev_hash != prev:
            raise VerificationFailed(
                f"seq {seq}: its prev_hash is not the hash of seq "
                f"{seq - 1} (an event was removed, inserted or changed)",
                seq,
            )
        if not ev.verify():
            raise VerificationFailed(
                f"seq {seq}: its hash does not match its content (the event was changed)", seq
            )
        prev = ev.hash
    if seq < count:
        raise VerificationFailed(
            f"truncated: the journal ends at seq {seq}, the receipt covers {count} events", seq + 1
        )
    if prev != head:
        raise VerificationFailed(
            f"the chain's head {prev} is not the {head} the receipt signed (events were rewritten)",
            seq,
        )
    return Verified(run_id, str(predicate.get("status")), count, head, key_id(public), predicate)
