-- Housekeeping: recover expired leases (reap) and drop finished rows past
-- their queue's retention (purge). Both are bounded and skip rows that others
-- hold locked, so they never wait on a claimer, a renewer or a fence.

CREATE FUNCTION lease._reap(max_rows integer, only_queue text)
RETURNS TABLE (queue text, requeued bigint, dead bigint, cancelled bigint)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    f constant bigint := lease.epoch_floor();
    r record;
BEGIN
    FOR r IN
    WITH expired AS MATERIALIZED (
        SELECT j.id
          FROM lease.job j
         WHERE j.state = 'leased' AND j.lease_until <= t
           AND (only_queue IS NULL OR j.queue = only_queue)
         ORDER BY j.lease_until
         LIMIT n
           FOR UPDATE SKIP LOCKED
    ), recovered AS (
        -- An expiry is a retry that nobody reported: same accounting as
        -- lease.release(..., 'retry'), and a new epoch fences the old owner.
        UPDATE lease.job j
           SET state       = lease._next_state('retry', j.cancel_requested, j.attempt, q.max_attempts, q.attached),
               finished_at = CASE WHEN lease._next_state('retry', j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                                  THEN t END,
               next_at     = lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch),
               epoch       = greatest(j.epoch + 1, f),
               lease_until = NULL,
               -- Concatenated, not format()ted: Citus allows no STABLE
               -- function of a column in an UPDATE of a distributed table.
               last_error  = 'lease expired: owner ' || j.owner || ', epoch ' || j.epoch::text
                             || ', attempt ' || j.attempt::text
          FROM lease.queue q
         WHERE j.id = ANY (ARRAY(SELECT e.id FROM expired e))
           AND (only_queue IS NULL OR j.queue = only_queue)
           AND q.name = j.queue
        RETURNING j.id, j.queue, j.state, j.concurrency_key
    ), counted AS (
        SELECT r.queue,
               array_agg(r.id) FILTER (WHERE r.state = 'pending') AS requeued_ids,
               count(*) FILTER (WHERE r.state = 'pending')   AS requeued,
               count(*) FILTER (WHERE r.state = 'dead')      AS dead,
               count(*) FILTER (WHERE r.state = 'cancelled') AS cancelled,
               -- Requeued rows keep their concurrency slots; the others free them.
               array_agg(r.concurrency_key) FILTER (WHERE r.state <> 'pending' AND r.concurrency_key IS NOT NULL)
                                                             AS freed
          FROM recovered r
         GROUP BY r.queue
    ), totals AS (
        UPDATE lease.queue q
           SET recovered_total = q.recovered_total + c.requeued + c.dead + c.cancelled
          FROM counted c
         WHERE q.name = c.queue AND (only_queue IS NULL OR q.name = only_queue)
    )
    SELECT c.queue, c.requeued, c.dead, c.cancelled, c.freed, c.requeued_ids FROM counted c ORDER BY c.queue
    LOOP
        queue := r.queue;
        requeued := r.requeued;
        dead := r.dead;
        cancelled := r.cancelled;
        PERFORM lease._count(queue, died => dead, cancelled => cancelled, pending => requeued, dead => dead);
        IF r.freed IS NOT NULL THEN
            PERFORM lease._free_slots(queue, r.freed);
        END IF;
        -- Idle workers LISTENing on the channel wake up instead of polling;
        -- at most one notification per queue and sweep.
        IF requeued > 0 THEN
            -- With a zero backoff they may be due before the queue's head.
            PERFORM lease._lower_heads(r.requeued_ids, queue), pg_notify(lease._ready_channel(queue), '');
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._reap(integer, text) IS
$$Internal: lease.reap, limited to queue ONLY_QUEUE unless it is NULL (lease.sweep uses it to isolate a failing
queue).$$;

CREATE FUNCTION lease.reap(max_rows integer DEFAULT 1000)
RETURNS TABLE (queue text, requeued bigint, dead bigint, cancelled bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- On a distributed install each statement of lease._reap names its queue;
-- planned for it, it runs on that queue's node alone (citus.sql).
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    q text;
    left_over integer := lease._checked_limit(max_rows);
    r record;
BEGIN
    IF NOT lease._distributed() THEN
        RETURN QUERY SELECT * FROM lease._reap(max_rows, NULL);
        RETURN;
    END IF;
    -- One statement over every queue's rows would run on every node,
    -- which Citus refuses for FOR UPDATE: queue by queue instead.
    FOR q IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        FOR r IN SELECT * FROM lease._reap(left_over, q) LOOP
            queue := r.queue;
            requeued := r.requeued;
            dead := r.dead;
            cancelled := r.cancelled;
            RETURN NEXT;
            left_over := left_over - (r.requeued + r.dead + r.cancelled)::integer;
        END LOOP;
        EXIT WHEN left_over <= 0;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease.reap(integer) IS
$$Recovers up to MAX_ROWS expired leases (lease_until passed, by the database clock) and returns per queue
how many went back to pending (with backoff), to the dead letters (attempts reached max_attempts) and to
cancelled (cancel was requested). Each recovered row gets a new epoch, so its old owner is fenced at once.
Rows locked by others are skipped. Sends a NOTIFY on the queue's channel (lease.ready_channel) for each queue
that got rows back. Run it from any scheduler; the pg_lease background worker calls it too. On a
distributed install it goes queue by queue, each queue's rows on the node holding them.
Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE FUNCTION lease._purge(max_rows integer, only_queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    removed bigint := 0;
    r record;
BEGIN
    FOR r IN
    WITH old AS MATERIALIZED (
        SELECT j.id
          FROM lease.job j JOIN lease.queue q ON q.name = j.queue
         WHERE j.state IN ('done', 'dead', 'cancelled')
           -- An attached table's finished rows go when their table row stops
           -- matching; purging them earlier would leave that row unleased.
           AND NOT q.attached
           AND j.finished_at < t - CASE WHEN j.state = 'done' THEN q.retention ELSE q.dead_retention END
           AND (only_queue IS NULL OR j.queue = only_queue)
         LIMIT n
           FOR UPDATE OF j SKIP LOCKED
    ), gone AS (
        DELETE FROM lease.job j
         WHERE j.id = ANY (ARRAY(SELECT o.id FROM old o)) AND (only_queue IS NULL OR j.queue = only_queue)
        RETURNING j.queue, j.state
    )
    SELECT g.queue, count(*) AS n, count(*) FILTER (WHERE g.state = 'dead') AS dead
      FROM gone g GROUP BY g.queue
    LOOP
        removed := removed + r.n;
        IF r.dead > 0 THEN
            PERFORM lease._count(r.queue, dead => -r.dead);
        END IF;
    END LOOP;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease._purge(integer, text) IS
$$Internal: lease.purge, of ONLY_QUEUE when it is not NULL.$$;

CREATE FUNCTION lease.purge(max_rows integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text;
    removed bigint := 0;
BEGIN
    IF NOT lease._distributed() THEN
        RETURN lease._purge(max_rows, NULL);
    END IF;
    -- Citus locks rows (FOR UPDATE SKIP LOCKED) only on one shard: queue by
    -- queue, as each node's reaper purges.
    PERFORM lease._checked_limit(max_rows);
    FOR qn IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        EXIT WHEN removed >= max_rows;
        removed := removed + lease._purge((max_rows - removed)::integer, qn);
    END LOOP;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.purge(integer) IS
$$Deletes up to MAX_ROWS finished rows older than their queue's retention (done rows) or dead_retention
(dead and cancelled rows) and returns how many. Rows of attached tables are left to their triggers. Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE FUNCTION lease._log_reaped(queue text, requeued bigint, dead bigint, cancelled bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE LOG 'pg_lease: expired leases in queue "%" of database "%": % back to pending, % dead-lettered, % cancelled',
        queue, current_database(), requeued, dead, cancelled;
    RETURN requeued + dead + cancelled;
END
$$;

COMMENT ON FUNCTION lease._log_reaped(text, bigint, bigint, bigint) IS
    'Internal: logs what lease.sweep recovered in one queue and returns how many rows that was.';
