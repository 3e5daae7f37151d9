-- Role model.
--
--   lease_worker  replicas: enqueue, claim, renew, release, fenced writes,
--                 cancel, named leases. Cannot read or write the tables
--                 directly, so it can act only through the fenced functions.
--                 Roles that write an attached table need it too (its
--                 triggers sync the lease rows as the writing role).
--   lease_admin   operators: everything lease_worker can, plus creating and
--                 dropping queues, attaching tables, reap, purge, sweep and
--                 the monitoring views.
--
-- Both are NOLOGIN group roles: GRANT them to your login roles. PUBLIC gets
-- nothing: no schema usage, no function, no table. Roles are cluster-wide and
-- outlive DROP EXTENSION; creating the extension in a second database reuses
-- them.

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
    lease.enqueue(text, jsonb, text, timestamptz, integer),
    lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer),
    lease.claim_pending(integer, interval, text, text),
    lease.reclaim_own(integer, interval, text, text),
    lease.release_and_claim(bigint[], text, bigint[], integer, interval, text),
    lease.renew(bigint, text, bigint, interval),
    lease.renew_batch(bigint[], text, bigint[], interval),
    lease.release(bigint, text, bigint, text, timestamptz, text),
    lease.release_batch(bigint[], text, bigint[], text, timestamptz, text),
    lease.fenced_update(bigint, bigint, jsonb),
    lease.fence(bigint, bigint),
    lease.cancel(bigint),
    lease.try_acquire(text, text, interval),
    lease.renew_named(text, text, bigint, interval),
    lease.release_named(text, text, bigint),
    lease.fence_named(text, bigint),
    -- Run by the triggers of attached tables, as the role writing the table.
    lease.attached_row_changed(),
    lease.sync_attached(text, text[], text[])
TO lease_worker;
GRANT SELECT ON lease.attachment TO lease_worker;

GRANT EXECUTE ON FUNCTION
    lease.create_queue(text, integer, interval, interval, interval, interval),
    lease.drop_queue(text, boolean),
    lease.reap(integer),
    lease.purge(integer),
    lease.sweep(integer),
    lease.attach(regclass, text, text, integer, interval, interval, interval),
    lease.register_attachment(regclass, text, name, text, integer, interval, interval, interval),
    lease.detach(regclass),
    lease.unregister_attachment(text)
TO lease_admin;

GRANT SELECT ON lease.queue_stats, lease.in_flight, lease.dead_letters, lease.holders, lease.reaper_stats, lease.queue
TO lease_admin;
