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
    held text[];
    lims integer[];
    periods interval[];
    rooms bigint[];
    took bigint;
    kept_starts timestamptz[];
    kept_counts integer[];
    last integer;
    full_at timestamptz;
BEGIN
    SELECT array_agg(f.key) INTO limited
      FROM lease.fairness_key f
     WHERE f.queue = q AND f.key = ANY (named) AND f.rate_limit IS NOT NULL;
    IF limited IS NULL THEN
        kept := ids;
        at := clock_timestamp();
        RETURN;
    END IF;
    -- In key order, so that claims naming the same keys cannot deadlock.
    SELECT array_agg(l.key ORDER BY l.key), array_agg(l.rate_limit ORDER BY l.key),
           array_agg(l.rate_period ORDER BY l.key)
      INTO held, lims, periods
      FROM (SELECT f.key, f.rate_limit, f.rate_period
              FROM lease.fairness_key f
             WHERE f.queue = q AND f.key = ANY (limited) AND f.rate_limit IS NOT NULL
             ORDER BY f.key
               FOR NO KEY UPDATE SKIP LOCKED) AS l;
    -- Read once the keys are this claim's (rate.sql, _rate_take).
    at := clock_timestamp();
    held := coalesce(held, '{}');
    rooms := ARRAY(SELECT greatest(h.lim - lease._rate_used(f.starts, f.counts, at - h.per), 0)
                     FROM unnest(held, lims, periods) WITH ORDINALITY AS h(key, lim, per, o)
                     JOIN lease.fairness_key f ON f.queue = q AND f.key = h.key
                    ORDER BY h.o);
    -- A limited key's rows up to its room, in claim order; a limited key
    -- another claim holds gets none.
    SELECT coalesce(array_agg(u.id ORDER BY u.o), '{}') INTO kept
      FROM (SELECT x.id, x.o, coalesce(x.k, '') AS k,
                   row_number() OVER (PARTITION BY coalesce(x.k, '') ORDER BY x.o) AS nth
              FROM unnest(ids, keys) WITH ORDINALITY AS x(id, k, o)) AS u
     WHERE u.k <> ALL (limited)
        OR u.nth <= (SELECT r.room FROM unnest(held, rooms) AS r(key, room) WHERE r.key = u.k);
    FOR i IN 1 .. cardinality(held) LOOP
        took := (SELECT count(*) FROM unnest(ids, keys) AS x(id, k)
                  WHERE coalesce(x.k, '') = held[i] AND x.id = ANY (kept));
        SELECT coalesce(array_agg(u.s ORDER BY u.o), '{}'), coalesce(array_agg(u.n ORDER BY u.o), '{}')
          INTO kept_starts, kept_counts
          FROM lease.fairness_key f
         CROSS JOIN LATERAL unnest(f.starts, f.counts) WITH ORDINALITY AS u(s, n, o)
         WHERE f.queue = q AND f.key = held[i] AND u.s > at - periods[i];
        IF took > 0 THEN
            -- Merged within a hundredth of a period, as a share's record.
            last := cardinality(kept_starts);
            IF last > 0 AND kept_starts[last] > at - periods[i] / 100 THEN
                kept_starts[last] := at;
                kept_counts[last] := kept_counts[last] + took;
            ELSE
                kept_starts := kept_starts || at;
                kept_counts := kept_counts || took::integer;
            END IF;
        END IF;
        -- Full: claims leave the key out until its oldest claim ages out.
        full_at := CASE WHEN rooms[i] - took <= 0 THEN kept_starts[1] + periods[i] END;
        -- From variables, as the UPDATEs of rate.sql: on a distributed
        -- install Citus takes no STABLE expression in it.
        UPDATE lease.fairness_key f
           SET starts = kept_starts,
               counts = kept_counts,
               full_until = full_at
         WHERE f.queue = q AND f.key = held[i];
    END LOOP;
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
span of RATE_PERIOD (default 1 second, at most 1 day), by the database clock: a sliding window, counted
from the claims that start after this call commits. Rows held back stay pending and are claimable again as
soon as the window has room (lease.rate_wait); a claim that meets a full key takes other keys' rows
instead. RATE_LIMIT NULL lifts the key's limit. Applies with the queue's own rate limit, if any: a row
needs room in both.
Errors: 22004 queue, fairness_key or rate_period NULL; 22023 rate_limit or rate_period out of range, or
fairness_key over 256 characters; 42704 no such queue.$$;
