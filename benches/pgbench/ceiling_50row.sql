-- Commit-bound ceiling, 50 rows: a primary-key range UPDATE of 50 rows per transaction,
-- in the client's own id range (no lock waits between clients).
\set lo :client_id * 1000 + random(0, 950)
UPDATE bench_ceiling SET n = n + 1 WHERE id BETWEEN :lo AND :lo + 49;
