-- Signed run receipts and journal retention.
--
-- run_receipts: one signed receipt per finished run (a DSSE envelope) over the journal up
-- to seq; written in the transaction that ends the run, or on demand. A run re-queued after
-- failing and ending again gets a new receipt over its longer journal. It outlives the
-- journal: pruning never deletes it.
CREATE TABLE run_receipts (
    run_id    text PRIMARY KEY,
    seq       bigint NOT NULL,
    key_id    text NOT NULL,
    envelope  jsonb NOT NULL,
    signed_at timestamptz NOT NULL
);

-- pruned_at: when pruning began to delete the run's journal; journal_pruned once it is
-- all gone. A prune interrupted between the two is finished by the next one.
ALTER TABLE runs ADD COLUMN pruned_at timestamptz;
ALTER TABLE runs ADD COLUMN journal_pruned boolean NOT NULL DEFAULT false;
CREATE INDEX runs_prunable ON runs (updated_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled') AND pruned_at IS NULL;
CREATE INDEX runs_pruning ON runs (run_id) WHERE pruned_at IS NOT NULL AND NOT journal_pruned;
