-- What each worker serves, and when it counts as gone (see the PostgreSQL migration).
ALTER TABLE workers ADD COLUMN serves TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN queues TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN lease_ttl REAL NOT NULL DEFAULT 15;

-- A finished run's lease row goes in its finishing transaction; lease_epoch keeps the
-- highest epoch the run has handed out, so the next lease continues above it.
ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET lease_epoch = (SELECT epoch FROM run_locks l WHERE l.run_id = runs.run_id)
WHERE status IN ('succeeded', 'failed', 'cancelled')
  AND run_id IN (SELECT run_id FROM run_locks);
DELETE FROM run_locks
WHERE run_id IN (SELECT run_id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled'));
DELETE FROM signals
WHERE consumed_seq IS NOT NULL
  AND run_id IN (SELECT run_id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled'));

CREATE INDEX runs_created ON runs (created_at DESC, run_id);
