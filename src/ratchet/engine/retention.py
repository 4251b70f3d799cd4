"""Retention: delete the journals of runs that finished long ago, keeping their receipts.

A pass takes finished runs past the cutoff a batch at a time: it signs the receipt of any
that lacks one over its whole journal (never is a journal deleted that no receipt covers),
marks them pruned, then deletes their events a few hundred per transaction, so no
transaction holds locks or the SQLite write lock long enough to stall a worker. The runs
rows, their signed receipts and their delivery receipts stay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ratchet.errors import InvalidInput, RatchetError
from ratchet.model import TERMINAL_STATUSES
from ratchet.receipts.keys import Signer
from ratchet.receipts.service import ensure_receipt
from ratchet.store import Store, retention

log = logging.getLogger("ratchet.retention")

RUN_BATCH = 100  # runs marked per transaction
EVENT_BATCH = 500  # events deleted per transaction
# After each delete, a rest as long as the delete took (and at least PAUSE_S): pruning
# takes at most half the database's time for writes, and the workers' commits, which
# wait on the same WAL flushes, get in between.
PAUSE_S = 0.002
DEFAULT_STATUSES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune did (or, dry, would do)."""

    runs: int
    events: int
    skipped: int  # runs left alone: no receipt could be signed over their journal
    dry_run: bool


def parse_statuses(text: str | Sequence[str]) -> tuple[str, ...]:
    """``succeeded,cancelled`` → the statuses, each a terminal one; refused otherwise."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    statuses = tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))
    terminal = sorted(str(s) for s in TERMINAL_STATUSES)
    bad = [s for s in statuses if s not in terminal]
    if bad or not statuses:
        raise InvalidInput(
            f"invalid status {', '.join(map(repr, bad)) or repr(text)}: prune "
            f"takes finished runs, with status {', '.join(terminal)}"
        )
    return statuses


async def prune(
    store: Store,
    signer: Signer,
    before: float,
    statuses: Sequence[str] = DEFAULT_STATUSES,
    *,
    dry_run: bool = False,
    event_batch: int = EVENT_BATCH,
    pause_s: float = PAUSE_S,
) -> PruneReport:
    """Delete the journals of runs that finished (with one of ``statuses``) before
    ``before`` (Unix seconds, the database's clock). ``dry_run`` counts without changing
    anything."""
    statuses = parse_statuses(statuses)
    if dry_run:
        runs, events = await retention.prune_count(store, before, statuses)
        return PruneReport(runs, events, 0, True)
    runs = events = 0
    # First the runs an interrupted prune left half done.
    while leftover := await retention.pruning_runs(store, RUN_BATCH):
        events += await _delete_journals(store, leftover, event_batch, pause_s)
    # Runs left alone stay candidates: each pass asks past them rather than for them again.
    skipped: set[str] = set()
    while True:
        batch = [
            c
            for c in await retention.prune_candidates(
                store, before, statuses, RUN_BATCH + len(skipped)
            )
            if c.run_id not in skipped
        ]
        if not batch:
            break
        for c in batch:
            if not c.covered:
                try:
                    await ensure_receipt(store, signer, c.run_id)
                except RatchetError as e:
                    log.warning("action=prune_skipped run_id=%s error=%s", c.run_id, e)
        marked = await retention.mark_pruned(store, [c.run_id for c in batch])
        skipped.update({c.run_id for c in batch} - set(marked))
        if marked:
            runs += len(marked)
            events += await _delete_journals(store, marked, event_batch, pause_s)
    log.info("action=pruned runs=%s events=%s skipped=%s", runs, events, len(skipped))
    return PruneReport(runs, events, len(skipped), False)


async def _delete_journals(
    store: Store, run_ids: list[str], event_batch: int, pause_s: float
) -> int:
    deleted = 0
    while True:
        began = time.monotonic()
        n = await retention.delete_events(store, run_ids, event_batch)
        deleted += n
        if n < event_batch:
            break
        await asyncio.sleep(max(pause_s, time.monotonic() - began))
    await retention.journals_gone(store, run_ids)
    return deleted
