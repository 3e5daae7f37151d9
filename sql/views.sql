-- Observability. Times are measured with the database clock.
--
-- The views that read lease.job or lease.counter have a read_ function
-- each, which answers whoever may read the view (lease._check_reader) with
-- the view's owner's rights: on a distributed install Citus reads a view's
-- tables on the worker nodes as the querying role, who may not read them
-- there. The client and the CLI read through the functions.

CREATE VIEW lease.queue_stats AS
SELECT q.name AS queue,
       count(j.id) FILTER (WHERE j.state = 'pending')                                   AS pending,
       count(j.id) FILTER (WHERE j.state = 'pending' AND NOT j.held AND j.next_at <= clock_timestamp()) AS ready,
       count(j.id) FILTER (WHERE j.state = 'leased')                                    AS leased,
       count(j.id) FILTER (WHERE j.state = 'leased' AND j.lease_until <= clock_timestamp()) AS expired,
       count(j.id) FILTER (WHERE j.state = 'done')                                      AS done,
       count(j.id) FILTER (WHERE j.state = 'dead')                                      AS dead,
       count(j.id) FILTER (WHERE j.state = 'cancelled')                                 AS cancelled,
       clock_timestamp() - min(j.next_at) FILTER (WHERE j.state = 'pending' AND NOT j.held
                                                    AND j.next_at <= clock_timestamp())
                                                                                        AS oldest_ready_age,
       q.recovered_total,
       q.paused
  FROM lease.queue q
  LEFT JOIN lease.job j ON j.queue = q.name
 GROUP BY q.name, q.recovered_total, q.paused;

COMMENT ON VIEW lease.queue_stats IS
    'Per queue: rows by state, how many are claimable now (ready; not counting rows held for a concurrency slot), leases past expiry not yet reaped (expired), age of the oldest ready row, leases recovered by reap so far, and whether the queue is paused (lease.pause: claims take none of its rows).';

CREATE FUNCTION lease.read_queue_stats() RETURNS SETOF lease.queue_stats
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_reader('lease.queue_stats');
    RETURN QUERY
    SELECT * FROM lease.queue_stats;
END
$$;

COMMENT ON FUNCTION lease.read_queue_stats() IS
$$lease.read_metrics for lease.queue_stats. Errors: 42501 the caller may not read lease.queue_stats.$$;

CREATE VIEW lease.in_flight AS
SELECT j.id, j.queue, j.key, j.owner, j.epoch, j.attempt, j.lease_until,
       j.lease_until - clock_timestamp() AS remaining,
       j.cancel_requested
  FROM lease.job j
 WHERE j.state = 'leased';

COMMENT ON VIEW lease.in_flight IS
    'Leased rows with their owner, fencing epoch and remaining time (negative: expired, waiting for reap).';

CREATE FUNCTION lease.read_in_flight(queue text DEFAULT NULL) RETURNS SETOF lease.in_flight
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Citus plans no parameter of an SQL function, and those of plpgsql only
-- in a plan made for their values.
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    PERFORM lease._check_reader('lease.in_flight');
    RETURN QUERY
    SELECT * FROM lease.in_flight v
     WHERE read_in_flight.queue IS NULL OR v.queue = read_in_flight.queue
     ORDER BY v.id;
END
$$;

COMMENT ON FUNCTION lease.read_in_flight(text) IS
$$lease.read_metrics for lease.in_flight: its rows (of QUEUE, when given) by id. Errors: 42501 the caller may
not read lease.in_flight.$$;

CREATE VIEW lease.fairness_keys AS
SELECT coalesce(f.queue, r.queue) AS queue,
       coalesce(f.key, r.fairness_key) AS fairness_key,
       coalesce(f.weight, 1) AS weight,
       coalesce(r.pending, 0) AS pending,
       coalesce(r.ready, 0) AS ready,
       coalesce(r.leased, 0) AS leased,
       f.rate_limit,
       CASE WHEN f.rate_limit IS NOT NULL THEN f.rate_period END AS rate_period,
       -- The key's window, counted as its claims count it (key_rate.sql).
       CASE WHEN f.rate_limit IS NOT NULL THEN
            (SELECT coalesce(sum(u.n), 0) FROM unnest(f.starts, f.counts) AS u(s, n)
              WHERE u.s > clock_timestamp() - f.rate_period) END AS claimed_in_period,
       CASE WHEN f.full_until > clock_timestamp() THEN f.full_until END AS held_until
  FROM lease.fairness_key f
  FULL JOIN (SELECT j.queue, coalesce(j.fairness_key, '') AS fairness_key,
                    count(*) FILTER (WHERE j.state = 'pending') AS pending,
                    count(*) FILTER (WHERE j.state = 'pending' AND NOT j.held
                                       AND j.next_at <= clock_timestamp()) AS ready,
                    count(*) FILTER (WHERE j.state = 'leased') AS leased
               FROM lease.job j
              WHERE j.state IN ('pending', 'leased')
                AND j.queue IN (SELECT q.name FROM lease.queue q WHERE q.fair)
              GROUP BY j.queue, coalesce(j.fairness_key, '')) AS r
    ON r.queue = f.queue AND r.fairness_key = f.key;

COMMENT ON VIEW lease.fairness_keys IS
    'Per fairness key of a queue that has them (lease.enqueue''s fairness_key; rows without one are of the key ''''): its weight, its rows pending, ready (claimable now) and leased, its rate limit (lease.set_key_rate), the rows claimed in its window now, and, while its window is full, until when claims hold its rows back (held_until).';

CREATE FUNCTION lease.read_fairness_keys(queue text DEFAULT NULL) RETURNS SETOF lease.fairness_keys
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- As read_in_flight: planned for the call's queue.
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    PERFORM lease._check_reader('lease.fairness_keys');
    RETURN QUERY
    SELECT * FROM lease.fairness_keys v
     WHERE read_fairness_keys.queue IS NULL OR v.queue = read_fairness_keys.queue
     ORDER BY v.queue, v.fairness_key;
END
$$;

COMMENT ON FUNCTION lease.read_fairness_keys(text) IS
$$lease.read_metrics for lease.fairness_keys: its rows (of QUEUE, when given) by queue and key. Errors: 42501
the caller may not read lease.fairness_keys.$$;

CREATE FUNCTION lease.wait_reason(id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    j lease.job;
    qu lease.queue;
    k lease.key_slot;
    queue_wait interval;
    key_room timestamptz;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    SELECT * INTO j FROM lease.job r WHERE r.id = wait_reason.id;
    IF NOT FOUND OR j.state <> 'pending' THEN
        RETURN NULL;
    END IF;
    SELECT * INTO qu FROM lease.queue r WHERE r.name = j.queue;
    -- In the order the claim decides (sql.md, "Fairness": precedence).
    IF j.held THEN
        SELECT * INTO k FROM lease.key_slot s WHERE s.queue = j.queue AND s.key = j.concurrency_key;
        RETURN format('held: concurrency key %s has %s of its %s slots in use',
                      quote_literal(j.concurrency_key), k.active, qu.concurrency);
    END IF;
    IF qu.paused THEN
        RETURN format('paused: queue %s is paused (lease.resume)', quote_literal(qu.name));
    END IF;
    IF j.next_at > t THEN
        RETURN format('not due: claimable from %s', j.next_at);
    END IF;
    IF qu.rate_limit IS NOT NULL THEN
        queue_wait := lease._rate_wait_of(qu.name, qu.rate_period, t);
        IF queue_wait > interval '0' THEN
            RETURN format('rate limit: queue %s has no room until %s', quote_literal(qu.name), t + queue_wait);
        END IF;
    END IF;
    SELECT f.full_until INTO key_room
      FROM lease.fairness_key f
     WHERE f.queue = j.queue AND f.key = coalesce(j.fairness_key, '') AND f.rate_limit IS NOT NULL
       AND f.full_until > t;
    IF key_room IS NOT NULL THEN
        RETURN format('rate limit: fairness key %s has no room until %s',
                      quote_literal(coalesce(j.fairness_key, '')), key_room);
    END IF;
    RETURN 'ready: claimable now';
END
$$;

COMMENT ON FUNCTION lease.wait_reason(bigint) IS
$$Why pending row ID has not been claimed, as the claim would decide it now: held (its concurrency key's slots
all in use), paused (its queue), not due (run_at or a retry's backoff), rate limit (of its queue or of its
fairness key, with the time it has room again), or ready; NULL if the row is not pending or does not exist.
For lease_admin. Errors: 22004 id NULL.$$;

CREATE VIEW lease.dead_letters AS
SELECT j.id, j.queue, j.key, j.payload, j.attempt, j.last_error, j.finished_at
  FROM lease.job j
 WHERE j.state = 'dead';

COMMENT ON VIEW lease.dead_letters IS
    'Rows that failed for good (outcome fail, or attempts reached max_attempts), with their last error.';

CREATE FUNCTION lease.read_dead_letters(queue text DEFAULT NULL, "limit" bigint DEFAULT NULL) RETURNS SETOF lease.dead_letters
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan  -- as lease.read_in_flight
AS $$
BEGIN
    PERFORM lease._check_reader('lease.dead_letters');
    RETURN QUERY
    SELECT * FROM lease.dead_letters v
     WHERE read_dead_letters.queue IS NULL OR v.queue = read_dead_letters.queue
     ORDER BY v.id
     LIMIT read_dead_letters."limit";
END
$$;

COMMENT ON FUNCTION lease.read_dead_letters(text, bigint) IS
$$lease.read_metrics for lease.dead_letters: its first LIMIT rows (all when NULL; of QUEUE, when given) by id.
Errors: 42501 the caller may not read lease.dead_letters; 2201W LIMIT negative.$$;

CREATE VIEW lease.write_backs AS
SELECT w.id, w.queue, a.rel AS "table", w.key, w.outcome, w.created_at, w.attempts, w.next_try_at, w.last_error
  FROM lease.write_back w
  JOIN lease.attachment a ON a.queue = w.queue;

COMMENT ON VIEW lease.write_backs IS
$$on_dead/on_cancel write-backs recorded and not yet applied to their table rows (lease.apply_write_backs): the
row's key, the outcome, attempts so far, when the next is due and the last one's error.$$;

CREATE VIEW lease.holders AS
SELECT n.name, n.owner, n.epoch, n.acquired_at, n.lease_until,
       n.lease_until - clock_timestamp() AS remaining
  FROM lease.named_lease n
 WHERE n.lease_until > clock_timestamp();

COMMENT ON VIEW lease.holders IS
    'Current holders of named leases (leaders, singletons).';

-- Who holds this database's sweep, if another session does (lease.sweep's
-- lock is a row lock on sweep_state: its holder's transaction id is the
-- row's xmax). SECURITY DEFINER: the start of another role's transaction is
-- hidden from the view's readers otherwise.
CREATE FUNCTION lease._sweep_holder(OUT pid integer, OUT since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT l.pid, a.xact_start
      FROM lease.sweep_state s
      JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = s.xmax AND l.granted
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.pid <> pg_backend_pid()
     LIMIT 1;
END;

COMMENT ON FUNCTION lease._sweep_holder() IS
    'Internal (lease.reaper_stats): the backend of another session that holds this database''s sweep now, and since when its transaction runs; no row if none.';

CREATE VIEW lease.reaper_stats AS
SELECT current_database() AS database, s.sweeps, s.recovered, s.purged,
       s.last_sweep_at, s.last_duration, s.last_error, s.last_error_at,
       lease._reaper_slot_shortages() AS slot_shortages,
       to_timestamp(lease._reaper_last_slot_shortage()) AS last_slot_shortage_at,
       h.pid AS sweep_held_by, h.since AS sweep_held_since
  FROM lease.sweep_state s
  LEFT JOIN lease._sweep_holder() h ON true;

COMMENT ON VIEW lease.reaper_stats IS
$$Housekeeping in this database: sweeps run, leases recovered, rows purged, last sweep time and duration,
last error; server-wide, how often the reaper found no free worker slot (NULL: not preloaded); and the
backend of another session that holds this database's sweep (a lease.sweep() left open in a transaction),
with its transaction's start: while it holds it, no sweep runs here.$$;
