"""A run's receipt: an in-toto Statement v1 in a DSSE envelope, signed with Ed25519.

The statement's subject is the run, its digest the sha256 head of the run's hash chain
(the last event's ``hash``); the predicate says what the journal holds in brief. The
signature is over DSSE's pre-authentication encoding of the payload, so a verifier never
has to re-serialise JSON to check it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from ratchet.model import RunRecord, RunState, dumps
from ratchet.receipts.keys import Signer

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://ratchet-engine.dev/receipt/v1"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _time(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def statement(record: RunRecord, state: RunState, key_id: str) -> dict[str, Any]:
    """The in-toto statement for a finished run whose journal folds to ``state``."""
    llm = state.llm
    output_digest = hashlib.sha256(dumps(state.output).encode()).hexdigest()
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": record.run_id, "digest": {"sha256": state.last_hash}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "run_id": record.run_id,
            "workflow": record.workflow,
            "workflow_version": record.workflow_version,
            "status": str(state.status),
            "output_digest": {"sha256": output_digest},
            "event_count": state.last_seq,
            "first_event_at": _time(state.first_at),
            "last_event_at": _time(state.last_at),
            "llm": {
                "calls": llm.calls,
                "input_tokens": llm.input_tokens,
                "output_tokens": llm.output_tokens,
                # null when a call's model had no price: a total would understate it
                "cost_usd": None if llm.unpriced_calls else round(llm.cost_usd, 10),
            },
            "key_id": key_id,
        },
    }


def sign(signer: Signer, record: RunRecord, state: RunState) -> dict[str, Any]:
    """The DSSE envelope of the run's receipt."""
    key = signer.key_id
    body = json.dumps(statement(record, state, key), separators=(",", ":"), sort_keys=True).encode()
    sig = signer.sign(pae(PAYLOAD_TYPE, body))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode(),
        "signatures": [{"keyid": key, "sig": base64.b64encode(sig).decode()}],
    }
