-- Raw states compress about 8x with lz4, which is cheap enough to pay on every write (pglz is
-- not, which is why 0001 stored them uncompressed). Servers built without lz4 keep that.
DO $$
BEGIN
    ALTER TABLE state_versions ALTER COLUMN raw_state SET STORAGE EXTENDED;
    ALTER TABLE state_versions ALTER COLUMN raw_state SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    ALTER TABLE state_versions ALTER COLUMN raw_state SET STORAGE EXTERNAL;
END
$$;
