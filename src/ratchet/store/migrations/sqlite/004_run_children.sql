-- A run's children are looked up when it ends (to cancel the unfinished ones).
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
