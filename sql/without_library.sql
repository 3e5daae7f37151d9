-- The functions that pg_lease's shared library provides, written in SQL for
-- the install without it (bin/sql-install; see docs/operations.md, "Installing").
-- Not part of the extension script: bin/sql-install puts each of these in
-- place of the library function of the same signature, so every caller and
-- every comment stays as it is.
--
-- What an install without the library loses, and nothing else:
--   * the background reaper (run lease.sweep() from pg_cron, cron, or the
--     client's Sweeper instead);
--   * cron expressions in lease.schedule (intervals work);
--   * lease.attach's WHEN clauses inline: they call a function of the
--     table's instead (below), which every write of an attached table pays
--     for, and the caller needs CREATE on the table's schema;
--   * DROP TABLE detaching (an event trigger's work): detach first;
--   * an epoch floor on a standby (it answers NULL there; a standby issues
--     no epochs anyway);
--   * lease.fence on a row of an attached table whose reading could run
--     code of its owner's (row security, an index or constraint using the
--     owner's functions): refused with 0A000 (below).

-- The WAL timeline from the name of the current WAL file (its first 8 hex
-- digits), which any role may read on a primary: the same floor as the
-- library's, so epochs stay failover-safe (see extension/src/epoch.rs).
CREATE FUNCTION lease.epoch_floor() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40
       END
$$;

-- Cron expressions, which SQL cannot parse, refuse the same way in both
-- stand-ins; each keeps the signature of the function it stands in for,
-- and a shared helper would be a function the extension does not have (the
-- catalogs must match).
CREATE FUNCTION lease._cron_next(spec text, after double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'cron schedules need the pg_lease library'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Schedule with every => an interval, or install the extension with its library.';
END
$$;

CREATE FUNCTION lease._cron_last(spec text, at double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN lease._cron_next(spec, at);
END
$$;

-- lease.attach's triggers test the predicate over NEW and OLD in their WHEN
-- clauses. SQL cannot print the parsed predicate again with its columns
-- qualified, so the predicate goes, as PostgreSQL printed the view
-- `SELECT <predicate> AS m FROM <table>`, into a function of the table's
-- (<table>_pg_lease_match(jsonb) in its schema, created by the caller, who
-- owns the table): its FROM is the row handed over as jsonb, under the
-- table's name, so qualified and bare column names both resolve. The WHEN
-- clauses call it; lease.detach drops it.
CREATE FUNCTION lease._qualified_predicate(view oid, "table" oid, alias text) RETURNS text
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Both printed under this function's search_path, so they qualify the
    -- table alike.
    printed text := rtrim(pg_get_viewdef(view), E'; \n');
    source constant text := "table"::regclass::text;
    relname name;
    fn text;
    head text;
BEGIN
    SELECT c.relname, format('%I.%I', n.nspname, left(c.relname || '_pg_lease_match', 63))
      INTO relname, fn
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = "table";
    head := rtrim(left(printed, -length('FROM ' || source)), E' \n');
    IF right(printed, length('FROM ' || source)) <> 'FROM ' || source
       OR ltrim(head) NOT LIKE 'SELECT %' OR right(head, 5) <> ' AS m' THEN
        RAISE EXCEPTION 'unexpected definition of the predicate view: %', printed
            USING ERRCODE = 'internal_error';
    END IF;
    EXECUTE format('CREATE OR REPLACE FUNCTION %s(r jsonb) RETURNS boolean
                    LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
                    AS %L', fn,
                   format('%s FROM jsonb_populate_record(NULL::%s, r) AS %I', left(head, -5), source, relname));
    EXECUTE format('COMMENT ON FUNCTION %s(jsonb) IS %L', fn,
                   format('pg_lease: the pending predicate of %s, for the WHEN clauses of its triggers (install without the library). Dropped by lease.detach.', source));
    RETURN format('%s(to_jsonb(%s))', fn, upper(alias));
END
$$;

-- The reaper's shared memory does not exist: nothing to mark, nothing to
-- report (as in a server that does not preload the library).
CREATE FUNCTION lease._reaper_touch("rows" bigint DEFAULT 0) RETURNS void
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT $$;

CREATE FUNCTION lease._reaper_discover() RETURNS void
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT $$;

CREATE FUNCTION lease._reaper_wake() RETURNS void
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT $$;

CREATE FUNCTION lease._reaper_slot_shortages() RETURNS bigint
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT NULL::bigint $$;

CREATE FUNCTION lease._reaper_last_slot_shortage() RETURNS bigint
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT NULL::bigint $$;

-- Claims raise their queue's head only where its lock is surely released
-- at the end of the statement; without the library that cannot be told,
-- so they leave it to the sweep.
CREATE FUNCTION lease._own_transaction() RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT false $$;

-- lease.fence locks an attached row's table row as the extension owner's
-- frame. The library reads the table as its owner, in a sandbox that undoes
-- the owner's settings (extension/src/as_owner.rs); SQL has no such
-- sandbox, so here the table is read as the installing role, and only if
-- nothing of the table owner's can run in that read: the table and its
-- descendants must be tables without row security, and their indexes,
-- constraints and statistics (whose expressions the planner may evaluate)
-- may use only functions and operators of superusers or in C. Anything else
-- is refused (55000, or 0A000: it needs the library).
CREATE FUNCTION lease._lock_table_rows(rel oid, key_column text, keys text[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    key_type text;
    locked text[];
BEGIN
    -- What the read takes anyway; held until commit, it keeps the table from
    -- becoming a view after the checks.
    EXECUTE format('LOCK TABLE %s IN ROW SHARE MODE', rel::regclass);
    SELECT CASE a.atttypid WHEN 'bigint'::regtype THEN 'int8' WHEN 'integer'::regtype THEN 'int4'
                           WHEN 'smallint'::regtype THEN 'int2' WHEN 'uuid'::regtype THEN 'uuid'
                           WHEN 'text'::regtype THEN 'text' WHEN 'character varying'::regtype THEN 'varchar' END
      INTO key_type
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = key_column AND NOT a.attisdropped
     WHERE c.oid = rel AND c.relkind IN ('r', 'p');
    IF key_type IS NULL THEN
        RAISE EXCEPTION '% is no longer a table with the key attach saw', rel::regclass
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Detach it.';
    END IF;
    IF EXISTS (
        WITH RECURSIVE tree (oid) AS (
            SELECT rel UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid),
        code (oid, classid) AS (
            SELECT t.oid, 'pg_class'::regclass FROM tree t
            UNION ALL SELECT x.indexrelid, 'pg_class'::regclass FROM pg_index x JOIN tree t ON x.indrelid = t.oid
            UNION ALL SELECT k.oid, 'pg_constraint'::regclass FROM pg_constraint k JOIN tree t ON k.conrelid = t.oid
            UNION ALL SELECT s.oid, 'pg_statistic_ext'::regclass FROM pg_statistic_ext s JOIN tree t ON s.stxrelid = t.oid)
        SELECT FROM tree t JOIN pg_class c ON c.oid = t.oid
         WHERE c.relkind NOT IN ('r', 'p') OR c.relrowsecurity
        UNION ALL
        SELECT FROM code o
          JOIN pg_depend d ON d.classid = o.classid AND d.objid = o.oid
          JOIN pg_proc p ON (d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid)
                         OR (d.refclassid = 'pg_operator'::regclass
                             AND p.oid = (SELECT op.oprcode FROM pg_operator op WHERE op.oid = d.refobjid))
          JOIN pg_roles r ON r.oid = p.proowner
          JOIN pg_language l ON l.oid = p.prolang
         WHERE NOT r.rolsuper AND l.lanname NOT IN ('internal', 'c'))
    THEN
        RAISE EXCEPTION 'pg_lease cannot lock rows of % without its library', rel::regclass
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'It has row security, a child that is no table, or an index, constraint or statistics object using a function of a role that is no superuser, which reading it could run as the installing role.',
                  HINT = 'Remove that from the table, or install pg_lease with its library.';
    END IF;
    EXECUTE format('SELECT array_agg(l.k)
                      FROM (SELECT t.%1$I::text AS k FROM %2$s t
                             WHERE t.%1$I OPERATOR(pg_catalog.=) ANY ($1::%3$s[])
                             ORDER BY t.%1$I FOR NO KEY UPDATE OF t) l',
                   key_column, rel::regclass, key_type)
      INTO locked USING keys;
    RETURN coalesce(locked, '{}');
END
$$;
