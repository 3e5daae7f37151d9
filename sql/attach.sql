-- Leases on rows of the user's own tables.
--
-- attach(table, pending => 'predicate') gives every row of a domain table
-- for which the predicate holds one lease.job row in a queue of its own,
-- keyed by the row's primary key (as text). From then on the row is claimed,
-- renewed, released, fenced, cancelled and reaped exactly like queue rows.
--
-- The lease state lives beside the domain table, not in it: the domain table
-- gets no columns, only four row triggers whose WHEN clauses are the
-- predicate itself, evaluated inline by the executor. A write that does not
-- change the predicate's value (or the key of a matching row) fires nothing
-- and touches no lease.job row; measured with pgbench, see the README. When
-- the value changes, lease.attached_row_changed passes the key to
-- lease.sync_attached: rows that start matching become claimable, rows that
-- stop matching (or are deleted) lose their lease at once.
--
-- The predicate is evaluated as the role that writes the domain table (the
-- trigger function is SECURITY INVOKER), never with the extension owner's
-- rights; only keys cross into SECURITY DEFINER code.

CREATE TABLE lease.attachment (
    queue       text PRIMARY KEY REFERENCES lease.queue (name),
    rel         regclass NOT NULL UNIQUE,
    key_column  name NOT NULL,
    pending     text NOT NULL,
    attached_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE lease.attachment IS
    'Domain tables attached with lease.attach(): their queue, primary-key column and pending predicate.';

-- Fired only when a row starts matching (TG_ARGV[2] = 'start': insert, or an
-- update into the predicate or to a new key) or stops matching ('stop').
CREATE FUNCTION lease.attached_row_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    queue constant text := TG_ARGV[0];
    key_column constant text := TG_ARGV[1];
BEGIN
    IF TG_ARGV[2] = 'start' THEN
        PERFORM lease.sync_attached(queue, ARRAY[to_jsonb(NEW) ->> key_column], '{}');
    ELSE
        PERFORM lease.sync_attached(queue, '{}', ARRAY[to_jsonb(OLD) ->> key_column]);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease.attached_row_changed() IS
$$Internal row trigger of attached tables, arguments (queue, key column, 'start' | 'stop'): passes the
key of a row that started or stopped matching the pending predicate to lease.sync_attached. Runs as the
role writing the table.$$;

CREATE FUNCTION lease.sync_attached(queue text, became text[], ceased text[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- Stopped matching (the domain moved on, or the row is gone): the row is
    -- no longer claimable and any lease on it ends now.
    IF cardinality(ceased) > 0 THEN
        DELETE FROM lease.job j WHERE j.queue = sync_attached.queue AND j.key = ANY (ceased);
    END IF;
    -- Started matching: claimable at once. A row that still has a job row
    -- (dead or cancelled) keeps it: it is not new work.
    IF cardinality(became) > 0 THEN
        INSERT INTO lease.job (queue, key, payload, next_at, created_at)
        SELECT sync_attached.queue, k, '{}', clock_timestamp(), clock_timestamp()
          FROM unnest(became) AS k
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
        IF FOUND THEN
            PERFORM lease.wake(sync_attached.queue, cardinality(became));
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION lease.sync_attached(text, text[], text[]) IS
$$Internal: keys of an attached table that started (BECAME) or stopped (CEASED) matching its pending
predicate. Ceased keys lose their lease.job row (any lease on it ends); new keys get a pending one.
Granted to lease_worker: roles that write an attached table must be members.$$;

CREATE FUNCTION lease.attach(
    "table"        regclass,
    pending        text,
    queue          text     DEFAULT NULL,
    max_attempts   integer  DEFAULT 25,
    backoff_base   interval DEFAULT '1 second',
    backoff_max    interval DEFAULT '1 hour',
    dead_retention interval DEFAULT '7 days'
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := queue;
    key_col name;
    key_type regtype;
    existing text[];
    expr text;
    now_in text;
    was_in text;
    key_moved text;
BEGIN
    PERFORM lease.checked_not_null("table", 'table'), lease.checked_not_null(pending, 'pending');
    SELECT a.attname, a.atttypid::regtype INTO key_col, key_type
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
    IF EXISTS (SELECT FROM lease.attachment a WHERE a.rel = "table") THEN
        RAISE EXCEPTION 'table % is already attached', "table" USING ERRCODE = 'duplicate_object';
    END IF;

    -- PostgreSQL parses the predicate (as the caller: an unknown column or a
    -- syntax error fails here, 42703 or 42601) and prints it back with every
    -- column qualified by an alias, which then becomes NEW or OLD.
    EXECUTE format('CREATE TEMP VIEW pg_lease_predicate AS SELECT coalesce((%s), false) AS m FROM %s AS pg_lease_attached_row',
                   pending, "table");
    expr := substring(pg_get_viewdef('pg_temp.pg_lease_predicate'::regclass) FROM '^\s*SELECT (.*) AS m\s+FROM ');
    DROP VIEW pg_temp.pg_lease_predicate;
    now_in := replace(expr, 'pg_lease_attached_row.', 'NEW.');
    was_in := replace(expr, 'pg_lease_attached_row.', 'OLD.');
    key_moved := format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', key_col);

    PERFORM lease.register_attachment("table", q, key_col, pending, max_attempts, backoff_base,
                                      backoff_max, dead_retention);
    -- Creating the triggers needs the caller to own the table. The lock it
    -- takes (SHARE ROW EXCLUSIVE, until commit) keeps concurrent writes out
    -- until the triggers and the initial rows are in place. A predicate that
    -- a trigger condition cannot hold (a subquery) fails here: 0A000.
    EXECUTE format('CREATE TRIGGER pg_lease_start AFTER INSERT ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease.attached_row_changed(%L, %L, ''start'')',
                   "table", now_in, q, key_col);
    EXECUTE format('CREATE TRIGGER pg_lease_stop AFTER DELETE ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease.attached_row_changed(%L, %L, ''stop'')',
                   "table", was_in, q, key_col);
    EXECUTE format('CREATE TRIGGER pg_lease_update_start AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease.attached_row_changed(%L, %L, ''start'')',
                   "table", now_in, was_in, key_moved, q, key_col);
    EXECUTE format('CREATE TRIGGER pg_lease_update_stop AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease.attached_row_changed(%L, %L, ''stop'')',
                   "table", was_in, now_in, key_moved, q, key_col);
    -- The rows matching now become claimable.
    EXECUTE format('SELECT coalesce(array_agg(%I::text), ''{}'') FROM %s WHERE (%s)', key_col, "table", pending)
       INTO existing;
    PERFORM lease.sync_attached(q, existing, '{}');
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease.attach(regclass, text, text, integer, interval, interval, interval) IS
$$Makes the rows of TABLE for which PENDING (an SQL boolean expression over the table's columns, e.g.
'status = ''SCHEDULED''') holds claimable in queue QUEUE (default: the table's name without schema), with the queue
options given. claim_pending returns them with key = the primary key as text; renew, release,
fenced_update, fence, cancel and the reaper work as for any queue. Rows that start matching later
become claimable; rows that stop matching (or are deleted) stop being claimable and their lease ends.
The predicate may use the row's columns and functions of them, no subqueries; it is evaluated when a
row is written, so it must not depend on the time or on other tables. Returns the queue name. The caller must own the table. Errors: 22004 table or pending NULL; 0A000 no
single-column primary key of type bigint, integer, smallint, uuid, text or varchar; 42710 already
attached; 42601, 42703, 42804: the predicate does not parse as a boolean over the table's columns;
0A000: it contains a subquery; 22023 bad queue option.$$;

CREATE FUNCTION lease.register_attachment(
    rel regclass, queue text, key_column name, pending text, max_attempts integer,
    backoff_base interval, backoff_max interval, dead_retention interval
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM lease.queue q WHERE q.name = register_attachment.queue) THEN
        RAISE EXCEPTION 'queue "%" already exists', queue
            USING ERRCODE = 'duplicate_object', HINT = 'Pass another queue name to attach.';
    END IF;
    -- Retention 0: a finished row is deleted, so the domain row starts
    -- afresh (a new id, hence a new token) when it matches again.
    PERFORM lease.create_queue(queue, max_attempts, backoff_base, backoff_max, '0', dead_retention);
    INSERT INTO lease.attachment (queue, rel, key_column, pending)
    VALUES (queue, rel, key_column, pending);
END
$$;

COMMENT ON FUNCTION lease.register_attachment(regclass, text, name, text, integer, interval, interval, interval) IS
$$Internal part of lease.attach that needs the extension owner's rights: creates the queue and records
the attachment. Errors: 42710 the queue exists; 22023 bad queue option.$$;

CREATE FUNCTION lease.detach("table" regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    PERFORM lease.checked_not_null("table", 'table');
    SELECT a.queue INTO q FROM lease.attachment a WHERE a.rel = "table";
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not attached', "table" USING ERRCODE = 'undefined_object';
    END IF;
    -- Dropping the triggers needs the caller to own the table.
    EXECUTE format('DROP TRIGGER pg_lease_start ON %s', "table");
    EXECUTE format('DROP TRIGGER pg_lease_stop ON %s', "table");
    EXECUTE format('DROP TRIGGER pg_lease_update_start ON %s', "table");
    EXECUTE format('DROP TRIGGER pg_lease_update_stop ON %s', "table");
    RETURN lease.unregister_attachment(q);
END
$$;

COMMENT ON FUNCTION lease.detach(regclass) IS
$$Undoes lease.attach on TABLE: drops its triggers, its queue and every lease.job row of it (held leases
end), and returns how many rows were removed. The domain table's data is not touched. The caller must
own the table. Errors: 22004 table NULL; 42704 not attached.$$;

CREATE FUNCTION lease.unregister_attachment(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM lease.attachment a WHERE a.queue = unregister_attachment.queue;
    RETURN lease.drop_queue(queue, force => true);
END
$$;

COMMENT ON FUNCTION lease.unregister_attachment(text) IS
    'Internal part of lease.detach that needs the extension owner''s rights: removes the attachment, its queue and its rows.';
