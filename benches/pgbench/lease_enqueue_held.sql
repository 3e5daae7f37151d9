-- pg_lease, the churn section's producer: enqueue 100 rows in one enqueue_batch call
-- while the queue holds fewer than :cap pending rows, else wait a millisecond. Twice
-- what a consumer takes per cycle, so that the backlog stays near :cap and the table's
-- size can be read against it. The pending gauge is summed from lease.counter
-- directly: lease.metrics would also walk the leases in flight on every try.
SELECT (coalesce(sum(pending), 0) < :cap)::int AS room FROM lease.counter WHERE queue = 'q' \gset
\if :room
SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{"n": 1}'::jsonb, ARRAY[100]));
\else
\sleep 1 ms
\endif
