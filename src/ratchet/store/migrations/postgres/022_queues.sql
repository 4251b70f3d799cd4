-- Queues with limits (ratchet.store.queues): declared in code, written here when an app or
-- worker starts, changed at run time through the API; every claimer of a limited queue
-- locks its row in the claim transaction, so the limits hold across every worker. A NULL
-- limit is no limit.
CREATE TABLE queues (
    name                text PRIMARY KEY,
    concurrency         integer,
    per_key_concurrency integer,
    rate_limit          integer,
    rate_per_s          double precision,
    hold_while_parked   boolean NOT NULL DEFAULT false,
    -- 'code' (an app's declaration, with RATCHET_QUEUES over it) or 'api' (changed at run
    -- time, which a later declaration in code leaves as it is).
    set_by              text NOT NULL DEFAULT 'code',
    updated_at          timestamptz NOT NULL
);
-- A run's concurrency key (per_key_concurrency counts the runs in flight that share it),
-- and when a rate-limited queue first drove it (the rate counts first drives in a window).
ALTER TABLE runs ADD COLUMN concurrency_key text;
ALTER TABLE runs ADD COLUMN first_started_at timestamptz;
-- Runs in flight are counted along runs_running (a queue's share of the fleet's running
-- runs), so no index here costs the runs of queues without limits anything.
CREATE INDEX runs_first_started ON runs (queue, first_started_at) WHERE first_started_at IS NOT NULL;
