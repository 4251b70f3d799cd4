"""Signed run receipts: a DSSE envelope over an in-toto statement whose subject digest is
the head of the run's journal hash chain, signed with Ed25519 and verifiable offline."""

from __future__ import annotations

from ratchet.receipts.envelope import PAYLOAD_TYPE, PREDICATE_TYPE, sign, statement
from ratchet.receipts.keys import Signer, load_public_key, load_signer
from ratchet.receipts.verify import VerificationFailed, Verified, verify

__all__ = [
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "Signer",
    "VerificationFailed",
    "Verified",
    "load_public_key",
    "load_signer",
    "sign",
    "statement",
    "verify",
]
