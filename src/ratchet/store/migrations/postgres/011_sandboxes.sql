-- The isolated tier: one row per sandbox ever spawned for a run (its attempts). The row
-- is written by the run's lease holder before the sandbox starts, so a worker that dies
-- right after spawning still left the attempt counted; `end_reason` says why it ended
-- (finished, crashed, oom, timeout, killed, orphaned, shutdown).
CREATE TABLE sandboxes (
    sandbox_id  text PRIMARY KEY,
    run_id      text NOT NULL,
    attempt     integer NOT NULL,
    status      text NOT NULL DEFAULT 'starting',
    backend     text NOT NULL,
    worker_id   text NOT NULL,
    epoch       bigint NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz,
    exit_code   integer,
    signal      integer,
    peak_memory bigint,
    end_reason  text,
    CHECK (status IN ('starting', 'running', 'terminated'))
);
CREATE UNIQUE INDEX sandboxes_run_attempt ON sandboxes (run_id, attempt);
