-- Graph workflows: each registered graph version, by content. version is the sha256 of the
-- graph's canonical JSON, so registering the same content twice is one row and an edited
-- graph is a new row beside the old one: a run names its graph and version in runs
-- (workflow, workflow_version) and is driven from this row, whatever is registered later.
CREATE TABLE graphs (
    name          TEXT NOT NULL,
    version       TEXT NOT NULL,
    definition    TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX graphs_latest ON graphs (name, registered_at);
