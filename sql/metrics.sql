-- Metrics that cost O(queues), not O(rows): lease.metrics.
--
-- Counting rows by state on every poll grows with the table (lease.queue_stats
-- does, and a monitoring poll at 10^6 rows took ~0.3 s). Instead, every
-- function that moves rows between states adds what it did to a counter row,
-- once per call, not per row:
--
--   * monotonic totals: enqueued, claimed, done, retried, dead, cancelled;
--   * two gauges kept as sums of deltas: pending and dead rows.
--
-- Leased and expired rows are few at any time and are counted live from the
-- job_leased index; the age of the oldest ready row and the number of rows
-- waiting for a later next_at are read from job_ready, one probe per
-- priority.
--
-- Counter rows are per (queue, backend): a backend runs one transaction at
-- a time, so no two transactions ever wait on each other's counter row (one
-- row per queue would serialise every claim of a queue until its commit).
-- lease.sweep folds the rows into backend 0 so that the table stays small.

CREATE TABLE lease.counter (
    queue     text NOT NULL,
    -- pg_backend_pid() of the writer; 0 for the folded sums.
    backend   integer NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    claimed   bigint NOT NULL DEFAULT 0,
    done      bigint NOT NULL DEFAULT 0,
    retried   bigint NOT NULL DEFAULT 0,
    died      bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    -- Deltas of the number of pending and of dead rows.
    pending   bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, backend)
)
-- Room for HOT updates: a counter row is rewritten by every call.
WITH (fillfactor = 50);

COMMENT ON TABLE lease.counter IS
    'Per queue and writing backend: totals of state changes and deltas of pending and dead rows. Read them through lease.metrics.';

CREATE FUNCTION lease._count(
    queue     text,
    enqueued  bigint DEFAULT 0,
    claimed   bigint DEFAULT 0,
    done      bigint DEFAULT 0,
    retried   bigint DEFAULT 0,
    died      bigint DEFAULT 0,
    cancelled bigint DEFAULT 0,
    pending   bigint DEFAULT 0,
    dead      bigint DEFAULT 0
) RETURNS void
LANGUAGE plpgsql VOLATILE
-- No SET search_path: only lease's SECURITY DEFINER functions call it, with
-- theirs already set, and not being SECURITY DEFINER it can do nothing its
-- caller could not. A SET here cost each call ~20,000 instructions (two
-- search-path switches; docs/archive/performance-history.md, the callgrind table).
AS $$
BEGIN
    INSERT INTO lease.counter AS c (queue, backend, enqueued, claimed, done, retried, died, cancelled, pending, dead)
    VALUES (_count.queue, pg_backend_pid(), _count.enqueued, _count.claimed, _count.done, _count.retried,
            _count.died, _count.cancelled, _count.pending, _count.dead)
        ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
       SET enqueued  = c.enqueued + excluded.enqueued,
           claimed   = c.claimed + excluded.claimed,
           done      = c.done + excluded.done,
           retried   = c.retried + excluded.retried,
           died      = c.died + excluded.died,
           cancelled = c.cancelled + excluded.cancelled,
           pending   = c.pending + excluded.pending,
           dead      = c.dead + excluded.dead;
END
$$;

COMMENT ON FUNCTION lease._count(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
    'Internal: adds one call''s state changes in QUEUE to this backend''s counter row (see lease.metrics).';

-- Rows that moved out of one state and into another, per queue: what the
-- functions that change many rows at once pass to _count.
CREATE FUNCTION lease._count_moved(queue text, from_state lease.job_state, to_state lease.job_state, n bigint,
                                   outcome text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF n = 0 OR from_state IS NOT DISTINCT FROM to_state THEN
        RETURN;
    END IF;
    PERFORM lease._count(
        queue,
        enqueued  => CASE WHEN from_state IS NULL AND to_state = 'pending' THEN n ELSE 0 END,
        claimed   => CASE WHEN to_state = 'leased' THEN n ELSE 0 END,
        done      => CASE WHEN to_state = 'done' OR (to_state IS NULL AND from_state = 'leased' AND outcome = 'done')
                          THEN n ELSE 0 END,
        retried   => CASE WHEN from_state = 'leased' AND to_state = 'pending' AND outcome = 'retry' THEN n ELSE 0 END,
        died      => CASE WHEN to_state = 'dead' THEN n ELSE 0 END,
        cancelled => CASE WHEN to_state = 'cancelled' THEN n ELSE 0 END,
        pending   => (CASE WHEN to_state = 'pending' THEN n ELSE 0 END) - (CASE WHEN from_state = 'pending' THEN n ELSE 0 END),
        dead      => (CASE WHEN to_state = 'dead' THEN n ELSE 0 END) - (CASE WHEN from_state = 'dead' THEN n ELSE 0 END));
END
$$;

COMMENT ON FUNCTION lease._count_moved(text, lease.job_state, lease.job_state, bigint, text) IS
$$Internal: counts N rows of QUEUE that went from FROM_STATE to TO_STATE (NULL: inserted, or deleted);
OUTCOME 'retry' counts a return to pending as a retry, OUTCOME 'done' a leased row deleted as done.$$;

CREATE FUNCTION lease._fold_counters(only_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    folded bigint := 0;
    r record;
BEGIN
    -- Rows a backend's open transaction holds are left for the next sweep.
    -- The upsert is lease._count's, for summed rows: _count stays one
    -- statement on every state change's path. One upsert per queue, not an
    -- INSERT ... SELECT from the DELETE: on a distributed install (citus.sql)
    -- Citus would run that one through the coordinator.
    FOR r IN
    WITH gone AS (
        DELETE FROM lease.counter c
         WHERE (only_queue IS NULL OR c.queue = only_queue)
           AND (c.queue, c.backend) IN (SELECT k.queue, k.backend FROM lease.counter k
                                         WHERE k.backend <> 0 AND (only_queue IS NULL OR k.queue = only_queue)
                                           FOR UPDATE SKIP LOCKED)
        RETURNING c.*
    )
    SELECT g.queue, count(*) AS n, sum(g.enqueued) AS enqueued, sum(g.claimed) AS claimed, sum(g.done) AS done,
           sum(g.retried) AS retried, sum(g.died) AS died, sum(g.cancelled) AS cancelled,
           sum(g.pending) AS pending, sum(g.dead) AS dead
      FROM gone g
     GROUP BY g.queue
    LOOP
        INSERT INTO lease.counter AS c (queue, backend, enqueued, claimed, done, retried, died, cancelled, pending, dead)
        VALUES (r.queue, 0, r.enqueued, r.claimed, r.done, r.retried, r.died, r.cancelled, r.pending, r.dead)
            ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
           SET enqueued  = c.enqueued + excluded.enqueued,
               claimed   = c.claimed + excluded.claimed,
               done      = c.done + excluded.done,
               retried   = c.retried + excluded.retried,
               died      = c.died + excluded.died,
               cancelled = c.cancelled + excluded.cancelled,
               pending   = c.pending + excluded.pending,
               dead      = c.dead + excluded.dead;
        folded := folded + r.n;
    END LOOP;
    RETURN folded;
END
$$;

COMMENT ON FUNCTION lease._fold_counters(text) IS
    'Internal: adds the counter rows of every backend into the folded row of their queue (of ONLY_QUEUE, or all) (lease.sweep calls it); returns how many rows were folded.';

CREATE FUNCTION lease.recount() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fixed bigint;
    qn text;
BEGIN
    -- The gauges as the rows say, against the counters; a queue lock keeps
    -- writers out while both are read.
    LOCK TABLE lease.job IN SHARE MODE;
    WITH actual AS (
        SELECT q.name AS queue,
               count(j.id) FILTER (WHERE j.state = 'pending') AS pending,
               count(j.id) FILTER (WHERE j.state = 'dead')    AS dead
          FROM lease.queue q LEFT JOIN lease.job j ON j.queue = q.name
         GROUP BY q.name
    ), counted AS (
        SELECT c.queue, sum(c.pending) AS pending, sum(c.dead) AS dead
          FROM lease.counter c GROUP BY c.queue
    ), off AS (
        SELECT a.queue, a.pending - coalesce(k.pending, 0) AS pending, a.dead - coalesce(k.dead, 0) AS dead
          FROM actual a LEFT JOIN counted k ON k.queue = a.queue
         WHERE a.pending <> coalesce(k.pending, 0) OR a.dead <> coalesce(k.dead, 0)
    ), fixes AS (
        INSERT INTO lease.counter AS c (queue, backend, pending, dead)
        SELECT o.queue, 0, o.pending, o.dead FROM off o
            ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
           SET pending = c.pending + excluded.pending,
               dead    = c.dead + excluded.dead
    )
    SELECT count(*) INTO fixed FROM off;
    -- The concurrency slots as the rows say, then whatever they now admit.
    DELETE FROM lease.key_slot;
    INSERT INTO lease.key_slot (queue, key, active, waiting)
    SELECT j.queue, j.concurrency_key,
           count(*) FILTER (WHERE j.state IN ('pending', 'leased') AND NOT j.held),
           count(*) FILTER (WHERE j.state = 'pending' AND j.held)
      FROM lease.job j
     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('pending', 'leased')
     GROUP BY j.queue, j.concurrency_key;
    -- Queue by queue: a distributed install (citus.sql) locks rows of one
    -- shard at a time.
    FOR qn IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        PERFORM lease._top_up_slots(qn);
    END LOOP;
    -- Rows made pending by hand may be before a queue's head (head.sql):
    -- claims start from the start again until the next sweep.
    UPDATE lease.queue q
       SET head_priority = DEFAULT, head_rank = DEFAULT, head_next_at = DEFAULT, head_id = DEFAULT;
    RETURN fixed;
END
$$;

COMMENT ON FUNCTION lease.recount() IS
$$Admin: recounts the pending and dead rows of every queue (O(rows), locks out writers of lease.job
while it runs) and corrects lease.metrics' gauges where they differ; returns how many queues needed it.
Rebuilds the concurrency slots (lease.key_slot) from the rows too, and admits held rows they leave room for,
and moves every queue's head (where claims start reading) back to its start. Never needed in normal operation: for after rows were changed other than through lease.* functions.$$;

-- Per priority of QUEUE's pending rows: the earliest next_at at the head of
-- the claim order and how many rows wait for a later next_at. Rows with a
-- rank (an attached table's order_by) count as ready.
CREATE FUNCTION lease._queue_head(queue text, OUT delayed bigint, OUT oldest_ready timestamptz)
-- The owner's rights: lease_admin reads the metrics view but not lease.job.
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    p integer;
    first timestamptz;
BEGIN
    delayed := 0;
    p := (SELECT max(j.priority) FROM lease.job j
           WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held);
    WHILE p IS NOT NULL LOOP
        SELECT j.next_at INTO first
          FROM lease.job j
         WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held AND j.priority = p
         ORDER BY j.priority DESC, j.rank, j.next_at, j.id
         LIMIT 1;
        IF first <= t THEN
            oldest_ready := least(oldest_ready, first);
        END IF;
        delayed := delayed + (SELECT count(*) FROM lease.job j
                               WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held
                                 AND j.priority = p AND j.rank = 0 AND j.next_at > t);
        p := (SELECT max(j.priority) FROM lease.job j
               WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held AND j.priority < p);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._queue_head(text) IS
$$Internal: for lease.metrics, how many pending rows of QUEUE wait for a later next_at, and the earliest
next_at among ready rows at the head of each priority; one index probe per distinct priority.$$;

CREATE VIEW lease.metrics AS
SELECT q.name AS queue,
       greatest(coalesce(c.pending, 0) - h.delayed - coalesce(k.held, 0), 0) AS ready,
       h.delayed,
       coalesce(l.leased, 0)  AS leased,
       coalesce(l.expired, 0) AS expired,
       coalesce(c.dead, 0)    AS dead,
       clock_timestamp() - h.oldest_ready AS oldest_ready_age,
       clock_timestamp() - l.oldest_expiry AS reap_lag,
       coalesce(c.enqueued, 0)  AS enqueued_total,
       coalesce(c.claimed, 0)   AS claimed_total,
       coalesce(c.done, 0)      AS done_total,
       coalesce(c.retried, 0)   AS retried_total,
       coalesce(c.died, 0)      AS dead_total,
       coalesce(c.cancelled, 0) AS cancelled_total,
       q.recovered_total,
       coalesce(k.held, 0) AS held,
       q.paused,
       q.rate_limit,
       q.rate_period,
       coalesce(r.used, 0) AS rate_used
  FROM lease.queue q
  -- sum(bigint) is numeric; the counts stay bigint.
  LEFT JOIN (SELECT k.queue, sum(k.enqueued)::bigint AS enqueued, sum(k.claimed)::bigint AS claimed,
                    sum(k.done)::bigint AS done, sum(k.retried)::bigint AS retried, sum(k.died)::bigint AS died,
                    sum(k.cancelled)::bigint AS cancelled, sum(k.pending)::bigint AS pending,
                    sum(k.dead)::bigint AS dead
               FROM lease.counter k GROUP BY k.queue) c ON c.queue = q.name
  LEFT JOIN (SELECT j.queue, count(*) AS leased,
                    count(*) FILTER (WHERE j.lease_until <= clock_timestamp()) AS expired,
                    min(j.lease_until) FILTER (WHERE j.lease_until <= clock_timestamp()) AS oldest_expiry
               FROM lease.job j WHERE j.state = 'leased' GROUP BY j.queue) l ON l.queue = q.name
  LEFT JOIN (SELECT s.queue, sum(s.waiting)::bigint AS held FROM lease.key_slot s GROUP BY s.queue) k
         ON k.queue = q.name
  CROSS JOIN LATERAL lease._queue_head(q.name) h
  -- Sixteen rows of at most about a hundred entries each (rate.sql).
  -- Counted here, not by lease._rate_used: the view's readers may not
  -- execute internal functions.
  LEFT JOIN (SELECT s.queue, sum(u.n)::bigint AS used
               FROM lease.rate_share s
               JOIN lease.queue sq ON sq.name = s.queue
              CROSS JOIN LATERAL unnest(s.starts, s.counts) AS u(st, n)
              WHERE sq.rate_limit IS NOT NULL AND u.st > clock_timestamp() - sq.rate_period
              GROUP BY s.queue) r ON r.queue = q.name;

COMMENT ON VIEW lease.metrics IS
$$Per queue, at O(queues + leases in flight + distinct priorities) cost: ready rows (pending, next_at
reached), delayed rows (pending, next_at later), held rows (pending, waiting for a slot of their
concurrency_key; O(keys) to count), leased rows and those past expiry not yet reaped, dead
letters, age of the oldest ready row, how long the oldest expired lease has waited for the reaper
(reap_lag), and monotonic totals since install (enqueued, claimed, done, retried, dead, cancelled,
recovered by reap), whether the queue is paused (lease.pause: claims take none of its rows), and its rate
limit (rate_limit rows per rate_period, NULL if none; see lease.create_queue) with the rows claimed in the
last rate_period (rate_used). Totals and gauges change only when a transaction that moved rows commits.$$;

CREATE FUNCTION lease.read_metrics() RETURNS SETOF lease.metrics
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_reader('lease.metrics');
    RETURN QUERY
    SELECT * FROM lease.metrics;
END
$$;

COMMENT ON FUNCTION lease.read_metrics() IS
$$The rows of lease.metrics for a role that may read the view, read with the view's owner's rights: on a
distributed install the view itself fails for its readers (views.sql). Errors: 42501 the caller may not read
lease.metrics.$$;
