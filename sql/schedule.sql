-- Periodic work: schedules whose occurrences lease.sweep() enqueues, each
-- exactly once, with no leader among the application's replicas.
--
-- Exactly once per occurrence: the step that enqueues an occurrence locks
-- its schedule row and moves next_at past it in the same transaction as the
-- enqueue, so a second sweeper (another session, the reaper, a restarted
-- one) either waits behind the lock and then sees the new next_at, or skips
-- the row. Each occurrence's row carries the key 'schedule:<name>@<time>',
-- so even a replayed occurrence (e.g. a restore) would find its row while
-- it is retained. The state is in tables, so restarts and a promoted
-- standby go on from the last committed occurrence.

CREATE TABLE lease.schedule (
    name        text PRIMARY KEY CHECK (name <> '' AND length(name) <= 128),
    queue       text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    -- Exactly one of: a cron expression (UTC), or a fixed period counted
    -- from anchor.
    cron        text,
    every       interval CHECK (every > interval '0'),
    anchor      timestamptz NOT NULL,
    payload     jsonb NOT NULL,
    priority    integer NOT NULL DEFAULT 0,
    -- Occurrences more than 5 s overdue (an outage): 'skip' enqueues only
    -- the latest of them, 'catch_up' each, oldest first.
    missed      text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'catch_up')),
    -- NULL: a cron expression that never fires again.
    next_at     timestamptz,
    enqueued    bigint NOT NULL DEFAULT 0,
    last_run_at timestamptz,
    last_job_id bigint,
    last_error  text,
    last_error_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((cron IS NULL) <> (every IS NULL))
);

CREATE INDEX schedule_due ON lease.schedule (next_at);

COMMENT ON TABLE lease.schedule IS
    'Periodic enqueues, one row per schedule. Change them with lease.schedule() and lease.unschedule().';

CREATE FUNCTION lease._schedule_next(cron text, every interval, anchor timestamptz, after timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN cron IS NOT NULL
    THEN to_timestamp(lease._cron_next(cron, extract(epoch FROM after)::double precision))
    ELSE anchor + every * (floor(extract(epoch FROM after - anchor) / extract(epoch FROM every)) + 1)::double precision
END;

COMMENT ON FUNCTION lease._schedule_next(text, interval, timestamptz, timestamptz) IS
    'Internal: the first occurrence strictly after AFTER of a schedule (CRON, or EVERY counted from ANCHOR); NULL if none.';

-- The mirror of _schedule_next: the last occurrence at or before AT.
CREATE FUNCTION lease._schedule_last(cron text, every interval, anchor timestamptz, at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN cron IS NOT NULL
    THEN to_timestamp(lease._cron_last(cron, extract(epoch FROM at)::double precision))
    ELSE anchor + every * floor(extract(epoch FROM at - anchor) / extract(epoch FROM every))::double precision
END;

COMMENT ON FUNCTION lease._schedule_last(text, interval, timestamptz, timestamptz) IS
    'Internal: the last occurrence at or before AT of a schedule (CRON, or EVERY counted from ANCHOR); NULL if none.';

CREATE FUNCTION lease.schedule(
    name     text,
    queue    text,
    cron     text     DEFAULT NULL,
    every    interval DEFAULT NULL,
    payload  jsonb    DEFAULT '{}',
    priority integer  DEFAULT 0,
    missed   text     DEFAULT 'skip'
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n constant text := lease._checked_not_null(name, 'name');
    p constant jsonb := lease._checked_not_null(payload, 'payload');
    q constant text := (lease._checked_producer_queue(queue, octet_length(p::text))).name;
    t constant timestamptz := clock_timestamp();
    first timestamptz;
BEGIN
    IF n = '' OR length(n) > 128 THEN
        RAISE EXCEPTION 'schedule name must have 1 to 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (cron IS NULL) = (every IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of cron and every' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The reaper sweeps at a schedule's next occurrence, a few milliseconds
    -- late; a shorter period would leave it no margin.
    IF every IS NOT NULL AND (lease._checked_span(every, interval '366 days', 'every') < interval '1 second') THEN
        RAISE EXCEPTION 'every must be at least 1 second (got %)', every USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF missed IS NULL OR missed NOT IN ('skip', 'catch_up') THEN
        RAISE EXCEPTION 'missed must be ''skip'' or ''catch_up'' (got %)', coalesce(missed, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first := lease._schedule_next(cron, every, t, t);
    IF first IS NULL THEN
        RAISE EXCEPTION 'cron expression "%" never fires', cron USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO lease.schedule AS s (name, queue, cron, every, anchor, payload, priority, missed, next_at)
    VALUES (n, q, schedule.cron, schedule.every, t, p, coalesce(schedule.priority, 0), schedule.missed, first)
    ON CONFLICT (name) DO UPDATE
       SET queue = excluded.queue, cron = excluded.cron, every = excluded.every,
           anchor = excluded.anchor, payload = excluded.payload, priority = excluded.priority,
           missed = excluded.missed, next_at = excluded.next_at, last_error = NULL, last_error_at = NULL;
    -- Have the reaper (where preloaded) look at this database's next due time.
    -- Its first occurrence may come before the reaper's next pass.
    PERFORM lease._reaper_wake();
    RETURN first;
END
$$;

COMMENT ON FUNCTION lease.schedule(text, text, text, interval, jsonb, integer, text) IS
$$Creates or replaces the schedule NAME: enqueue PAYLOAD (with PRIORITY) into QUEUE at every occurrence
of CRON (a cron expression in UTC: five fields, or six with seconds first) or EVERY (a fixed period,
counted from now). Returns the first occurrence. lease.sweep() (the reaper, pg_cron, or any caller)
enqueues each due occurrence exactly once, keyed 'schedule:NAME@<occurrence in UTC>', with the
occurrence as run_at; the reaper sweeps at the next occurrence. An occurrence more than 5 seconds
overdue counts as missed (no reaper or sweep ran): MISSED = 'skip' enqueues only the latest of those,
'catch_up' every one of them, oldest first (at most 100 per schedule and sweep).
Errors: 22004 name, queue or payload NULL; 22023 not exactly one of cron and every, an invalid or
never-firing cron expression (five or six fields), every not in [1 second, 366 days] or with months, missed unknown, name empty or
over 128 characters; 42704 no such queue; 42809 the queue is fed by an attached table; 42501 the queue
is restricted and the caller may not produce into it.$$;

CREATE FUNCTION lease.unschedule(name text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH gone AS (DELETE FROM lease.schedule s WHERE s.name = unschedule.name RETURNING 1)
    SELECT count(*) > 0 FROM gone;
END;

COMMENT ON FUNCTION lease.unschedule(text) IS
    'Deletes the schedule NAME; returns false if there was none. Rows it already enqueued stay.';

CREATE FUNCTION lease._enqueue_occurrence(s lease.schedule, at timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE
RETURN lease.enqueue(s.queue, s.payload,
                     key => format('schedule:%s@%s', s.name,
                                   to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
                     run_at => at, priority => s.priority);

COMMENT ON FUNCTION lease._enqueue_occurrence(lease.schedule, timestamptz) IS
    'Internal: enqueues the occurrence AT of schedule S, keyed by its name and time; returns the row id.';

CREATE FUNCTION lease._enqueue_due(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    s lease.schedule;
    at timestamptz;
    job bigint;
    made integer;
    total bigint := 0;
    problem text;
BEGIN
    -- A locked schedule is being run by another sweeper: skip it.
    FOR s IN SELECT * FROM lease.schedule sc
              WHERE sc.next_at <= t
              ORDER BY sc.next_at
              LIMIT max_rows
                FOR UPDATE SKIP LOCKED LOOP
        made := 0;
        BEGIN
            -- An occurrence less than a few seconds overdue is a sweep
            -- that came late, not an outage: it is enqueued either way.
            at := CASE s.missed
                      WHEN 'skip' THEN greatest(s.next_at,
                                                lease._schedule_last(s.cron, s.every, s.anchor, t - interval '5 seconds'))
                      ELSE s.next_at END;
            WHILE at IS NOT NULL AND at <= t AND made < 100 LOOP
                job := lease._enqueue_occurrence(s, at);
                made := made + 1;
                at := lease._schedule_next(s.cron, s.every, s.anchor, at);
            END LOOP;
            UPDATE lease.schedule sc
               SET next_at = at, enqueued = sc.enqueued + made, last_run_at = t, last_job_id = job
             WHERE sc.name = s.name;
        EXCEPTION WHEN OTHERS THEN
            -- One schedule (its queue attached since, say) must not stop
            -- the others; its due occurrences are dropped, and the reason
            -- kept where operators look.
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            UPDATE lease.schedule sc
               SET next_at = lease._schedule_next(s.cron, s.every, s.anchor, t),
                   last_error = format('%s: %s', SQLSTATE, problem), last_error_at = t
             WHERE sc.name = s.name;
            RAISE WARNING 'pg_lease: schedule "%" could not enqueue: %', s.name, problem;
        END;
        total := total + made;
    END LOOP;
    RETURN total;
END
$$;

COMMENT ON FUNCTION lease._enqueue_due(integer) IS
$$Internal (lease.sweep): enqueues the due occurrences of up to MAX_ROWS schedules, each exactly once,
and returns how many rows it enqueued. A schedule whose enqueue fails records the error and moves on.$$;
