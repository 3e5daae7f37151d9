-- An attached row's outcome written back to its table row.
--
-- attach(..., on_dead => 'status = ''FAILED''', on_cancel => 'status =
-- ''cancelled''') makes a dead letter or a cancel of an attached row visible
-- in the domain: the table row gets that SET list (if it still matches the
-- pending predicate). Usually that moves it out of the predicate, so its
-- lease row goes too, and the domain is the one place to look and to retry
-- from (move the row back into the predicate).
--
-- Trust: the SET list is the table owner's SQL, and so is whatever its
-- UPDATE runs (triggers, deferred constraint triggers, defaults, checks,
-- index expressions, policies). None of it may run in a transaction or a
-- session of anyone but the owner: SECURITY DEFINER switches current_user
-- only while the function runs, while session settings, deferred trigger
-- events and pg_lease's idea of the calling role outlive it. So the
-- transaction that makes a row dead or cancelled (a worker's release, an
-- admin's cancel, a reap) only records a write-back in lease.write_back and
-- touches nothing of the table; lease.apply_write_backs applies them, and
-- only in a session that logged in as the table's owner: with the library a
-- background worker of its own per owner and database (write_back.rs),
-- logged in as that role (or, for a role that may not log in, turned into
-- it and kept in a security-restricted operation); without it, the owner's
-- own scheduler.
--
-- Each write-back is applied once: it is deleted in the transaction that
-- applies it, and dropped unapplied if its key has work again by then
-- (requeued, or a new row). One that fails keeps its error and is tried
-- again with backoff (lease.write_backs lists them).

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

-- Called where a write-back is applied: the function must still be the
-- table owner's and SECURITY DEFINER, or it would run as us.
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

CREATE TABLE lease.write_back (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key         text NOT NULL,
    outcome     lease.job_state NOT NULL CHECK (outcome IN ('dead', 'cancelled')),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts    integer NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error  text
);

CREATE INDEX write_back_queue ON lease.write_back (queue);

COMMENT ON TABLE lease.write_back IS
    'on_dead/on_cancel write-backs recorded and not yet applied to their table rows (read them through lease.write_backs).';

-- Runs in the transaction that makes the row dead or cancelled, whoever's
-- that is: it records, and runs nothing of the table owner's.
CREATE FUNCTION lease._job_finished() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM lease.attachment a WHERE a.queue = NEW.queue AND a.outcome_function IS NOT NULL) THEN
        INSERT INTO lease.write_back (queue, key, outcome) VALUES (NEW.queue, NEW.key, NEW.state);
        PERFORM lease._reaper_touch();
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease._job_finished() IS
    'Internal trigger function on lease.job: records the write-back of a row of an attached table with on_dead/on_cancel that became dead or cancelled.';

-- OF finished_at, not OF state: every UPDATE that makes a row dead or
-- cancelled sets finished_at, and claims and renewals never do, so they skip
-- the trigger before its WHEN is read. PostgreSQL parses and prepares a
-- trigger's WHEN once per statement that may fire it: ~32,000 instructions
-- on every claim (docs/archive/performance-history.md, the callgrind table).
-- attach_outcomes.rs walks every path to dead and cancelled.
CREATE TRIGGER pg_lease_outcome AFTER UPDATE OF finished_at ON lease.job
FOR EACH ROW
WHEN (NEW.state IN ('dead', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state AND NEW.key IS NOT NULL)
EXECUTE FUNCTION lease._job_finished();

-- The role whose write-backs this session may apply: the session user, if
-- it acts as itself. INVOKER is lease.apply_write_backs' current_user, so a
-- call under SET ROLE or from another role's SECURITY DEFINER function is
-- refused.
CREATE FUNCTION lease._write_back_owner(invoker name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF invoker IS DISTINCT FROM session_user OR current_setting('role') <> 'none' THEN
        RAISE EXCEPTION 'write-backs are applied only in a session that logged in as the table''s owner'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Session user "%s", acting as "%s".', session_user, invoker),
                  HINT = 'Connect as the owner of the attached table, without SET ROLE.';
    END IF;
    RETURN (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user);
END
$$;

COMMENT ON FUNCTION lease._write_back_owner(name) IS
    'Internal: the oid of the session user if INVOKER (the current_user of lease.apply_write_backs) is that user and no SET ROLE is in force; else 42501.';

-- Takes up to MAX_ROWS due write-backs of tables the session user owns,
-- locked until commit (a concurrent applier skips them), and pushes each
-- one's next try back first: one that keeps failing, or takes its process
-- down, is not retried in a tight loop.
CREATE FUNCTION lease._take_write_backs(invoker name, max_rows integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    n constant integer := lease._checked_limit(max_rows);
BEGIN
    RETURN QUERY
    UPDATE lease.write_back w
       SET attempts = w.attempts + 1,
           next_try_at = clock_timestamp() + lease._backoff(w.attempts + 1, '1 second', '10 minutes')
     WHERE w.id = ANY (ARRAY(SELECT d.id
                               FROM lease.write_back d
                               JOIN lease.attachment a ON a.queue = d.queue
                               JOIN pg_class c ON c.oid = a.rel
                              WHERE c.relowner = owner AND d.next_try_at <= clock_timestamp()
                              ORDER BY d.next_try_at, d.id
                              LIMIT n
                                FOR UPDATE OF d SKIP LOCKED))
    RETURNING w.id;
END
$$;

COMMENT ON FUNCTION lease._take_write_backs(name, integer) IS
    'Internal part of lease.apply_write_backs: locks up to MAX_ROWS due write-backs of tables the session user owns, counts an attempt on each and returns their ids.';

-- What applying write-back ID takes, for lease.apply_write_backs to run in
-- its own frame, as the table's owner: nothing of the owner's (its table, its
-- function, the operators and settings they might bring) runs in a frame of
-- the extension owner's. Both statements are built here, under this
-- function's search_path, so every name in them is qualified.
CREATE FUNCTION lease._write_back_target(invoker name, id bigint)
RETURNS TABLE (lock_sql text, apply_sql text, key text, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    w lease.write_back;
    target record;
    fn regproc;
BEGIN
    SELECT * INTO w FROM lease.write_back b WHERE b.id = _write_back_target.id;
    SELECT a.rel, c.relowner, c.relkind, format_type(k.atttypid, NULL) AS key_type,
           lease._attached_key_column(a.queue, a.rel) AS key_col
      INTO target
      FROM lease.attachment a
      JOIN pg_class c ON c.oid = a.rel
      JOIN pg_attribute k ON k.attrelid = a.rel AND k.attnum = a.key_attnum
     WHERE a.queue = w.queue;
    IF w.id IS NULL OR target.rel IS NULL THEN
        RETURN;
    END IF;
    IF target.relowner <> owner THEN
        RAISE EXCEPTION 'write-back % is for table %, which role "%" does not own', id, target.rel, session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF target.relkind NOT IN ('r', 'p') OR target.key_col IS NULL THEN
        RAISE EXCEPTION '% is no longer a table with the key attach saw', target.rel
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Detach it.';
    END IF;
    fn := lease._outcome_function(w.queue);
    IF fn IS NULL THEN
        DELETE FROM lease.write_back b WHERE b.id = w.id;
        RETURN;
    END IF;
    -- The key type is one attach supports, so = and the cast are built in.
    lock_sql := format('SELECT FROM %s t WHERE t.%I OPERATOR(pg_catalog.=) $1::%s FOR NO KEY UPDATE OF t',
                       target.rel, target.key_col, target.key_type);
    apply_sql := format('SELECT %s($1, $2)', fn);
    key := w.key;
    outcome := w.outcome::text;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION lease._write_back_target(name, bigint) IS
$$Internal part of lease.apply_write_backs: the statements that lock the table row of write-back ID and apply
its on_dead/on_cancel function (with their arguments), for the table's owner to run; no row if the write-back
is gone (or deleted here, its table having no outcome function any more). 42501 unless the session user owns the table and acts as itself; 55000 if the table is no longer a
table, or its outcome function is gone or altered.$$;

-- Called once the table row is locked (the lock order of lease.fence and of
-- every writer of the table: table row, then lease row): locks the key's
-- lease row FOR SHARE until commit, so that no requeue slips in between this
-- check and the write.
CREATE FUNCTION lease._write_back_wanted(invoker name, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    w lease.write_back;
BEGIN
    SELECT b.* INTO w
      FROM lease.write_back b
      JOIN lease.attachment a ON a.queue = b.queue
      JOIN pg_class c ON c.oid = a.rel
     WHERE b.id = _write_back_wanted.id AND c.relowner = owner;
    IF w.id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM FROM lease.job j WHERE j.queue = w.queue AND j.key = w.key FOR SHARE;
    -- Work again under this key (requeued, or a new row) is not undone.
    IF EXISTS (SELECT FROM lease.job j
                WHERE j.queue = w.queue AND j.key = w.key AND j.state IN ('pending', 'leased')) THEN
        DELETE FROM lease.write_back b WHERE b.id = w.id;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease._write_back_wanted(name, bigint) IS
$$Internal part of lease.apply_write_backs, after the table row is locked: locks the key's lease row and says
whether write-back ID is still to be applied; deletes it, unapplied, if its key has work again. Acts only on
tables the session user owns.$$;

CREATE FUNCTION lease._write_back_applied(invoker name, id bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
BEGIN
    DELETE FROM lease.write_back w
     WHERE w.id = _write_back_applied.id
       AND EXISTS (SELECT FROM lease.attachment a JOIN pg_class c ON c.oid = a.rel
                    WHERE a.queue = w.queue AND c.relowner = owner);
END
$$;

COMMENT ON FUNCTION lease._write_back_applied(name, bigint) IS
    'Internal part of lease.apply_write_backs: deletes write-back ID, applied, of a table the session user owns.';

CREATE FUNCTION lease._write_back_failed(invoker name, id bigint, error text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
BEGIN
    UPDATE lease.write_back w SET last_error = left(error, 2000)
     WHERE w.id = _write_back_failed.id
       AND EXISTS (SELECT FROM lease.attachment a JOIN pg_class c ON c.oid = a.rel
                    WHERE a.queue = w.queue AND c.relowner = owner);
END
$$;

COMMENT ON FUNCTION lease._write_back_failed(name, bigint, text) IS
    'Internal part of lease.apply_write_backs: records ERROR on write-back ID of a table the session user owns.';

-- SECURITY INVOKER: it runs as the table's owner, and so does everything of
-- the owner's it calls: the lock of the table row, the outcome function, and
-- the deferred triggers that the owner's UPDATE queued, which fire here
-- inside the block that catches what they raise (left for the commit, they
-- would fire as whoever commits). The parts that change pg_lease's tables
-- are SECURITY DEFINER functions that run nothing of the owner's.
CREATE FUNCTION lease.apply_write_backs(max_rows integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    me constant name := current_user;
    w bigint;
    target record;
    handled integer := 0;
    problem text;
BEGIN
    FOR w IN SELECT * FROM lease._take_write_backs(me, max_rows) LOOP
        BEGIN
            SELECT * INTO target FROM lease._write_back_target(me, w);
            IF FOUND THEN
                EXECUTE target.lock_sql USING target.key;
                IF lease._write_back_wanted(me, w) THEN
                    EXECUTE target.apply_sql USING target.key, target.outcome;
                    PERFORM lease._write_back_applied(me, w);
                END IF;
            END IF;
            SET CONSTRAINTS ALL IMMEDIATE;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            PERFORM lease._write_back_failed(me, w, format('%s: %s', SQLSTATE, problem));
        END;
        handled := handled + 1;
    END LOOP;
    RETURN handled;
END
$$;

COMMENT ON FUNCTION lease.apply_write_backs(integer) IS
$$Applies up to MAX_ROWS due on_dead/on_cancel write-backs (see lease.attach) of the tables the session user
owns and returns how many it handled. Each runs in a subtransaction of its own, with the deferred constraints of
its UPDATE checked at once; one that fails keeps its error (lease.write_backs) and is tried again after a
backoff (1 s, doubling to 10 min). With the library a background worker calls it as each table's owner; without
it, call it as the owner from a scheduler (pg_cron, or the client's Sweeper connected as the owner). It must run
in a session that logged in as the owner, without SET ROLE: the owner's code never runs in another role's
session. Leaves SET CONSTRAINTS ALL IMMEDIATE in force for the rest of the transaction.
Errors: 42501 called under SET ROLE or from another role's function; 22004/22023 max_rows NULL or outside
1..10000.$$;

-- The owners with due write-backs, for the background worker. Only those
-- that may call lease.apply_write_backs: another would fail every pass.
CREATE FUNCTION lease._write_back_owners() RETURNS SETOF oid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT DISTINCT c.relowner
      FROM lease.write_back w
      JOIN lease.attachment a ON a.queue = w.queue
      JOIN pg_class c ON c.oid = a.rel
     WHERE w.next_try_at <= clock_timestamp()
       AND has_schema_privilege(c.relowner, 'lease', 'USAGE')
       AND has_function_privilege(c.relowner, 'lease.apply_write_backs(integer)', 'EXECUTE');
END;

COMMENT ON FUNCTION lease._write_back_owners() IS
    'Internal: the roles that own attached tables with due write-backs and may apply them (lease.apply_write_backs).';

-- Locks the table rows of those of IDS that belong to attached tables, in
-- key order, FOR NO KEY UPDATE. Returns the ids whose table rows this
-- transaction now holds. Called by lease.fence, as the extension owner: the
-- reads of the tables run as their owners (lease._lock_table_rows).
CREATE FUNCTION lease._lock_attached_rows(ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target record;
    locked_keys text[];
    locked bigint[] := '{}';
BEGIN
    FOR target IN
        SELECT a.queue, a.rel, c.attname, array_agg(j.key) AS keys
          FROM lease.job j
          JOIN lease.attachment a ON a.queue = j.queue
          JOIN pg_attribute c ON c.attrelid = a.rel AND c.attnum = a.key_attnum
         WHERE j.id = ANY (ids)
           AND c.attname = lease._attached_key_column(a.queue, a.rel)
         GROUP BY a.queue, a.rel, c.attname
    LOOP
        locked_keys := lease._lock_table_rows(target.rel, target.attname, target.keys);
        locked := locked || ARRAY(SELECT j.id FROM lease.job j
                                   WHERE j.queue = target.queue AND j.key = ANY (locked_keys) AND j.id = ANY (ids));
    END LOOP;
    RETURN locked;
END
$$;

COMMENT ON FUNCTION lease._lock_attached_rows(bigint[]) IS
$$Internal: locks the table rows of the attached-table rows among IDS FOR NO KEY UPDATE, in key order, each
table's as its owner (lease._lock_table_rows); returns the ids whose table rows are now locked. The lock
order of lease.fence: table row, then lease row.$$;
