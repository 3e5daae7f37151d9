-- The functions that pg_lease's shared library provides, written in SQL for
-- the install without it (bin/sql-install; see the README's "Installing").
-- Not part of the extension script: bin/sql-install puts each of these in
-- place of the library function of the same signature, so every caller and
-- every comment stays as it is.
--
-- What an install without the library loses, and nothing else:
--   * the background reaper (run lease.sweep() from pg_cron, cron, or the
--     client's Sweeper instead);
--   * cron expressions in lease.schedule (intervals work);
--   * lease.attach (its triggers' WHEN clauses are printed from the
--     predicate's parse tree, which SQL cannot reach);
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

-- The two features SQL cannot do refuse the same way; each keeps the
-- signature of the function it stands in for, and a shared helper would be
-- a function the extension does not have (the catalogs must match).
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

CREATE FUNCTION lease._qualified_predicate(view oid, "table" oid, alias text) RETURNS text
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease.attach needs the pg_lease library'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Enqueue rows into a queue instead, or install the extension with its library.';
END
$$;

-- The reaper's shared memory does not exist: nothing to mark, nothing to
-- report (as in a server that does not preload the library).
CREATE FUNCTION lease._reaper_touch() RETURNS void
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT $$;

CREATE FUNCTION lease._reaper_discover() RETURNS void
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT $$;

CREATE FUNCTION lease._reaper_slot_shortages() RETURNS bigint
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT NULL::bigint $$;

CREATE FUNCTION lease._reaper_last_slot_shortage() RETURNS bigint
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT NULL::bigint $$;
