-- Who asked for a run's pending cancel (the name given to cancel: a person, a token), kept
-- beside cancel_requested for the worker that holds the run to journal in its
-- run_cancelled; NULL where nobody was named (and for requests made before this column).
ALTER TABLE runs ADD COLUMN cancel_by TEXT;
