-- Leases bound to a session: a holder that opts in names a database
-- session of its own (its keeper) for its leases in a queue, and they end
-- as soon as the reaper sees that session gone, instead of at their ttl.
--
-- A session is gone when its backend is: the process was killed, its host
-- vanished and TCP keepalive gave up, or the connection closed. Giving a
-- lease back early is safe because of fencing: a late write of the old
-- holder carries the old epoch and is refused, so a wrong guess costs a
-- duplicate attempt, never a corrupted row. A holder whose keeper only
-- reconnected while the old backend still lived (a network blip) binds the
-- new session and keeps its leases.

CREATE TABLE lease.session (
    queue         text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    owner         text NOT NULL,
    -- The keeper: its backend, and that backend's start where the binding
    -- role could read it (so that a reused pid is not taken for it).
    pid           integer NOT NULL,
    backend_start timestamptz,
    -- The server's start: after a restart no pid of before is alive.
    server_start  timestamptz NOT NULL,
    bound_at      timestamptz NOT NULL,
    PRIMARY KEY (queue, owner)
);

COMMENT ON TABLE lease.session IS
    'Leases bound to a session (lease.bind_session): per queue and owner, the backend whose end ends them.';

CREATE FUNCTION lease._ended_sessions() RETURNS TABLE (queue text, owner text)
LANGUAGE sql STABLE
BEGIN ATOMIC
    -- One anti-join: the backends are read once, however many sessions a
    -- queue's workers have bound.
    SELECT se.queue, se.owner
      FROM lease.session se
     -- After a restart no backend of before is alive.
     WHERE se.server_start <> pg_postmaster_start_time()
        OR NOT EXISTS (SELECT FROM pg_stat_activity a
                        WHERE a.pid = se.pid
                          -- NULL where the reader may not see it: the pid alone decides.
                          AND (a.backend_start IS NULL OR se.backend_start IS NULL
                               OR a.backend_start = se.backend_start));
END;

COMMENT ON FUNCTION lease._ended_sessions() IS
    'Internal: the bindings (queue, owner) whose session has ended: its backend is gone, or the server restarted since.';

CREATE FUNCTION lease._end_bound_leases(queue text, owner text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    ended bigint;
BEGIN
    -- Expired as of now: the reaper recovers them as it recovers any
    -- expiry (a new epoch, the attempt counted, the retry backoff). Rows
    -- locked by others, and those past MAX_ROWS, are left for the next pass.
    UPDATE lease.job j
       SET lease_until = t
     WHERE j.id = ANY (ARRAY(SELECT b.id
                               FROM lease.job b
                              WHERE b.queue = _end_bound_leases.queue AND b.owner = _end_bound_leases.owner
                                AND b.state = 'leased' AND b.lease_until > t
                              LIMIT max_rows
                                FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS ended = ROW_COUNT;
    RETURN ended;
END
$$;

COMMENT ON FUNCTION lease._end_bound_leases(text, text, integer) IS
    'Internal: sets up to MAX_ROWS of the leases OWNER holds in QUEUE to expire now (rows locked by others are skipped); returns how many.';

CREATE FUNCTION lease.bind_session(queue text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q constant text := lease._checked_queue(queue);
    o constant text := lease._checked_owner(owner);
    me constant integer := pg_backend_pid();
    started constant timestamptz := (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = me);
    prior lease.session;
    ended bigint := 0;
BEGIN
    -- The session would be looked for on the node holding the queue, where
    -- it does not run.
    PERFORM lease._refuse_if_distributed('lease.bind_session');
    PERFORM lease._check_access(q, '{work}');
    SELECT * INTO prior FROM lease.session s WHERE s.queue = q AND s.owner = o FOR UPDATE;
    IF FOUND AND prior.pid = me AND prior.server_start = pg_postmaster_start_time() THEN
        RETURN true;
    END IF;
    -- The session the leases were bound to has ended: so have they, even
    -- if the reaper has not got to them yet. A live one (the holder
    -- reconnected while its old backend still ran) hands them over.
    IF FOUND AND EXISTS (SELECT FROM lease._ended_sessions() e WHERE e.queue = q AND e.owner = o) THEN
        ended := lease._end_bound_leases(q, o, 2147483647);
    END IF;
    -- The reaper looks at this database from now on (lease._next_sweep_due).
    PERFORM lease._reaper_touch(ended);
    INSERT INTO lease.session AS s (queue, owner, pid, backend_start, server_start, bound_at)
    VALUES (q, o, me, started, pg_postmaster_start_time(), clock_timestamp())
    ON CONFLICT (queue, owner) DO UPDATE
       SET pid = excluded.pid, backend_start = excluded.backend_start,
           server_start = excluded.server_start, bound_at = excluded.bound_at;
    RETURN ended = 0;
END
$$;

COMMENT ON FUNCTION lease.bind_session(text, text) IS
$$Binds the leases OWNER holds in QUEUE, now and later, to the calling session: when its backend ends (process
killed, connection closed, host gone and TCP keepalive fired, server restarted) the reaper expires them within
a sweep interval instead of at their ttl, and they are retried as after any expiry. Call it on a connection
that stays open as long as the holder runs, and again after that connection is replaced. Binding a new
session while the old one still runs moves the leases to it; if the old one has ended, its leases end at once.
Returns false when it ended leases that way, true otherwise. Any role that may work QUEUE may bind any owner
name in it (as with lease.reclaim_own): owner names are not secrets between a queue's workers. Errors: 22004
an argument NULL; 22023 owner invalid; 42704 no such queue; 42501 the queue is restricted and the caller may
not work it; 0A000 on a distributed install (lease.distribute).$$;

CREATE FUNCTION lease._end_lost_sessions(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    s record;
    ended bigint := 0;
BEGIN
    -- Bounded in bindings and in leases: each costs an index probe and the
    -- rows it ends, and the pass stops at MAX_ROWS of either; the rest wait
    -- for the next one.
    FOR s IN SELECT se.queue, se.owner
               FROM lease.session se
              WHERE (se.queue, se.owner) IN (SELECT e.queue, e.owner FROM lease._ended_sessions() e)
              LIMIT max_rows
                FOR UPDATE OF se SKIP LOCKED LOOP
        EXIT WHEN ended >= max_rows;
        ended := ended + lease._end_bound_leases(s.queue, s.owner, (max_rows - ended)::integer);
        -- Kept while a lease of it is left (locked by someone else, or past
        -- this pass's bound).
        DELETE FROM lease.session se
         WHERE se.queue = s.queue AND se.owner = s.owner
           AND NOT EXISTS (SELECT FROM lease.job j
                            WHERE j.queue = s.queue AND j.owner = s.owner
                              AND j.state = 'leased' AND j.lease_until > clock_timestamp());
    END LOOP;
    RETURN ended;
END
$$;

COMMENT ON FUNCTION lease._end_lost_sessions(integer) IS
    'Internal (lease.sweep, before it reaps): expires the leases bound to sessions that have ended, up to MAX_ROWS bindings and MAX_ROWS leases a call, and forgets those sessions once none is left; returns how many leases.';
