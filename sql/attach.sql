-- Leases on rows of the user's own tables.
--
-- attach(table, pending => 'predicate') gives every row of a domain table
-- for which the predicate holds one lease.job row in a queue of its own,
-- keyed by the row's primary key (as text). From then on the row is claimed,
-- renewed, released, fenced, cancelled and reaped exactly like queue rows.
--
-- The lease state lives beside the domain table, not in it: the domain table
-- gets no columns, only row triggers whose WHEN clauses are the predicate
-- itself, evaluated inline by the executor. A write that does not change the
-- predicate's value (or the key of a matching row) fires nothing and touches
-- no lease.job row; measured with pgbench, see docs/attached-tables.md. When the value
-- changes, lease._attached_row_changed adds or removes that key's job row:
-- rows that start matching become claimable, rows that stop matching (or are
-- deleted) lose their lease at once. TRUNCATE removes them all, DROP TABLE
-- the attachment with its queue, and a renamed key column is followed.
--
-- Trust: the predicate is only ever evaluated with the rights of the role
-- that writes the table (the WHEN clause) or attaches it (the first scan),
-- never with the extension owner's. The trigger function runs as the
-- extension owner, reads nothing of the row but its key, and acts only on
-- the queue attached to the very table it fires on, so a trigger that any
-- role creates on a table of its own cannot reach another queue.

-- The rank (lease.job.rank) of a table's row as SQL over the row ROW_REF,
-- from its order_by column ATTNUM: microseconds since the epoch for times,
-- the value for integers, 0 without a column. NULL if that column is gone or
-- has another type now: the trigger function runs it as the extension owner,
-- so no cast a user could define may be reached (the key's reason too).
CREATE FUNCTION lease._rank_sql(rel oid, attnum smallint, row_ref text) RETURNS text
LANGUAGE sql STABLE
RETURN CASE WHEN attnum IS NULL THEN '0' ELSE (
    SELECT CASE WHEN a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype, 'date'::regtype)
                    THEN format('(date_part(''epoch'', (%s).%I) * 1000000)::bigint', row_ref, a.attname)
                WHEN a.atttypid IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype)
                    THEN format('(%s).%I::bigint', row_ref, a.attname)
           END
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = _rank_sql.rel AND a.attnum = _rank_sql.attnum AND NOT a.attisdropped) END;

COMMENT ON FUNCTION lease._rank_sql(oid, smallint, text) IS
    'Internal: SQL computing lease.job.rank from order_by column ATTNUM of table REL for the row ROW_REF (''0'' without one); NULL if the column is gone or not a time or integer type.';

CREATE FUNCTION lease._attached_row_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := TG_ARGV[0];
    col constant name := lease._attached_key_column(q, TG_RELID);
    k text;
    r bigint;
    rank_sql text;
    st lease.job_state;
    n bigint;
    jid bigint;
BEGIN
    IF col IS NULL THEN
        RAISE EXCEPTION 'trigger "%" on % is not the trigger of an attachment of queue "%"', TG_NAME, TG_RELID::regclass, q
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Only lease.attach creates these triggers; the key column must keep a supported type.';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        FOR st, n IN WITH gone AS (DELETE FROM lease.job j WHERE j.queue = q RETURNING j.state)
                     SELECT g.state, count(*) FROM gone g GROUP BY g.state LOOP
            PERFORM lease._count_moved(q, st, NULL, n);
        END LOOP;
        RETURN NULL;
    END IF;
    IF TG_ARGV[1] IN ('start', 'reorder') THEN
        rank_sql := lease._rank_sql(TG_RELID, (SELECT t.order_attnum FROM lease.attachment t WHERE t.queue = q), '$1');
        IF rank_sql IS NULL THEN
            RAISE EXCEPTION 'the order_by column of % was dropped or retyped', TG_RELID::regclass
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Give it a time or integer type again, or detach and attach the table.';
        END IF;
        EXECUTE format('SELECT ($1).%I::text, %s', col, rank_sql) INTO k, r USING NEW;
    END IF;
    IF TG_ARGV[1] = 'start' THEN
        -- A row that still has a job row (dead or cancelled) keeps it: it
        -- is not new work.
        INSERT INTO lease.job AS j (queue, key, payload, rank, next_at, created_at)
        VALUES (q, k, '{}', r, clock_timestamp(), clock_timestamp())
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING j.id INTO jid;
    ELSIF TG_ARGV[1] = 'reorder' THEN
        UPDATE lease.job j SET rank = r WHERE j.queue = q AND j.key = k RETURNING j.id INTO jid;
    ELSE
        -- Stopped matching (the domain moved on, or the row is gone): the
        -- row is no longer claimable and any lease on it ends now.
        EXECUTE format('SELECT ($1).%I::text', col) INTO k USING OLD;
        DELETE FROM lease.job j WHERE j.queue = q AND j.key = k RETURNING j.state INTO st;
        -- A leased row that stops matching is its job's completion.
        PERFORM lease._count_moved(q, st, NULL, 1, 'done');
    END IF;
    IF TG_ARGV[1] = 'start' AND jid IS NOT NULL THEN
        PERFORM lease._count(q, enqueued => 1, pending => 1), lease._wake(q, 1);
    END IF;
    -- A new row, or a pending one that moved up, may be before the head.
    IF jid IS NOT NULL THEN
        PERFORM lease._lower_heads(ARRAY[jid]);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease._attached_row_changed() IS
$$Internal trigger function of attached tables, arguments (queue, 'start' | 'stop' | 'reorder'): adds the
pending job row of a row that started matching the predicate, removes that of a row that stopped matching,
or updates its rank when its order_by column changed; on TRUNCATE removes them all. Refuses (55000) to act unless it fires on the table attached to that queue.
EXECUTE is granted to lease_admin only so that lease.attach can create the triggers; a trigger function
cannot be called directly.$$;

CREATE FUNCTION lease._attach_triggers(rel regclass, queue text, pending text, key_col name, order_col name)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_in text;
    was_in text;
    key_moved constant text := format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', key_col);
BEGIN
    -- PostgreSQL parses the predicate (as the caller: an unknown column or a
    -- syntax error fails here, 42703 or 42601), and lease._qualified_predicate
    -- prints the parse tree back with the columns qualified by NEW and OLD.
    EXECUTE format('CREATE TEMP VIEW pg_lease_predicate AS SELECT coalesce((%s), false) AS m FROM %s',
                   pending, rel);
    now_in := lease._qualified_predicate('pg_temp.pg_lease_predicate'::regclass, rel, 'new');
    was_in := lease._qualified_predicate('pg_temp.pg_lease_predicate'::regclass, rel, 'old');
    DROP VIEW pg_temp.pg_lease_predicate;
    -- A predicate that a trigger condition cannot hold (a subquery) fails
    -- here: 0A000.
    EXECUTE format('CREATE TRIGGER pg_lease_start AFTER INSERT ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''start'')',
                   rel, now_in, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_stop AFTER DELETE ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''stop'')',
                   rel, was_in, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_update_start AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''start'')',
                   rel, now_in, was_in, key_moved, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_update_stop AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''stop'')',
                   rel, was_in, now_in, key_moved, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''truncate'')',
                   rel, queue);
    IF order_col IS NOT NULL THEN
        -- A matching row whose order_by value changes keeps its lease row
        -- and gets the new rank.
        EXECUTE format('CREATE TRIGGER pg_lease_reorder AFTER UPDATE OF %I ON %s FOR EACH ROW
                        WHEN ((%s) AND (%s) AND NOT (%s) AND OLD.%I IS DISTINCT FROM NEW.%I)
                        EXECUTE FUNCTION lease._attached_row_changed(%L, ''reorder'')',
                       order_col, rel, now_in, was_in, key_moved, order_col, order_col, queue);
    END IF;
END
$$;

COMMENT ON FUNCTION lease._attach_triggers(regclass, text, text, name, name) IS
$$Internal part of lease.attach (and of the 0.1.0 upgrade): creates the triggers of table REL attached to
QUEUE with predicate PENDING (and ORDER_COL, if any, followed by claims), as the caller, who must own the
table. Granted to lease_admin because
lease.attach runs as its caller; the triggers it creates act only for an attached table.$$;

CREATE FUNCTION lease.attach(
    "table"        regclass,
    pending        text,
    queue          text     DEFAULT NULL,
    max_attempts   integer  DEFAULT 25,
    backoff_base   interval DEFAULT '1 second',
    backoff_max    interval DEFAULT '1 hour',
    dead_retention interval DEFAULT '7 days',
    order_by       name     DEFAULT NULL,
    on_dead        text     DEFAULT NULL,
    on_cancel      text     DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := queue;
    key_attnum smallint;
    key_col name;
    key_type regtype;
    order_attnum smallint;
    rank_sql text;
    existing text[];
    ranks bigint[];
    outcome_function regprocedure;
BEGIN
    -- Runs as the caller: creating triggers proves the caller may, and the
    -- predicate is parsed and first evaluated with the caller's rights.
    IF "table" IS NULL OR pending IS NULL THEN
        RAISE EXCEPTION 'table and pending must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM lease._refuse_if_distributed('attach');
    SELECT a.attnum, a.attname, a.atttypid::regtype INTO key_attnum, key_col, key_type
      FROM pg_index i
      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
     WHERE i.indrelid = "table" AND i.indisprimary AND i.indnkeyatts = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % has no single-column primary key', "table"
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'attach needs a primary key of one column of type bigint, integer, smallint, uuid, text or varchar.';
    END IF;
    IF key_type NOT IN ('bigint'::regtype, 'integer', 'smallint', 'uuid', 'text', 'character varying') THEN
        RAISE EXCEPTION 'primary key %.% has type %, which attach does not support', "table", key_col, key_type
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Supported key types: bigint, integer, smallint, uuid, text, varchar.';
    END IF;
    IF q IS NULL THEN
        SELECT c.relname INTO q FROM pg_class c WHERE c.oid = "table";
    END IF;
    IF order_by IS NOT NULL THEN
        SELECT a.attnum INTO order_attnum
          FROM pg_attribute a
         WHERE a.attrelid = "table" AND a.attname = order_by AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'column "%" of % does not exist', order_by, "table" USING ERRCODE = 'undefined_column';
        END IF;
    END IF;
    rank_sql := lease._rank_sql("table", order_attnum, 't');
    IF rank_sql IS NULL THEN
        RAISE EXCEPTION 'order_by column "%" of % must have a time or integer type', order_by, "table"
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Supported: timestamptz, timestamp, date, bigint, integer, smallint.';
    END IF;

    -- Creating the triggers needs the caller to own the table. The lock it
    -- takes (SHARE ROW EXCLUSIVE, until commit) keeps concurrent writes, and
    -- a concurrent attach, out until the triggers and the initial rows are
    -- in place.
    BEGIN
        PERFORM lease._attach_triggers("table", q, pending, key_col, order_by);
    EXCEPTION WHEN duplicate_object THEN
        RAISE EXCEPTION 'table % is already attached', "table" USING ERRCODE = 'duplicate_object';
    END;
    IF on_dead IS NOT NULL OR on_cancel IS NOT NULL THEN
        outcome_function := lease._create_outcome_function("table", key_col, pending, on_dead, on_cancel);
    END IF;
    -- The rows matching now become claimable.
    EXECUTE format('SELECT coalesce(array_agg(t.%I::text), ''{}''), coalesce(array_agg(%s), ''{}'')
                      FROM %s AS t WHERE (%s)', key_col, rank_sql, "table", pending)
       INTO existing, ranks;
    PERFORM lease._attach_register("table", q, key_attnum, order_attnum, pending, max_attempts, backoff_base,
                                   backoff_max, dead_retention, existing, ranks, on_dead, on_cancel,
                                   outcome_function);
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease.attach(regclass, text, text, integer, interval, interval, interval, name, text, text) IS
$$Makes the rows of TABLE for which PENDING (an SQL boolean expression over the table's columns, e.g.
'status = ''SCHEDULED''') holds claimable in queue QUEUE (default: the table's name without schema), with the queue
options given. claim_pending returns them with key = the primary key as text; renew, release,
fenced_update, fence, cancel and the reaper work as for any queue. Rows that start matching later
become claimable; rows that stop matching (or are deleted, or truncated) stop being claimable and their
lease ends; DROP TABLE detaches. lease.enqueue refuses the queue (42809).
The predicate may use the row's columns and functions of them, no subqueries; it is evaluated when a
row is written, as the writing role, so it must not depend on the time or on other tables. Returns the
queue name. ORDER_BY names a column (time or integer) that claims follow, lowest first, within a
priority (e.g. an SLO deadline); a change of it on a matching row moves the row in the order.
ON_DEAD and ON_CANCEL are SET lists (e.g. 'status = ''FAILED'', error = now()::text') applied to the
table row, if it still matches, after its lease row became a dead letter or cancelled: that transaction
records a write-back (lease.write_backs), which lease.apply_write_backs applies once, as the table's owner
and only in a session of the owner's, in a function <table>_pg_lease_outcome that attach creates in the
table's schema.
The caller must own the table and be a lease_admin. Errors: 22004 table or pending NULL; 42703 no
such order_by column; 0A000 order_by not a time or integer type; 0A000 a distributed install
(lease.distribute); 0A000 no single-column primary key of type bigint, integer, smallint, uuid, text or varchar; 42710
already attached, or the queue exists; 42601, 42703, 42804: the predicate does not parse as a boolean
over the table's columns; 0A000: it contains a subquery; 42501 not the table's owner, no CREATE on its
schema (with on_dead/on_cancel, and always without the library) or, without the library, the installing role
has no SELECT and UPDATE on it; 42601, 42703: a bad on_dead/on_cancel; 42723 the outcome function's name
is taken; 22023 bad queue option.$$;

CREATE FUNCTION lease._check_table_owner(rel regclass) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT pg_has_role(lease._caller(), (SELECT c.relowner FROM pg_class c WHERE c.oid = rel), 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', rel USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_table_owner(regclass) IS
    'Internal: raises 42501 unless the calling role (see lease._caller) owns table REL.';

CREATE FUNCTION lease._attach_register(
    rel regclass, queue text, key_attnum smallint, order_attnum smallint, pending text, max_attempts integer,
    backoff_base interval, backoff_max interval, dead_retention interval, existing text[], ranks bigint[],
    on_dead text, on_cancel text, outcome_function regprocedure
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- ON CONFLICT (queue, key) names columns.
#variable_conflict use_column
DECLARE
    added bigint;
BEGIN
    -- Callable by any lease_admin, so it checks for itself what lease.attach
    -- established: the calling role owns the table.
    PERFORM lease._check_table_owner(rel);
    -- Releases, fenced writes and the reaper lock the table's rows as the
    -- extension's owner, this function's user: a superuser with the
    -- library, the installing role without it, whom the table's owner must
    -- grant as much (a release refused later would strand the lease).
    IF NOT (has_table_privilege(rel, 'SELECT') AND has_table_privilege(rel, 'UPDATE')) THEN
        RAISE EXCEPTION 'role "%", which owns pg_lease, may not read and lock the rows of %', current_user, rel
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('As the table''s owner: GRANT SELECT, UPDATE ON %s TO %I;', rel, current_user);
    END IF;
    IF EXISTS (SELECT FROM lease.attachment a WHERE a.rel = _attach_register.rel) THEN
        RAISE EXCEPTION 'table % is already attached', rel USING ERRCODE = 'duplicate_object';
    END IF;
    IF outcome_function IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_proc p JOIN pg_class c ON c.oid = rel
         WHERE p.oid = outcome_function AND p.prosecdef AND p.proowner = c.relowner) THEN
        RAISE EXCEPTION 'function % is not a SECURITY DEFINER function of the owner of %', outcome_function, rel
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT FROM lease.queue q WHERE q.name = _attach_register.queue) THEN
        RAISE EXCEPTION 'queue "%" already exists', queue
            USING ERRCODE = 'duplicate_object', HINT = 'Pass another queue name to attach.';
    END IF;
    -- Retention 0: a finished row is deleted, so the domain row starts
    -- afresh (a new id, hence a new token) when it matches again.
    PERFORM lease.create_queue(queue, max_attempts, backoff_base, backoff_max, '0', dead_retention);
    UPDATE lease.queue q SET attached = true WHERE q.name = _attach_register.queue;
    INSERT INTO lease.attachment (queue, rel, key_attnum, order_attnum, pending, on_dead, on_cancel, outcome_function)
    VALUES (_attach_register.queue, rel, _attach_register.key_attnum, _attach_register.order_attnum,
            _attach_register.pending, _attach_register.on_dead, _attach_register.on_cancel,
            _attach_register.outcome_function);
    -- The queue is new, its head the start: nothing to lower.
    INSERT INTO lease.job (queue, key, payload, rank, next_at, created_at)
    SELECT _attach_register.queue, u.k, '{}', coalesce(u.r, 0), clock_timestamp(), clock_timestamp()
      FROM unnest(existing, ranks) AS u(k, r)
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    IF added > 0 THEN
        PERFORM lease._count(_attach_register.queue, enqueued => added, pending => added);
    END IF;
    IF cardinality(existing) > 0 THEN
        PERFORM lease._wake(_attach_register.queue, cardinality(existing));
    END IF;
END
$$;

COMMENT ON FUNCTION lease._attach_register(regclass, text, smallint, smallint, text, integer, interval, interval, interval, text[], bigint[], text, text, regprocedure) IS
$$Internal part of lease.attach that needs the extension owner's rights: creates the queue, records the
attachment (with its outcome function, which must be a SECURITY DEFINER function of the table's owner) and
makes the EXISTING keys claimable with their RANKS. Granted to lease_admin because lease.attach runs as
its caller; refuses (42501) unless the calling role owns the table and the extension's owner may read and
update it (installs without the library). Errors: 42710 the table is attached
or the queue exists; 22023 bad queue option.$$;

CREATE FUNCTION lease.detach("table" regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn regprocedure;
    match regprocedure;
    removed bigint;
BEGIN
    IF "table" IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Without the library the triggers' WHEN clauses call the predicate's
    -- function of the table's (sql/without_library.sql): it goes with them.
    SELECT p.oid INTO match
      FROM pg_trigger t
      JOIN pg_depend d ON d.classid = 'pg_trigger'::regclass AND d.objid = t.oid
                      AND d.refclassid = 'pg_proc'::regclass
      JOIN pg_proc p ON p.oid = d.refobjid
      JOIN pg_class c ON c.oid = t.tgrelid
     WHERE t.tgrelid = "table" AND t.tgname = 'pg_lease_start'
       AND p.pronamespace = c.relnamespace AND p.proname = left(c.relname || '_pg_lease_match', 63)
       AND p.pronargs = 1 AND p.proargtypes[0] = 'jsonb'::regtype;
    -- Dropping the triggers needs the caller to own the table.
    EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_start ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_stop ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_update_start ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_update_stop ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_truncate ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_reorder ON %1$s', "table");
    SELECT a.outcome_function INTO fn FROM lease.attachment a WHERE a.rel = "table";
    removed := lease._detach_unregister("table");
    IF fn IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION IF EXISTS %s', fn);
    END IF;
    IF match IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION %s', match);
    END IF;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.detach(regclass) IS
$$Undoes lease.attach on TABLE: drops its triggers, its outcome function (on_dead/on_cancel), its predicate's
function (installs without the library), its queue and
every lease.job row of it (held leases end), and returns how many rows were removed. The domain table's data is not touched. The caller must
own the table. Errors: 22004 table NULL; 42704 not attached; 42501 not the table's owner.$$;

CREATE FUNCTION lease._detach_unregister(rel regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    PERFORM lease._check_table_owner(rel);
    DELETE FROM lease.attachment a WHERE a.rel = _detach_unregister.rel RETURNING a.queue INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not attached', rel USING ERRCODE = 'undefined_object';
    END IF;
    RETURN lease._delete_queue(q);
END
$$;

COMMENT ON FUNCTION lease._detach_unregister(regclass) IS
$$Internal part of lease.detach that needs the extension owner's rights: removes the attachment, its queue
and its rows. Granted to lease_admin because lease.detach runs as its caller; refuses (42501) unless the
calling role owns the table.$$;

-- DROP TABLE (or DROP SCHEMA ... CASCADE) of an attached table takes its
-- attachment, queue and rows along, so the name can be attached again.
CREATE FUNCTION lease._forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone record;
    fn text;
BEGIN
    FOR gone IN
        DELETE FROM lease.attachment a
         USING pg_event_trigger_dropped_objects() d
         WHERE d.classid = 'pg_class'::regclass AND d.objid = a.rel::oid AND d.objsubid = 0
        RETURNING a.queue, a.outcome_function::oid AS fn_oid
    LOOP
        PERFORM lease._delete_queue(gone.queue);
        -- Its outcome function writes the dropped table: drop it too, unless
        -- the same command (DROP SCHEMA ... CASCADE) already did.
        SELECT p.oid::regprocedure::text INTO fn FROM pg_proc p WHERE p.oid = gone.fn_oid;
        IF fn IS NOT NULL THEN
            EXECUTE format('DROP FUNCTION %s', fn);
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._forget_dropped_tables() IS
    'Internal event trigger function (sql_drop): forgets the attachments of dropped tables with their queues, rows and outcome functions.';

CREATE EVENT TRIGGER pg_lease_forget_dropped_tables ON sql_drop
EXECUTE FUNCTION lease._forget_dropped_tables();
