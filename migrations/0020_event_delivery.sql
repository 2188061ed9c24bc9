-- Outgoing events: the audit trail (``events``) is the outbox. Each endpoint keeps a cursor (the last
-- audit row it has dealt with), so delivery is in audit order per endpoint and nothing committed is lost.
CREATE TABLE event_endpoints (
    id            bigserial PRIMARY KEY,
    tenant_id     bigint,
    name          text NOT NULL UNIQUE,
    url           text NOT NULL,
    format        text NOT NULL DEFAULT 'webhook',
    secret        text NOT NULL,
    states        text[] NOT NULL DEFAULT '{}',
    globs         text[] NOT NULL DEFAULT '{}',
    cursor_id     bigint NOT NULL DEFAULT 0,
    attempts      integer NOT NULL DEFAULT 0,
    next_at       timestamptz,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per event an endpoint received (delivered) or gave up on (dead, after the last retry).
CREATE TABLE event_deliveries (
    id            bigserial PRIMARY KEY,
    endpoint_id   bigint NOT NULL REFERENCES event_endpoints (id) ON DELETE CASCADE,
    event_id      bigint NOT NULL,
    status        text NOT NULL,
    attempts      integer NOT NULL,
    last_error    text,
    at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (endpoint_id, event_id)
);

-- The transaction that wrote each audit row: an endpoint's cursor moves only over rows whose transaction
-- is older than every transaction still running, so a row that commits late is never skipped.
ALTER TABLE events ADD COLUMN txid xid8 DEFAULT pg_current_xact_id();
