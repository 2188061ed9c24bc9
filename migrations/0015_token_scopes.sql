-- Address scopes of API tokens: 'GLOB:read' or 'GLOB:write' texts (canonical, sorted). An empty list is
-- the whole state, which every token created before had.
ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS scopes text[] NOT NULL DEFAULT '{}';
