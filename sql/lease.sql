-- Holding and ending a lease: renew and release, single and batch.
--
-- Every statement here is keyed on (id, owner, epoch), on state = 'leased'
-- and on the database clock (lease_until > lease._now()): a lease that
-- expired, was reaped, taken over or released is "lost" and nothing changes.
-- lease._now() is evaluated per row, after any row-lock wait, so a
-- renewal that waited past the expiry does not resurrect the lease.
--
-- Each function takes the leases' queue last, optional: given, a lease of
-- another queue is lost; on a distributed install (citus.sql) it is what
-- forwards the call to the node holding the queue, and every statement
-- names it so that the node runs it on that queue's shard alone.
--
-- The batch forms find each row's epoch with array_position instead of
-- joining unnest(ids, epochs): under the generic plan that join became a
-- nested loop over both arrays (2,450 comparisons for 50 leases; the
-- release of 50 leases went from ~0.6 ms to ~0.2 ms). The IN (unnest) arm
-- only matters when one id is listed twice with different epochs.

CREATE FUNCTION lease.renew(id bigint, owner text, epoch bigint, ttl interval, queue text DEFAULT NULL)
RETURNS lease.renewal
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o constant text := owner;
    d constant interval := ttl;
    result lease.renewal;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF renew.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.renew without its queue');
    END IF;
    -- The checks run only when an argument is off (see lease.claim_pending).
    IF NOT (id IS NOT NULL AND epoch IS NOT NULL AND lease._valid_owner(o) AND lease._valid_ttl(d)) THEN
        PERFORM lease._checked_owner(o), lease._checked_ttl(d),
                lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch');
    END IF;
    -- Inline, not a call of lease._check_rows: this runs on every renewal.
    IF EXISTS (SELECT FROM lease.queue qu WHERE qu.restricted AND (renew.queue IS NULL OR qu.name = renew.queue)) THEN
        PERFORM lease._check_rows(ARRAY[id], '{work}', renew.queue);
    END IF;
    UPDATE lease.job j
       SET lease_until = lease._now() + d
     WHERE j.id = renew.id AND j.owner = o AND j.epoch = renew.epoch
       AND (renew.queue IS NULL OR j.queue = renew.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
    RETURNING j.id, true, j.lease_until, j.cancel_requested
      INTO result;
    IF NOT FOUND THEN
        result := ROW(renew.id, false, NULL, NULL);
    END IF;
    RETURN result;
END
$$;

COMMENT ON FUNCTION lease.renew(bigint, text, bigint, interval, text) IS
$$Extends OWNER's lease on row ID at EPOCH to now + TTL (database clock); QUEUE, when given, is the row's
queue (a lease of another is lost), and routes the call on a distributed install. Returns (id, held, lease_until,
cancel_requested): held = false means the lease is lost and nothing changed; cancel_requested = true
means lease.cancel was called and the owner should stop and release.
Errors: 22004 an argument NULL; 22023 ttl not in (0, 1 day], owner empty or over 256 characters;
42501 the row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE FUNCTION lease.renew_batch(ids bigint[], owner text, epochs bigint[], ttl interval, queue text DEFAULT NULL)
RETURNS SETOF lease.renewal
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o constant text := lease._checked_owner(owner);
    d constant interval := lease._checked_ttl(ttl);
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF renew_batch.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.renew_batch without its queue');
    END IF;
    PERFORM lease._checked_same_length(ids, epochs), lease._check_rows(ids, '{work}', renew_batch.queue);
    RETURN QUERY
    WITH held AS MATERIALIZED (
        -- A heartbeat locks many rows; waiting for one that another
        -- transaction holds (a writer of an attached table removing it, in
        -- its own order) while holding the others can deadlock. So rows
        -- locked by others are skipped and reported as busy (held NULL).
        SELECT j.id
          FROM lease.job j
         WHERE j.id = ANY (ids)
           AND (j.epoch = epochs[array_position(ids, j.id)]
                OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
           AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
           AND (renew_batch.queue IS NULL OR j.queue = renew_batch.queue)
           FOR NO KEY UPDATE SKIP LOCKED
    ), renewed AS (
        UPDATE lease.job j
           SET lease_until = lease._now() + d
         WHERE j.id = ANY (ARRAY(SELECT h.id FROM held h))
           AND (renew_batch.queue IS NULL OR j.queue = renew_batch.queue)
        RETURNING j.id, j.epoch, j.lease_until, j.cancel_requested
    )
    -- Matched on (id, epoch): a stale epoch listed beside the current one
    -- for the same id is reported as lost. A row not renewed that this
    -- statement still sees held was skipped as locked: busy.
    SELECT w.id,
           CASE WHEN r.id IS NOT NULL THEN true WHEN s.id IS NOT NULL THEN NULL ELSE false END,
           coalesce(r.lease_until, s.lease_until),
           coalesce(r.cancel_requested, s.cancel_requested)
      FROM unnest(ids, epochs) WITH ORDINALITY AS w(id, epoch, ord)
      LEFT JOIN renewed r ON r.id = w.id AND r.epoch = w.epoch
      LEFT JOIN (SELECT s.id, s.epoch, s.lease_until, s.cancel_requested
                   FROM lease.job s
                  WHERE s.id = ANY (ids) AND s.owner = o AND s.state = 'leased' AND s.lease_until > lease._now()
                    AND (renew_batch.queue IS NULL OR s.queue = renew_batch.queue)) s
             ON r.id IS NULL AND s.id = w.id AND s.epoch = w.epoch
     ORDER BY w.ord;
END
$$;

COMMENT ON FUNCTION lease.renew_batch(bigint[], text, bigint[], interval, text) IS
$$lease.renew for many leases of one owner (of QUEUE, when given) in one statement (one round trip per
heartbeat). ids[i] goes
with epochs[i]; returns one lease.renewal per element, in input order. It never waits for a row another
transaction holds locked (the owner's own open fence, a writer of an attached table removing the row):
such a lease is reported with held NULL (busy: still held, not extended; try again soon) and its current
lease_until.
Errors: 22004 an argument NULL or an element NULL; 22023 arrays of different lengths or over 10000
elements, ttl or owner invalid; 42501 a row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE FUNCTION lease.release(
    id       bigint,
    owner    text,
    epoch    bigint,
    outcome  text        DEFAULT 'done',
    retry_at timestamptz DEFAULT NULL,
    error    text        DEFAULT NULL,
    queue    text        DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o  constant text := owner;
    oc constant text := outcome;
    -- The time the SET lists record (Citus allows no lease._now() in a
    -- CASE or COALESCE); the WHERE clauses read the clock per row.
    t  constant timestamptz := clock_timestamp();
    q  text;
    st lease.job_state;
    ck text;
    pr integer;
    rk bigint;
    na timestamptz;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF release.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.release without its queue');
    END IF;
    -- The checks run only when an argument is off (see lease.claim_pending).
    IF NOT (id IS NOT NULL AND epoch IS NOT NULL AND lease._valid_owner(o) AND lease._valid_outcome(oc)) THEN
        PERFORM lease._checked_owner(o), lease._checked_outcome(oc),
                lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch');
    END IF;
    IF NOT lease._valid_time(retry_at) THEN
        PERFORM lease._checked_time(retry_at, 'retry_at');
    END IF;
    IF EXISTS (SELECT FROM lease.queue qu WHERE qu.restricted AND (release.queue IS NULL OR qu.name = release.queue)) THEN
        PERFORM lease._check_rows(ARRAY[id], '{work}', release.queue);
    END IF;
    IF oc = 'done' THEN
        -- Queues that keep no history drop done rows at once: one write, not two.
        DELETE FROM lease.job j
         USING lease.queue q
         WHERE j.id = release.id AND j.owner = o AND j.epoch = release.epoch
           AND (release.queue IS NULL OR j.queue = release.queue)
           AND j.state = 'leased' AND j.lease_until > lease._now()
           AND q.name = j.queue AND q.retention = interval '0' AND NOT q.attached
        RETURNING j.queue, j.concurrency_key INTO q, ck;
        IF q IS NOT NULL THEN
            -- lease._count's upsert, written out (see lease.claim_pending).
            INSERT INTO lease.counter AS c (queue, backend, done)
            VALUES (q, pg_backend_pid(), 1)
                ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE SET done = c.done + 1;
            IF ck IS NOT NULL THEN
                PERFORM lease._free_slots(q, ARRAY[ck]);
            END IF;
            RETURN true;
        END IF;
    END IF;

    UPDATE lease.job j
       SET state       = lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached),
           finished_at = CASE WHEN lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                              THEN t END,
           attempt     = CASE WHEN oc = 'abandon' THEN j.attempt - 1 ELSE j.attempt END,
           next_at     = CASE WHEN oc = 'retry'
                              THEN coalesce(retry_at, lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch))
                              ELSE j.next_at END,
           lease_until = NULL,
           last_error  = coalesce(error, CASE WHEN oc = 'done' AND q.attached THEN lease._stranded_done() END, j.last_error)
      FROM lease.queue q
     WHERE j.id = release.id AND j.owner = o AND j.epoch = release.epoch
       AND (release.queue IS NULL OR j.queue = release.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
       AND q.name = j.queue
    RETURNING j.queue, j.state, j.concurrency_key, j.priority, j.rank, j.next_at INTO q, st, ck, pr, rk, na;
    IF st IS NULL THEN
        RETURN false;
    END IF;
    PERFORM lease._count_moved(q, 'leased', st, 1, oc);
    IF st = 'pending' THEN
        -- A retry (or an abandon, which keeps its place) may be due before
        -- the queue's head.
        PERFORM lease._lower_head(q, pr, rk, na, release.id);
    ELSIF ck IS NOT NULL THEN
        PERFORM lease._free_slots(q, ARRAY[ck]);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.release(bigint, text, bigint, text, timestamptz, text, text) IS
$$Ends OWNER's lease on row ID at EPOCH with an outcome, and returns true; returns false and changes
nothing if the lease is lost (stale epoch, wrong owner, expired, already released, not of QUEUE when that
is given; QUEUE routes the call on a distributed install).
Outcomes: 'done' (finished; deleted at once if the queue's retention is 0; on an attached table's row,
which is finished only when the table's row stops matching, a dead letter instead), 'retry' (pending again at
retry_at, default now + backoff; dead once attempts reach max_attempts), 'fail' (dead letter now),
'abandon' (pending again at once, the attempt is given back). A cancel request turns retry and abandon
into 'cancelled'. error is kept in last_error.
Errors: 22004 an argument NULL; 22023 unknown outcome, owner empty or over 256 characters, retry_at
infinite; 42501 the row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE FUNCTION lease.release_batch(
    ids      bigint[],
    owner    text,
    epochs   bigint[],
    outcome  text        DEFAULT 'done',
    retry_at timestamptz DEFAULT NULL,
    error    text        DEFAULT NULL,
    queue    text        DEFAULT NULL
) RETURNS TABLE (id bigint, released boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    o  constant text := lease._checked_owner(owner);
    oc constant text := lease._checked_outcome(outcome);
    -- As in lease.release.
    t  constant timestamptz := clock_timestamp();
    gone bigint[] := '{}';
    gone_epochs bigint[] := '{}';
    gone_queues text[];
    -- Concurrency keys of the deleted rows (NULL where none).
    gone_keys text[];
    -- Rows the UPDATE ended: their tokens and the states they went to.
    ended_ids bigint[];
    ended_epochs bigint[];
    states lease.job_state[];
    updated_queues text[];
    updated_keys text[];
    keyed boolean := false;
    moved record;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF release_batch.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.release_batch without its queue');
    END IF;
    PERFORM lease._checked_same_length(ids, epochs), lease._checked_time(retry_at, 'retry_at');
    IF EXISTS (SELECT FROM lease.queue qu
                WHERE qu.restricted AND (release_batch.queue IS NULL OR qu.name = release_batch.queue)) THEN
        PERFORM lease._check_rows(ids, '{work}', release_batch.queue);
    END IF;
    IF oc = 'done' THEN
        WITH deleted AS (
            DELETE FROM lease.job j
             USING lease.queue q
             WHERE j.id = ANY (ids)
               AND (j.epoch = epochs[array_position(ids, j.id)]
                    OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
               AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
               AND (release_batch.queue IS NULL OR j.queue = release_batch.queue)
               AND q.name = j.queue AND q.retention = interval '0' AND NOT q.attached
            RETURNING j.id, j.epoch, j.queue, j.concurrency_key
        )
        SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.epoch), '{}'), array_agg(d.queue),
               array_agg(d.concurrency_key), coalesce(bool_or(d.concurrency_key IS NOT NULL), false)
          INTO gone, gone_epochs, gone_queues, gone_keys, keyed
          FROM deleted d;
        FOR moved IN SELECT g.queue, count(*) AS n FROM unnest(gone_queues) AS g(queue) GROUP BY g.queue LOOP
            PERFORM lease._count(moved.queue, done => moved.n);
        END LOOP;
        IF cardinality(gone) = cardinality(ids) THEN
            IF keyed THEN
                PERFORM lease._free_slots_of(gone_queues, gone_keys);
            END IF;
            -- The common case (all completions accepted): skip the UPDATE.
            RETURN QUERY SELECT u.id, true FROM unnest(ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
            RETURN;
        END IF;
    END IF;

    -- The SET list is lease.release's, for many rows: each function keeps
    -- its statement whole so the planner sees it (a shared function per row
    -- would cost the single release, the hot path at batch 1).
    WITH updated AS (
        UPDATE lease.job j
           SET state       = lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached),
               finished_at = CASE WHEN lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                                  THEN t END,
               attempt     = CASE WHEN oc = 'abandon' THEN j.attempt - 1 ELSE j.attempt END,
               next_at     = CASE WHEN oc = 'retry'
                                  THEN coalesce(retry_at, lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch))
                                  ELSE j.next_at END,
               lease_until = NULL,
               last_error  = coalesce(error, CASE WHEN oc = 'done' AND q.attached THEN lease._stranded_done() END, j.last_error)
          FROM lease.queue q
         WHERE j.id = ANY (ids)
           AND (j.epoch = epochs[array_position(ids, j.id)]
                OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
           AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
           AND (release_batch.queue IS NULL OR j.queue = release_batch.queue)
           AND q.name = j.queue
        RETURNING j.id, j.epoch, j.queue, j.state, j.concurrency_key
    )
    SELECT coalesce(array_agg(u.id), '{}'), coalesce(array_agg(u.epoch), '{}'), array_agg(u.queue), array_agg(u.state),
           array_agg(u.concurrency_key), keyed OR coalesce(bool_or(u.concurrency_key IS NOT NULL), false)
      INTO ended_ids, ended_epochs, updated_queues, states, updated_keys, keyed
      FROM updated u;
    FOR moved IN SELECT m.queue, m.state, count(*) AS n
                   FROM unnest(updated_queues, states) AS m(queue, state) GROUP BY m.queue, m.state LOOP
        PERFORM lease._count_moved(moved.queue, 'leased', moved.state, moved.n, oc);
    END LOOP;
    -- Retries and abandons may be due before their queue's head.
    IF 'pending' = ANY (states) THEN
        PERFORM lease._lower_heads(ARRAY(SELECT m.id FROM unnest(ended_ids, states) AS m(id, state)
                                          WHERE m.state = 'pending'), release_batch.queue);
    END IF;
    -- The deleted rows and those the UPDATE ended give up their slots; rows
    -- that went back to pending keep theirs.
    IF keyed THEN
        PERFORM lease._free_slots_of(
            coalesce(gone_queues, '{}')
                || ARRAY(SELECT m.queue FROM unnest(updated_queues, states) AS m(queue, state)
                          WHERE m.state <> 'pending'),
            coalesce(gone_keys, '{}')
                || ARRAY(SELECT m.key FROM unnest(updated_keys, states) AS m(key, state)
                          WHERE m.state <> 'pending'));
    END IF;
    RETURN QUERY
    SELECT w.id, (w.id, w.epoch) IN (SELECT * FROM unnest(gone, gone_epochs))
                 OR (w.id, w.epoch) IN (SELECT * FROM unnest(ended_ids, ended_epochs))
      FROM unnest(ids, epochs) WITH ORDINALITY AS w(id, epoch, ord)
     ORDER BY w.ord;
END
$$;

COMMENT ON FUNCTION lease.release_batch(bigint[], text, bigint[], text, timestamptz, text, text) IS
$$lease.release for many leases of one owner (of QUEUE, when given) with one outcome, in one statement
(batched completions).
ids[i] goes with epochs[i]; returns (id, released) per element in input order.
Errors: 22004 an argument or element NULL; 22023 arrays of different lengths or over 10000 elements,
unknown outcome, owner invalid, retry_at infinite; 42501 a row's queue is restricted and the caller may
not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;
