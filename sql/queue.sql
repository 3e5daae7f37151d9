-- Queues and the way work enters and leaves them without a lease:
-- create_queue, drop_queue, enqueue, enqueue_batch, cancel.

CREATE FUNCTION lease.create_queue(
    name           text,
    max_attempts   integer  DEFAULT 25,
    backoff_base   interval DEFAULT '1 second',
    backoff_max    interval DEFAULT '1 hour',
    retention      interval DEFAULT '0',
    dead_retention interval DEFAULT '7 days',
    jitter         text     DEFAULT 'full',
    concurrency    integer  DEFAULT NULL,
    max_payload_bytes integer DEFAULT 1048576,
    rate_limit     integer  DEFAULT NULL,
    rate_period    interval DEFAULT '1 second'
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._checked_not_null(name, 'name');
    IF name = '' OR length(name) > 128 THEN
        RAISE EXCEPTION 'queue name must be 1 to 128 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000000 (got %)', max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- By value (see lease._valid_span): what these add to a timestamp must
    -- stay far from overflow, whatever units they were written in.
    PERFORM lease._checked_span(backoff_base, interval '365 days', 'backoff_base'),
            lease._checked_span(backoff_max, interval '365 days', 'backoff_max'),
            lease._checked_span(retention, interval '36500 days', 'retention'),
            lease._checked_span(dead_retention, interval '36500 days', 'dead_retention');
    IF jitter IS NULL OR jitter NOT IN ('full', 'none') THEN
        RAISE EXCEPTION 'jitter must be full or none (got %)', coalesce(jitter, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_payload_bytes IS NULL OR max_payload_bytes NOT BETWEEN 1 AND 268435455 THEN
        RAISE EXCEPTION 'max_payload_bytes must be between 1 and 268435455 (got %)', max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concurrency NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'concurrency must be between 1 and 100000 (got %)', concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF rate_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'rate_limit must be between 1 and 100000 (got %)', rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM lease._checked_span(rate_period, interval '1 day', 'rate_period');
    IF date_part('epoch', rate_period) <= 0 THEN
        RAISE EXCEPTION 'rate_period must be longer than 0 (got %)', rate_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF date_part('epoch', backoff_max) < date_part('epoch', backoff_base) THEN
        RAISE EXCEPTION 'need backoff_base <= backoff_max (got % and %)', backoff_base, backoff_max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Create or reconfigure: every replica can call this at start-up.
    INSERT INTO lease.queue AS q (name, max_attempts, backoff_base, backoff_max, retention, dead_retention, jitter,
                                  concurrency, max_payload_bytes, rate_limit, rate_period)
    VALUES (create_queue.name, create_queue.max_attempts, create_queue.backoff_base,
            create_queue.backoff_max, create_queue.retention, create_queue.dead_retention, create_queue.jitter,
            create_queue.concurrency, create_queue.max_payload_bytes, create_queue.rate_limit,
            create_queue.rate_period)
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
        SET max_attempts   = EXCLUDED.max_attempts,
            backoff_base   = EXCLUDED.backoff_base,
            backoff_max    = EXCLUDED.backoff_max,
            retention      = EXCLUDED.retention,
            dead_retention = EXCLUDED.dead_retention,
            jitter         = EXCLUDED.jitter,
            concurrency    = EXCLUDED.concurrency,
            max_payload_bytes = EXCLUDED.max_payload_bytes,
            rate_limit     = EXCLUDED.rate_limit,
            rate_period    = EXCLUDED.rate_period;
    IF rate_limit IS NOT NULL THEN
        -- Dealt out over the sixteen shares (rate.sql). The claims already
        -- counted keep counting under a new limit: a share over its new
        -- part lets nothing through until it is below.
        INSERT INTO lease.rate_share AS r (queue, share, permits)
        SELECT create_queue.name, s, create_queue.rate_limit / 16 + (s < create_queue.rate_limit % 16)::integer
          FROM generate_series(0, 15) AS s
            ON CONFLICT ON CONSTRAINT rate_share_pkey DO UPDATE
           SET permits = excluded.permits
         WHERE r.permits <> excluded.permits;
    END IF;
    -- A raised (or removed) limit admits held rows now.
    PERFORM lease._top_up_slots(name);
END
$$;

COMMENT ON FUNCTION lease.create_queue(text, integer, interval, interval, interval, interval, text, integer, integer, integer, interval) IS
$$Creates queue NAME, or updates the policy of an existing one.
max_attempts: claims a row may spend before retry/expiry dead-letters it (1..1000000).
backoff_base, backoff_max: delay after attempt n is min(backoff_max, backoff_base * 2^(n-1)); each at most 365 days.
jitter: 'full' (default) makes each retry delay uniform in [0, that delay), so rows that failed together do
not come back together; 'none' keeps it exact.
retention: how long done rows are kept (0 = deleted at release). dead_retention: same for dead and cancelled rows.
Both at most 36500 days. Intervals are judged by the time they add and may not have a month part.
concurrency: at most this many rows of one concurrency_key (see lease.enqueue) are admitted at once,
1..100000; NULL (default): no limit, and enqueues may not name a concurrency_key. Raising or removing it
admits held rows at once; lowering it admits no more until the key is below the new limit.
max_payload_bytes: the largest payload an enqueue (or a fenced_update's result) may have, in bytes of its text
form (octet_length(payload::text), whether or not it would be stored compressed), 1..268435455; default 1 MiB.
rate_limit, rate_period: claims take at most rate_limit rows (1..100000) in any span of rate_period (more than
0, at most 1 day; default 1 second), whatever the number of workers: each row claimed counts from its claim
until rate_period later (a sliding window; see lease.rate_wait). NULL (default): no limit. Rows held back stay
pending and are claimable as soon as the limit allows. The limit is dealt out in sixteen shares, each held
by one claim from its count to the end of its transaction: up to sixteen claims count side by side, and a
claim that finds every share held waits at most 100 ms and then takes nothing, so claim such a queue in
short transactions. The rate limit applies after lease.pause and before
concurrency (held rows are never claimed) and priorities; lease.reclaim_own, which takes back leases already
started, is not counted.
Errors: 22004 name or an option NULL; 22023 empty or over-long name, option out of range.$$;

CREATE FUNCTION lease.pause(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE lease.queue q SET paused = true WHERE q.name = lease._checked_queue(pause.queue) AND NOT q.paused;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.pause(text) IS
$$Pauses QUEUE: claims (claim_pending, release_and_claim) take none of its rows until lease.resume; leases
held run on (renew, release, fence as before) and enqueues go on. Returns false if it was paused already.
Errors: 22004 queue NULL; 42704 no such queue.$$;

CREATE FUNCTION lease.resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE lease.queue q SET paused = false WHERE q.name = lease._checked_queue(resume.queue) AND q.paused;
    IF FOUND THEN
        -- Idle workers may have stopped at an empty claim: wake them.
        PERFORM pg_notify(lease._ready_channel(resume.queue), '');
    END IF;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.resume(text) IS
$$Ends lease.pause of QUEUE: claims take its rows again, and idle workers listening on its channel are woken.
Returns false if it was not paused. Errors: 22004 queue NULL; 42704 no such queue.$$;

CREATE FUNCTION lease.purge_dead(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Checked first: on a distributed install Citus would send the check
    -- inside the read below to the queue's node, where its own read of
    -- lease.queue is a refused nested query.
    qn constant text := lease._checked_queue(purge_dead.queue);
    q lease.queue;
    removed bigint;
BEGIN
    SELECT * INTO q FROM lease.queue qu WHERE qu.name = qn;
    IF q.attached THEN
        -- Its dead rows go when their table rows stop matching; deleting
        -- them now would make those rows claimable again.
        RAISE EXCEPTION 'queue "%" is fed by an attached table', q.name
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Move the table rows out of the pending predicate instead.';
    END IF;
    DELETE FROM lease.job j WHERE j.queue = q.name AND j.state = 'dead';
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed > 0 THEN
        PERFORM lease._count(q.name, dead => -removed);
    END IF;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.purge_dead(text) IS
$$Deletes every dead letter of QUEUE now, whatever its dead_retention, and returns how many. Errors: 22004
queue NULL; 42704 no such queue; 42809 the queue is fed by an attached table.$$;

-- What dropping a queue deletes, for drop_queue and for detach (its grants,
-- key_slot, rate_share and schedule rows go by their foreign keys).
CREATE FUNCTION lease._delete_queue(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    removed bigint;
BEGIN
    DELETE FROM lease.job j WHERE j.queue = _delete_queue.queue;
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM lease.counter c WHERE c.queue = _delete_queue.queue;
    DELETE FROM lease.queue q WHERE q.name = _delete_queue.queue;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease._delete_queue(text) IS
    'Internal: deletes queue QUEUE with its rows and counters; returns how many rows.';

CREATE FUNCTION lease.drop_queue(name text, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._checked_queue(name);
    -- Lock the queue row first: enqueue's foreign key check waits on it, so no
    -- row can slip in between the check below and the delete.
    IF (SELECT q.attached FROM lease.queue q WHERE q.name = drop_queue.name FOR UPDATE) THEN
        RAISE EXCEPTION 'queue "%" belongs to an attached table', name
            USING ERRCODE = 'object_in_use', HINT = 'Use lease.detach(table).';
    END IF;
    IF NOT coalesce(force, false) AND EXISTS (
        SELECT FROM lease.job j
         WHERE j.queue = drop_queue.name AND j.state IN ('pending', 'leased'))
    THEN
        RAISE EXCEPTION 'queue "%" still has pending or leased rows', name
            USING ERRCODE = 'object_in_use',
                  HINT = 'Pass force => true to delete them with the queue.';
    END IF;
    RETURN lease._delete_queue(name);
END
$$;

COMMENT ON FUNCTION lease.drop_queue(text, boolean) IS
$$Drops queue NAME and all its rows; returns how many rows were deleted.
Refuses while rows are pending or leased unless force => true, and for the queue of an attached table
(use lease.detach).
Errors: 22004 name NULL; 42704 no such queue; 55006 unfinished rows and force is false.$$;

-- The payload cap: without one, a single enqueue could write hundreds of
-- megabytes that every claim of the row then sends back.
CREATE FUNCTION lease._check_payload_size(q lease.queue, payload_bytes bigint) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF payload_bytes > q.max_payload_bytes THEN
        RAISE EXCEPTION 'a payload of % bytes is over the limit of queue "%" (% bytes)',
                        payload_bytes, q.name, q.max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Keep large data elsewhere and pass a reference, or raise the limit with lease.create_queue(..., max_payload_bytes => ...).';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_payload_size(lease.queue, bigint) IS
    'Internal: raises 22023 if PAYLOAD_BYTES is over the max_payload_bytes of queue Q.';

CREATE FUNCTION lease._checked_producer_queue(queue text, payload_bytes bigint) RETURNS lease.queue
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    q lease.queue;
BEGIN
    SELECT * INTO q FROM lease.queue qu WHERE qu.name = _checked_producer_queue.queue;
    IF NOT FOUND THEN
        PERFORM lease._checked_queue(queue);
    END IF;
    -- First, so that a role that may not produce into it learns nothing of
    -- it.
    IF q.restricted THEN
        PERFORM lease._check_access(queue, '{produce}');
    END IF;
    IF q.attached THEN
        -- Its rows are the table's rows that match the predicate; a row
        -- enqueued by key would hand out one that does not.
        RAISE EXCEPTION 'queue "%" is fed by an attached table', queue
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Insert or update rows of the table so that they match its pending predicate.';
    END IF;
    PERFORM lease._check_payload_size(q, payload_bytes);
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease._checked_producer_queue(text, bigint) IS
    'Internal: returns queue''s row, or raises 22004/42704 as lease._checked_queue, 42809 if an attached table feeds it, 42501 if the caller may not produce into it, 22023 if PAYLOAD_BYTES is over its max_payload_bytes.';

CREATE FUNCTION lease.enqueue(
    queue    text,
    payload  jsonb,
    key      text        DEFAULT NULL,
    run_at   timestamptz DEFAULT NULL,
    priority integer     DEFAULT 0,
    unique_key text      DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    fairness_key text    DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p  constant jsonb := lease._checked_not_null(payload, 'payload');
    qr constant lease.queue := lease._checked_producer_queue(queue, octet_length(p::text));
    q  constant text := qr.name;
    r  constant timestamptz := lease._checked_time(run_at, 'run_at');
    t  constant timestamptz := clock_timestamp();
    ck constant text := CASE WHEN concurrency_key IS NOT NULL
                             THEN lease._checked_concurrency_key(q, concurrency_key) END;
    -- Its place among the rows of its priority (fairness.sql).
    rk bigint := 0;
    new_id bigint;
BEGIN
    IF fairness_key IS NOT NULL OR qr.fair THEN
        rk := (lease._fair_ranks(qr, ARRAY[lease._checked_fairness_key(fairness_key)]))[1];
    END IF;
    -- A row in the way is either the same key (any state, while retained)
    -- or the same unique_key while pending or leased; the insert waits for
    -- a concurrent producer's row and then sees it, so one row wins. The
    -- row found may finish before it is read: then try again.
    FOR tries IN 1..3 LOOP
        INSERT INTO lease.job AS j (queue, key, payload, priority, rank, next_at, created_at, unique_key,
                                    concurrency_key, held, fairness_key)
        VALUES (q, enqueue.key, p, coalesce(enqueue.priority, 0), rk, coalesce(r, t), t, enqueue.unique_key,
                ck, ck IS NOT NULL, enqueue.fairness_key)
        ON CONFLICT DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            PERFORM lease._count(q, enqueued => 1, pending => 1);
            IF ck IS NOT NULL THEN
                PERFORM lease._hold(q, ARRAY[ck]);
            ELSE
                PERFORM lease._lower_head(q, coalesce(enqueue.priority, 0), rk, coalesce(r, t), new_id);
                IF coalesce(r, t) <= t THEN
                    PERFORM lease._wake(q, 1);
                END IF;
            END IF;
            RETURN new_id;
        END IF;
        -- Hand back the row in the way, change nothing.
        SELECT j.id INTO new_id
          FROM lease.job j
         WHERE j.queue = q
           AND (j.key = enqueue.key
                OR (j.unique_key = enqueue.unique_key AND j.state IN ('pending', 'leased')))
         ORDER BY j.key IS NOT DISTINCT FROM enqueue.key DESC
         LIMIT 1;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'enqueue into "%" kept conflicting with rows that finished before they could be read', q
        USING ERRCODE = 'serialization_failure', HINT = 'Retry the enqueue.';
END
$$;

COMMENT ON FUNCTION lease.enqueue(text, jsonb, text, timestamptz, integer, text, text, text) IS
$$Adds one row to QUEUE and returns its id. Claimable from run_at (default: now, by the database clock).
Higher priority is claimed first. With a key, enqueue is idempotent on (queue, key): a second call
returns the existing row's id and changes nothing (for as long as that row is retained, whatever its
state). With a unique_key, at most one row per (queue, unique_key) is pending or leased: while one is,
enqueue returns its id and changes nothing; once it has finished (done, dead, cancelled), the same
unique_key enqueues a new row. Concurrent producers of one key or unique_key get one row and one id.
With a concurrency_key (the queue needs a concurrency limit k, see lease.create_queue), at most k rows of
that key are admitted at once; the others are held, never claimed, until an admitted one ends (done,
dead, cancelled) and gives up its slot (highest priority, then oldest, first). A retry or expiry keeps the
slot, so k = 1 runs a key's rows one at a time, in order.
With a fairness_key (a tenant, say), claims share themselves among the keys with ready rows in proportion
to their weights (lease.set_weight; round-robin while all weigh 1), among the rows of one priority,
whatever each key's backlog: a key's rows are placed one step apart, a step of 1,000,000 / weight, from
where claims are now. Once a queue has a row with a fairness_key, its rows without one are of the key ''.
A row claimable at once sends a NOTIFY on the queue's channel (lease.ready_channel), on commit.
Errors: 22004 queue or payload NULL; 22023 run_at infinite, or payload over the queue's max_payload_bytes; 42704 no such queue; 42809 the queue is
fed by an attached table (write the table instead); 42501 the queue is restricted and the caller may
not produce into it; 22023 concurrency_key empty or over 256 characters, or the queue has no concurrency
limit; 22023 fairness_key over 256 characters; 22P02 payload is not valid JSON; 40001 (rare: retry) the
row in the way kept finishing before it could be read.$$;

CREATE FUNCTION lease.enqueue_batch(
    queue    text,
    payloads jsonb[],
    keys     text[]      DEFAULT NULL,
    run_at   timestamptz DEFAULT NULL,
    priority integer     DEFAULT 0,
    concurrency_keys text[] DEFAULT NULL,
    fairness_keys text[] DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- ON CONFLICT (queue, key) names columns, not this function's arguments.
#variable_conflict use_column
DECLARE
    n  constant integer := cardinality(lease._checked_not_null(payloads, 'payloads'));
    qr constant lease.queue := lease._checked_producer_queue(queue, (SELECT max(octet_length(u.p::text))
                                                                       FROM unnest(payloads) AS u(p)));
    q  constant text := qr.name;
    r  constant timestamptz := lease._checked_time(run_at, 'run_at');
    t  constant timestamptz := clock_timestamp();
    ranks bigint[];
    ids bigint[];
    added bigint;
    held_keys text[];
BEGIN
    IF keys IS NOT NULL AND cardinality(keys) <> n THEN
        RAISE EXCEPTION 'keys has % elements, payloads has %', cardinality(keys), n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concurrency_keys IS NOT NULL THEN
        IF cardinality(concurrency_keys) <> n THEN
            RAISE EXCEPTION 'concurrency_keys has % elements, payloads has %', cardinality(concurrency_keys), n
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM lease._checked_concurrency_key(q, c) FROM unnest(concurrency_keys) AS u(c) WHERE c IS NOT NULL;
    END IF;
    IF fairness_keys IS NOT NULL THEN
        IF cardinality(fairness_keys) <> n THEN
            RAISE EXCEPTION 'fairness_keys has % elements, payloads has %', cardinality(fairness_keys), n
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM lease._checked_fairness_key(f) FROM unnest(fairness_keys) AS u(f) WHERE f IS NOT NULL;
    END IF;
    IF n > 100000 THEN
        RAISE EXCEPTION 'at most 100000 rows per batch (got %)', n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(payloads, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'payloads must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Their places among the rows of their priority (fairness.sql).
    IF fairness_keys IS NOT NULL OR qr.fair THEN
        ranks := lease._fair_ranks(qr, coalesce(fairness_keys, array_fill(NULL::text, ARRAY[n])));
    END IF;

    -- Ids are drawn up front so that the result can be returned in input
    -- order, including for rows without a key.
    ids := ARRAY(SELECT nextval('lease.job_id_seq') FROM generate_series(1, n));
    WITH inserted AS (
        INSERT INTO lease.job (id, queue, key, payload, priority, rank, next_at, created_at, concurrency_key, held,
                               fairness_key)
        SELECT ids[u.ord], q, u.k, u.p, coalesce(enqueue_batch.priority, 0), coalesce(ranks[u.ord], 0),
               coalesce(r, t), t, u.c, u.c IS NOT NULL, u.f
          FROM unnest(payloads, keys, concurrency_keys, fairness_keys) WITH ORDINALITY AS u(p, k, c, f, ord)
         ORDER BY u.ord
            ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING concurrency_key
    )
    SELECT count(*), array_agg(i.concurrency_key) FILTER (WHERE i.concurrency_key IS NOT NULL)
      INTO added, held_keys
      FROM inserted i;
    IF added > 0 THEN
        PERFORM lease._count(q, enqueued => added, pending => added);
    END IF;
    IF held_keys IS NOT NULL THEN
        PERFORM lease._hold(q, held_keys);
    END IF;
    IF added > coalesce(cardinality(held_keys), 0) THEN
        -- Every row has the same priority and next_at, and ids in input
        -- order: the least rank and the first id are at or before all of
        -- them.
        PERFORM lease._lower_head(q, coalesce(enqueue_batch.priority, 0),
                                  coalesce((SELECT min(x) FROM unnest(ranks) AS x), 0), coalesce(r, t), ids[1]);
        IF coalesce(r, t) <= t THEN
            PERFORM lease._wake(q, n);
        END IF;
    END IF;

    -- A new statement sees the rows just inserted, so keys that collided (with
    -- an older row or earlier in this batch) resolve to the row that won.
    RETURN QUERY
    SELECT CASE WHEN u.k IS NULL THEN u.id
                ELSE (SELECT j.id FROM lease.job j WHERE j.queue = q AND j.key = u.k) END
      FROM unnest(ids, keys) WITH ORDINALITY AS u(id, k, ord)
     ORDER BY u.ord;
END
$$;

COMMENT ON FUNCTION lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer, text[], text[]) IS
$$Adds many rows to QUEUE in one statement and returns their ids in input order.
keys (optional, same length as payloads, NULL elements allowed) make each row idempotent as in lease.enqueue;
concurrency_keys and fairness_keys (same shape) give rows a concurrency_key and a fairness_key as in
lease.enqueue.
Errors: 22004 queue, payloads or a payload NULL; 22023 keys, concurrency_keys or fairness_keys length
differs, a concurrency or fairness key invalid or the queue without a concurrency limit, more than 100000 rows, run_at
infinite or a payload over the queue's max_payload_bytes; 42704 no such queue; 42809 attached queue; 42501 no produce right on a restricted queue.$$;

CREATE FUNCTION lease.cancel(id bigint, queue text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Taken once: Citus allows no VOLATILE function in an UPDATE.
    t constant timestamptz := clock_timestamp();
    qn text := cancel.queue;
    result text;
    q text;
    ck text;
    was_held boolean;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    -- On a distributed install a call reaches here without its queue only
    -- unforwarded, on the coordinator (lease.queue_of(id) as the queue, or a
    -- NULL Citus could not see coming): find the row's node there.
    IF qn IS NULL AND lease._distributed() THEN
        qn := (SELECT j.queue FROM lease.job j WHERE j.id = cancel.id);
        IF qn IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM lease._check_rows(ARRAY[id], '{produce,work}', qn);
    UPDATE lease.job j
       SET cancel_requested = true,
           state = CASE WHEN j.state = 'pending' THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN j.state = 'pending' THEN t ELSE j.finished_at END
     WHERE j.id = cancel.id AND (qn IS NULL OR j.queue = qn)
       AND j.state IN ('pending', 'leased')
    RETURNING CASE WHEN j.state = 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END, j.queue,
              j.concurrency_key, j.held
      INTO result, q, ck, was_held;
    IF result IS NULL THEN
        SELECT j.state::text INTO result FROM lease.job j
         WHERE j.id = cancel.id AND (qn IS NULL OR j.queue = qn);
    ELSE
        IF result = 'cancelled' THEN
            PERFORM lease._count(q, cancelled => 1, pending => -1);
            IF ck IS NOT NULL THEN
                PERFORM lease._free_slots(q, ARRAY[ck], was_held);
            END IF;
        END IF;
        -- A cancelled row is purged after dead_retention: work for the reaper.
        PERFORM lease._reaper_touch();
    END IF;
    RETURN result;
END
$$;

COMMENT ON FUNCTION lease.cancel(bigint, text) IS
$$Cancels row ID. A pending row becomes cancelled at once ('cancelled'). A leased row keeps its lease
but is marked ('cancel_requested'): its owner sees the flag on renew, and a retry, abandon or
expiry ends it as cancelled, never pending again. A finished row is left alone and its state is
returned ('done', 'dead', 'cancelled'); NULL means no such row (in QUEUE, when given: QUEUE also routes
the call on a distributed install, where a NULL written or bound is refused: give lease.queue_of(ID)
instead, and the call runs on the coordinator). Errors: 22004 id NULL, or QUEUE NULL as a constant or
parameter on a distributed install; 42501 the row's queue is restricted and the caller may neither produce
into nor work it.$$;

CREATE FUNCTION lease.queue_of(id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := (SELECT j.queue FROM lease.job j WHERE j.id = queue_of.id);
BEGIN
    -- A restricted queue the caller holds no right on stays unnamed.
    IF q IS NULL OR NOT coalesce(lease._access(q, '{produce,work}'), false) THEN
        RETURN NULL;
    END IF;
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease.queue_of(bigint) IS
$$The queue of row ID; NULL if there is no such row, or its queue is restricted and the caller may neither
produce into nor work it. For calls by id on a distributed install: lease.cancel(ID, lease.queue_of(ID)).$$;

CREATE FUNCTION lease.cancel_key(queue text, key text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target bigint;
BEGIN
    PERFORM lease._checked_queue(queue), lease._checked_not_null(key, 'key');
    -- Before the key is looked up: a role that may not cancel here gets the
    -- same answer whether the key exists or not.
    PERFORM lease._check_access(queue, '{work,produce}');
    SELECT j.id INTO target FROM lease.job j WHERE j.queue = cancel_key.queue AND j.key = cancel_key.key;
    IF target IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN lease.cancel(target, cancel_key.queue);
END
$$;

COMMENT ON FUNCTION lease.cancel_key(text, text) IS
$$lease.cancel for the row of QUEUE with KEY (for an attached table: its primary key as text), for callers
that know the key but not the row id. Returns what lease.cancel returns; NULL if no such row.
Errors: 22004 an argument NULL; 42704 no such queue (or a restricted one the caller holds no right on);
42501 as lease.cancel, whether the key exists or not.$$;

CREATE FUNCTION lease.requeue(id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    q text;
    ck text;
    pr integer;
    rk bigint;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    -- A fresh start: attempts from zero, claimable now. The epoch stays, so
    -- the next claim still issues a greater one.
    UPDATE lease.job j
       SET state = 'pending', attempt = 0, next_at = t, finished_at = NULL,
           cancel_requested = false, owner = NULL, lease_until = NULL,
           -- Back in line for its key's slots, as if enqueued now.
           held = j.concurrency_key IS NOT NULL
     WHERE j.id = requeue.id AND j.state = 'dead'
    RETURNING j.queue, j.concurrency_key, j.priority, j.rank INTO q, ck, pr, rk;
    IF q IS NULL THEN
        RETURN false;
    END IF;
    PERFORM lease._count(q, pending => 1, dead => -1);
    IF ck IS NOT NULL THEN
        PERFORM lease._hold(q, ARRAY[ck]);
    ELSE
        PERFORM lease._lower_head(q, pr, rk, t, requeue.id), lease._wake(q, 1);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.requeue(bigint) IS
$$Puts dead letter ID back to pending, claimable now, with its attempts reset (last_error is kept). Returns
false and changes nothing unless the row is dead. For any queue, attached tables' included. Errors: 22004 id
NULL.$$;
