-- Deduplicated and debounced starts (ratchet.store.start_options). A run started with a
-- dedup id holds it while it is not terminal: the partial unique index is what refuses a
-- second one, so two starts racing cannot both win, and the transaction that ends the run
-- frees the id in the same commit (its status leaves the index's predicate).
ALTER TABLE runs ADD COLUMN dedup_id TEXT;
CREATE UNIQUE INDEX runs_dedup ON runs (tenant_id, workflow, dedup_id)
    WHERE dedup_id IS NOT NULL AND status NOT IN ('succeeded', 'failed', 'cancelled');
-- A debounced run collects the starts of its key while it has not begun: waiting, on no
-- wait key (a parked run always has one), until its not_before. One such run per key.
ALTER TABLE runs ADD COLUMN debounce_key TEXT;
CREATE UNIQUE INDEX runs_debounce ON runs (tenant_id, workflow, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'waiting' AND waiting_for IS NULL;
