-- Role model.
--
--   lease_worker  replicas: enqueue, claim, renew, release, fenced writes,
--                 cancel, named leases, on every queue that is not
--                 restricted and on restricted ones they were granted
--                 (access.sql). Cannot read or write the tables directly,
--                 so it can act only through the fenced functions.
--   lease_admin   operators: everything lease_worker can on every queue,
--                 plus creating and dropping queues, granting access,
--                 attaching tables they own, schedules, reap, purge,
--                 sweep and the monitoring views.
--
-- Both are NOLOGIN group roles: GRANT them to your login roles. PUBLIC gets
-- nothing: no schema usage, no function, no table. Internal functions
-- (named with a leading "_", commented "Internal") are granted to
-- nobody, with the exceptions noted below (parts of attach, detach and
-- apply_write_backs). Roles are cluster-wide and
-- outlive DROP EXTENSION; creating the extension in a second database
-- reuses them.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'lease_worker') THEN
        CREATE ROLE lease_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'lease_admin') THEN
        CREATE ROLE lease_admin NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('lease_admin', 'lease_worker', 'MEMBER') THEN
        GRANT lease_worker TO lease_admin;
    END IF;
END
$$;

REVOKE ALL ON SCHEMA lease FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA lease FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA lease FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC;

GRANT USAGE ON SCHEMA lease TO lease_worker;

GRANT EXECUTE ON FUNCTION
    lease.enqueue(text, jsonb, text, timestamptz, integer, text, text, text),
    lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer, text[], text[]),
    lease.claim_pending(integer, interval, text, text),
    lease.rate_wait(text),
    lease.reclaim_own(integer, interval, text, text),
    lease.bind_session(text, text),
    lease.release_and_claim(bigint[], text, bigint[], integer, interval, text),
    lease.renew(bigint, text, bigint, interval, text),
    lease.renew_batch(bigint[], text, bigint[], interval, text),
    lease.release(bigint, text, bigint, text, timestamptz, text, text),
    lease.release_batch(bigint[], text, bigint[], text, timestamptz, text, text),
    lease.fenced_update(bigint, bigint, jsonb, text),
    lease.fence(bigint, bigint, text),
    lease.cancel(bigint, text),
    lease.queue_of(bigint),
    lease.try_acquire(text, text, interval),
    lease.renew_named(text, text, bigint, interval),
    lease.release_named(text, text, bigint),
    lease.release_named_batch(text[], text, bigint[]),
    lease.release_named(text[], text, bigint[]),
    lease.fence_named(text, bigint),
    lease.cancel_key(text, text),
    lease.ready_channel(text),
    -- Applies only the write-backs of tables the session user owns, and
    -- only in a session acting as itself (outcome.sql); its parts check
    -- that for themselves.
    lease.apply_write_backs(integer),
    lease._take_write_backs(name, integer),
    lease._write_back_target(name, bigint),
    lease._write_back_wanted(name, bigint),
    lease._write_back_applied(name, bigint),
    lease._write_back_failed(name, bigint, text)
TO lease_worker;

GRANT EXECUTE ON FUNCTION
    lease.create_queue(text, integer, interval, interval, interval, interval, text, integer, integer, integer, interval),
    lease.drop_queue(text, boolean),
    lease.pause(text),
    lease.resume(text),
    lease.set_weight(text, text, integer),
    lease.set_key_rate(text, text, integer, interval),
    lease.wait_reason(bigint),
    lease.purge_dead(text),
    lease.grant(text, regrole, boolean, boolean),
    lease.revoke(text, regrole),
    lease.requeue(bigint),
    lease.recount(),
    lease.reap(integer),
    lease.purge(integer),
    lease.sweep(integer),
    lease.schedule(text, text, text, interval, jsonb, integer, text),
    lease.unschedule(text),
    lease.attach(regclass, text, text, integer, interval, interval, interval, name, text, text),
    lease.detach(regclass),
    -- The exceptions. attach and detach run as their caller (they must
    -- create and drop triggers on the caller's table, and evaluate the
    -- caller's predicate with the caller's rights); these are their parts
    -- that need the extension owner's, and check ownership themselves.
    lease._attach_register(regclass, text, smallint, smallint, text, integer, interval, interval, interval,
                           text[], bigint[], text, text, regprocedure),
    lease._attach_triggers(regclass, text, text, name, name),
    -- Runs as the caller (it creates the caller's own function).
    lease._create_outcome_function(regclass, name, text, text, text),
    lease._rank_sql(oid, smallint, text),
    lease._detach_unregister(regclass),
    -- A trigger function cannot be called; EXECUTE only lets attach create
    -- the triggers, and the function acts only for the attached table.
    lease._attached_row_changed(),
    -- Prints the caller's own view; changes nothing.
    lease._qualified_predicate(oid, oid, text),
    -- attach's refusal on a distributed install; read Citus's catalog only.
    lease._refuse_if_distributed(text),
    lease._distributed(),
    -- Read the reaper's shared-memory counters for lease.reaper_stats (a
    -- view's function calls are checked against the reader).
    lease._reaper_slot_shortages(),
    lease._reaper_last_slot_shortage(),
    lease._sweep_holder(),
    -- lease.metrics' index probes; reads only (SECURITY DEFINER: the
    -- view's readers may not read lease.job).
    lease._queue_head(text)
TO lease_admin;

-- The views' readers, whoever may read them (each function checks): the
-- views, read with their owner's rights (views.sql).
GRANT EXECUTE ON FUNCTION
    lease.read_metrics(),
    lease.read_queue_stats(),
    lease.read_in_flight(text),
    lease.read_fairness_keys(text),
    lease.read_dead_letters(text, bigint)
TO PUBLIC;

GRANT SELECT ON lease.metrics, lease.queue_stats, lease.in_flight, lease.fairness_keys, lease.dead_letters, lease.holders,
                lease.reaper_stats, lease.write_backs, lease.queue, lease.queue_grant, lease.attachment, lease.schedule
TO lease_admin;

-- pg_dump keeps the lease state (and pg_restore brings it back) like the
-- user's own data. The default queue and the sweep counters are created by
-- this script, so dumping them too would collide on restore: the default
-- queue's policy and the counters start afresh in a restored database.
SELECT pg_catalog.pg_extension_config_dump('lease.queue', $$WHERE name <> 'default'$$);
SELECT pg_catalog.pg_extension_config_dump('lease.queue_grant', '');
SELECT pg_catalog.pg_extension_config_dump('lease.job', '');
SELECT pg_catalog.pg_extension_config_dump('lease.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lease.named_lease', '');
SELECT pg_catalog.pg_extension_config_dump('lease.attachment', '');
SELECT pg_catalog.pg_extension_config_dump('lease.schedule', '');
-- lease.metrics' counters must match the restored rows.
SELECT pg_catalog.pg_extension_config_dump('lease.counter', '');
-- The concurrency slots must match the restored rows too.
SELECT pg_catalog.pg_extension_config_dump('lease.key_slot', '');
-- And the rate limits' records of what they let through.
SELECT pg_catalog.pg_extension_config_dump('lease.rate_share', '');
-- And the fairness keys' weights and places.
SELECT pg_catalog.pg_extension_config_dump('lease.fairness_key', '');

-- Job ids are half of every fencing token, so a reinstall must never issue
-- an id the previous install issued. The WAL position only grows in a
-- cluster, and it grows faster than ids are drawn (a sequence writes a WAL
-- record of over 60 bytes per 32 ids at most), so starting from it is above
-- every id issued before DROP EXTENSION. A restore then sets the sequence
-- back to the dumped value, which is above every id of the dumped database.
SELECT pg_catalog.setval('lease.job_id_seq',
                         (pg_catalog.pg_current_wal_lsn() OPERATOR(pg_catalog.-) '0/0')::bigint);

-- With the reaper preloaded, have it look at this database now rather than
-- at its next periodic look.
SELECT lease._reaper_discover();
