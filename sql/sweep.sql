-- One housekeeping pass for a database: what the background reaper runs
-- every lease.sweep_interval, and what a user without preloading can run
-- from cron or pg_cron. Its counters live in a one-row table per database.

CREATE TABLE lease.sweep_state (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    sweeps        bigint NOT NULL DEFAULT 0,
    recovered     bigint NOT NULL DEFAULT 0,
    purged        bigint NOT NULL DEFAULT 0,
    last_sweep_at timestamptz,
    last_duration interval,
    last_error    text,
    last_error_at timestamptz
);

COMMENT ON TABLE lease.sweep_state IS
    'Counters of lease.sweep() in this database (read them through lease.reaper_stats).';

INSERT INTO lease.sweep_state DEFAULT VALUES;

-- The sweep's step that moves queue heads up (head.sql).
CREATE FUNCTION lease._raise_heads(only_queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- A variable: Citus refuses a VOLATILE function in a subquery.
    stale_before constant timestamptz := clock_timestamp() - interval '1 minute';
    q record;
    raised integer := 0;
    from_start boolean;
BEGIN
    IF only_queue IS NOT NULL THEN
        -- One queue, as a distributed install sweeps (citus.sql): each
        -- statement names it, and so runs on its shard alone. The query
        -- below, with its EXISTS under an OR, went to every shard of
        -- lease.queue there, over connections to every node.
        SELECT qu.head_checked_at < stale_before AND qu.head_priority <> 2147483647 INTO from_start
          FROM lease.queue qu WHERE qu.name = only_queue;
        IF from_start OR EXISTS (SELECT FROM lease.counter c
                                  WHERE c.queue = only_queue AND c.backend <> 0
                                    AND (c.claimed > 0 OR c.cancelled > 0)) THEN
            IF lease._raise_head(only_queue, coalesce(from_start, false)) THEN
                raised := 1;
            END IF;
        END IF;
        RETURN raised;
    END IF;
    -- Queues whose rows were claimed or cancelled since the counters were
    -- last folded (lease.metrics), and once a minute every raised head.
    FOR q IN SELECT qu.name, checked.stale AS from_start
               FROM lease.queue qu
              CROSS JOIN LATERAL (SELECT qu.head_checked_at < stale_before
                                         -- A head at the start has nothing to heal.
                                         AND qu.head_priority <> 2147483647 AS stale) AS checked
              WHERE (only_queue IS NULL OR qu.name = only_queue)
                AND (checked.stale
                     OR EXISTS (SELECT FROM lease.counter c
                                 WHERE c.queue = qu.name AND c.backend <> 0 AND (c.claimed > 0 OR c.cancelled > 0)))
              ORDER BY qu.name LOOP
        IF lease._raise_head(q.name, q.from_start) THEN
            raised := raised + 1;
        END IF;
    END LOOP;
    RETURN raised;
END
$$;

COMMENT ON FUNCTION lease._raise_heads(text) IS
$$Internal (lease.sweep): lease._raise_head for each queue (or ONLY_QUEUE) whose rows were claimed or cancelled since the
metrics counters were last folded, and from the start for each raised head not so checked for a minute;
returns how many heads it could look at.$$;

CREATE FUNCTION lease._sweep_all(max_rows integer, t timestamptz,
                                 OUT recovered bigint, OUT purged bigint, OUT failures text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n constant integer := max_rows;
    r record;
    q text;
    step record;
    done bigint;
    problem text;
BEGIN
    recovered := 0;
    purged := 0;
    failures := '{}';
    -- Leases whose session has ended expire first, so that this pass
    -- already recovers them.
    BEGIN
        PERFORM lease._end_lost_sessions(n);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        failures := failures || format('sessions: %s: %s', SQLSTATE, problem);
    END;
    BEGIN
        FOR r IN SELECT * FROM lease._reap(n, NULL) LOOP
            recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        -- One queue's rows must not stop the others: reap queue by queue,
        -- each in its own subtransaction, and record what failed.
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        problem := format('%s: %s', SQLSTATE, problem);
        -- The loop above again, once per queue.
        FOR q IN SELECT DISTINCT j.queue FROM lease.job j WHERE j.state = 'leased' AND j.lease_until <= t LOOP
            BEGIN
                FOR r IN SELECT * FROM lease._reap(n, q) LOOP
                    recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
                END LOOP;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
                problem := format('queue "%s": %s: %s', q, SQLSTATE, problem);
                failures := failures || problem;
            END;
        END LOOP;
    END;
    -- The other steps, each in a subtransaction of its own: one that fails
    -- is recorded and stops none of the others. Each answers how many rows
    -- it purged (only purge does).
    FOR step IN SELECT * FROM (VALUES ('schedules', 'SELECT 0 FROM lease._enqueue_due($1)'),
                                      ('purge', 'SELECT lease.purge($1)'),
                                      ('concurrency slots', 'SELECT 0 FROM lease._top_up_slots()'),
                                      -- Before the fold: it reads which queues had claims.
                                      -- Late in the pass: it holds queue rows until commit.
                                      ('heads', 'SELECT 0 FROM lease._raise_heads()'),
                                      ('counters', 'SELECT 0 FROM lease._fold_counters()'),
                                      -- After the heads: it reads where they are.
                                      ('fairness keys', 'SELECT 0 FROM lease._forget_idle_keys($1)')) AS v(name, call)
    LOOP
        BEGIN
            EXECUTE step.call INTO done USING n;
            purged := purged + coalesce(done, 0);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            failures := failures || format('%s: %s: %s', step.name, SQLSTATE, problem);
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._sweep_all(integer, timestamptz) IS
$$Internal (lease.sweep on a single node): the leases of ended sessions expired, then lease.reap, due
schedules, lease.purge, concurrency slots, queue heads and counters, MAX_ROWS rows per step, each step in a
subtransaction of its own (T: when the sweep started); returns the rows recovered and purged and what failed.$$;

CREATE FUNCTION lease.sweep(max_rows integer DEFAULT 1000)
RETURNS TABLE (recovered bigint, purged bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    problem text;
    failures text[];
BEGIN
    recovered := 0;
    purged := 0;
    -- One sweep per database at a time, and never a wait for another one:
    -- a session that left a sweep open in its transaction must not hold up
    -- the reaper (nor, through it, other databases). The lock is the row of
    -- sweep_state, which only pg_lease's own functions (and superusers) can
    -- lock: an advisory lock's key any role could take first.
    PERFORM FROM lease.sweep_state s FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- Each node of a distributed install sweeps the queues it holds (citus.sql).
    IF lease._distributed() THEN
        SELECT d.recovered, d.purged, d.failures INTO recovered, purged, failures FROM lease._sweep_queues(n) d;
    ELSE
        SELECT d.recovered, d.purged, d.failures INTO recovered, purged, failures FROM lease._sweep_all(n, t) d;
    END IF;
    IF cardinality(failures) > 0 THEN
        -- Keep the reason where operators look (reaper_stats and the log).
        problem := array_to_string(failures, '; ');
        RAISE WARNING 'pg_lease: sweep of database "%" failed in part: %', current_database(), problem;
    END IF;
    UPDATE lease.sweep_state s
       SET sweeps        = s.sweeps + 1,
           recovered     = s.recovered + sweep.recovered,
           purged        = s.purged + sweep.purged,
           last_sweep_at = t,
           last_duration = clock_timestamp() - t,
           last_error    = CASE WHEN cardinality(failures) > 0 THEN problem ELSE s.last_error END,
           last_error_at = CASE WHEN cardinality(failures) > 0 THEN clock_timestamp() ELSE s.last_error_at END;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION lease.sweep(integer) IS
$$One bounded housekeeping pass: the leases of ended sessions expired (lease.bind_session), lease.reap(max_rows), due schedules, lease.purge(max_rows), the removal of up to max_rows fairness keys
fallen idle (of weight 1 and no rate limit), moving the heads
of queues whose rows were claimed past them (where claims start reading), and the folding of lease.metrics'
counter rows; returns how many leases
were recovered and rows purged, and adds them to lease.reaper_stats. An error inside is caught, logged and
recorded as last_error, so the pass itself never fails: if reaping fails, each queue is reaped on its own,
so one queue's rows cannot stop the others. Returns (0, 0) at once while another sweep of this database runs. The pg_lease background worker calls this every
lease.sweep_interval; without preloading, call it from any scheduler.
Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE FUNCTION lease._sweep_queues(max_rows integer, OUT recovered bigint, OUT purged bigint, OUT failures text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Every statement names its queue; planned for it, it runs on that
-- queue's shard alone (citus.sql).
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    q text;
    r record;
    problem text;
BEGIN
    recovered := 0;
    purged := 0;
    failures := '{}';
    -- Schedules live on the coordinator (lease.schedule is not distributed;
    -- elsewhere it is empty): their occurrences are enqueued on the nodes of
    -- their queues, in this transaction.
    BEGIN
        PERFORM lease._enqueue_due(max_rows);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        failures := failures || format('schedules: %s: %s', SQLSTATE, problem);
    END;
    -- Queue by queue, each in a subtransaction: one that fails stops none of
    -- the others. No bound sessions on a distributed install.
    FOR q IN SELECT lease._local_queues() LOOP
        BEGIN
            FOR r IN SELECT * FROM lease._reap(max_rows, q) LOOP
                recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
            END LOOP;
            purged := purged + lease._purge(max_rows, q);
            PERFORM lease._top_up_slots(q);
            PERFORM lease._raise_heads(q);
            PERFORM lease._fold_counters(q);
            PERFORM lease._forget_idle_keys(max_rows, q);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            failures := failures || format('queue "%s": %s: %s', q, SQLSTATE, problem);
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._sweep_queues(integer) IS
$$Internal (lease.sweep on a distributed install): enqueues the due occurrences of schedules (on the
coordinator, which holds them), then reaps, purges, tops up the concurrency slots, raises the head, folds
the counters and forgets idle fairness keys of each queue this node holds, MAX_ROWS rows per step and queue; returns the rows
recovered and purged and what failed.$$;

CREATE FUNCTION lease._next_sweep_due() RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        -- Where Citus is, every lease.sweep_interval: on a distributed
        -- install the reads below would ask every node, and a worker node
        -- learns that it is one (lease.distribute) only from DDL, which
        -- marks nothing due. (Due at once, each node would sweep back to
        -- back.)
        -- Schedules are the coordinator's own table, read here alone.
        RETURN least(now() + coalesce(pg_catalog.current_setting('lease.sweep_interval', true), '1s')::interval,
                     (SELECT min(s.next_at) FROM lease.schedule s));
    END IF;
    RETURN least(
        (SELECT min(j.lease_until) FROM lease.job j WHERE j.state = 'leased'),
        -- Per queue, so that it costs O(queues); either retention bounds it.
        (SELECT min(f.first + least(q.retention, q.dead_retention))
           FROM lease.queue q
           CROSS JOIN LATERAL (SELECT min(j.finished_at) AS first
                                 FROM lease.job j
                                WHERE j.queue = q.name AND j.state IN ('done', 'dead', 'cancelled')) AS f
          WHERE NOT q.attached),
        (SELECT min(s.next_at) FROM lease.schedule s),
        -- At most once a second for write-backs: one that stays due while its
        -- owner's worker runs, waits or finds no worker slot would make every
        -- pass a sweep of this database.
        (SELECT greatest(min(w.next_try_at), clock_timestamp() + interval '1 second')
           FROM lease.write_back w HAVING count(*) > 0),
        -- Sessions that leases are bound to are looked at on every pass.
        (SELECT now() WHERE EXISTS (SELECT FROM lease.session)));
END
$$;

COMMENT ON FUNCTION lease._next_sweep_due() IS
    'Internal: when this database next has work for the reaper (a lease expiry, a purge, a scheduled enqueue, a write-back to retry, a bound session to look at); NULL if none until something changes; where Citus is installed, one lease.sweep_interval from now or a schedule''s next occurrence if sooner.';
