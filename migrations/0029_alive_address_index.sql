-- One index of the live rows by address instead of two. resources_alive_uq (state_id, address, deposed) kept
-- at most one live row per instance object and served exact lookups; resources_alive_prefix_ix
-- (state_id, address text_pattern_ops) served the range scans of a prefix. Both covered the same rows under
-- the same key, and every row a write opens paid for both. text_pattern_ops compares addresses byte by byte
-- and calls two addresses equal exactly when the default operator class does (equality on text is byte
-- equality under a deterministic collation), so one unique index under it enforces the same rule, answers
-- `address = …` and the `~>=~`/`~<~` range of a prefix, and, read in order, gives the live rows in the byte
-- order of their addresses (`ORDER BY address USING ~<~`).
--
-- Built before the old ones are dropped, so the rule is enforced throughout. Migrations run in one transaction,
-- where CREATE INDEX CONCURRENTLY cannot: the build lets reads of resources through and holds writes, and the
-- drops then hold the table until the migration commits, just after. The new index takes the old unique
-- index's name.
CREATE UNIQUE INDEX resources_alive_key_uq ON resources (state_id, address text_pattern_ops, deposed)
    WHERE delete_serial IS NULL;
DROP INDEX resources_alive_uq;
DROP INDEX resources_alive_prefix_ix;
ALTER INDEX resources_alive_key_uq RENAME TO resources_alive_uq;
