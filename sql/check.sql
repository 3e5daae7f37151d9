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

CREATE FUNCTION lease.valid_ttl(ttl interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(ttl > interval '0' AND ttl <= interval '1 day', false);

COMMENT ON FUNCTION lease.valid_ttl(interval) IS
    'Internal: whether 0 < ttl <= 1 day (false for NULL).';

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
        RAISE EXCEPTION 'ttl must be greater than 0 and at most 1 day (got %)', ttl
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Renew long work with lease.renew instead of taking a long lease.';
    END IF;
    RETURN ttl;
END
$$;

COMMENT ON FUNCTION lease.checked_ttl(interval) IS
    'Internal: returns ttl, or raises 22004 if NULL, 22023 unless 0 < ttl <= 1 day.';

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
CREATE FUNCTION lease.next_state(outcome text, cancel_requested boolean, attempt integer, max_attempts integer)
RETURNS lease.job_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN outcome = 'done' THEN 'done'
    WHEN outcome = 'fail' THEN 'dead'
    -- Cancel intent wins over every way back to pending.
    WHEN cancel_requested THEN 'cancelled'
    WHEN outcome = 'retry' AND attempt >= max_attempts THEN 'dead'
    ELSE 'pending'
END::lease.job_state;

COMMENT ON FUNCTION lease.next_state(text, boolean, integer, integer) IS
    'Internal: the state a leased row moves to for outcome done/retry/fail/abandon, given its cancel flag and attempts.';

-- Exponential backoff after the given attempt: base * 2^(attempt-1), capped.
CREATE FUNCTION lease.backoff(attempt integer, base interval, cap interval) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(cap, base * power(2, least(greatest(attempt - 1, 0), 40)));

COMMENT ON FUNCTION lease.backoff(integer, interval, interval) IS
    'Internal: delay before the next attempt, base * 2^(attempt-1) capped at cap.';
