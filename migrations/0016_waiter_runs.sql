-- A waiting request for more reservations belongs to a run: kept with its queue place, so a request refused
-- because earlier waiters go first can name their runs (NULL for a waiter that opens a new run).
ALTER TABLE reservation_waiters ADD COLUMN run_id text;
