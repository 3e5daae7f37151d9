-- Weighted fairness: rows carry a fairness key (a tenant, a customer), and
-- claims share themselves among the keys with ready rows in proportion to
-- their weights, whatever each key's backlog.
--
-- Decided when a row is enqueued, not when it is claimed: the claim takes
-- rows in claim order (priority DESC, rank, next_at, id), so the enqueue
-- gives each row of a key a rank one step after that key's previous row,
-- a step of 1,000,000 / weight (start-time fair queuing). The rows of keys
-- A and B then alternate in claim order however many A has, and a key of
-- weight 3 gets three rows for every one of a key of weight 1. A key that
-- had no rows (or fell behind) starts at the queue's head rank, where
-- claims are now, not at its old place: an idle key earns no credit to
-- spend in a burst. Claims look at no key and pay nothing; an enqueue pays
-- one upsert per key it names.
--
-- Priorities come first: fairness shares out the rows of one priority.
-- A queue becomes fair with the first row enqueued with a fairness key;
-- from then on rows without one are of the key '' (before, they kept rank
-- 0, ahead of every keyed row).

CREATE TABLE lease.fairness_key (
    queue     text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key       text NOT NULL,
    weight    integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    -- The rank the key's next row gets unless the head is past it.
    next_rank bigint NOT NULL DEFAULT 0,
    -- At most rate_limit of the key's rows claimed in any span of
    -- rate_period; NULL: no limit (key_rate.sql).
    rate_limit  integer CHECK (rate_limit BETWEEN 1 AND 100000),
    rate_period interval NOT NULL DEFAULT '1 second' CHECK (rate_period > interval '0'),
    -- The claims of the last rate_period, oldest first, as a rate share's.
    starts timestamptz[] NOT NULL DEFAULT '{}',
    counts integer[] NOT NULL DEFAULT '{}',
    -- Until when the window is full: claims leave the key's rows out.
    full_until timestamptz,
    PRIMARY KEY (queue, key)
)
-- A limited key's row is rewritten by its claims: room for HOT.
WITH (fillfactor = 70);

-- A queue claimed empty starts its keys past the last of their rows.
CREATE INDEX fairness_key_next ON lease.fairness_key (queue, next_rank);
-- The limited keys a claim leaves out (key_rate.sql).
CREATE INDEX fairness_key_full ON lease.fairness_key (queue, full_until) WHERE rate_limit IS NOT NULL;

COMMENT ON TABLE lease.fairness_key IS
    'Per (queue, fairness_key): its weight (lease.set_weight), the rank its next row gets, and its rate limit and the claims that count towards it (lease.set_key_rate). Kept by lease.enqueue, lease.enqueue_batch and lease.claim_pending.';

CREATE FUNCTION lease._checked_fairness_key(key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF length(key) > 256 THEN
        RAISE EXCEPTION 'fairness_key must be at most 256 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN key;
END
$$;

COMMENT ON FUNCTION lease._checked_fairness_key(text) IS
    'Internal: returns KEY (NULL too), or raises 22023 if it is over 256 characters.';

CREATE FUNCTION lease._fair_ranks(q lease.queue, keys text[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Where claims are, and a key with nothing left before it starts:
    -- the head (head.sql), or, in a queue claimed empty (its head at the
    -- end of the order), past every key's last row.
    now_rank constant bigint := greatest(
        CASE WHEN q.head_id < 9223372036854775807 THEN q.head_rank
             ELSE (SELECT max(f.next_rank) FROM lease.fairness_key f WHERE f.queue = q.name) END, 0);
    ranks bigint[];
    first bigint;
BEGIN
    IF NOT q.fair THEN
        UPDATE lease.queue qu SET fair = true WHERE qu.name = q.name AND NOT qu.fair;
    END IF;
    IF cardinality(keys) = 1 THEN
        -- One row (lease.enqueue): a plain upsert, which a distributed
        -- install sends to the queue's node as it is (the statement below
        -- went through the coordinator there, 25 ms a row).
        INSERT INTO lease.fairness_key AS f (queue, key, next_rank)
        VALUES (q.name, coalesce(keys[1], ''), now_rank + 1000000)
            ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
           SET next_rank = greatest(f.next_rank, now_rank) + 1000000 / f.weight
        RETURNING f.next_rank - 1000000 / f.weight INTO first;
        RETURN ARRAY[first];
    END IF;
    -- One upsert for every key (in key order, so that two enqueues naming
    -- the same keys cannot deadlock): each key's row is this transaction's
    -- until it ends, so the enqueues of one key take turns and its ranks
    -- never repeat. A new key's next_rank says how many rows it has (a
    -- step of 1,000,000 each), which the update reads back from excluded.
    -- The i-th row of a key in KEYS gets that key's i-th step.
    WITH n AS (SELECT coalesce(u.k, '') AS k, count(*) AS c FROM unnest(keys) AS u(k) GROUP BY 1),
    placed AS (
        INSERT INTO lease.fairness_key AS f (queue, key, next_rank)
        SELECT q.name, n.k, now_rank + n.c * 1000000 FROM n ORDER BY n.k
            ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
           SET next_rank = greatest(f.next_rank, now_rank)
                           + (excluded.next_rank - now_rank) / 1000000 * (1000000 / f.weight)
        RETURNING f.key, f.next_rank, 1000000 / f.weight AS step
    )
    SELECT array_agg(p.next_rank - (n.c - r.nth + 1) * p.step ORDER BY r.o) INTO ranks
      FROM (SELECT coalesce(u.k, '') AS k, u.o, row_number() OVER (PARTITION BY coalesce(u.k, '') ORDER BY u.o) AS nth
              FROM unnest(keys) WITH ORDINALITY AS u(k, o)) r
      JOIN n ON n.k = r.k
      JOIN placed p ON p.key = r.k;
    RETURN ranks;
END
$$;

COMMENT ON FUNCTION lease._fair_ranks(lease.queue, text[]) IS
$$Internal (lease.enqueue, lease.enqueue_batch): the ranks of new rows of queue Q whose fairness keys are KEYS
(NULL: the key ''), in order; moves each key's next rank on and makes the queue fair.$$;

CREATE FUNCTION lease._forget_idle_keys(max_rows integer, only_queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    now_rank bigint;
    idle text[];
    n integer;
    gone integer := 0;
BEGIN
    -- A key behind where its next row would start anyway (the head, or
    -- the last key's place in a queue claimed empty), of weight 1 and no
    -- rate limit, is what a key without a row is (lease._fair_ranks): its
    -- row can go. Keys in an enqueue's hands are left for the next sweep.
    FOR q IN SELECT qu.name, CASE WHEN qu.head_id < 9223372036854775807 THEN qu.head_rank END AS head_rank
               FROM lease.queue qu
              WHERE qu.fair AND (only_queue IS NULL OR qu.name = only_queue)
              ORDER BY qu.name LOOP
        EXIT WHEN gone >= max_rows;
        now_rank := coalesce(q.head_rank, (SELECT max(m.next_rank) FROM lease.fairness_key m WHERE m.queue = q.name));
        -- Two statements, each on the queue's shard alone (citus.sql).
        idle := ARRAY(SELECT k.key FROM lease.fairness_key k
                       WHERE k.queue = q.name AND k.next_rank < now_rank
                         AND k.weight = 1 AND k.rate_limit IS NULL
                       LIMIT max_rows - gone
                         FOR UPDATE SKIP LOCKED);
        DELETE FROM lease.fairness_key f WHERE f.queue = q.name AND f.key = ANY (idle);
        GET DIAGNOSTICS n = ROW_COUNT;
        gone := gone + n;
    END LOOP;
    RETURN gone;
END
$$;

COMMENT ON FUNCTION lease._forget_idle_keys(integer, text) IS
$$Internal (lease.sweep): removes up to MAX_ROWS rows of lease.fairness_key (of ONLY_QUEUE, or of every queue) whose
keys have fallen idle and carry no weight or rate limit, so keys seen once do not pile up; returns how many.$$;

CREATE FUNCTION lease.set_weight(queue text, fairness_key text, weight integer) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
BEGIN
    PERFORM lease._checked_fairness_key(lease._checked_not_null(fairness_key, 'fairness_key')),
            lease._checked_not_null(weight, 'weight');
    IF weight NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'weight must be between 1 and 1000 (got %)', weight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO lease.fairness_key AS f (queue, key, weight)
    VALUES (q, set_weight.fairness_key, set_weight.weight)
        ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
       SET weight = excluded.weight;
END
$$;

COMMENT ON FUNCTION lease.set_weight(text, text, integer) IS
$$Gives FAIRNESS_KEY of QUEUE the weight WEIGHT (1..1000; a key never weighed weighs 1): while several keys
have ready rows, claims take rows of each in proportion to their weights (see lease.enqueue's
fairness_key). Rows enqueued from now on follow it; rows already enqueued keep their place.
Errors: 22004 an argument NULL; 22023 weight out of range or fairness_key over 256 characters; 42704 no
such queue.$$;
