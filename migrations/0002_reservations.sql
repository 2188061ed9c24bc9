-- Apply runs and resource reservations: read/write claims on address globs with leases,
-- plus the queue of waiting acquirers that keeps waiting fair.

CREATE TABLE apply_runs (
    id               text PRIMARY KEY,
    tenant_id        bigint NOT NULL,
    state_id         bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    status           text NOT NULL
        CHECK (status IN ('reserved', 'running', 'committed', 'failed', 'aborted', 'expired')),
    actor            text NOT NULL,
    base_serial      bigint,
    committed_serial bigint,
    lease_seconds    integer NOT NULL,
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    counters         jsonb NOT NULL DEFAULT '{}',
    error_summary    text,
    info             jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX apply_runs_state_ix ON apply_runs (state_id, created_at DESC);
CREATE INDEX apply_runs_live_ix ON apply_runs (state_id) WHERE status IN ('reserved', 'running');

CREATE TABLE resource_reservations (
    id           bigserial PRIMARY KEY,
    tenant_id    bigint NOT NULL,
    state_id     bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    run_id       text NOT NULL REFERENCES apply_runs (id) ON DELETE CASCADE,
    glob         text NOT NULL,
    -- The glob's first address step (module call or resource), or '*': two globs can only
    -- intersect when their roots are equal or one is '*', so conflict checks read one index range.
    root         text NOT NULL,
    mode         text NOT NULL CHECK (mode IN ('read', 'write')),
    holder       text NOT NULL,
    info         jsonb NOT NULL DEFAULT '{}',
    acquired_at  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    UNIQUE (run_id, glob, mode)
);
CREATE INDEX resource_reservations_root_ix ON resource_reservations (state_id, root);
CREATE INDEX resource_reservations_run_ix ON resource_reservations (run_id);

-- Acquirers waiting for conflicts to clear. A grant must also not intersect an earlier waiter's
-- request, so a large request is never starved by a stream of small ones. Waiters refresh
-- seen_at while they poll; a stale waiter (its client went away) no longer holds its place.
CREATE TABLE reservation_waiters (
    id          bigserial PRIMARY KEY,
    state_id    bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    holder      text NOT NULL,
    wanted      jsonb NOT NULL,
    enqueued_at timestamptz NOT NULL,
    seen_at     timestamptz NOT NULL
);
CREATE INDEX reservation_waiters_state_ix ON reservation_waiters (state_id, id);
