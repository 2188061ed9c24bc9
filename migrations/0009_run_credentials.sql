-- Apply runs are bound to the credential that opened them: commits, renews, releases and closes
-- from another credential are refused. 'token:ID' in database mode, 'shared' for the open and static
-- modes' single credential. Runs opened before this column existed have '' and match no credential:
-- an operator aborts them (kl abort) and they are opened again.
ALTER TABLE apply_runs ADD COLUMN credential text NOT NULL DEFAULT '';

-- A waiting request's queue ticket is redeemed only by the credential that took it.
ALTER TABLE reservation_waiters ADD COLUMN credential text NOT NULL DEFAULT '';

-- How long a ticket may stay queued in all (the request's wait_seconds, capped by KL_MAX_WAIT_SECONDS).
ALTER TABLE reservation_waiters ADD COLUMN wait_until timestamptz;
