-- Waking idle workers when a queue gets ready rows.
--
-- Each queue has a channel of its own, named from the queue and a secret of
-- the database's, and notifications carry no payload: a role that may
-- connect but may not work a queue learns neither its name nor when work
-- arrives (any role may LISTEN on any channel). Workers ask for the name
-- with lease.ready_channel, which checks their right to work the queue.

CREATE TABLE lease.channel_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   text NOT NULL DEFAULT md5(gen_random_uuid()::text)
);

COMMENT ON TABLE lease.channel_secret IS
    'The secret that the NOTIFY channel names of the queues are derived from (lease.ready_channel); readable by the extension''s owner only.';

INSERT INTO lease.channel_secret DEFAULT VALUES;

-- 9 + 32 characters: well under the 63 of an identifier.
CREATE FUNCTION lease._ready_channel(queue text) RETURNS text
LANGUAGE sql STABLE
RETURN 'pg_lease_' || md5((SELECT s.secret FROM lease.channel_secret s) || queue);

COMMENT ON FUNCTION lease._ready_channel(text) IS
    'Internal: the NOTIFY channel of QUEUE, a hash of its name and the database''s channel secret.';

CREATE FUNCTION lease.ready_channel(queue text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_access(lease._checked_queue(queue), '{work}');
    RETURN lease._ready_channel(queue);
END
$$;

COMMENT ON FUNCTION lease.ready_channel(text) IS
$$The channel to LISTEN on for QUEUE: a NOTIFY without payload arrives there, on commit, when the queue
gets claimable rows while it had none (an enqueue, a reap's retries). The name is derived from a secret of
the database, so only roles that may work the queue can learn it. Errors: 22004 queue NULL; 42704 no such
queue; 42501 the queue is restricted and the caller may not work it.$$;

-- A NOTIFY takes a lock that serialises the commits of all notifying
-- transactions of the cluster (measured: 3.8k single enqueues/s with one per
-- enqueue, 12k without), so only the rows that make a queue non-empty
-- announce themselves: while ready rows wait, every worker is either
-- claiming or about to (a worker idles only after a claim that found fewer
-- rows than it asked for). In the race where that claim's snapshot missed
-- the row, the Worker's rechecks (claims at 10 ms, 20 ms, ... after its last
-- rows came, up to its poll interval) pick it up.
CREATE FUNCTION lease._wake(queue text, added integer) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF (SELECT count(*)
          FROM (SELECT FROM lease.job j
                 WHERE j.queue = _wake.queue AND j.state = 'pending' AND NOT j.held
                   AND j.next_at <= clock_timestamp()
                 LIMIT added + 1) AS ready) <= added THEN
        PERFORM pg_notify(lease._ready_channel(queue), '');
    END IF;
END
$$;

COMMENT ON FUNCTION lease._wake(text, integer) IS
$$Internal: sends a NOTIFY on QUEUE's channel (lease.ready_channel) unless QUEUE had ready rows besides the
ADDED ones the caller just inserted.$$;
