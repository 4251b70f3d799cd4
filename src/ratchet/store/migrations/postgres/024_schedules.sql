-- Schedules (ratchet.engine.schedules): one row per tenant and schedule name, declared in
-- code (source 'code', written by every worker that has it) or added through the API
-- (source 'api'). last_tick is the newest tick fired (epoch seconds), so a worker that
-- comes back after downtime knows what it missed; the run of a tick is created under an
-- id derived from the schedule and the tick, so the runs table's key, not a leader, makes
-- one run per tick however many workers look.
CREATE TABLE schedules (
    tenant_id text NOT NULL,
    name text NOT NULL,
    workflow text NOT NULL,
    cron text,
    every_s double precision,
    tz text NOT NULL,
    missed text NOT NULL,
    source text NOT NULL,
    paused integer NOT NULL DEFAULT 0,
    created_at double precision NOT NULL,
    last_tick double precision,
    PRIMARY KEY (tenant_id, name)
);
