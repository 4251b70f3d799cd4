-- A fork's lineage (ratchet.app.forking): the run it was forked from and the step it was
-- forked at, set when the fork is created and never changed; NULL for a run started afresh.
ALTER TABLE runs ADD COLUMN forked_from TEXT;
ALTER TABLE runs ADD COLUMN forked_at TEXT;
CREATE INDEX runs_forked_from ON runs (forked_from) WHERE forked_from IS NOT NULL;
