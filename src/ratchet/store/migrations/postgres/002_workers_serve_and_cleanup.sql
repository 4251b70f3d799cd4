-- What each worker serves, and when it counts as gone.
-- serves: JSON [[workflow, version], ...] it has registered; queues: JSON [queue, ...];
-- lease_ttl: its lease TTL in seconds (it renews, and so is seen, every ttl/3). A worker
-- is live while seen_at + lease_ttl is ahead of the clock; claims take only runs whose
-- (workflow, workflow_version) the claiming worker serves, and `ratchet runs` says so
-- when no live worker serves a queued run.
ALTER TABLE workers ADD COLUMN serves text NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN queues text NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN lease_ttl float8 NOT NULL DEFAULT 15;

-- A finished run's lease row goes in its finishing transaction; lease_epoch keeps the
-- highest epoch the run has handed out, so the next lease (a dead-lettered run retried)
-- continues above it and an old holder's (worker_id, epoch) can never match again.
ALTER TABLE runs ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0;
UPDATE runs r SET lease_epoch = l.epoch FROM run_locks l
WHERE l.run_id = r.run_id AND r.status IN ('succeeded', 'failed', 'cancelled');
DELETE FROM run_locks l USING runs r
WHERE r.run_id = l.run_id AND r.status IN ('succeeded', 'failed', 'cancelled');
-- Consumed signals of finished runs: the journal holds what they carried.
DELETE FROM signals s USING runs r
WHERE r.run_id = s.run_id AND s.consumed_seq IS NOT NULL
  AND r.status IN ('succeeded', 'failed', 'cancelled');

-- `ratchet runs` without a status filter, newest first, in index order.
CREATE INDEX runs_created ON runs (created_at DESC, run_id);
