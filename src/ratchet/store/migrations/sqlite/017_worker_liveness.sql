-- Whether the worker holds its liveness lock (a byte of the file beside the database,
-- named after its worker id, locked for as long as its process lives): live workers on
-- the same file test the lock to see it die, and take its runs at once. 0 for workers
-- that never took one (an earlier version's), which only the lease and the sweep judge.
ALTER TABLE workers ADD COLUMN liveness_lock INTEGER NOT NULL DEFAULT 0;
