-- A distributed install on Citus: queues spread over worker nodes.
--
-- lease.distribute() turns lease.queue into a table distributed by its name
-- and every table keyed by queue (rows, counters, concurrency slots,
-- grants, bound sessions) into one distributed by its queue column, all in
-- one colocation group: everything of a queue lives on the one node that
-- holds its shard. The functions that take a queue are registered as
-- distributed functions routed by it: the coordinator forwards the whole
-- call to that node (one round trip) and the node runs it on its shards.
--
-- What Citus asks of a function that runs there, and every function
-- registered below keeps: each statement on a distributed table names its
-- queue (else the node sends it to every shard), no UPDATE of one
-- evaluates a VOLATILE function (clock_timestamp(): such values are taken
-- into variables first, or read through the STABLE lease._now()), and
-- statements are planned for the call's queue (a generic plan, whose queue
-- is a parameter, cannot be routed). A call without its queue (renew,
-- release and their batches take it as an optional last argument) runs on
-- the coordinator, over every shard.

CREATE FUNCTION lease._distributed() RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found boolean;
BEGIN
    -- Citus's catalog exists only where Citus is installed: read it by name.
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
       INTO found USING 'lease.job'::regclass;
    RETURN found;
END
$$;

COMMENT ON FUNCTION lease._distributed() IS
$$Internal: whether lease.distribute() has made this a distributed install (lease.job is a Citus
distributed table).$$;

CREATE FUNCTION lease._refuse_if_distributed(what text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease._distributed() THEN
        RAISE EXCEPTION '% is not supported on a distributed install', what
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'docs/operations.md, "Outgrowing one PostgreSQL: Citus", lists what is.';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._refuse_if_distributed(text) IS
$$Internal: raises 0A000 naming WHAT when this is a distributed install (lease.distribute()).$$;

CREATE FUNCTION lease._local_queues() RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard text;
BEGIN
    -- Read from this node's shards of lease.queue themselves: a read of
    -- lease.queue would ask every node, and each node sweeps alone.
    FOR shard IN EXECUTE
        $q$SELECT pg_catalog.format('lease.%I', 'queue_' || s.shardid)
             FROM pg_catalog.pg_dist_shard s
             JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
            WHERE s.logicalrelid = 'lease.queue'::regclass
              AND p.groupid = (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l)
            ORDER BY s.shardid$q$
    LOOP
        RETURN QUERY EXECUTE pg_catalog.format('SELECT q.name FROM %s q ORDER BY q.name', shard);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._local_queues() IS
$$Internal (lease.sweep on a distributed install): the queues whose shard this node holds.$$;

CREATE FUNCTION lease._assign_id_ranges() RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prev text;
    failed text;
BEGIN
    -- Each node draws lease.job ids from a sequence of its own, set from its
    -- own WAL position at install (privileges.sql), so two nodes' ids
    -- overlap: give node group g the ids from g * 2^48 + 1 to (g + 1) * 2^48 - 1,
    -- starting at its WAL position within them, as the install does, so a
    -- reinstall never issues an id again. The coordinator (group 0) keeps
    -- its position, below 2^48. A node that has its range keeps it.
    SELECT pg_catalog.string_agg(pg_catalog.format('%s:%s: %s', w.nodename, w.nodeport, w.result), '; ')
      INTO failed
      FROM run_command_on_workers($cmd$
        DO $do$
        DECLARE
            g constant bigint := (SELECT groupid FROM pg_catalog.pg_dist_local_group);
            low constant bigint := g * 281474976710656 + 1;
        BEGIN
            IF (SELECT s.seqmin FROM pg_catalog.pg_sequence s
                 WHERE s.seqrelid = 'lease.job_id_seq'::regclass) <> low THEN
                SET LOCAL citus.enable_ddl_propagation = off;
                EXECUTE pg_catalog.format('ALTER SEQUENCE lease.job_id_seq MINVALUE %s MAXVALUE %s START %s RESTART %s',
                                          low, low + 281474976710654, low,
                                          low + (pg_catalog.pg_current_wal_lsn() OPERATOR(pg_catalog.-) '0/0')::bigint);
            END IF;
        END
        $do$
    $cmd$) AS w
     WHERE NOT w.success;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'could not give the worker nodes their id ranges: %', failed;
    END IF;
    -- Not propagated: the workers' sequences have their own bounds.
    prev := pg_catalog.current_setting('citus.enable_ddl_propagation');
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
    ALTER SEQUENCE lease.job_id_seq MAXVALUE 281474976710656;
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', prev, true);
END
$$;

COMMENT ON FUNCTION lease._assign_id_ranges() IS
$$Internal (lease.distribute): gives every worker node's lease.job id sequence a range of its own (group g:
g * 2^48 + 1 to (g + 1) * 2^48 - 1), so that ids are unique across the cluster; the coordinator keeps 1 .. 2^48.$$;

CREATE FUNCTION lease.distribute(shard_count integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    coordinator boolean;
    t text;
    f text;
    arg text;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RAISE EXCEPTION 'lease.distribute() needs the citus extension in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Preload citus, CREATE EXTENSION citus and add the worker nodes first.';
    END IF;
    IF lease._distributed() THEN
        -- Again after nodes were added: their id ranges.
        PERFORM lease._assign_id_ranges();
        RETURN;
    END IF;
    EXECUTE 'SELECT citus_is_coordinator()' INTO STRICT coordinator;
    IF NOT coordinator THEN
        RAISE EXCEPTION 'lease.distribute() runs on the coordinator' USING ERRCODE = 'feature_not_supported';
    END IF;
    IF EXISTS (SELECT FROM lease.attachment) THEN
        RAISE EXCEPTION 'a database with attached tables cannot be distributed'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Detach them first (lease.detach).';
    END IF;
    -- A distributed function's command (the ALTER FUNCTION below) must
    -- come over one connection per node, so the copies do too.
    PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    IF shard_count IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.shard_count', shard_count::text, true);
    END IF;
    -- Citus distributes no table with triggers; this one serves only attached
    -- tables, which a distributed install refuses.
    DROP TRIGGER pg_lease_outcome ON lease.job;
    -- A unique key of a distributed table holds its distribution column.
    -- Ids stay unique across nodes by lease._assign_id_ranges.
    ALTER TABLE lease.job DROP CONSTRAINT job_pkey, ADD PRIMARY KEY (id, queue);
    PERFORM create_distributed_table('lease.queue', 'name');
    FOREACH t IN ARRAY ARRAY['lease.job', 'lease.counter', 'lease.key_slot', 'lease.queue_grant', 'lease.session',
                                'lease.rate_share', 'lease.fairness_key'] LOOP
        PERFORM create_distributed_table(t::regclass, 'queue', colocate_with := 'lease.queue');
    END LOOP;
    -- The functions forwarded to the node of their queue, with the argument
    -- that names it.
    FOR f, arg IN SELECT * FROM (VALUES
            ('lease.create_queue(text, integer, interval, interval, interval, interval, text, integer, integer, integer, interval)', 'name'),
            ('lease.enqueue(text, jsonb, text, timestamptz, integer, text, text, text)', 'queue'),
            ('lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer, text[], text[])', 'queue'),
            ('lease.claim_pending(integer, interval, text, text)', 'queue'),
            ('lease.reclaim_own(integer, interval, text, text)', 'queue'),
            ('lease.ready_channel(text)', 'queue'),
            ('lease.rate_wait(text)', 'queue'),
            ('lease.release_and_claim(bigint[], text, bigint[], integer, interval, text)', 'queue'),
            ('lease.renew(bigint, text, bigint, interval, text)', 'queue'),
            ('lease.renew_batch(bigint[], text, bigint[], interval, text)', 'queue'),
            ('lease.release(bigint, text, bigint, text, timestamptz, text, text)', 'queue'),
            ('lease.release_batch(bigint[], text, bigint[], text, timestamptz, text, text)', 'queue'),
            ('lease.fenced_update(bigint, bigint, jsonb, text)', 'queue'),
            ('lease.cancel(bigint, text)', 'queue'),
            ('lease.cancel_key(text, text)', 'queue')) AS v(f, arg) LOOP
        PERFORM create_distributed_function(f::regprocedure, arg, colocate_with := 'lease.queue');
        -- Citus cannot route every statement of a generic plan, whose queue
        -- is a parameter: plan each statement of a forwarded call, and of
        -- the functions it calls, for that call's queue (claim.sql says what
        -- the generic plan saves on a single node).
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f);
    END LOOP;
    -- lease.metrics joins each queue with lease._queue_head(name), which
    -- Citus pushes down to the node holding the queue; there the function's
    -- reads of lease.job are queries nested in a shard's, which Citus
    -- refuses unless allowed. They read that queue alone, on that node.
    -- Distributed, the function keeps the setting on nodes added later.
    PERFORM create_distributed_function('lease._queue_head(text)'::regprocedure, 'queue',
                                        colocate_with := 'lease.queue');
    ALTER FUNCTION lease._queue_head(text) SET citus.allow_nested_distributed_execution = on;
    PERFORM lease._assign_id_ranges();
END
$$;

COMMENT ON FUNCTION lease.distribute(integer) IS
$$Makes this database's pg_lease a distributed install on Citus (run it once on the coordinator, as the
extension's owner, after adding the worker nodes): lease.queue is distributed by name and every table keyed
by queue by its queue, in one colocation group, so each queue lives on one worker node; create_queue,
enqueue, enqueue_batch, claim_pending, reclaim_own, release_and_claim, ready_channel, cancel_key, and
renew, release, their batch forms, fenced_update and cancel given their queue are forwarded to the node
holding it, one round trip (lease.fence given its queue runs in the caller's transaction, which locks the
row on that node). The reaper of
each node sweeps the queues that node holds.
SHARD_COUNT overrides citus.shard_count for these tables. Each node draws row ids from a range of its own;
call it again after adding nodes, to give them theirs (it changes nothing else the second time).
Experimental: docs/operations.md says what a distributed install supports so far.
Errors: 0A000 no Citus here, not the coordinator, or attached tables exist.$$;
