-- Multi-tenant auth: workspaces and environments under tenants, API tokens stored only as
-- SHA-256 hashes, and the audit trail widened to record scope and failed authentication.

CREATE TABLE workspaces (
    id          bigserial PRIMARY KEY,
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    public_id   text NOT NULL UNIQUE,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE environments (
    id           bigserial PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    workspace_id bigint NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    public_id    text NOT NULL UNIQUE,
    name         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, name)
);

CREATE TABLE api_tokens (
    id             bigserial PRIMARY KEY,
    public_id      text NOT NULL UNIQUE,
    tenant_id      bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    name           text NOT NULL,
    token_hash     text NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    created_by     text NOT NULL DEFAULT '',
    last_used_at   timestamptz,
    revoked_at     timestamptz
);
CREATE INDEX api_tokens_tenant_ix ON api_tokens (tenant_id, created_at);

ALTER TABLE events ALTER COLUMN tenant_id DROP NOT NULL;
ALTER TABLE events ADD COLUMN scope text NOT NULL DEFAULT '';
