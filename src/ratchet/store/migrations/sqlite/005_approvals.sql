-- Approvals: what a parked run asks a person, and the decision, recorded once. A row is
-- written with the step_waiting event that asks (so it is listed and decidable at once,
-- whether or not the run parks); a decision updates it while it is still pending and wakes
-- the run, which journals the decision as the approval step's completion. root_run_id is
-- the top-level run, so a child's approval is found through its parent.
CREATE TABLE approvals (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    name        TEXT NOT NULL,
    data        TEXT NOT NULL,
    root_run_id TEXT NOT NULL,
    asked_at    REAL NOT NULL,
    deadline    REAL,
    status      TEXT NOT NULL DEFAULT 'pending',  -- pending | approved | rejected | expired
    decided_by  TEXT,
    comment     TEXT,
    decided_at  REAL,
    PRIMARY KEY (run_id, step_id)
);
CREATE INDEX approvals_pending ON approvals (asked_at) WHERE status = 'pending';
CREATE INDEX approvals_root ON approvals (root_run_id) WHERE status = 'pending';
