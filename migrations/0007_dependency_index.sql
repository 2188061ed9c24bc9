-- File-scoped plans ask which live instances depend on the resources a change writes; a GIN index
-- on the recorded dependency names answers that without unnesting every row of a large state.
CREATE INDEX resources_alive_deps_gin ON resources USING gin (dependencies) WHERE delete_serial IS NULL;
