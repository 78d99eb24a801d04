-- Tokens of their own: a user may hold several, each revocable, rotatable and optionally expiring.
-- Portable SQL, as 0001: it runs unchanged on PostgreSQL and SQLite; times are Unix milliseconds.

CREATE TABLE tokens (
    -- The `<id>` of `spw_<id>_<secret>`: 32 hex digits.
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    -- argon2id of the current secret; a rotation replaces it.
    secret_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- When the current secret was issued: created_at, or the last rotation.
    issued_at BIGINT NOT NULL,
    expires_at BIGINT,
    last_used_at BIGINT,
    revoked_at BIGINT
);
CREATE INDEX tokens_user ON tokens (user_id);

-- Each user's one token so far becomes a token whose id is the user's id, so that every token
-- already handed out keeps working.
INSERT INTO tokens (id, user_id, secret_hash, created_at, issued_at)
    SELECT id, id, token_hash, created_at, created_at FROM users;

ALTER TABLE users DROP COLUMN token_hash;
