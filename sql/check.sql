-- Argument checks shared by the public functions. They run inside the
-- SECURITY DEFINER callers, whose search_path is already pinned, and are not
-- granted to anyone; so they carry no SET clause of their own (it would cost a
-- GUC save/restore on every claim). Each returns its argument
-- (so it can be used as a cheap simple expression in a DECLARE block) or
-- raises the documented SQLSTATE:
--   22004 null_value_not_allowed   a required argument is NULL
--   22023 invalid_parameter_value  an argument is out of its documented range
--   42704 undefined_object         the queue does not exist

-- The rules themselves, as SQL expressions the planner inlines: the hot
-- paths (claim_pending, renew, release) test them in one IF and call the
-- raising checks below only when one fails, so each rule is written once.
CREATE FUNCTION lease.valid_owner(owner text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(owner <> '' AND length(owner) <= 256, false);

COMMENT ON FUNCTION lease.valid_owner(text) IS
    'Internal: whether owner is 1 to 256 characters long (false for NULL).';

-- Intervals are checked by the time they add, not by interval comparison:
-- comparison counts a month as 30 days, so '1000 years -359999 days'
-- compares equal to one day yet adds 5,242 days to a timestamp. A month
-- part is refused outright, since what it adds depends on the date.
CREATE FUNCTION lease.valid_ttl(ttl interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', ttl) > 0 AND date_part('epoch', ttl) <= 86400
                AND date_part('year', ttl) = 0 AND date_part('month', ttl) = 0, false);

COMMENT ON FUNCTION lease.valid_ttl(interval) IS
    'Internal: whether ttl adds more than 0 and at most 86400 seconds, with no month part (false for NULL).';

CREATE FUNCTION lease.valid_span(span interval, longest interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', span) >= 0 AND date_part('epoch', span) <= date_part('epoch', longest)
                AND date_part('year', span) = 0 AND date_part('month', span) = 0, false);

COMMENT ON FUNCTION lease.valid_span(interval, interval) IS
    'Internal: whether span is finite, without a month part, and between 0 and longest seconds (false for NULL).';

CREATE FUNCTION lease.valid_time(t timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NULL OR isfinite(t);

COMMENT ON FUNCTION lease.valid_time(timestamptz) IS
    'Internal: whether an optional time is NULL or finite (''infinity'' and ''-infinity'' are not).';

CREATE FUNCTION lease.valid_limit(n integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(n BETWEEN 1 AND 10000, false);

COMMENT ON FUNCTION lease.valid_limit(integer) IS
    'Internal: whether 1 <= n <= 10000 (false for NULL).';

CREATE FUNCTION lease.valid_outcome(outcome text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(outcome IN ('done', 'retry', 'fail', 'abandon'), false);

COMMENT ON FUNCTION lease.valid_outcome(text) IS
    'Internal: whether outcome is done, retry, fail or abandon (false for NULL).';

CREATE FUNCTION lease.checked_owner(owner text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF owner IS NULL THEN
        RAISE EXCEPTION 'owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease.valid_owner(owner) THEN
        RAISE EXCEPTION 'owner must be 1 to 256 characters long (got %)', length(owner)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN owner;
END
$$;

COMMENT ON FUNCTION lease.checked_owner(text) IS
    'Internal: returns owner, or raises 22004 if NULL, 22023 if empty or longer than 256 characters.';

CREATE FUNCTION lease.checked_ttl(ttl interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'ttl must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease.valid_ttl(ttl) THEN
        RAISE EXCEPTION 'ttl must be greater than 0 and at most 1 day, without months (got %)', ttl
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Renew long work with lease.renew instead of taking a long lease.';
    END IF;
    RETURN ttl;
END
$$;

COMMENT ON FUNCTION lease.checked_ttl(interval) IS
    'Internal: returns ttl, or raises 22004 if NULL, 22023 unless it adds more than 0 and at most 1 day (no months).';

CREATE FUNCTION lease.checked_time(t timestamptz, what text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF NOT lease.valid_time(t) THEN
        RAISE EXCEPTION '% must be a finite time (got %)', what, t USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN t;
END
$$;

COMMENT ON FUNCTION lease.checked_time(timestamptz, text) IS
    'Internal: returns t, or raises 22023 naming the argument when it is infinity or -infinity.';

CREATE FUNCTION lease.checked_span(span interval, longest interval, what text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF span IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease.valid_span(span, longest) THEN
        RAISE EXCEPTION '% must be between 0 and %, without months (got %)', what, longest, span
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN span;
END
$$;

COMMENT ON FUNCTION lease.checked_span(interval, interval, text) IS
    'Internal: returns span, or raises 22004 if NULL, 22023 unless it is finite, has no month part and lies in [0, longest].';

CREATE FUNCTION lease.checked_limit(n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF n IS NULL THEN
        RAISE EXCEPTION 'limit must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease.valid_limit(n) THEN
        RAISE EXCEPTION 'limit must be between 1 and 10000 (got %)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END
$$;

COMMENT ON FUNCTION lease.checked_limit(integer) IS
    'Internal: returns n, or raises 22004 if NULL, 22023 unless 1 <= n <= 10000.';

CREATE FUNCTION lease.checked_queue(queue text) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM lease.queue q WHERE q.name = checked_queue.queue) THEN
        RAISE EXCEPTION 'queue "%" does not exist', queue
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create it with lease.create_queue().';
    END IF;
    RETURN queue;
END
$$;

COMMENT ON FUNCTION lease.checked_queue(text) IS
    'Internal: returns queue, or raises 22004 if NULL, 42704 if no such queue exists.';

CREATE FUNCTION lease.checked_not_null(value anyelement, what text) RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN value;
END
$$;

COMMENT ON FUNCTION lease.checked_not_null(anyelement, text) IS
    'Internal: returns value, or raises 22004 naming the argument when it is NULL.';

-- What a row becomes when its lease ends with an outcome. One definition for
-- release and for reap (an expired lease counts as outcome ''retry'') so the
-- two paths can never account differently. Inlined by the planner.
CREATE FUNCTION lease.next_state(outcome text, cancel_requested boolean, attempt integer, max_attempts integer,
                                 attached boolean)
RETURNS lease.job_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    -- An attached row is done when its domain row stops matching (the
    -- trigger then removes it). Released as done while it still matches,
    -- it would be neither claimable nor visible: a dead letter says so.
    WHEN outcome = 'done' AND attached THEN 'dead'
    WHEN outcome = 'done' THEN 'done'
    WHEN outcome = 'fail' THEN 'dead'
    -- Cancel intent wins over every way back to pending.
    WHEN cancel_requested THEN 'cancelled'
    WHEN outcome = 'retry' AND attempt >= max_attempts THEN 'dead'
    ELSE 'pending'
END::lease.job_state;

COMMENT ON FUNCTION lease.next_state(text, boolean, integer, integer, boolean) IS
    'Internal: the state a leased row moves to for outcome done/retry/fail/abandon, given its cancel flag, attempts and whether its queue is an attached table''s.';

CREATE FUNCTION lease.stranded_done() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'released as done while its table row still matches the pending predicate: move the row on (that is the completion), or requeue it';

COMMENT ON FUNCTION lease.stranded_done() IS
    'Internal: last_error of an attached row released as done while its domain row still matches.';

-- Exponential backoff after the given attempt: base * 2^(attempt-1), capped.
-- Computed in seconds (double precision) and capped before it becomes an
-- interval, so no attempt count can overflow it: with base 30 s, attempt 40
-- overflowed interval arithmetic (22008) and stopped every sweep.
CREATE FUNCTION lease.backoff(attempt integer, base interval, cap interval) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN make_interval(secs => least(date_part('epoch', cap),
                                   date_part('epoch', base) * power(2::float8, least(greatest(attempt - 1, 0), 60))));

COMMENT ON FUNCTION lease.backoff(integer, interval, interval) IS
    'Internal: delay before the next attempt, base * 2^(attempt-1) capped at cap.';

-- The delay a retry or an expiry actually gets. With 'full' jitter it is
-- uniform in [0, backoff): rows that failed together (a dependency was
-- down) come back spread out instead of in lockstep.
CREATE FUNCTION lease.retry_delay(attempt integer, base interval, cap interval, jitter text) RETURNS interval
LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN CASE WHEN jitter = 'full' THEN lease.backoff(attempt, base, cap) * random()
            ELSE lease.backoff(attempt, base, cap) END;

COMMENT ON FUNCTION lease.retry_delay(integer, interval, interval, text) IS
    'Internal: lease.backoff, times a uniform random factor in [0, 1) with jitter ''full'' (the default of a queue), exact with ''none''.';
