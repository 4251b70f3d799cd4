-- Whether the worker holds its liveness lock (a session-level advisory lock keyed by its
-- worker id, on a connection of its own, which the server releases when the session
-- ends): live workers test the lock to see it die, and take its runs at once. false for
-- workers that never took one (an earlier version's), which only the lease and the sweep
-- judge.
ALTER TABLE workers ADD COLUMN liveness_lock boolean NOT NULL DEFAULT false;
