-- Drift reports: what a refresh-only check (kl drift) or a refresh (kl refresh) found, per state,
-- kept as history. Attribute NAMES only, never values. "drifted" is what this check found inside
-- its globs; "outstanding" is the state's known drift after it (earlier findings outside the globs
-- carried over), so the newest row answers "what is drifted now" without re-reading history.
CREATE TABLE drift_reports (
    id           bigserial PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    state_id     bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    serial       bigint NOT NULL,
    checked_at   timestamptz NOT NULL DEFAULT now(),
    source       text NOT NULL CHECK (source IN ('drift', 'refresh')),
    outcome      text NOT NULL CHECK (outcome IN ('clean', 'drifted', 'refreshed')),
    actor        text NOT NULL,
    run_id       text,
    globs        jsonb NOT NULL,
    checked      integer NOT NULL,
    drifted      jsonb NOT NULL,
    outstanding  jsonb NOT NULL,
    outstanding_count integer NOT NULL
);

CREATE INDEX drift_reports_state ON drift_reports (state_id, id DESC);
