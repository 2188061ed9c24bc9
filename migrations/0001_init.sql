-- Kilolock schema, version 1: tenants, states and their versions, resource lifecycles,
-- outputs, the state lock and the audit trail. Every row hangs off a tenant from day one.

CREATE TABLE tenants (
    id          bigserial PRIMARY KEY,
    slug        text NOT NULL UNIQUE,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The built-in tenant used by the open and static auth modes.
INSERT INTO tenants (id, slug, name) VALUES (1, 'default', 'Default tenant');
SELECT setval(pg_get_serial_sequence('tenants', 'id'), 1);

CREATE TABLE states (
    id              bigserial PRIMARY KEY,
    tenant_id       bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    scope           text NOT NULL DEFAULT '',
    name            text NOT NULL,
    lineage         text,
    current_serial  bigint,
    head_version_id bigint,
    lock_id         text,
    lock_info       bytea,
    locked_at       timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, scope, name)
);

CREATE TABLE state_versions (
    id                bigserial PRIMARY KEY,
    tenant_id         bigint NOT NULL,
    state_id          bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    serial            bigint NOT NULL,
    lineage           text NOT NULL,
    terraform_version text NOT NULL DEFAULT '',
    raw_state         bytea NOT NULL,
    sha256            text NOT NULL,
    size_bytes        bigint NOT NULL,
    encrypted         boolean NOT NULL DEFAULT false,
    source            text NOT NULL,
    actor             text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (state_id, serial)
);
-- Raw states are written once and read whole; skipping TOAST compression keeps a 50 MB POST
-- from spending most of its time in pglz.
ALTER TABLE state_versions ALTER COLUMN raw_state SET STORAGE EXTERNAL;

ALTER TABLE states ADD CONSTRAINT states_head_version_fk
    FOREIGN KEY (head_version_id) REFERENCES state_versions (id) DEFERRABLE INITIALLY DEFERRED;

-- One row per resource instance object per lifecycle: alive in [create_serial, delete_serial).
CREATE TABLE resources (
    id                bigserial PRIMARY KEY,
    tenant_id         bigint NOT NULL,
    state_id          bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    address           text NOT NULL,
    resource_address  text NOT NULL,
    module            text NOT NULL DEFAULT '',
    mode              text NOT NULL,
    type              text NOT NULL,
    name              text NOT NULL,
    index_key         jsonb,
    deposed           text NOT NULL DEFAULT '',
    status            text NOT NULL DEFAULT '',
    provider          text NOT NULL,
    instance          jsonb NOT NULL,
    attributes_hash   text NOT NULL,
    dependencies      text[] NOT NULL DEFAULT '{}',
    create_serial     bigint NOT NULL,
    delete_serial     bigint,
    CHECK (delete_serial IS NULL OR delete_serial > create_serial)
);
-- At most one live row per instance object; also the index the per-write open-set load uses.
CREATE UNIQUE INDEX resources_alive_uq ON resources (state_id, address, deposed)
    WHERE delete_serial IS NULL;
CREATE INDEX resources_history_ix ON resources (state_id, address, create_serial);

CREATE TABLE outputs (
    state_version_id bigint NOT NULL REFERENCES state_versions (id) ON DELETE CASCADE,
    state_id         bigint NOT NULL REFERENCES states (id) ON DELETE CASCADE,
    tenant_id        bigint NOT NULL,
    name             text NOT NULL,
    value            jsonb NOT NULL,
    type             jsonb NOT NULL,
    sensitive        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (state_version_id, name)
);

-- The audit trail outlives the state it describes, so it keeps the name and no cascading key.
CREATE TABLE events (
    id          bigserial PRIMARY KEY,
    tenant_id   bigint NOT NULL,
    state_id    bigint,
    state_name  text NOT NULL DEFAULT '',
    kind        text NOT NULL,
    actor       text NOT NULL DEFAULT '',
    serial      bigint,
    lock_id     text,
    detail      jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX events_state_ix ON events (tenant_id, state_id, id);

CREATE VIEW current_resources AS
    SELECT * FROM resources WHERE delete_serial IS NULL;

-- Every recorded dependency of every instance row, with the lifecycle of the depending row.
CREATE VIEW resource_dependencies AS
    SELECT r.tenant_id, r.state_id, r.id AS resource_id, r.address, r.resource_address,
           dep.depends_on, r.create_serial, r.delete_serial
    FROM resources r, unnest(r.dependencies) AS dep(depends_on);

-- Edges between live instances: each dependency resolved to the live instances it names.
CREATE VIEW current_resource_dependencies AS
    SELECT d.tenant_id, d.state_id, d.resource_id, d.address, d.depends_on,
           t.id AS depends_on_id, t.address AS depends_on_address
    FROM resource_dependencies d
    JOIN current_resources t
      ON t.state_id = d.state_id AND t.resource_address = d.depends_on AND t.deposed = ''
    WHERE d.delete_serial IS NULL;

-- Resolving dependency names to live instances (current_resource_dependencies) by resource.
CREATE INDEX resources_resource_alive_ix ON resources (state_id, resource_address)
    WHERE delete_serial IS NULL;
