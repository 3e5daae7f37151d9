-- The head of a queue: where claims start reading job_ready.
--
-- A claim takes the first pending rows in claim order (priority DESC, rank,
-- next_at, id). Every row it claims leaves a dead entry at the front of
-- job_ready, and while any snapshot older than that claim is held (a
-- report, a long transaction, a standby's hot_standby_feedback) no later
-- claim may skip it unseen: each one walks all of them and their heap
-- tuples again. So each queue keeps a head (lease.queue.head_*): a
-- position in claim order that no pending row of the queue is before.
-- Claims start there and never see what earlier claims left behind it.
--
-- Two rules keep "no pending row before the head" true:
--
-- * Lowering is the writer's job. A transaction that makes a row pending
--   and not held (enqueue, retry, abandon, expiry, admission, requeue, an
--   attached row that starts matching or moves in order) calls
--   lease._lower_head afterwards, in the same transaction, with the
--   earliest position it made. That takes a KEY SHARE lock on the queue row
--   (enqueue's foreign key takes the same), reads the head as it now is,
--   and moves it back if the row is before it.
--
-- * Raising takes the queue row FOR UPDATE SKIP LOCKED, which it only gets
--   while no writer of the first rule is between its change and its commit,
--   and then, in a new statement whose snapshot sees every such writer's
--   rows, moves the head to the first pending row (pending, not merely
--   claimable: a row locked by a claim still in flight counts, the claim may
--   roll back). A writer that changes a row after that lock was taken reads
--   the raised head once the raiser commits, and lowers it again if need
--   be. lease.sweep raises the heads of queues that had claims; a claim
--   raises its own queue's head at most every 50 ms, and only when it is a
--   transaction of its own: the lock holds producers off until the raiser
--   commits.
--
-- The head only ever says where to start: a lowering that could have been
-- skipped costs a claim some walking, never a row. As a safety net for rows
-- edited by hand, the sweep recomputes the head from the very start of the
-- queue once a minute.

CREATE FUNCTION lease._lower_head(queue text, priority integer, rank bigint, next_at timestamptz, id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The lock keeps a raise from committing until this transaction
        -- has; the next statement's snapshot sees any raise before it.
        PERFORM FROM lease.queue q WHERE q.name = _lower_head.queue FOR KEY SHARE;
    ELSE
        -- One snapshot for the whole transaction: a raise committed since
        -- would go unseen, so take a lock that fails (40001) if there was
        -- one rather than read a stale head.
        PERFORM FROM lease.queue q WHERE q.name = _lower_head.queue FOR SHARE;
    END IF;
    UPDATE lease.queue q
       SET head_priority = _lower_head.priority, head_rank = _lower_head.rank,
           head_next_at = _lower_head.next_at, head_id = _lower_head.id
     WHERE q.name = _lower_head.queue
       AND (-_lower_head.priority::bigint, _lower_head.rank, _lower_head.next_at, _lower_head.id)
           < (-q.head_priority::bigint, q.head_rank, q.head_next_at, q.head_id);
END
$$;

COMMENT ON FUNCTION lease._lower_head(text, integer, bigint, timestamptz, bigint) IS
$$Internal: the caller's transaction made a row of QUEUE pending (and not held) at claim position
(PRIORITY, RANK, NEXT_AT, ID): moves the queue's head back to it if it is before the head. Call it after
the change, in the same transaction; a lower bound of the position (an id of 0) is fine.$$;

CREATE FUNCTION lease._raise_head(queue text, from_start boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h lease.queue;
    -- The first pending row's position.
    p integer;
    r bigint;
    n timestamptz;
    i bigint;
    t timestamptz;
BEGIN
    -- Only a statement snapshot taken after the lock sees every writer that
    -- made rows pending; a transaction snapshot may predate them.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN false;
    END IF;
    -- A writer between its change and its commit holds the row: try later.
    SELECT * INTO h FROM lease.queue q WHERE q.name = _raise_head.queue FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF from_start THEN
        h.head_priority := 2147483647;
        h.head_rank := -9223372036854775808;
        h.head_next_at := '-infinity';
        h.head_id := -9223372036854775808;
    END IF;
    -- The first pending row at or after the head (claim.sql's two arms,
    -- without the eligibility test and the locks).
    SELECT a.priority, a.rank, a.next_at, a.id INTO p, r, n, i
      FROM ((SELECT j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.queue = _raise_head.queue AND j.priority = h.head_priority
                AND (j.rank, j.next_at, j.id) >= (h.head_rank, h.head_next_at, h.head_id)
                AND j.state = 'pending' AND NOT j.held
              ORDER BY j.rank, j.next_at, j.id
              LIMIT 1)
            UNION ALL
            (SELECT j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.queue = _raise_head.queue AND j.priority < h.head_priority
                AND j.state = 'pending' AND NOT j.held
              ORDER BY j.priority DESC, j.rank, j.next_at, j.id
              LIMIT 1)) AS a
     LIMIT 1;
    IF NOT FOUND THEN
        -- Nothing pending: the end of the order, until a writer lowers it.
        p := -2147483648;
        r := 9223372036854775807;
        n := 'infinity';
        i := 9223372036854775807;
    END IF;
    -- A variable, not clock_timestamp() in the UPDATE: Citus refuses a
    -- VOLATILE function there (citus.sql).
    t := clock_timestamp();
    UPDATE lease.queue q
       SET head_priority = p, head_rank = r, head_next_at = n, head_id = i, head_raised_at = t,
           head_checked_at = CASE WHEN from_start THEN t ELSE q.head_checked_at END
     WHERE q.name = _raise_head.queue;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease._raise_head(text, boolean) IS
$$Internal (lease.sweep, lease.claim_pending): moves the head of QUEUE forward to its first pending row, or to the end of the
claim order if it has none, searching from the head or, with FROM_START, from the start of the queue.
Returns false, changing nothing, when a writer holds the queue row or the transaction is not READ
COMMITTED.$$;

CREATE FUNCTION lease._lower_heads(ids bigint[], queue text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    -- Queue by queue in name order, so that two callers cannot deadlock on
    -- the queue rows they lower.
    FOR f IN SELECT DISTINCT ON (j.queue) j.queue, j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.id = ANY (ids) AND j.state = 'pending' AND NOT j.held
                -- Named, the queue keeps the read on its shard (citus.sql).
                AND (_lower_heads.queue IS NULL OR j.queue = _lower_heads.queue)
              ORDER BY j.queue, j.priority DESC, j.rank, j.next_at, j.id LOOP
        PERFORM lease._lower_head(f.queue, f.priority, f.rank, f.next_at, f.id);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._lower_heads(bigint[], text) IS
$$Internal: lease._lower_head for the rows IDS (of QUEUE, when given) that the caller's transaction made pending
(those not pending, or held, are passed over), once per queue with its earliest row.$$;
