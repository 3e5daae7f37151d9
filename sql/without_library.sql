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
--     no epochs anyway).

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
