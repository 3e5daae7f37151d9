-- Rate limits per fairness key: at most rate_limit rows of one key (a
-- tenant, an upstream API) claimed in any span of rate_period, by the
-- database clock, whatever the other keys of the queue do. A sliding window,
-- as a queue's limit (rate.sql), kept on the key's row of
-- lease.fairness_key: the claims of the last period and how many rows each
-- took.
--
-- A claim decides in three steps (lease.claim_pending):
--  1. before it reads rows, it leaves out the keys that are full (their
--     window holds rate_limit rows until full_until), so a full key at the
--     head of the queue costs a claim nothing: fairness interleaves the
--     keys' rows, and the scan steps over the full key's;
--  2. it picks rows as ever, and then locks the limited keys among them
--     (SKIP LOCKED: a key another claim is counting is left to that claim,
--     never waited for), reads the time, and keeps of each key's rows, in
--     claim order, as many as its window has room for;
--  3. it records them in the keys' windows, which it holds until its
--     transaction ends, so each key's claims count one after another and
--     their times rise in that order (the argument of rate.sql's shares).
-- Rows left out stay pending where they are and are claimable the moment
-- their key's window has room again (lease.rate_wait says when).

CREATE FUNCTION lease._key_rate_take(queue text, ids bigint[], keys text[],
                                     OUT kept bigint[], OUT at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := queue;
    named constant text[] := ARRAY(SELECT DISTINCT coalesce(k, '') FROM unnest(keys) AS u(k));
    limited text[];
    -- Per limited key this claim holds, in one order: its limit and
    -- period, where its window starts, the room left in it, its oldest
    -- claim still in it (AT if none), and how many rows it keeps.
    held text[];
    lims integer[];
    periods interval[];
    sinces timestamptz[] := '{}';
    rooms bigint[];
    firsts timestamptz[];
    tooks bigint[];
    fulls timestamptz[] := '{}';
BEGIN
    SELECT array_agg(f.key) INTO limited
      FROM lease.fairness_key f
     WHERE f.queue = q AND f.key = ANY (named) AND f.rate_limit IS NOT NULL;
    IF limited IS NULL THEN
        kept := ids;
        at := clock_timestamp();
        RETURN;
    END IF;
    -- In no order: SKIP LOCKED never waits, so claims cannot deadlock here.
    -- (ORDER BY key made the planner read every key of the queue in the
    -- index's order, filtering, 3 ms a claim at 10,000 keys.)
    SELECT coalesce(array_agg(l.key), '{}'), array_agg(l.rate_limit), array_agg(l.rate_period)
      INTO held, lims, periods
      FROM (SELECT f.key, f.rate_limit, f.rate_period
              FROM lease.fairness_key f
             WHERE f.queue = q AND f.key = ANY (limited) AND f.rate_limit IS NOT NULL
               FOR NO KEY UPDATE SKIP LOCKED) AS l;
    -- Read once the keys are this claim's (rate.sql, _rate_take).
    at := clock_timestamp();
    FOR i IN 1 .. cardinality(held) LOOP
        sinces[i] := at - periods[i];
    END LOOP;
    SELECT array_agg(greatest(h.lim - w.used, 0) ORDER BY h.o), array_agg(coalesce(w.first, at) ORDER BY h.o)
      INTO rooms, firsts
      FROM unnest(held, lims, sinces) WITH ORDINALITY AS h(key, lim, since, o)
      JOIN lease.fairness_key f ON f.queue = q AND f.key = h.key
     CROSS JOIN LATERAL (SELECT coalesce(sum(u.n), 0) AS used, min(u.s) AS first
                           FROM unnest(f.starts, f.counts) AS u(s, n)
                          WHERE u.s > h.since) AS w;
    -- A limited key's rows up to its room, in claim order; a limited key
    -- another claim holds gets none.
    WITH u AS (
        SELECT x.id, x.o, coalesce(x.k, '') AS k,
               row_number() OVER (PARTITION BY coalesce(x.k, '') ORDER BY x.o) AS nth
          FROM unnest(ids, keys) WITH ORDINALITY AS x(id, k, o)
    ), k AS (
        SELECT u.id, u.o, u.k
          FROM u
          LEFT JOIN unnest(held, rooms) AS r(key, room) ON r.key = u.k
         WHERE u.k <> ALL (limited) OR u.nth <= r.room
    )
    SELECT coalesce((SELECT array_agg(k.id ORDER BY k.o) FROM k), '{}'),
           ARRAY(SELECT (SELECT count(*) FROM k WHERE k.k = h.key)
                   FROM unnest(held) WITH ORDINALITY AS h(key, o) ORDER BY h.o)
      INTO kept, tooks;
    -- Full: claims leave the key out until its oldest claim ages out.
    FOR i IN 1 .. cardinality(held) LOOP
        fulls[i] := CASE WHEN rooms[i] - tooks[i] <= 0 THEN firsts[i] + periods[i] END;
    END LOOP;
    -- One statement for every key, of IMMUTABLE functions of the row and
    -- the arrays above: Citus takes no STABLE expression in it, and crashed
    -- (signal 11, 13.2.2) on an array element picked by a column in SET and
    -- on a multi-column SET from a subquery (rate.sql, _rate_record).
    UPDATE lease.fairness_key f
       SET starts = (lease._window(f.starts, f.counts, h.since, at, h.period, h.took::integer)).kept_starts,
           counts = (lease._window(f.starts, f.counts, h.since, at, h.period, h.took::integer)).kept_counts,
           full_until = h.full_at
      FROM unnest(held, sinces, periods, tooks, fulls) AS h(key, since, period, took, full_at)
     WHERE f.queue = q AND f.key = h.key;
END
$$;

COMMENT ON FUNCTION lease._key_rate_take(text, bigint[], text[]) IS
$$Internal (lease.claim_pending): of the rows IDS picked from QUEUE, whose fairness keys are KEYS (in claim
order), keeps (KEPT, in order) those that their keys' rate limits let through now, locking each limited key
(skipping keys other transactions hold, whose rows it drops) and recording the rows kept in its window;
AT is the database clock read after the locks, the time the rows are claimed at.$$;

CREATE FUNCTION lease.set_key_rate(queue text, fairness_key text, rate_limit integer,
                                   rate_period interval DEFAULT '1 second') RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
BEGIN
    PERFORM lease._checked_fairness_key(lease._checked_not_null(fairness_key, 'fairness_key')),
            lease._checked_not_null(rate_period, 'rate_period');
    IF rate_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'rate_limit must be between 1 and 100000 (got %)', rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF rate_period <= interval '0' OR rate_period > interval '1 day' THEN
        RAISE EXCEPTION 'rate_period must be in (0, 1 day] (got %)', rate_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The record stays: claims made under the old limit count on under
    -- the new one.
    INSERT INTO lease.fairness_key AS f (queue, key, rate_limit, rate_period)
    VALUES (q, set_key_rate.fairness_key, set_key_rate.rate_limit, set_key_rate.rate_period)
        ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
       SET rate_limit = excluded.rate_limit,
           rate_period = excluded.rate_period,
           full_until = NULL;
    IF set_key_rate.rate_limit IS NOT NULL THEN
        UPDATE lease.queue qu SET key_limited = true WHERE qu.name = q AND NOT qu.key_limited;
    END IF;
END
$$;

COMMENT ON FUNCTION lease.set_key_rate(text, text, integer, interval) IS
$$Limits the rows of FAIRNESS_KEY (see lease.enqueue) of QUEUE to at most RATE_LIMIT (1..100000) claimed in any
span of RATE_PERIOD (default 1 second, at most 1 day), by the database clock: a sliding window, from the
claims that start after this call commits on (with those an earlier limit of the key recorded). Rows held
back stay pending and are claimable again as
soon as the window has room (lease.rate_wait); a claim that meets a full key takes other keys' rows
instead. RATE_LIMIT NULL lifts the key's limit. Applies with the queue's own rate limit, if any: a row
needs room in both.
Errors: 22004 queue, fairness_key or rate_period NULL; 22023 rate_limit or rate_period out of range, or
fairness_key over 256 characters; 42704 no such queue.$$;
