-- What ending a lease does to its row: the state it moves to and, when it
-- goes back to pending, how long it waits. The rules of the state diagram in
-- schema.sql, written once for release, release_batch and the reaper.

-- What a row becomes when its lease ends with an outcome. One definition for
-- release and for reap (an expired lease counts as outcome ''retry'') so the
-- two paths can never account differently. Inlined by the planner because
-- each branch is an enum constant: the CASE of text cast to lease.job_state
-- as a whole converted at run time (enum_in is STABLE), which kept this
-- IMMUTABLE function from being inlined, and every statement calling it ran
-- the body through the SQL-function executor (pg_tests/tests/sql_inlining.rs).
CREATE FUNCTION lease._next_state(outcome text, cancel_requested boolean, attempt integer, max_attempts integer,
                                 attached boolean)
RETURNS lease.job_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    -- An attached row is done when its domain row stops matching (the
    -- trigger then removes it). Released as done while it still matches,
    -- it would be neither claimable nor visible: a dead letter says so.
    WHEN outcome = 'done' AND attached THEN 'dead'::lease.job_state
    WHEN outcome = 'done' THEN 'done'::lease.job_state
    WHEN outcome = 'fail' THEN 'dead'::lease.job_state
    -- Cancel intent wins over every way back to pending.
    WHEN cancel_requested THEN 'cancelled'::lease.job_state
    WHEN outcome = 'retry' AND attempt >= max_attempts THEN 'dead'::lease.job_state
    ELSE 'pending'::lease.job_state
END;

COMMENT ON FUNCTION lease._next_state(text, boolean, integer, integer, boolean) IS
    'Internal: the state a leased row moves to for outcome done/retry/fail/abandon, given its cancel flag, attempts and whether its queue is an attached table''s.';

CREATE FUNCTION lease._stranded_done() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'released as done while its table row still matches the pending predicate: move the row on (that is the completion), or requeue it';

COMMENT ON FUNCTION lease._stranded_done() IS
    'Internal: last_error of an attached row released as done while its domain row still matches.';

-- Exponential backoff after the given attempt: base * 2^(attempt-1), capped.
-- Computed in seconds (double precision) and capped before it becomes an
-- interval, so no attempt count can overflow it: with base 30 s, attempt 40
-- overflowed interval arithmetic (22008) and stopped every sweep.
CREATE FUNCTION lease._backoff(attempt integer, base interval, cap interval) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN make_interval(secs => least(date_part('epoch', cap),
                                   date_part('epoch', base) * power(2::float8, least(greatest(attempt - 1, 0), 60))));

COMMENT ON FUNCTION lease._backoff(integer, interval, interval) IS
    'Internal: delay before the next attempt, base * 2^(attempt-1) capped at cap.';

-- When a retry or an expired lease is due again: AT plus the backoff. With
-- 'full' jitter the delay is uniform in [0, backoff): rows that failed
-- together (a dependency was down) come back spread out instead of in
-- lockstep. The factor is drawn from the lease's (id, epoch), not from
-- random(), and the sum is taken in UTC (timestamptz + interval is STABLE,
-- timestamp + interval is not): Citus allows neither a VOLATILE function in
-- an UPDATE of a distributed table nor a STABLE one in its CASE, and the
-- planner inlines the function. Each attempt of a row has an epoch of its
-- own, so it draws anew.
CREATE FUNCTION lease._retry_at(at timestamptz, attempt integer, base interval, cap interval, jitter text,
                                id bigint, epoch bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((at AT TIME ZONE 'UTC')
        + CASE WHEN jitter = 'full'
               THEN lease._backoff(attempt, base, cap)
                    * ((hashint8extended(id, epoch) & 9007199254740991)::float8 / 9007199254740992)
               ELSE lease._backoff(attempt, base, cap) END) AT TIME ZONE 'UTC';

COMMENT ON FUNCTION lease._retry_at(timestamptz, integer, interval, interval, text, bigint, bigint) IS
    'Internal: AT + lease._backoff, the backoff times a factor in [0, 1) drawn uniformly from the lease''s (id, epoch) with jitter ''full'' (the default of a queue), exact with ''none''.';

-- The database clock, read where the statement reads it: per row, after
-- any wait for the row's lock, so a renewal or release that waited past the
-- expiry finds the lease lost. clock_timestamp(), declared STABLE: Citus
-- refuses a VOLATILE function in an UPDATE or DELETE of a distributed table,
-- and evaluates a STABLE one once, when the statement starts
-- (docs/operations.md, "Outgrowing one PostgreSQL: Citus"). SQL, not an
-- alias of the C function: the install without the library is run by a
-- database owner, who may not use LANGUAGE internal. A STABLE function with
-- a VOLATILE body is never inlined, so it is called per row.
CREATE FUNCTION lease._now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pg_catalog.clock_timestamp();

COMMENT ON FUNCTION lease._now() IS
    'Internal: clock_timestamp(), declared STABLE so that statements on a distributed install may read it.';
