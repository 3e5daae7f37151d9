-- Hand-written baseline: insert one row per transaction.
INSERT INTO bench_jobs (queue, payload) VALUES ('q', '{"n": 1}');
