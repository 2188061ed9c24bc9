-- Every whole-state write maintains each index of resources for every row it opens, so an index no reader
-- needs is paid for by every POST. resources_history_ix (state_id, address, create_serial) repeats
-- resources_history_prefix_ix (state_id, address text_pattern_ops, create_serial): equality on address is the
-- same operator in both operator classes, so each per-address read (history, lifecycles, the changed-names
-- join, a commit's base rows) is served by the prefix index, ordered by create_serial.
DROP INDEX IF EXISTS resources_history_ix;
