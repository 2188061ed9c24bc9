-- The bytes of a version Terraform wrote, as the assembly from that serial's rows lays them out: a base the
-- next apply version's first read splices from (app.store.splicebase). Written off the request path after
-- a large whole-state POST; removed with the version, by retention with its raw bytes, and when a newer
-- base of the same state is stored.
CREATE TABLE state_version_bases (
    version_id      bigint PRIMARY KEY REFERENCES state_versions (id) ON DELETE CASCADE,
    state_id        bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    raw             bytea NOT NULL,
    size_bytes      bigint NOT NULL,
    sha256          text NOT NULL,
    assembly_format smallint NOT NULL,
    assembled_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX state_version_bases_state ON state_version_bases (state_id);
-- Compressed as raw_state is (0005): lz4 where the server has it, else stored as is.
DO $$
BEGIN
    ALTER TABLE state_version_bases ALTER COLUMN raw SET STORAGE EXTENDED;
    ALTER TABLE state_version_bases ALTER COLUMN raw SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    ALTER TABLE state_version_bases ALTER COLUMN raw SET STORAGE EXTERNAL;
END
$$;
