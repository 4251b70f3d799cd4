"""Receipts on demand: the stored receipt of a finished run, signed now if it has none.

The engine signs a run's receipt in the transaction that ends it. A run that ended
elsewhere (cancelled while queued, settled from its journal after a crash) or before
receipts existed is signed here, once: the journal is read, its hash chain checked event by
event (nothing is signed over a broken chain), and the receipt stored unless a concurrent
signer stored one first. Ed25519 signatures are deterministic, so two signers with the same
key produce the same receipt.

Receipts sit below the engine: they read only the model and the store, and the engine
signs with them in the commit that ends a run (:func:`receipt_for`) and before retention
deletes a journal (:func:`ensure_receipt`).
"""

from __future__ import annotations

from typing import Any

from ratchet.errors import ChainBroken, JournalPruned, RunNotFinished, UnknownRun
from ratchet.model import GENESIS_HASH, Event, RunRecord, RunState, fold
from ratchet.receipts.envelope import sign
from ratchet.receipts.keys import Signer
from ratchet.store import Store, retention
from ratchet.store.retention import StoredRunReceipt


def receipt_for(signer: Signer | None, record: RunRecord, state: RunState) -> dict[str, Any] | None:
    """The stored form of the run's signed receipt over ``state`` (None without a key): what
    the engine writes in the commit that ends the run."""
    if signer is None:
        return None
    return retention.receipt_params(
        record.run_id, state.last_seq, signer.key_id, sign(signer, record, state)
    )


def check_chain(run_id: str, events: list[Event]) -> None:
    """Raise :class:`ChainBroken` at the first event that does not follow from the last."""
    prev = GENESIS_HASH
    for n, ev in enumerate(events, start=1):
        if ev.seq != n or ev.prev_hash != prev or not ev.verify():
            raise ChainBroken(
                f"the stored journal of run {run_id} fails its hash chain at "
                f"seq {n}: no receipt is signed over it"
            )
        prev = ev.hash


async def sign_from_journal(store: Store, signer: Signer, rec: RunRecord) -> StoredRunReceipt:
    """Sign the run's receipt from its stored journal and store it."""
    events = await store.load_events(rec.run_id)
    check_chain(rec.run_id, events)
    state = fold(rec.run_id, events)
    if not state.status.terminal:
        raise RunNotFinished(
            f"run {rec.run_id} has not finished (its journal ends "
            f"{state.status}): a receipt is signed when it ends"
        )
    envelope = sign(signer, rec, state)
    return await retention.put_receipt(store, rec.run_id, state.last_seq, signer.key_id, envelope)


async def ensure_receipt(store: Store, signer: Signer, run_id: str) -> StoredRunReceipt:
    """The run's receipt over its whole journal, signed now with ``signer`` if missing or
    older than the journal."""
    rec = await store.get_run(run_id)
    if rec is None:
        raise UnknownRun(f"unknown run id {run_id!r}")
    if not rec.status.terminal:
        raise RunNotFinished(
            f"run {run_id} has not finished (status {rec.status}): a receipt is signed when it ends"
        )
    stored = await retention.get_receipt(store, run_id)
    if await retention.pruned_at(store, run_id) is not None:
        if stored is None:
            raise JournalPruned(f"the journal of run {run_id} was pruned without a receipt")
        return stored
    if stored is not None and not await store.load_events(run_id, after=stored.seq, limit=1):
        return stored
    return await sign_from_journal(store, signer, rec)
