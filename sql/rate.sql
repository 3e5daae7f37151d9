-- Rate limits: at most rate_limit rows of a queue claimed in any span of
-- rate_period, by the database clock. Each claimed row holds one of the
-- queue's rate_limit permits from its claim until rate_period later: a
-- sliding window. (A bucket of N refilled at N per period would let 2N
-- through in a period that starts with the bucket full.) The claims of the
-- window are kept in the queue's row (about a hundred entries), and claims
-- of a limited queue take turns on that row until their transactions end,
-- so each counts every claim before it, whatever the number of claimers.
-- A claim waits for its turn at most 100 ms and then takes nothing: a
-- claim left in an open transaction must not hang every other claimer.
-- (Taking nothing at once instead made claimers spin: on a distributed
-- install sixteen of them used 80% of the limit, starving the turn's
-- holder.)

CREATE FUNCTION lease._rate_take(queue text, wanted integer, OUT permitted integer, OUT at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline constant timestamptz := clock_timestamp() + interval '100 milliseconds';
    nap float8 := 0.001;
    lim integer;
    period interval;
    starts timestamptz[];
    counts integer[];
    used bigint;
    last integer;
BEGIN
    -- Polled, not waited for: a lock_timeout would bound the wait only
    -- where this function runs, and on a distributed install a claim in a
    -- transaction block runs on the coordinator and waits on the node.
    LOOP
        -- NO KEY: enqueues (their key share of the queue row) go on meanwhile.
        SELECT q.rate_limit, q.rate_period, q.rate_starts, q.rate_counts INTO lim, period, starts, counts
          FROM lease.queue q
         WHERE q.name = _rate_take.queue
           FOR NO KEY UPDATE SKIP LOCKED;
        EXIT WHEN FOUND;
        IF clock_timestamp() > deadline THEN
            -- Another claim's turn has lasted too long.
            permitted := 0;
            at := clock_timestamp();
            RETURN;
        END IF;
        -- Doubling, so that many claimers waiting leave the turn's holder
        -- the CPU.
        PERFORM pg_sleep(nap);
        nap := least(nap * 2, 0.02);
    END LOOP;
    -- Read once the row is ours: the stamps of one queue's claims rise in
    -- the order they hold it, so an entry older than a window is old for
    -- every claim after this one too, and is dropped.
    at := clock_timestamp();
    IF lim IS NULL THEN
        -- The limit was removed while this claim waited.
        permitted := wanted;
        RETURN;
    END IF;
    SELECT coalesce(array_agg(u.s ORDER BY u.o), '{}'), coalesce(array_agg(u.n ORDER BY u.o), '{}'),
           coalesce(sum(u.n), 0)
      INTO starts, counts, used
      FROM unnest(starts, counts) WITH ORDINALITY AS u(s, n, o)
     WHERE u.s > at - period;
    permitted := least(wanted, greatest(lim - used, 0));
    IF permitted = 0 THEN
        RETURN;
    END IF;
    -- Taken now, while the row is read, and given back by the claim if it
    -- finds fewer rows (lease._rate_give_back). A claim within a hundredth
    -- of a period of the last one joins its entry, which takes the later
    -- time: its rows count a little longer, never shorter, and the row
    -- keeps about a hundred entries at any claim rate (one per claim, it
    -- grew with the rate, and so did the cost of every claim).
    last := cardinality(starts);
    IF last > 0 AND starts[last] > at - period / 100 THEN
        starts[last] := at;
        counts[last] := counts[last] + permitted;
    ELSE
        starts := starts || at;
        counts := counts || permitted;
    END IF;
    -- From variables: on a distributed install (citus.sql) the UPDATE runs
    -- on the queue's node, which takes no subquery of its own row in SET.
    UPDATE lease.queue q
       SET rate_starts = starts,
           rate_counts = counts
     WHERE q.name = _rate_take.queue;
END
$$;

COMMENT ON FUNCTION lease._rate_take(text, integer) IS
$$Internal (lease.claim_pending): locks QUEUE's row until the transaction ends, takes as many of WANTED rows
as its rate limit lets a claim take now (0 if another transaction held the row for 100 ms), records them
taken at AT (the database clock, read after the lock), and returns both.$$;

CREATE FUNCTION lease._rate_give_back(queue text, unused integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    counts integer[];
    lim integer;
BEGIN
    -- The row is this transaction's since lease._rate_take: its last entry
    -- holds what that took, unless there was no limit to take from.
    SELECT q.rate_counts, q.rate_limit INTO counts, lim FROM lease.queue q WHERE q.name = _rate_give_back.queue;
    IF lim IS NULL THEN
        RETURN;
    END IF;
    counts[cardinality(counts)] := counts[cardinality(counts)] - unused;
    UPDATE lease.queue q SET rate_counts = counts WHERE q.name = _rate_give_back.queue;
END
$$;

COMMENT ON FUNCTION lease._rate_give_back(text, integer) IS
$$Internal (lease.claim_pending): gives back UNUSED of the rows lease._rate_take took for QUEUE in this
transaction, which the claim did not find.$$;

CREATE FUNCTION lease.rate_wait(queue text DEFAULT 'default') RETURNS interval
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
    t constant timestamptz := clock_timestamp();
    lim integer;
    period interval;
    starts timestamptz[];
    counts integer[];
    restricted boolean;
    used bigint;
BEGIN
    SELECT qu.rate_limit, qu.rate_period, qu.rate_starts, qu.rate_counts, qu.restricted
      INTO lim, period, starts, counts, restricted
      FROM lease.queue qu
     WHERE qu.name = q;
    IF restricted THEN
        PERFORM lease._check_access(q, '{work}');
    END IF;
    IF lim IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(sum(u.n), 0) INTO used FROM unnest(starts, counts) AS u(s, n) WHERE u.s > t - period;
    IF used < lim THEN
        RETURN interval '0';
    END IF;
    -- Permits come back oldest claim first.
    RETURN (SELECT min(u.s) FROM unnest(starts) AS u(s) WHERE u.s > t - period) + period - t;
END
$$;

COMMENT ON FUNCTION lease.rate_wait(text) IS
$$How long until QUEUE's rate limit lets a claim take a row again (by the database clock): 0 if it would now,
NULL if the queue has no rate limit. A worker whose claim came back empty sleeps this long rather than
polling. Errors: 22004 queue NULL; 42704 no such queue; 42501 the queue is restricted and the caller may not
work it.$$;
