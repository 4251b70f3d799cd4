-- Run ids are scoped to their tenant (ratchet.store.tenants): from now on a run of a tenant
-- other than default is stored as '<tenant>~<id>'. Rows written before keep their raw ids
-- (the journal's hash chain commits to them); the tenants that have such rows are written
-- down once, here, so only their lookups fall back to a raw id.
CREATE TABLE tenant_legacy_ids (
    tenant_id TEXT PRIMARY KEY
);
INSERT INTO tenant_legacy_ids (tenant_id)
SELECT DISTINCT tenant_id FROM runs WHERE tenant_id <> 'default';
-- A token may expire: past expires_at it is refused as a revoked one is (NULL: never).
ALTER TABLE api_tokens ADD COLUMN expires_at REAL;
-- Who decided an approval is the deciding token (decided_by); a name the client gave is
-- kept beside it as a note.
ALTER TABLE approvals ADD COLUMN note TEXT;
