-- Fenced writes: the holder of (id, epoch) may write; nobody else may, not
-- even the same owner with an older epoch.

CREATE FUNCTION lease.fenced_update(id bigint, epoch bigint, patch jsonb, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text;
    q lease.queue;
    bytes integer;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF fenced_update.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.fenced_update without its queue');
    END IF;
    PERFORM lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch'),
            lease._checked_not_null(patch, 'patch'),
            lease._check_rows(ARRAY[id], '{work}', fenced_update.queue);
    IF jsonb_typeof(patch) <> 'object' THEN
        RAISE EXCEPTION 'patch must be a JSON object (got %)', jsonb_typeof(patch)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE lease.job j
       SET payload = j.payload || patch
     WHERE j.id = fenced_update.id AND j.epoch = fenced_update.epoch
       AND (fenced_update.queue IS NULL OR j.queue = fenced_update.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
    RETURNING j.queue, octet_length(j.payload::text) INTO qn, bytes;
    IF bytes IS NULL THEN
        RETURN false;
    END IF;
    SELECT qu.* INTO q FROM lease.queue qu WHERE qu.name = qn;
    -- Raised here, the error undoes the update.
    PERFORM lease._check_payload_size(q, bytes);
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.fenced_update(bigint, bigint, jsonb, text) IS
$$Merges PATCH (a JSON object; top-level keys replace) into row ID's payload, but only while (id, epoch)
is the current, unexpired lease. QUEUE, when given, is the row's queue (a lease of another is lost), and
routes the call on a distributed install. Returns true if applied, false (nothing changed) if the lease
is lost.
Errors: 22004 an argument NULL; 22023 patch is not a JSON object, or the payload would grow over the
queue's max_payload_bytes; 42501 the row's queue is restricted
and the caller may not work it; 0A000 a distributed install and no QUEUE.$$;

CREATE FUNCTION lease.fence(id bigint, epoch bigint, queue text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until timestamptz;
BEGIN
    -- Only the queue can route a statement on a distributed install. There
    -- the function runs where the caller's transaction does, and the lock
    -- below is taken on the queue's node inside that transaction.
    IF fence.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.fence without its queue');
    END IF;
    PERFORM lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch'),
            lease._check_rows(ARRAY[id], '{work}', fence.queue);
    -- Lock order for an attached table's row: the table row first, then
    -- its lease row. Every other writer of the table takes them in that
    -- order (its UPDATE locks the table row, then its trigger the lease
    -- row), so fence must too, or a holder's fenced write and a user's
    -- cancel of the same row deadlock.
    -- (A distributed install has no attached tables, and joins no table to
    -- lease.job without a queue.)
    IF EXISTS (SELECT FROM lease.attachment) THEN
        PERFORM lease._lock_attached_rows(ARRAY[id]);
    END IF;
    -- FOR SHARE holds the row until the caller's transaction ends: the reaper
    -- and claimers skip or wait for it, so no new epoch can be issued before
    -- the caller's own writes commit.
    SELECT j.lease_until INTO until
      FROM lease.job j
     WHERE j.id = fence.id AND j.epoch = fence.epoch
       AND (fence.queue IS NULL OR j.queue = fence.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease % at epoch % is not held', id, epoch
            USING ERRCODE = 'LE001',
                  DETAIL = 'The lease expired, was released, or a newer epoch took over.',
                  HINT = 'Roll back: this transaction must not write on behalf of a lost lease.';
    END IF;
    RETURN until;
END
$$;

COMMENT ON FUNCTION lease.fence(bigint, bigint, text) IS
$$Guard for the caller's own transaction: succeeds (returning lease_until) only while (id, epoch) is the
current, unexpired lease (of QUEUE, when given: a lease of another is not held), and keeps the row locked FOR SHARE until the transaction ends, so writes that
follow in the same transaction are ordered before any takeover. For a row of an attached table it first
locks that table's row FOR NO KEY UPDATE, the order every writer of the table follows, so a fenced write
cannot deadlock with a concurrent cancel or acknowledgement of the same row. Call it first, then write
your tables.
Errors: LE001 lease not held (roll back); 22004 an argument NULL; 42501 the row's queue is restricted
and the caller may not work it; 0A000 a distributed install and no QUEUE.$$;
