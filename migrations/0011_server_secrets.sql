-- Secrets the service generates for itself on first start and shares between every process and host
-- that uses this database (the dashboard's session-signing key). Never returned by any endpoint.
CREATE TABLE server_secrets (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
