-- One housekeeping pass for a database: what the background reaper runs
-- every lease.sweep_interval, and what a user without preloading can run
-- from cron or pg_cron. Its counters live in a one-row table per database.

CREATE TABLE lease.sweep_state (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    sweeps        bigint NOT NULL DEFAULT 0,
    recovered     bigint NOT NULL DEFAULT 0,
    purged        bigint NOT NULL DEFAULT 0,
    last_sweep_at timestamptz,
    last_duration interval,
    last_error    text,
    last_error_at timestamptz
);

COMMENT ON TABLE lease.sweep_state IS
    'Counters of lease.sweep() in this database (read them through lease.reaper_stats).';

INSERT INTO lease.sweep_state DEFAULT VALUES;

CREATE FUNCTION lease.sweep(max_rows integer DEFAULT 1000)
RETURNS TABLE (recovered bigint, purged bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n constant integer := lease.checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    r record;
    problem text;
BEGIN
    recovered := 0;
    purged := 0;
    BEGIN
        FOR r IN SELECT * FROM lease.reap(n) LOOP
            recovered := recovered + r.requeued + r.dead + r.cancelled;
            RAISE LOG 'pg_lease: expired leases in queue "%" of database "%": % back to pending, % dead-lettered, % cancelled',
                r.queue, current_database(), r.requeued, r.dead, r.cancelled;
        END LOOP;
        purged := lease.purge(n);
    EXCEPTION WHEN OTHERS THEN
        -- Keep the reason where operators look (reaper_stats and the log),
        -- count the failed sweep, and let the next one try again.
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        problem := format('%s: %s', SQLSTATE, problem);
        RAISE WARNING 'pg_lease: sweep of database "%" failed: %', current_database(), problem;
        UPDATE lease.sweep_state s
           SET sweeps = s.sweeps + 1, last_error = problem, last_error_at = clock_timestamp();
        recovered := 0;
        purged := 0;
        RETURN NEXT;
        RETURN;
    END;
    UPDATE lease.sweep_state s
       SET sweeps        = s.sweeps + 1,
           recovered     = s.recovered + sweep.recovered,
           purged        = s.purged + sweep.purged,
           last_sweep_at = t,
           last_duration = clock_timestamp() - t;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION lease.sweep(integer) IS
$$One bounded housekeeping pass: lease.reap(max_rows) then lease.purge(max_rows); returns how many leases
were recovered and rows purged, and adds them to lease.reaper_stats. An error inside is caught, logged and
recorded as last_error, so the pass itself never fails. The pg_lease background worker calls this every
lease.sweep_interval; without preloading, call it from any scheduler.
Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE VIEW lease.reaper_stats AS
SELECT current_database() AS database, s.sweeps, s.recovered, s.purged,
       s.last_sweep_at, s.last_duration, s.last_error, s.last_error_at
  FROM lease.sweep_state s;

COMMENT ON VIEW lease.reaper_stats IS
    'Housekeeping in this database: sweeps run, leases recovered, rows purged, last sweep time and duration, last error.';
