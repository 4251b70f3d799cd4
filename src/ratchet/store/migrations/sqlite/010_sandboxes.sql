-- The isolated tier: one row per sandbox ever spawned for a run (its attempts). The row
-- is written by the run's lease holder before the sandbox starts, so a worker that dies
-- right after spawning still left the attempt counted; `end_reason` says why it ended
-- (finished, crashed, oom, timeout, killed, orphaned, shutdown).
CREATE TABLE sandboxes (
    sandbox_id  TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    status      TEXT NOT NULL DEFAULT 'starting',
    backend     TEXT NOT NULL,
    worker_id   TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    started_at  REAL NOT NULL,
    ended_at    REAL,
    exit_code   INTEGER,
    signal      INTEGER,
    peak_memory INTEGER,
    end_reason  TEXT,
    CHECK (status IN ('starting', 'running', 'terminated'))
);
CREATE UNIQUE INDEX sandboxes_run_attempt ON sandboxes (run_id, attempt);
