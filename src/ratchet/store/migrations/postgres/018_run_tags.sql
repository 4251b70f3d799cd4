-- A run's tags (ratchet.names: at most 20 string keys and values), set at its start and
-- never changed. The tag filters of the run listings match them with @> along runs_tags.
ALTER TABLE runs ADD COLUMN tags jsonb NOT NULL DEFAULT '{}';
CREATE INDEX runs_tags ON runs USING gin (tags jsonb_path_ops);
