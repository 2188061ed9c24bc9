-- Slicing the trunk by address glob reads live rows by address prefix ("module.web." …), which
-- needs a pattern-capable index whatever the database's collation.
CREATE INDEX resources_alive_prefix_ix ON resources (state_id, address text_pattern_ops)
    WHERE delete_serial IS NULL;
