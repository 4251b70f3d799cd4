-- A run's tags (ratchet.names: at most 20 string keys and values), set at its start and
-- never changed. The JSON object on the run is what its record reads back.
ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '{}';
-- The tag filters of the run listings match here, along run_tags_match: a row per tag of
-- a run, written by the trigger below in the statement that inserts the run (a run's tags
-- never change after it), so every insert of a run, one or a batch, keeps it whole.
CREATE TABLE run_tags (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_tags_match ON run_tags (key, value, run_id);
CREATE TRIGGER runs_tags_insert AFTER INSERT ON runs WHEN NEW.tags <> '{}'
BEGIN INSERT INTO run_tags (run_id, key, value) SELECT NEW.run_id, key, value FROM json_each(NEW.tags); END;
CREATE TRIGGER runs_tags_delete AFTER DELETE ON runs
BEGIN DELETE FROM run_tags WHERE run_id = OLD.run_id; END;
