-- A run whose Terraform is applying is not ended at once by an abort: it becomes 'aborting', keeps its
-- reservations while its client stops Terraform, and ends when the client closes it (or its lease lapses).

ALTER TABLE apply_runs DROP CONSTRAINT IF EXISTS apply_runs_status_check;
ALTER TABLE apply_runs ADD CONSTRAINT apply_runs_status_check
    CHECK (status IN ('reserved', 'running', 'aborting', 'committed', 'failed', 'aborted', 'expired'));
DROP INDEX IF EXISTS apply_runs_live_ix;
CREATE INDEX apply_runs_live_ix ON apply_runs (state_id) WHERE status IN ('reserved', 'running', 'aborting');
