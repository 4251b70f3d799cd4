-- Guards (issue 12). The retry-storm guard counts a workflow's recent retries across all
-- its runs and workers: this index holds step_retrying events only, so the count reads
-- the window's retries and a run that never retries pays nothing for it.
CREATE INDEX journal_retries ON journal_events (at) WHERE kind = 'step_retrying';
-- The spike guards read the last finished runs of a workflow.
CREATE INDEX runs_finished_by_workflow ON runs (workflow, updated_at)
    WHERE status IN ('succeeded', 'failed');
