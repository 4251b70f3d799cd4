-- Dashboard sessions: signing in with an API token opens a session whose secret lives in
-- an HttpOnly cookie; only its sha256 is stored here, with the token it stands for, so a
-- revoked token ends its sessions too. Sessions expire; signing out deletes the row.
CREATE TABLE ui_sessions (
    session_hash text PRIMARY KEY,
    token_id text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ui_sessions_expiry ON ui_sessions (expires_at);
