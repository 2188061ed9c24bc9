-- Pull-request holds: a pull request that applied from a comment keeps the write globs it applied,
-- per project, until it is merged or closed or a `kilolock unlock` comment releases them. The
-- reservations themselves live in resource_reservations under a hold run of their own (run_id), whose
-- holder is 'owner/repo#N' and whose lease does not lapse; this table says which pull request holds
-- which run, what it applied and where, so merges, closes and reconciliation can find and end them.

CREATE TABLE pull_request_holds (
    repo            text NOT NULL,
    number          integer NOT NULL,
    project         text NOT NULL,
    tenant_id       bigint NOT NULL,
    scope           text NOT NULL DEFAULT '',
    token_name      text NOT NULL DEFAULT '',   -- the credential that opened the hold run (it ends it too)
    state_name      text NOT NULL,
    run_id          text NOT NULL REFERENCES apply_runs (id) ON DELETE CASCADE,
    head_sha        text NOT NULL,
    applied_serial  bigint,
    applied_run_id  text,
    write_globs     text[] NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repo, number, project)
);
CREATE INDEX pull_request_holds_state_ix ON pull_request_holds (tenant_id, scope, state_name);
