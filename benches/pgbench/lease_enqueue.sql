-- pg_lease: enqueue one row per transaction (sends a NOTIFY on the queue's channel on commit).
SELECT lease.enqueue('q', '{"n": 1}');
