-- Per-key concurrency: at most lease.queue.concurrency rows of one
-- concurrency_key are admitted at a time; the others wait, held.
--
-- A row enqueued (or requeued) with a concurrency_key starts held: pending
-- but outside job_ready, so no claim can see it. It is admitted (held =
-- false: in job_ready, claimable like any row) while its key has fewer than
-- `concurrency` admitted rows. An admitted row keeps its slot through
-- claims, retries, abandons and expiries — a row waiting out a backoff still
-- holds it, so with concurrency 1 the rows of a key run one at a time, in
-- order — and gives it up when it ends (done, dead, cancelled); the key's
-- next held row is admitted in the same transaction.
--
-- Claims never look at keys: they only ever see admitted rows, so no claim
-- can exceed a limit, and however many rows a busy key holds back, a claim
-- walks none of them. The bookkeeping is one row per (queue, key) in
-- lease.key_slot, locked by each transaction that admits into or frees a
-- slot of that key: transactions of one key take turns there (for the
-- moment of an UPDATE and until they commit), those of different keys never
-- meet. Functions that touch several keys lock them in (queue, key) order,
-- so two of them cannot deadlock on each other.

CREATE TABLE lease.key_slot (
    queue   text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key     text NOT NULL,
    -- Admitted rows of the key: pending and not held, or leased.
    active  integer NOT NULL DEFAULT 0 CHECK (active >= 0),
    -- Held rows of the key, waiting for a slot.
    waiting integer NOT NULL DEFAULT 0 CHECK (waiting >= 0),
    PRIMARY KEY (queue, key)
)
-- Rewritten on every admission and completion of its key: room for HOT.
WITH (fillfactor = 70);

COMMENT ON TABLE lease.key_slot IS
    'Per (queue, concurrency_key): admitted and held rows (see lease.enqueue''s concurrency_key). Kept by the lease.* functions; empty rows are removed by lease.sweep.';

CREATE FUNCTION lease._checked_concurrency_key(queue text, key text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key = '' OR length(key) > 256 THEN
        RAISE EXCEPTION 'concurrency_key must be 1 to 256 characters long'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT qu.concurrency FROM lease.queue qu WHERE qu.name = _checked_concurrency_key.queue) IS NULL THEN
        RAISE EXCEPTION 'queue "%" has no concurrency limit', queue
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Set one with lease.create_queue(name, ..., concurrency => k).';
    END IF;
    RETURN key;
END
$$;

COMMENT ON FUNCTION lease._checked_concurrency_key(text, text) IS
    'Internal: returns KEY, or raises 22023 if it is empty or over 256 characters or QUEUE has no concurrency limit.';

-- Admits held rows of KEYS into their free slots, in one statement for all
-- keys, and wakes idle workers if it admitted any. The caller holds the
-- keys' slot rows locked, which is what makes the counts exact.
CREATE FUNCTION lease._admit(queue text, keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lim constant integer := (SELECT qu.concurrency FROM lease.queue qu WHERE qu.name = _admit.queue);
    admitted integer;
    ids bigint[];
BEGIN
    -- Rows a concurrent cancel holds are skipped: if that cancel rolls
    -- back, lease.sweep admits the row later (lease._top_up_slots).
    WITH open AS (
        SELECT t.key, coalesce(lim - t.active, t.waiting) AS free
          FROM lease.key_slot t
         WHERE t.queue = _admit.queue AND t.key = ANY (keys)
           AND t.waiting > 0 AND t.active < coalesce(lim, t.active + 1)
    ), next AS MATERIALIZED (
        SELECT n.id
          FROM open o
         CROSS JOIN LATERAL (
            SELECT j.id
              FROM lease.job j
             WHERE j.queue = _admit.queue AND j.concurrency_key = o.key
               AND j.state = 'pending' AND j.held
             ORDER BY j.priority DESC, j.id
             LIMIT o.free
               FOR UPDATE SKIP LOCKED) n
    ), promoted AS (
        UPDATE lease.job j SET held = false
         WHERE j.id = ANY (ARRAY(SELECT n.id FROM next n))
        RETURNING j.id, j.concurrency_key
    ), counted AS (
        SELECT p.concurrency_key AS key, count(*)::integer AS n FROM promoted p GROUP BY p.concurrency_key
    ), slots AS (
        UPDATE lease.key_slot t
           SET active = t.active + c.n, waiting = t.waiting - c.n
          FROM counted c
         WHERE t.queue = _admit.queue AND t.key = c.key
    )
    SELECT coalesce(sum(c.n), 0), (SELECT array_agg(p.id) FROM promoted p) INTO admitted, ids FROM counted c;
    IF admitted > 0 THEN
        -- An admitted row keeps the place it was enqueued at, which may be
        -- before the queue's head.
        PERFORM lease._lower_heads(ids, queue), lease._wake(queue, admitted);
    END IF;
    RETURN admitted;
END
$$;

COMMENT ON FUNCTION lease._admit(text, text[]) IS
    'Internal: admits held rows of the concurrency KEYS of QUEUE (per key: highest priority, then oldest first) into their free slots and wakes idle workers; returns how many. The caller holds the keys'' lease.key_slot rows locked.';

CREATE FUNCTION lease._hold(queue text, keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Rows are inserted, and so locked, in key order.
    INSERT INTO lease.key_slot AS t (queue, key, waiting)
    SELECT _hold.queue, u.key, count(*)
      FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL
     GROUP BY u.key ORDER BY u.key
        ON CONFLICT ON CONSTRAINT key_slot_pkey DO UPDATE SET waiting = t.waiting + excluded.waiting;
    PERFORM lease._admit(queue, keys);
END
$$;

COMMENT ON FUNCTION lease._hold(text, text[]) IS
    'Internal: this transaction just made rows of QUEUE with these concurrency KEYS (one element per row) pending and held; counts them and admits what the keys'' free slots allow.';

CREATE FUNCTION lease._free_slots(queue text, keys text[], were_held boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Lock first, in key order: two calls over the same keys cannot deadlock.
    PERFORM FROM lease.key_slot t
      WHERE t.queue = _free_slots.queue AND t.key = ANY (keys)
      ORDER BY t.key
        FOR UPDATE;
    WITH ended AS (
        SELECT u.key, count(*)::integer AS n FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL GROUP BY u.key
    )
    UPDATE lease.key_slot t
       SET active  = t.active  - CASE WHEN were_held THEN 0 ELSE e.n END,
           waiting = t.waiting - CASE WHEN were_held THEN e.n ELSE 0 END
      FROM ended e
     WHERE t.queue = _free_slots.queue AND t.key = e.key;
    PERFORM lease._admit(queue, keys);
END
$$;

COMMENT ON FUNCTION lease._free_slots(text, text[], boolean) IS
    'Internal: rows of QUEUE with these concurrency KEYS (one element per row) just ended (done, dead, cancelled; held ones if WERE_HELD); gives their slots to the keys'' next held rows.';

CREATE FUNCTION lease._top_up_slots(only_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    locked text[];
    admitted bigint := 0;
BEGIN
    -- Keys with held rows and free slots: after a raised limit, or a row
    -- _admit skipped because a cancel that then rolled back held it.
    FOR q IN SELECT qu.name, qu.concurrency FROM lease.queue qu
              WHERE (only_queue IS NULL OR qu.name = only_queue)
                AND EXISTS (SELECT FROM lease.key_slot k WHERE k.queue = qu.name AND k.waiting > 0)
              ORDER BY qu.name
    LOOP
        WITH open AS (
            SELECT k.key FROM lease.key_slot k
             WHERE k.queue = q.name AND k.waiting > 0 AND k.active < coalesce(q.concurrency, k.active + 1)
             ORDER BY k.key
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(o.key) INTO locked FROM open o;
        admitted := admitted + lease._admit(q.name, locked);
    END LOOP;
    -- Keys with nothing admitted or held; a producer that is about to use
    -- one holds it locked, or re-creates it.
    -- The queue in the outer WHERE too: on a distributed install (citus.sql)
    -- only then does the DELETE go to that queue's shard alone.
    DELETE FROM lease.key_slot k
     WHERE (only_queue IS NULL OR k.queue = only_queue)
       AND (k.queue, k.key) IN (SELECT e.queue, e.key FROM lease.key_slot e
                                 WHERE e.active = 0 AND e.waiting = 0
                                   AND (only_queue IS NULL OR e.queue = only_queue)
                                 LIMIT 10000
                                   FOR UPDATE SKIP LOCKED);
    RETURN admitted;
END
$$;

COMMENT ON FUNCTION lease._top_up_slots(text) IS
    'Internal, run by lease.sweep and lease.create_queue: admits held rows into free slots (of ONLY_QUEUE, or all queues) and removes empty lease.key_slot rows; returns how many rows it admitted. Skips keys others hold locked.';

CREATE FUNCTION lease._free_slots_of(queues text[], keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
BEGIN
    FOR q IN SELECT u.queue, array_agg(u.key) AS keys
               FROM unnest(queues, keys) AS u(queue, key) WHERE u.key IS NOT NULL
              GROUP BY u.queue ORDER BY u.queue
    LOOP
        PERFORM lease._free_slots(q.queue, q.keys);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._free_slots_of(text[], text[]) IS
    'Internal: lease._free_slots for rows of several queues (QUEUES[i] goes with KEYS[i]), queue by queue in name order.';
