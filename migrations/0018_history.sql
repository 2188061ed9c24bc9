-- Per-address history: who wrote each version, and which top-level attribute names a lifecycle changed.
-- run_id is the apply run that committed a version (NULL for a whole-state write); token_name the API
-- token that wrote it ('' in the open and static modes).
ALTER TABLE state_versions ADD COLUMN run_id text;
ALTER TABLE state_versions ADD COLUMN token_name text NOT NULL DEFAULT '';
-- One row per lifecycle row that replaced an earlier lifecycle of the same instance object at its
-- create_serial: the attribute names whose values differ (names only, never values; sensitive names left
-- out and counted in sensitive). Kept beside the resource rows, written by an INSERT, so recording them
-- never rewrites a resource row. A lifecycle without a row here replaced nothing (or predates the table).
CREATE TABLE resource_changes (
    resource_id bigint PRIMARY KEY REFERENCES resources (id) ON DELETE CASCADE,
    names       text[] NOT NULL,
    sensitive   integer NOT NULL
);
-- The history of every address under a prefix, destroyed ones included.
CREATE INDEX resources_history_prefix_ix ON resources (state_id, address text_pattern_ops, create_serial);
