-- A row-level commit no longer stores a whole raw state: an apply version's bytes are assembled from the
-- resource rows on its first read and cached here (lz4, as 0005 set up). Until then raw_state, sha256
-- and size_bytes are NULL. Retention (kl prune) may empty raw_state of old versions again: pruned_at
-- records that, and a pruned apply version is re-assembled on read without being cached again.
ALTER TABLE state_versions ALTER COLUMN raw_state DROP NOT NULL;
ALTER TABLE state_versions ALTER COLUMN sha256 DROP NOT NULL;
ALTER TABLE state_versions ALTER COLUMN size_bytes DROP NOT NULL;
ALTER TABLE state_versions ADD COLUMN assembled_at timestamptz;
ALTER TABLE state_versions ADD COLUMN pruned_at timestamptz;

-- A commit's staleness check asks which rows opened or closed after the run's base serial: without
-- these it reads every row of the state; with them, only the rows changed since.
CREATE INDEX resources_created_ix ON resources (state_id, create_serial);
CREATE INDEX resources_deleted_ix ON resources (state_id, delete_serial) WHERE delete_serial IS NOT NULL;
