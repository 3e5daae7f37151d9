-- pg_lease: enqueue one row per transaction (sends NOTIFY pg_lease_ready on commit).
SELECT lease.enqueue('q', '{"n": 1}');
