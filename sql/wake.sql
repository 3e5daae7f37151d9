-- Waking idle workers when a queue gets ready rows.

-- Idle workers LISTEN on pg_lease_ready. A NOTIFY takes a lock that
-- serialises the commits of all notifying transactions of the cluster
-- (measured: 3.8k single enqueues/s with one per enqueue, 12k without), so
-- only the rows that make a queue non-empty announce themselves: while
-- ready rows wait, every worker is either claiming or about to (a worker
-- idles only after a claim that found fewer rows than it asked for). In the
-- narrow race where that claim's snapshot missed the row, the worker's poll
-- picks it up.
CREATE FUNCTION lease.wake(queue text, added integer) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF (SELECT count(*)
          FROM (SELECT FROM lease.job j
                 WHERE j.queue = wake.queue AND j.state = 'pending' AND NOT j.held
                   AND j.next_at <= clock_timestamp()
                 LIMIT added + 1) AS ready) <= added THEN
        PERFORM pg_notify('pg_lease_ready', queue);
    END IF;
END
$$;

COMMENT ON FUNCTION lease.wake(text, integer) IS
$$Internal: sends NOTIFY pg_lease_ready (payload QUEUE) unless QUEUE had ready rows besides the ADDED ones
the caller just inserted.$$;
