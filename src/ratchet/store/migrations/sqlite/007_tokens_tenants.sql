-- API tokens get an id to revoke them by, a name, and their lifetime: a token is the
-- sha256 of a secret shown once; revoked tokens keep their row (revoked_at set) so a
-- listing says what existed. Runs are listed per tenant, newest first.
ALTER TABLE api_tokens ADD COLUMN token_id TEXT;
ALTER TABLE api_tokens ADD COLUMN name TEXT;
ALTER TABLE api_tokens ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
ALTER TABLE api_tokens ADD COLUMN revoked_at REAL;
CREATE UNIQUE INDEX api_tokens_id ON api_tokens (token_id);
CREATE INDEX runs_tenant ON runs (tenant_id, created_at);
