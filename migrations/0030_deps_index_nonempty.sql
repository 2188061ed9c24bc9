-- The dependencies index enters only the live rows that name a dependency. Its one reader asks which live rows
-- share a name with a non-empty list (`dependencies && names`), which a row with no dependencies never does,
-- yet every such row a write opened was still entered (under GIN's "empty item" key, through the pending
-- list a bulk write then folds in). The reader states the same condition (`cardinality(dependencies) > 0`),
-- so the planner proves this index serves it.
--
-- Built before the old one is dropped, in the migration's one transaction (as 0029 does): reads of resources
-- go on during the build, writes wait; the new index takes the old one's name.
CREATE INDEX resources_alive_deps_nonempty ON resources USING gin (dependencies)
    WHERE delete_serial IS NULL AND cardinality(dependencies) > 0;
DROP INDEX resources_alive_deps_gin;
ALTER INDEX resources_alive_deps_nonempty RENAME TO resources_alive_deps_gin;
