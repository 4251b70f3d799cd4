-- Queues with limits (ratchet.store.queues): declared in code, written here when an app or
-- worker starts, changed at run time through the API; every claimer of a limited queue
-- reads them in its claim transaction. A NULL limit is no limit.
CREATE TABLE queues (
    name                TEXT PRIMARY KEY,
    concurrency         INTEGER,
    per_key_concurrency INTEGER,
    rate_limit          INTEGER,
    rate_per_s          REAL,
    hold_while_parked   INTEGER NOT NULL DEFAULT 0,
    -- 'code' (an app's declaration, with RATCHET_QUEUES over it) or 'api' (changed at run
    -- time, which a later declaration in code leaves as it is).
    set_by              TEXT NOT NULL DEFAULT 'code',
    updated_at          REAL NOT NULL
);
-- A run's concurrency key (per_key_concurrency counts the runs in flight that share it),
-- and when a rate-limited queue first drove it (the rate counts first drives in a window).
ALTER TABLE runs ADD COLUMN concurrency_key TEXT;
ALTER TABLE runs ADD COLUMN first_started_at REAL;
-- Runs in flight are counted along runs_running (a queue's share of the fleet's running
-- runs), so no index here costs the runs of queues without limits anything.
CREATE INDEX runs_first_started ON runs (queue, first_started_at) WHERE first_started_at IS NOT NULL;
