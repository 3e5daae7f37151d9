-- Hand-written baseline: insert 50 rows per transaction.
INSERT INTO bench_jobs (queue, payload) SELECT 'q', '{"n": 1}' FROM generate_series(1, 50);
