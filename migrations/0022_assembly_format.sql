-- The layout an apply version's cached bytes were assembled in (analyzer.state_assembly.ASSEMBLY_FORMAT).
-- The next version's assembly splices such bytes instead of assembling from every row, but only bytes of
-- the current layout: NULL (bytes Terraform wrote, or cached before this column) is never a base.
ALTER TABLE state_versions ADD COLUMN assembly_format smallint;
