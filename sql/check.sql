-- Argument checks shared by the public functions. They run inside the
-- SECURITY DEFINER callers, whose search_path is already pinned, and are not
-- granted to anyone; so they carry no SET clause of their own (it would cost a
-- GUC save/restore on every claim). Each returns its argument
-- (so it can be used as a cheap simple expression in a DECLARE block) or
-- raises the documented SQLSTATE:
--   22004 null_value_not_allowed   a required argument is NULL
--   22023 invalid_parameter_value  an argument is out of its documented range
--   42704 undefined_object         the queue does not exist
--
-- So every public function opens the same way: SECURITY DEFINER, the pinned
-- search_path, and its arguments checked into constants in DECLARE; and the
-- checked_* functions below share one shape (NULL first, then the rule, each
-- with its own message). The duplicates tool pairs these openings and
-- shapes; they are the convention, not copies to fold into one.

-- The rules themselves, as SQL expressions the planner inlines: the hot
-- paths (claim_pending, renew, release) test them in one IF and call the
-- raising checks below only when one fails, so each rule is written once.
CREATE FUNCTION lease._valid_owner(owner text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(owner <> '' AND length(owner) <= 256, false);

COMMENT ON FUNCTION lease._valid_owner(text) IS
    'Internal: whether owner is 1 to 256 characters long (false for NULL).';

-- Intervals are checked by the time they add, not by interval comparison:
-- comparison counts a month as 30 days, so '1000 years -359999 days'
-- compares equal to one day yet adds 5,242 days to a timestamp. A month
-- part is refused outright, since what it adds depends on the date.
CREATE FUNCTION lease._valid_ttl(ttl interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', ttl) > 0 AND date_part('epoch', ttl) <= 86400
                AND date_part('year', ttl) = 0 AND date_part('month', ttl) = 0, false);

COMMENT ON FUNCTION lease._valid_ttl(interval) IS
    'Internal: whether ttl adds more than 0 and at most 86400 seconds, with no month part (false for NULL).';

CREATE FUNCTION lease._valid_span(span interval, longest interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', span) >= 0 AND date_part('epoch', span) <= date_part('epoch', longest)
                AND date_part('year', span) = 0 AND date_part('month', span) = 0, false);

COMMENT ON FUNCTION lease._valid_span(interval, interval) IS
    'Internal: whether span is finite, without a month part, and between 0 and longest seconds (false for NULL).';

CREATE FUNCTION lease._valid_time(t timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NULL OR isfinite(t);

COMMENT ON FUNCTION lease._valid_time(timestamptz) IS
    'Internal: whether an optional time is NULL or finite (''infinity'' and ''-infinity'' are not).';

CREATE FUNCTION lease._valid_limit(n integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(n BETWEEN 1 AND 10000, false);

COMMENT ON FUNCTION lease._valid_limit(integer) IS
    'Internal: whether 1 <= n <= 10000 (false for NULL).';

CREATE FUNCTION lease._valid_outcome(outcome text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(outcome IN ('done', 'retry', 'fail', 'abandon'), false);

COMMENT ON FUNCTION lease._valid_outcome(text) IS
    'Internal: whether outcome is done, retry, fail or abandon (false for NULL).';

CREATE FUNCTION lease._checked_owner(owner text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF owner IS NULL THEN
        RAISE EXCEPTION 'owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_owner(owner) THEN
        RAISE EXCEPTION 'owner must be 1 to 256 characters long (got %)', length(owner)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN owner;
END
$$;

COMMENT ON FUNCTION lease._checked_owner(text) IS
    'Internal: returns owner, or raises 22004 if NULL, 22023 if empty or longer than 256 characters.';

CREATE FUNCTION lease._checked_ttl(ttl interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'ttl must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_ttl(ttl) THEN
        RAISE EXCEPTION 'ttl must be greater than 0 and at most 1 day, without months (got %)', ttl
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Renew long work with lease.renew instead of taking a long lease.';
    END IF;
    RETURN ttl;
END
$$;

COMMENT ON FUNCTION lease._checked_ttl(interval) IS
    'Internal: returns ttl, or raises 22004 if NULL, 22023 unless it adds more than 0 and at most 1 day (no months).';

CREATE FUNCTION lease._checked_time(t timestamptz, what text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF NOT lease._valid_time(t) THEN
        RAISE EXCEPTION '% must be a finite time (got %)', what, t USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN t;
END
$$;

COMMENT ON FUNCTION lease._checked_time(timestamptz, text) IS
    'Internal: returns t, or raises 22023 naming the argument when it is infinity or -infinity.';

CREATE FUNCTION lease._checked_span(span interval, longest interval, what text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF span IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_span(span, longest) THEN
        RAISE EXCEPTION '% must be between 0 and %, without months (got %)', what, longest, span
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN span;
END
$$;

COMMENT ON FUNCTION lease._checked_span(interval, interval, text) IS
    'Internal: returns span, or raises 22004 if NULL, 22023 unless it is finite, has no month part and lies in [0, longest].';

CREATE FUNCTION lease._checked_limit(n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF n IS NULL THEN
        RAISE EXCEPTION 'limit must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_limit(n) THEN
        RAISE EXCEPTION 'limit must be between 1 and 10000 (got %)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END
$$;

COMMENT ON FUNCTION lease._checked_limit(integer) IS
    'Internal: returns n, or raises 22004 if NULL, 22023 unless 1 <= n <= 10000.';

CREATE FUNCTION lease._checked_queue(queue text) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM lease.queue q WHERE q.name = _checked_queue.queue) THEN
        PERFORM lease._no_such_queue(queue);
    END IF;
    RETURN queue;
END
$$;

COMMENT ON FUNCTION lease._checked_queue(text) IS
    'Internal: returns queue, or raises 22004 if NULL, 42704 if no such queue exists.';

-- The one answer for a queue that does not exist, and for a restricted one
-- to a role that holds no right on it (access.sql): a role must not learn
-- which names the restricted queues have.
CREATE FUNCTION lease._no_such_queue(queue text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    RAISE EXCEPTION 'queue "%" does not exist', queue
        USING ERRCODE = 'undefined_object',
              HINT = 'Create it with lease.create_queue(); a restricted queue exists only for the roles granted on it.';
END
$$;

COMMENT ON FUNCTION lease._no_such_queue(text) IS
    'Internal: raises 42704, queue QUEUE does not exist (also for a restricted queue the caller holds no right on).';

CREATE FUNCTION lease._checked_not_null(value anyelement, what text) RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN value;
END
$$;

COMMENT ON FUNCTION lease._checked_not_null(anyelement, text) IS
    'Internal: returns value, or raises 22004 naming the argument when it is NULL.';

CREATE FUNCTION lease._checked_same_length(ids bigint[], epochs bigint[]) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF ids IS NULL OR epochs IS NULL THEN
        RAISE EXCEPTION 'ids and epochs must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(ids) <> cardinality(epochs) THEN
        RAISE EXCEPTION 'ids has % elements, epochs has %', cardinality(ids), cardinality(epochs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(ids) > 10000 THEN
        RAISE EXCEPTION 'at most 10000 leases per call (got %)', cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(ids, NULL) IS NOT NULL OR array_position(epochs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ids and epochs must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN cardinality(ids);
END
$$;

COMMENT ON FUNCTION lease._checked_same_length(bigint[], bigint[]) IS
    'Internal: returns the length of ids, or raises 22004 for NULL arrays/elements, 22023 for unequal lengths or more than 10000 elements.';

CREATE FUNCTION lease._checked_outcome(outcome text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF outcome IS NULL THEN
        RAISE EXCEPTION 'outcome must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_outcome(outcome) THEN
        RAISE EXCEPTION 'outcome must be one of done, retry, fail, abandon (got "%")', outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN outcome;
END
$$;

COMMENT ON FUNCTION lease._checked_outcome(text) IS
    'Internal: returns outcome, or raises 22004 if NULL, 22023 unless done/retry/fail/abandon.';

CREATE FUNCTION lease._checked_name(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF name = '' OR length(name) > 128 THEN
        RAISE EXCEPTION 'name must be 1 to 128 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN name;
END
$$;

COMMENT ON FUNCTION lease._checked_name(text) IS
    'Internal: returns name, or raises 22004 if NULL, 22023 if empty or longer than 128 characters.';
