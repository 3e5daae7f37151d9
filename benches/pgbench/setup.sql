-- Tables of the hand-written baseline and of the commit-bound ceiling, created by the
-- runner in the benchmark database next to the pg_lease extension.

-- The seeds' job table: status + claimed_until, no owner, no epoch. The partial index
-- covers the rows the claim looks at (pending, and running ones that may have expired),
-- in claim order.
CREATE TABLE bench_jobs (
    id            bigserial PRIMARY KEY,
    queue         text NOT NULL,
    payload       jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'pending',
    claimed_until timestamptz,
    attempts      integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX bench_jobs_claimable ON bench_jobs (id) WHERE status IN ('pending', 'running');

-- One row per id; clients update disjoint ranges of 1000 ids (up to 64 clients).
CREATE TABLE bench_ceiling (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
INSERT INTO bench_ceiling (id) SELECT generate_series(0, 64 * 1000 + 100);

-- pg_lease's queue for every scenario; default policy (retention 0: done rows are deleted).
SELECT lease.create_queue('q');
