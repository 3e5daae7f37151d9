-- Leases on rows of the user's own tables.
--
-- attach(table, pending => 'predicate') gives every row of a domain table
-- for which the predicate holds one lease.job row in a queue of its own,
-- keyed by the row's primary key (as text). From then on the row is claimed,
-- renewed, released, fenced, cancelled and reaped exactly like queue rows.
--
-- The lease state lives beside the domain table, not in it: three
-- statement-level triggers (with transition tables, so a bulk UPDATE costs
-- one sync, not one per row) compare the predicate before and after each
-- write and hand the keys that started or stopped matching to
-- lease.sync_attached. The domain table gets no columns, and writes that do
-- not change the predicate's value touch no lease.job row.
--
-- The predicate is evaluated as the role that writes the domain table (the
-- trigger function is SECURITY INVOKER), never with the extension owner's
-- rights; only the key lists cross into SECURITY DEFINER code.

CREATE TABLE lease.attachment (
    queue       text PRIMARY KEY REFERENCES lease.queue (name),
    rel         regclass NOT NULL UNIQUE,
    key_column  name NOT NULL,
    pending     text NOT NULL,
    attached_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE lease.attachment IS
    'Domain tables attached with lease.attach(): their queue, primary-key column and pending predicate.';

-- The keys whose predicate value changed in one statement: `now_in` rows
-- became claimable, `was_in` rows stopped being so. Evaluated as the writer.
CREATE FUNCTION lease.attached_rows_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    a lease.attachment;
    matching constant text := 'SELECT %1$I::text AS k, coalesce((%2$s), false) AS m FROM %3$s';
    became text[];
    ceased text[];
BEGIN
    SELECT * INTO STRICT a FROM lease.attachment WHERE queue = TG_ARGV[0];
    IF TG_OP = 'INSERT' THEN
        EXECUTE format('SELECT coalesce(array_agg(k), ''{}'') FROM (' || matching || ') n WHERE m',
                       a.key_column, a.pending, 'new_rows')
           INTO became;
        ceased := '{}';
    ELSIF TG_OP = 'DELETE' THEN
        EXECUTE format('SELECT coalesce(array_agg(k), ''{}'') FROM (' || matching || ') o WHERE m',
                       a.key_column, a.pending, 'old_rows')
           INTO ceased;
        became := '{}';
    ELSE
        -- A changed primary key shows up as one key ceasing, another starting.
        EXECUTE format(
            'SELECT coalesce(array_agg(k) FILTER (WHERE coalesce(n.m, false) AND NOT coalesce(o.m, false)), ''{}''),
                    coalesce(array_agg(k) FILTER (WHERE coalesce(o.m, false) AND NOT coalesce(n.m, false)), ''{}'')
               FROM (' || format(matching, a.key_column, a.pending, 'new_rows') || ') n
               FULL JOIN (' || format(matching, a.key_column, a.pending, 'old_rows') || ') o USING (k)')
           INTO became, ceased;
    END IF;
    IF cardinality(became) > 0 OR cardinality(ceased) > 0 THEN
        PERFORM lease.sync_attached(a.queue, became, ceased);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease.attached_rows_changed() IS
$$Internal trigger function of attached tables (statement level, transition tables new_rows/old_rows):
finds the keys whose pending predicate changed value and passes them to lease.sync_attached. Runs as
the role writing the table.$$;

CREATE FUNCTION lease.sync_attached(queue text, became text[], ceased text[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- Stopped matching (the domain moved on, or the row is gone): the row is
    -- no longer claimable and any lease on it ends now.
    DELETE FROM lease.job j WHERE j.queue = sync_attached.queue AND j.key = ANY (ceased);
    -- Started matching: claimable at once. A row that still has a job row
    -- (done and retained, dead, cancelled) keeps it: it is not new work.
    INSERT INTO lease.job (queue, key, payload, next_at, created_at)
    SELECT sync_attached.queue, k, '{}', clock_timestamp(), clock_timestamp()
      FROM unnest(became) AS k
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('pg_lease_ready', sync_attached.queue);
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

    PERFORM lease.register_attachment("table", q, key_col, pending, max_attempts, backoff_base,
                                      backoff_max, dead_retention);
    -- Creating the triggers needs the caller to own the table. The lock it
    -- takes (SHARE ROW EXCLUSIVE, until commit) keeps concurrent writes out
    -- until the triggers and the initial rows are in place.
    EXECUTE format('CREATE TRIGGER pg_lease_attach_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows
                    FOR EACH STATEMENT EXECUTE FUNCTION lease.attached_rows_changed(%L)', "table", q);
    EXECUTE format('CREATE TRIGGER pg_lease_attach_update AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
                    FOR EACH STATEMENT EXECUTE FUNCTION lease.attached_rows_changed(%L)', "table", q);
    EXECUTE format('CREATE TRIGGER pg_lease_attach_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows
                    FOR EACH STATEMENT EXECUTE FUNCTION lease.attached_rows_changed(%L)', "table", q);
    -- The predicate runs here as the caller: a syntax error or an unknown
    -- column fails attach (42601, 42703), not a later write. The rows it
    -- matches now become claimable.
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
Returns the queue name. The caller must own the table. Errors: 22004 table or pending NULL; 0A000 no
single-column primary key of type bigint, integer, smallint, uuid, text or varchar; 42710 already
attached; 42601/42703 and others: the predicate does not evaluate; 22023 bad queue option.$$;

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
    EXECUTE format('DROP TRIGGER pg_lease_attach_insert ON %s', "table");
    EXECUTE format('DROP TRIGGER pg_lease_attach_update ON %s', "table");
    EXECUTE format('DROP TRIGGER pg_lease_attach_delete ON %s', "table");
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
