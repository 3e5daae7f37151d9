-- An attached row's outcome written back to its table row.
--
-- attach(..., on_dead => 'status = ''FAILED''', on_cancel => 'status =
-- ''cancelled''') makes a dead letter or a cancel of an attached row visible
-- in the domain: in the same transaction that moves the lease row to dead or
-- cancelled, the table row gets that SET list (if it still matches the
-- pending predicate). Usually that moves it out of the predicate, so its
-- lease row goes too, and the domain is the one place to look and to retry
-- from (move the row back into the predicate).
--
-- Trust: the SET list is the table owner's SQL, and so is whatever the
-- UPDATE fires (triggers, defaults, constraints). It runs only inside a
-- function lease.attach creates as the table owner, SECURITY DEFINER, which
-- the extension calls after checking, on every call, that it still is the
-- owner's and still SECURITY DEFINER. Background workers never call it: the
-- reaper leaves the expired leases of such queues to the next claim on the
-- queue, which runs in a worker's session.
--
-- Lock order: the table row before its lease row, as lease.fence and every
-- writer of the table take them; release, release_batch, cancel and the
-- claim-time reap of such queues lock the table rows first.

-- The function that applies ON_DEAD/ON_CANCEL to table REL's row with key
-- $1 for outcome $2 ('dead' or 'cancelled'). Runs as the caller of
-- lease.attach (it must own the table), in the table's schema; a LANGUAGE sql
-- body is parsed here, so a bad SET list fails attach (42601, 42703).
CREATE FUNCTION lease._create_outcome_function(
    rel regclass, key_col name, pending text, on_dead text, on_cancel text
) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nsp name;
    fn text;
    key_type text;
    body text := '';
BEGIN
    SELECT n.nspname, format('%I.%I', n.nspname, left(c.relname || '_pg_lease_outcome', 63)),
           format_type(a.atttypid, NULL)
      INTO nsp, fn, key_type
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = key_col
     WHERE c.oid = rel;
    IF on_dead IS NOT NULL THEN
        body := body || format('UPDATE %s SET %s WHERE %I = $1::%s AND $2 = ''dead'' AND (%s);',
                               rel, on_dead, key_col, key_type, pending);
    END IF;
    IF on_cancel IS NOT NULL THEN
        body := body || format('UPDATE %s SET %s WHERE %I = $1::%s AND $2 = ''cancelled'' AND (%s);',
                               rel, on_cancel, key_col, key_type, pending);
    END IF;
    -- The caller's search_path is the one the SET lists were written for.
    EXECUTE format('CREATE FUNCTION %s(key text, outcome text) RETURNS void
                    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS %L',
                   fn, body);
    EXECUTE format('REVOKE ALL ON FUNCTION %s(text, text) FROM PUBLIC', fn);
    EXECUTE format('COMMENT ON FUNCTION %s(text, text) IS %L', fn,
                   format('pg_lease: writes the outcome of a lease of %s back to its row (attach on_dead/on_cancel). Dropped by lease.detach.', rel));
    RETURN format('%s(text, text)', fn)::regprocedure;
END
$$;

COMMENT ON FUNCTION lease._create_outcome_function(regclass, name, text, text, text) IS
$$Internal part of lease.attach: creates, as the caller, the SECURITY DEFINER function <table>_pg_lease_outcome(key,
outcome) in the table's schema that applies ON_DEAD or ON_CANCEL to a row still matching PENDING.$$;

-- Called by the trigger below as the extension owner: the function must
-- still be the table owner's and SECURITY DEFINER, or it would run as us.
CREATE FUNCTION lease._outcome_function(queue text) RETURNS regproc
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a lease.attachment;
BEGIN
    SELECT * INTO a FROM lease.attachment t WHERE t.queue = _outcome_function.queue;
    IF a.outcome_function IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_proc p JOIN pg_class c ON c.oid = a.rel
                    WHERE p.oid = a.outcome_function AND p.prosecdef AND p.proowner = c.relowner) THEN
        RAISE EXCEPTION 'the outcome function of % is gone, or no longer SECURITY DEFINER and owned by the table''s owner', a.rel
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Detach and attach the table again.';
    END IF;
    RETURN a.outcome_function::oid::regproc;
END
$$;

COMMENT ON FUNCTION lease._outcome_function(text) IS
    'Internal: the on_dead/on_cancel function of the table attached to QUEUE, NULL if none; raises 55000 if it was dropped or altered.';

CREATE FUNCTION lease._job_finished() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn constant regproc := lease._outcome_function(NEW.queue);
BEGIN
    IF fn IS NOT NULL THEN
        EXECUTE format('SELECT %s($1, $2)', fn) USING NEW.key, NEW.state::text;
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease._job_finished() IS
    'Internal trigger function on lease.job: a row of an attached table with on_dead/on_cancel that became dead or cancelled gets its SET list applied to the table row.';

-- OF finished_at, not OF state: every UPDATE that makes a row dead or
-- cancelled sets finished_at, and claims and renewals never do, so they skip
-- the trigger before its WHEN is read. PostgreSQL parses and prepares a
-- trigger's WHEN once per statement that may fire it: ~32,000 instructions
-- on every claim (benches/README: batch 1, the callgrind table).
-- attach_outcomes.rs walks every path to dead and cancelled.
CREATE TRIGGER pg_lease_outcome AFTER UPDATE OF finished_at ON lease.job
FOR EACH ROW
WHEN (NEW.state IN ('dead', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state AND NEW.key IS NOT NULL)
EXECUTE FUNCTION lease._job_finished();

-- Locks the table rows of those of IDS that belong to attached tables (only
-- tables with an outcome function if OUTCOME_ONLY), in key order, FOR NO KEY
-- UPDATE, skipping rows others hold if SKIP_LOCKED. Returns the ids whose
-- table rows this transaction now holds.
CREATE FUNCTION lease._lock_attached_rows(ids bigint[], outcome_only boolean DEFAULT false,
                                          skip_locked boolean DEFAULT false)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target record;
    locked_keys text[];
    locked bigint[] := '{}';
BEGIN
    FOR target IN
        SELECT a.queue, a.rel, c.attname, format_type(c.atttypid, NULL) AS type, array_agg(j.key) AS keys
          FROM lease.job j
          JOIN lease.attachment a ON a.queue = j.queue
          JOIN pg_attribute c ON c.attrelid = a.rel AND c.attnum = a.key_attnum
         WHERE j.id = ANY (ids) AND (NOT outcome_only OR a.outcome_function IS NOT NULL)
           AND c.attname = lease._attached_key_column(a.queue, a.rel)
         GROUP BY a.queue, a.rel, c.attname, c.atttypid
    LOOP
        -- The key type is one attach supports, so = and the cast are built in.
        EXECUTE format('SELECT array_agg(l.k) FROM (SELECT t.%1$I::text AS k FROM %2$s t WHERE t.%1$I = ANY ($1::%3$s[])
                         ORDER BY t.%1$I FOR NO KEY UPDATE %4$s) l',
                       target.attname, target.rel, target.type, CASE WHEN skip_locked THEN 'SKIP LOCKED' END)
          INTO locked_keys USING target.keys;
        locked := locked || ARRAY(SELECT j.id FROM lease.job j
                                   WHERE j.queue = target.queue AND j.key = ANY (locked_keys) AND j.id = ANY (ids));
    END LOOP;
    RETURN locked;
END
$$;

COMMENT ON FUNCTION lease._lock_attached_rows(bigint[], boolean, boolean) IS
$$Internal: locks the table rows of the attached-table rows among IDS (with OUTCOME_ONLY, only of tables with
on_dead/on_cancel) FOR NO KEY UPDATE in key order, SKIP LOCKED if asked; returns the ids whose table rows are
now locked. The lock order of lease.fence: table row, then lease row.$$;

-- The reaper leaves expired leases of tables with an outcome function to
-- this, run by claim_pending in a worker's session: it locks the table rows
-- first (skipping those a writer holds; the next claim retries them) and
-- reaps only those.
CREATE FUNCTION lease._reap_with_outcomes(queue text, max_rows integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
BEGIN
    ids := ARRAY(SELECT j.id FROM lease.job j
                  WHERE j.queue = _reap_with_outcomes.queue AND j.state = 'leased'
                    AND j.lease_until <= clock_timestamp()
                  ORDER BY j.lease_until LIMIT max_rows);
    IF cardinality(ids) > 0 THEN
        PERFORM lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled)
           FROM lease._reap(max_rows, _reap_with_outcomes.queue, lease._lock_attached_rows(ids, true, true)) r;
    END IF;
END
$$;

COMMENT ON FUNCTION lease._reap_with_outcomes(text, integer) IS
    'Internal: reaps up to MAX_ROWS expired leases of QUEUE, an attached table with on_dead/on_cancel, table rows locked first; called by claim_pending.';
