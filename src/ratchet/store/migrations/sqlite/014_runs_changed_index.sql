-- The live runs list asks, about once a second per tenant, which of the tenant's runs
-- changed last (ui_runs_changed). This index answers that from its last entry, so the probe
-- costs one index seek however many runs the tenant has.
CREATE INDEX runs_tenant_changed ON runs (tenant_id, updated_at, run_id);
