-- Commit-bound ceiling, one row: a primary-key UPDATE of one row per transaction.
-- Each client updates its own id range, so clients never wait on each other's locks.
\set id :client_id * 1000 + random(0, 999)
UPDATE bench_ceiling SET n = n + 1 WHERE id = :id;
