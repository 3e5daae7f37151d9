-- Rate limits: at most rate_limit rows of a queue claimed in any span of
-- rate_period, by the database clock. Each claimed row holds one of the
-- queue's rate_limit permits from its claim until rate_period later: a
-- sliding window. (A bucket of N refilled at N per period would let 2N
-- through in a period that starts with the bucket full.)
--
-- The permits are dealt out in sixteen shares, rows of lease.rate_share,
-- each keeping the claims of the window it let through. A claim locks a
-- share no other transaction holds (SKIP LOCKED), counts what it has left,
-- and moves to the next until it has what it wants; once it knows how many
-- rows it found, it records them in those shares, which it holds until its
-- transaction ends, so every share counts every claim before it. No
-- share lets more than its part through, so neither does the queue,
-- whatever the number of claimers, and sixteen claimers take permits side
-- by side. (One row for the whole queue made claims take turns for the
-- length of a transaction: a drain with sixteen claimers ran at 0.4x of
-- none, and claimers polling for the turn went without it for 100 ms
-- under load, taking nothing while rows were ready.)

CREATE TABLE lease.rate_share (
    queue  text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    share  integer NOT NULL CHECK (share BETWEEN 0 AND 15),
    -- This share's part of the queue's rate_limit: their sum is the limit.
    permits integer NOT NULL CHECK (permits >= 0),
    -- The claims of the last rate_period, oldest first: when (the database
    -- clock, as the claim stamped its rows) and how many rows each took.
    starts timestamptz[] NOT NULL DEFAULT '{}',
    counts integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (queue, share)
)
-- Rewritten on every claim of its queue: room for HOT.
WITH (fillfactor = 50);

COMMENT ON TABLE lease.rate_share IS
    'Per queue with a rate limit: the sixteen shares of its permits and the claims each let through in the last rate_period. Kept by lease.create_queue and lease.claim_pending.';

CREATE FUNCTION lease._rate_used(starts timestamptz[], counts integer[], since timestamptz) RETURNS bigint
-- plpgsql, whose plan a session keeps: a SQL function with a subquery is
-- never inlined, and was parsed and planned again on every claim (60 us).
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(sum(u.n), 0) FROM unnest(starts, counts) AS u(s, n) WHERE u.s > since);
END
$$;

COMMENT ON FUNCTION lease._rate_used(timestamptz[], integer[], timestamptz) IS
    'Internal: how many rows the claims of STARTS (when) and COUNTS (how many) took after SINCE.';

CREATE FUNCTION lease._window(starts timestamptz[], counts integer[], since timestamptz, at timestamptz,
                              period interval, took integer,
                              OUT kept_starts timestamptz[], OUT kept_counts integer[])
-- IMMUTABLE, of its arguments alone: a distributed install (citus.sql)
-- takes no other function in an UPDATE.
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    last integer;
BEGIN
    -- Claims after this one read their times after it ends: an entry older
    -- than SINCE (a period before AT) is old for all of them too.
    SELECT coalesce(array_agg(u.s ORDER BY u.o), '{}'), coalesce(array_agg(u.n ORDER BY u.o), '{}')
      INTO kept_starts, kept_counts
      FROM unnest(starts, counts) WITH ORDINALITY AS u(s, n, o)
     WHERE u.s > since;
    IF took = 0 THEN
        RETURN;
    END IF;
    -- A claim within a hundredth of a period of the last one joins its
    -- entry, at its own (later) time: those rows count a little longer,
    -- never shorter, and a record keeps about a hundred entries at any
    -- claim rate.
    last := cardinality(kept_starts);
    IF last > 0 AND kept_starts[last] > at - period / 100 THEN
        kept_starts[last] := at;
        kept_counts[last] := kept_counts[last] + took;
    ELSE
        kept_starts := kept_starts || at;
        kept_counts := kept_counts || took;
    END IF;
END
$$;

COMMENT ON FUNCTION lease._window(timestamptz[], integer[], timestamptz, timestamptz, interval, integer) IS
$$Internal (rate limits): a sliding window's record of claims, STARTS (when) and COUNTS (how many rows), without the
entries of SINCE or earlier, and with TOOK rows claimed at AT added (to the last entry, if within a hundredth of
PERIOD of it).$$;

CREATE FUNCTION lease._rate_take(queue text, period interval, wanted integer,
                                 OUT permitted integer, OUT at timestamptz,
                                 OUT shares integer[], OUT takes integer[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline constant timestamptz := clock_timestamp() + interval '100 milliseconds';
    -- Claimers start at different shares, and so rarely meet.
    first constant integer := pg_backend_pid() % 16;
    nap float8 := 0.001;
    seen integer[] := '{}';
    s integer;
    share_permits integer;
    kept_starts timestamptz[];
    kept_counts integer[];
    take integer;
BEGIN
    permitted := 0;
    shares := '{}';
    takes := '{}';
    LOOP
        -- NO KEY: a queue dropped meanwhile waits for this claim.
        SELECT r.share, r.permits, r.starts, r.counts INTO s, share_permits, kept_starts, kept_counts
          FROM lease.rate_share r
         WHERE r.queue = _rate_take.queue AND r.permits > 0 AND r.share <> ALL (seen)
         ORDER BY (r.share - first + 16) % 16
         LIMIT 1
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Every share was looked at, or the rest are other claims'.
            -- Having none, wait for them (they end with their claims),
            -- but never for a claim left in an open transaction.
            EXIT WHEN cardinality(seen) > 0 OR clock_timestamp() > deadline
                   OR NOT EXISTS (SELECT FROM lease.rate_share r
                                   WHERE r.queue = _rate_take.queue AND r.permits > 0);
            PERFORM pg_sleep(nap);
            nap := least(nap * 2, 0.02);
            CONTINUE;
        END IF;
        seen := seen || s;
        -- Counted from the time of the lock, before AT: a little more than
        -- AT's window, never less. (In the locking SELECT, this counted
        -- every share's record before taking one.)
        take := least(wanted - permitted,
                      greatest(share_permits - lease._rate_used(kept_starts, kept_counts, clock_timestamp() - period), 0));
        CONTINUE WHEN take = 0;
        permitted := permitted + take;
        shares := shares || s;
        takes := takes || take;
        EXIT WHEN permitted = wanted;
    END LOOP;
    -- Read once the shares are this claim's: the times of one share's
    -- claims rise in the order they hold it, so its record (and the
    -- window each claim counts) keeps their order.
    at := clock_timestamp();
END
$$;

COMMENT ON FUNCTION lease._rate_take(text, interval, integer) IS
$$Internal (lease.claim_pending): finds how many of WANTED rows QUEUE's rate limit (counting PERIOD) lets a
claim take now from the shares (lease.rate_share) no other transaction holds, locking them until the
transaction ends (waiting up to 100 ms if other transactions hold every share), and returns how many
(PERMITTED), from which shares (SHARES, TAKES), and the time to stamp the rows with (AT, the database clock,
read after the locks).$$;

CREATE FUNCTION lease._rate_record(queue text, period interval, at timestamptz,
                                   shares integer[], takes integer[], claimed integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    since constant timestamptz := at - period;
    take integer;
BEGIN
    FOR i IN 1 .. cardinality(shares) LOOP
        EXIT WHEN claimed = 0;
        take := least(claimed, takes[i]);
        claimed := claimed - take;
        -- Two calls, not a multi-column SET from a subquery, which crashed
        -- Citus 13.2.2 (signal 11) on a distributed install.
        UPDATE lease.rate_share r
           SET starts = (lease._window(r.starts, r.counts, since, at, period, take)).kept_starts,
               counts = (lease._window(r.starts, r.counts, since, at, period, take)).kept_counts
         WHERE r.queue = _rate_record.queue AND r.share = shares[i];
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._rate_record(text, interval, timestamptz, integer[], integer[], integer) IS
$$Internal (lease.claim_pending): records CLAIMED rows, taken at AT, in the shares of QUEUE (whose limit
counts PERIOD) that lease._rate_take locked for them in this transaction (TAKES of SHARES, in order).$$;

CREATE FUNCTION lease._rate_wait_of(queue text, period interval, t timestamptz) RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    free boolean;
    soonest timestamptz;
BEGIN
    -- A share's permits come back oldest claim first.
    SELECT bool_or(lease._rate_used(r.starts, r.counts, t - period) < r.permits),
           min((SELECT min(u.s) FROM unnest(r.starts) AS u(s) WHERE u.s > t - period))
      INTO free, soonest
      FROM lease.rate_share r
     WHERE r.queue = _rate_wait_of.queue AND r.permits > 0;
    RETURN CASE WHEN free THEN interval '0' ELSE greatest(soonest + period - t, interval '0') END;
END
$$;

COMMENT ON FUNCTION lease._rate_wait_of(text, interval, timestamptz) IS
$$Internal (lease.rate_wait, lease.wait_reason): how long after T until QUEUE's rate limit (counting PERIOD) lets
a claim take a row: 0 if a share has room.$$;

CREATE FUNCTION lease.rate_wait(queue text DEFAULT 'default') RETURNS interval
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
    t constant timestamptz := clock_timestamp();
    lim integer;
    period interval;
    restricted boolean;
    keyed boolean;
    queue_wait interval;
    key_wait interval;
BEGIN
    SELECT qu.rate_limit, qu.rate_period, qu.restricted, qu.key_limited INTO lim, period, restricted, keyed
      FROM lease.queue qu
     WHERE qu.name = q;
    IF restricted THEN
        PERFORM lease._check_access(q, '{work}');
    END IF;
    IF lim IS NOT NULL THEN
        queue_wait := lease._rate_wait_of(q, period, t);
    END IF;
    IF keyed THEN
        -- The first full key to have room again (key_rate.sql).
        key_wait := (SELECT min(f.full_until) - t FROM lease.fairness_key f
                      WHERE f.queue = q AND f.rate_limit IS NOT NULL AND f.full_until > t);
    END IF;
    -- A row needs room in both.
    RETURN CASE WHEN queue_wait IS NULL THEN key_wait
                WHEN key_wait IS NULL THEN queue_wait
                ELSE greatest(queue_wait, key_wait) END;
END
$$;

COMMENT ON FUNCTION lease.rate_wait(text) IS
$$How long until QUEUE's rate limit lets a claim take a row again (by the database clock): 0 if it would now,
NULL if the queue has no rate limit; where fairness keys of QUEUE are full (lease.set_key_rate), until the
first of them has room again, if later. A worker whose claim came back empty sleeps this long rather than
polling. Errors: 22004 queue NULL; 42704 no such queue; 42501 the queue is restricted and the caller may not
work it.$$;
