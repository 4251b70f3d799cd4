-- Ratchet schema, PostgreSQL dialect. Times are Unix epoch seconds (float8) from
-- ratchet_now(): the server's clock, so clock skew between workers cannot hand one run to
-- two of them. Every table is keyed by run_id (or carries it) so it distributes by run_id.

-- The server's clock plus the session's ratchet.skew (seconds; tests set it to move time
-- forward without sleeping through a lease).
CREATE FUNCTION ratchet_now() RETURNS float8 LANGUAGE sql VOLATILE AS $$
    SELECT extract(epoch FROM clock_timestamp())::float8
         + coalesce(nullif(current_setting('ratchet.skew', true), '')::float8, 0)
$$;

CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    tenant_id        text NOT NULL DEFAULT 'default',
    workflow         text NOT NULL,
    workflow_version text NOT NULL,
    input            text NOT NULL,
    status           text NOT NULL,
    output           text,
    error            text,
    parent_run_id    text,
    parent_step_id   text,
    queue            text NOT NULL DEFAULT 'default',
    priority         integer NOT NULL DEFAULT 0,
    not_before       float8,
    waiting_for      text,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at       float8 NOT NULL,
    updated_at       float8 NOT NULL
);
CREATE INDEX runs_queued ON runs (queue, priority DESC, created_at) WHERE status = 'queued';
CREATE INDEX runs_timers ON runs (not_before) WHERE status = 'waiting';
CREATE INDEX runs_running ON runs (run_id) WHERE status = 'running';
CREATE INDEX runs_status ON runs (status, created_at);

-- Append-only; seq starts at 1 and has no gaps within a run. Only the lease holder appends
-- (checked under a share lock on its run_locks row in the same transaction), and the few
-- writers without a lease (cancel, retry) first take that row's lock for update. Appends to
-- one run are therefore serialised and commit in seq order, so a reader tailing a run
-- never sees seq N+1 before N.
CREATE TABLE journal_events (
    run_id    text NOT NULL,
    seq       bigint NOT NULL,
    kind      text NOT NULL,
    step_id   text,
    attempt   integer,
    payload   text NOT NULL,
    at        float8 NOT NULL,
    prev_hash text NOT NULL,
    hash      text NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- The lease. epoch only grows: every claim, steal or reclaim bumps it, so an old holder's
-- (worker_id, epoch) never matches again. Released leases keep their row (worker_id NULL).
CREATE TABLE run_locks (
    run_id     text PRIMARY KEY,
    worker_id  text,
    epoch      bigint NOT NULL,
    expires_at float8 NOT NULL
);
CREATE INDEX run_locks_worker ON run_locks (worker_id);

CREATE TABLE side_effect_receipts (
    idempotency_key text PRIMARY KEY,
    run_id          text NOT NULL,
    step_id         text NOT NULL,
    status          text NOT NULL,
    response        text,
    epoch           bigint NOT NULL,
    claimed_at      float8 NOT NULL,
    settled_at      float8
);
CREATE INDEX side_effect_receipts_run ON side_effect_receipts (run_id);

CREATE TABLE dead_letters (
    run_id text PRIMARY KEY,
    reason text NOT NULL,
    error  text NOT NULL,
    at     float8 NOT NULL
);

CREATE TABLE signals (
    run_id       text NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    name         text NOT NULL,
    payload      text NOT NULL,
    sent_at      float8 NOT NULL,
    consumed_seq bigint,
    PRIMARY KEY (run_id, id)
);
CREATE INDEX signals_pending ON signals (run_id, name) WHERE consumed_seq IS NULL;

CREATE TABLE workers (
    worker_id  text PRIMARY KEY,
    host       text NOT NULL,
    pid        integer NOT NULL,
    started_at float8 NOT NULL,
    seen_at    float8 NOT NULL
);

CREATE TABLE api_tokens (
    token_hash text PRIMARY KEY,
    tenant_id  text NOT NULL,
    scopes     text NOT NULL
);
