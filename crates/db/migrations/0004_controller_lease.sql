-- The controllers' lease: one row per region, held by the controller that leads it until
-- `expires_at_ms` (Unix milliseconds of the holder's clock). Portable SQL, as 0001: it runs
-- unchanged on PostgreSQL and SQLite.
--
-- `epoch` only ever grows: every takeover (another holder, or the same one after its lease
-- lapsed) adds one, and rows are never deleted, so instructions stamped with it can be told
-- apart by their receivers.
CREATE TABLE controller_leases (
    region TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    address TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
