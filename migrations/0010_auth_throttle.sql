-- Failed-authentication throttling: one counter per client address (and per token, when a refused
-- credential names a known token), counted in fixed windows. Failures are audited once per key and
-- window (with the previous window's count), not one event per failure.

CREATE TABLE auth_throttle (
    key            text PRIMARY KEY,
    window_started timestamptz NOT NULL,
    failures       integer NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX auth_throttle_updated_at ON auth_throttle (updated_at);
