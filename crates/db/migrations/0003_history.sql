-- Traffic history for the configurator (the configurator's `builtin:` source): each controller with a
-- database writes its own region's counts per bucket per --history-resolution. Portable SQL, as
-- 0001: it runs unchanged on PostgreSQL and SQLite; times are Unix milliseconds.

-- How long each region was heard from in each slot: a bucket without a row in a slot that is
-- here had no traffic; a slot that is not here is a gap.
CREATE TABLE history_slots (
    region TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (region, start_ms)
);

-- One bucket's counts over one slot of one region: what arrived, what was admitted, what a
-- shadow bucket would have dropped, and what its candidate limit would have dropped.
CREATE TABLE bucket_history (
    region TEXT NOT NULL,
    service TEXT NOT NULL,
    bucket TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    offered BIGINT NOT NULL,
    admitted BIGINT NOT NULL,
    shadow_dropped BIGINT NOT NULL,
    candidate_dropped BIGINT NOT NULL,
    PRIMARY KEY (service, bucket, region, start_ms)
);
CREATE INDEX bucket_history_start ON bucket_history (start_ms);
