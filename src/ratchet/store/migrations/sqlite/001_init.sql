-- Ratchet schema, SQLite dialect. Times are Unix epoch seconds (REAL) from ratchet_now(),
-- the store's clock: on one machine the database's clock and the host's are the same.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL DEFAULT 'default',
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    input            TEXT NOT NULL,
    status           TEXT NOT NULL,
    output           TEXT,
    error            TEXT,
    parent_run_id    TEXT,
    parent_step_id   TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         INTEGER NOT NULL DEFAULT 0,
    not_before       REAL,
    waiting_for      TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL
);
CREATE INDEX runs_queued ON runs (queue, priority DESC, created_at) WHERE status = 'queued';
CREATE INDEX runs_timers ON runs (not_before) WHERE status = 'waiting';
CREATE INDEX runs_running ON runs (run_id) WHERE status = 'running';
CREATE INDEX runs_status ON runs (status, created_at);

-- Append-only; seq starts at 1 and has no gaps within a run. Only the lease holder appends,
-- so seq is assigned by that worker and the primary key turns any stray second writer into
-- an error instead of a fork.
CREATE TABLE journal_events (
    run_id    TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    step_id   TEXT,
    attempt   INTEGER,
    payload   TEXT NOT NULL,
    at        REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- The lease. epoch only grows: every claim, steal or reclaim bumps it, so an old holder's
-- (worker_id, epoch) never matches again. Released leases keep their row (worker_id NULL).
CREATE TABLE run_locks (
    run_id     TEXT PRIMARY KEY,
    worker_id  TEXT,
    epoch      INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX run_locks_worker ON run_locks (worker_id);

CREATE TABLE side_effect_receipts (
    idempotency_key TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    step_id         TEXT NOT NULL,
    status          TEXT NOT NULL,
    response        TEXT,
    epoch           INTEGER NOT NULL,
    claimed_at      REAL NOT NULL,
    settled_at      REAL
);
CREATE INDEX side_effect_receipts_run ON side_effect_receipts (run_id);

CREATE TABLE dead_letters (
    run_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    error  TEXT NOT NULL,
    at     REAL NOT NULL
);

CREATE TABLE signals (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    sent_at      REAL NOT NULL,
    consumed_seq INTEGER
);
CREATE INDEX signals_pending ON signals (run_id, name) WHERE consumed_seq IS NULL;

CREATE TABLE workers (
    worker_id  TEXT PRIMARY KEY,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at REAL NOT NULL,
    seen_at    REAL NOT NULL
);

CREATE TABLE api_tokens (
    token_hash TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    scopes     TEXT NOT NULL
);
