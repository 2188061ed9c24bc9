-- The GitHub bot: webhook deliveries (idempotency), each open pull request's predicted footprint
-- (overlap warnings), and bot jobs with their outcome, stored before it is posted to GitHub.

CREATE TABLE webhook_deliveries (
    delivery_id  text PRIMARY KEY,
    event        text NOT NULL,
    action       text NOT NULL DEFAULT '',
    repo         text NOT NULL DEFAULT '',
    status       text NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'queued', 'ignored', 'failed')),
    job_ids      text[] NOT NULL DEFAULT '{}',
    detail       jsonb NOT NULL DEFAULT '{}',
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_received_ix ON webhook_deliveries (received_at);

CREATE TABLE pull_request_footprints (
    repo         text NOT NULL,
    number       integer NOT NULL,
    project      text NOT NULL,
    state_name   text NOT NULL,
    head_sha     text NOT NULL,
    files        text[] NOT NULL DEFAULT '{}',
    write_globs  text[] NOT NULL DEFAULT '{}',
    read_globs   text[] NOT NULL DEFAULT '{}',
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repo, number, project)
);
CREATE INDEX pull_request_footprints_state_ix ON pull_request_footprints (repo, state_name);

CREATE TABLE bot_jobs (
    id           text PRIMARY KEY,          -- the job key: kind, repo, PR or SHA, project
    kind         text NOT NULL,
    repo         text NOT NULL,
    number       integer,
    sha          text NOT NULL DEFAULT '',
    project      text NOT NULL DEFAULT '',
    status       text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'skipped')),
    attempts     integer NOT NULL DEFAULT 0,
    result       jsonb NOT NULL DEFAULT '{}',
    posted       boolean NOT NULL DEFAULT false,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX bot_jobs_repo_ix ON bot_jobs (repo, number);
