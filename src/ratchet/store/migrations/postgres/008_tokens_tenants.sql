-- API tokens get an id to revoke them by, a name, and their lifetime: a token is the
-- sha256 of a secret shown once; revoked tokens keep their row (revoked_at set) so a
-- listing says what existed. Runs are listed per tenant, newest first.
ALTER TABLE api_tokens ADD COLUMN token_id text;
ALTER TABLE api_tokens ADD COLUMN name text;
ALTER TABLE api_tokens ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE api_tokens ADD COLUMN revoked_at timestamptz;
CREATE UNIQUE INDEX api_tokens_id ON api_tokens (token_id);
CREATE INDEX runs_tenant ON runs (tenant_id, created_at);

-- Journal tails (the API's event streams) are woken by the database: every statement that
-- appends events notifies ratchet_events once per run it touched, in its own commit, so a
-- listener hears of an event only once it is visible. One trigger covers every writer
-- (the group-commit append, starts, finishes, parks, cancels) without each remembering to.
CREATE FUNCTION ratchet_journal_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ratchet_events', run_id) FROM (SELECT DISTINCT run_id FROM appended) a;
    RETURN NULL;
END
$$;
CREATE TRIGGER journal_events_notify AFTER INSERT ON journal_events
    REFERENCING NEW TABLE AS appended FOR EACH STATEMENT
    EXECUTE FUNCTION ratchet_journal_notify();
