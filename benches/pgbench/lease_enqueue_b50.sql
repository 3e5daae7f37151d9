-- pg_lease: enqueue 50 rows per transaction in one enqueue_batch call.
SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{"n": 1}'::jsonb, ARRAY[50]));
