-- Spillway's rules store: users, rules, the audit log and one global rules version.
-- Portable SQL: it runs unchanged on PostgreSQL and SQLite. Identifiers are UUIDs as text and
-- times are Unix milliseconds (UTC), so both engines compare them the same way.

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL CHECK (role IN ('admin', 'viewer', 'service')),
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- One row; every committed modification adds one, so watchers resync by comparing numbers.
CREATE TABLE rules_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO rules_version (id, version) VALUES (1, 0);

CREATE TABLE rules (
    rule_id TEXT PRIMARY KEY,
    service TEXT NOT NULL,
    name TEXT NOT NULL,
    subject_scope TEXT NOT NULL CHECK (subject_scope IN ('user', 'ip', 'org', 'api_key', 'caller')),
    subject_value TEXT NOT NULL,
    api TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    max_requests BIGINT NOT NULL,
    window_seconds DOUBLE PRECISION NOT NULL,
    burst_size BIGINT,
    match_json TEXT NOT NULL,
    scope TEXT NOT NULL,
    mode TEXT NOT NULL,
    store TEXT NOT NULL,
    cost_json TEXT NOT NULL,
    on_store_failure TEXT NOT NULL,
    bucket_json TEXT NOT NULL,
    expires_at BIGINT,
    reason TEXT,
    version BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    CONSTRAINT rules_subject_api UNIQUE (service, subject_scope, subject_value, api),
    CONSTRAINT rules_service_name UNIQUE (service, name)
);

-- One row per modification; its version is the rules version the modification produced.
CREATE TABLE audit_log (
    version BIGINT PRIMARY KEY,
    actor TEXT NOT NULL,
    actor_id TEXT,
    at BIGINT NOT NULL,
    action TEXT NOT NULL,
    rule_id TEXT,
    before_json TEXT,
    after_json TEXT,
    reason TEXT
);
CREATE INDEX audit_log_actor_at ON audit_log (actor_id, at);
