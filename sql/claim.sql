-- Claiming: the one statement that turns pending rows into leases.

CREATE FUNCTION lease.claim_pending(
    "limit" integer,
    ttl     interval,
    owner   text,
    queue   text DEFAULT 'default'
) RETURNS SETOF lease.claim
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Without this, plpgsql re-plans the claim on every call: the custom plan for
-- a small LIMIT always looks cheaper than the generic one (measured: 20016
-- plans for 20000 calls, ~95 us each, 0.73x vs 0.56x of hand-written SQL at
-- batch 1). The generic plan was checked with EXPLAIN at 10^6 pending rows:
-- index scan on job_ready, then primary-key lookups.
SET plan_cache_mode = force_generic_plan
-- A session keeps that plan until lease.job's statistics change, so it must
-- not depend on them: planned while the table was small, or while its
-- statistics counted no live rows, it read the whole backlog on every claim
-- (a sequential scan for the primary-key lookup, or a bitmap scan of every
-- pending row and a sort; tests/claim_plan.rs). The claim needs none of
-- the three: only the ordered scan of job_ready and index lookups remain.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
-- The sort that returns the rows in claim order remains, costed at the
-- penalty for a disabled node: past every JIT threshold, which cost 2.4 s of
-- compiling per claim. A claim is short; JIT never pays.
SET jit = off
AS $$
DECLARE
    -- Both lowered and moved on by a rate limit.
    n integer := "limit";
    t timestamptz := clock_timestamp();
    d constant interval := ttl;
    o constant text := owner;
    q constant text := queue;
    f constant bigint := lease.epoch_floor();
    got bigint;
    restricted boolean;
    paused boolean;
    limited boolean;
    per interval;
    -- What a rate limit let this claim take, and from where (rate.sql).
    shares integer[];
    takes integer[];
    -- When the queue's head (head.sql) was last moved up.
    raised timestamptz;
    -- Whether a fairness key of the queue has a rate limit, the keys whose
    -- limit is full (key_rate.sql), and the rows picked with their keys.
    keyed boolean;
    full_keys text[] := '{}';
    ids bigint[];
    keys text[];
BEGIN
    -- The raising checks are plpgsql functions; calling four of them on every
    -- claim cost ~0.1 ms, so they run only when one of the (inlined) rules
    -- fails.
    IF NOT (lease._valid_limit(n) AND lease._valid_ttl(d) AND lease._valid_owner(o) AND q IS NOT NULL) THEN
        PERFORM lease._checked_limit(n), lease._checked_ttl(d), lease._checked_owner(o),
                lease._checked_not_null(q, 'queue');
    END IF;
    SELECT qu.restricted, qu.head_raised_at, qu.paused, qu.rate_limit IS NOT NULL, qu.rate_period, qu.key_limited
      INTO restricted, raised, paused, limited, per, keyed
      FROM lease.queue qu WHERE qu.name = q;
    -- Inline, not a call of lease._check_access: this runs on every claim.
    IF restricted THEN
        PERFORM lease._check_access(q, '{work}');
    END IF;
    IF paused THEN
        RETURN;
    END IF;
    -- Only a limited queue's claims take permits (rate.sql).
    IF limited THEN
        SELECT r.permitted, r.at, r.shares, r.takes INTO n, t, shares, takes FROM lease._rate_take(q, per, n) AS r;
        IF n = 0 THEN
            RETURN;
        END IF;
    END IF;
    IF keyed THEN
        full_keys := ARRAY(SELECT f.key FROM lease.fairness_key f
                       WHERE f.queue = q AND f.rate_limit IS NOT NULL AND f.full_until > t);
    END IF;
    -- The picked ids are materialised once, in claim order, and fed to the
    -- UPDATE as an array:
    --  * "id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)" may be re-run by
    --    the executor and lease more than n rows (PostgreSQL bug #15715);
    --  * "= ANY(ARRAY(...))" is a primary-key index scan whatever the plan
    --    cache assumes about n; a join against a CTE can turn into a hash
    --    join over the whole table under a generic plan.
    -- The scan starts at the head: first the rest of the head's priority
    -- from the head on, then the lower priorities (the row comparison only
    -- bounds an index scan over columns of one direction). Before the
    -- first raise the head is the start, and the first arm finds nothing.
    -- The head is read in this statement: with the rows, in one snapshot,
    -- so a row committed just before is never before a head read earlier.
    SELECT array_agg(p.id), array_agg(p.fairness_key) INTO ids, keys
      FROM (SELECT a.id, a.fairness_key
              FROM lease.queue h
             CROSS JOIN LATERAL (
                    SELECT j.id, j.fairness_key
                      FROM lease.job j
                     WHERE j.queue = q AND j.priority = h.head_priority
                       AND (j.rank, j.next_at, j.id) >= (h.head_rank, h.head_next_at, h.head_id)
                       AND j.state = 'pending' AND NOT j.held
                       AND j.next_at <= t
                       AND coalesce(j.fairness_key, '') <> ALL (full_keys)
                     ORDER BY j.rank, j.next_at, j.id
                     LIMIT n
                       FOR UPDATE OF j SKIP LOCKED) AS a
             WHERE h.name = q
            UNION ALL
            SELECT b.id, b.fairness_key
              FROM lease.queue h
             CROSS JOIN LATERAL (
                    SELECT j.id, j.fairness_key
                      FROM lease.job j
                     WHERE j.queue = q AND j.priority < h.head_priority
                       AND j.state = 'pending' AND NOT j.held
                       AND j.next_at <= t
                       AND coalesce(j.fairness_key, '') <> ALL (full_keys)
                     ORDER BY j.priority DESC, j.rank, j.next_at, j.id
                     LIMIT n
                       FOR UPDATE OF j SKIP LOCKED) AS b
             WHERE h.name = q
             LIMIT n) AS p;
    -- Of those, what the keys' rate limits let through; the claim's time
    -- is read after their locks (key_rate.sql).
    IF keyed AND ids IS NOT NULL THEN
        SELECT k.kept, k.at INTO ids, t FROM lease._key_rate_take(q, ids, keys) AS k;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE lease.job j
           SET state       = 'leased',
               owner       = o,
               epoch       = greatest(j.epoch + 1, f),
               attempt     = j.attempt + 1,
               lease_until = t + d
         WHERE j.queue = q AND j.id = ANY (ids)
        RETURNING j.id, j.queue, j.key, j.payload, j.epoch, j.attempt, j.lease_until, j.next_at,
                  j.priority, j.rank
    )
    -- The UPDATE names the queue and takes the time from t: on a distributed
    -- install (citus.sql) it runs on the queue's node, which would send it
    -- to every shard without the queue, and Citus refuses a VOLATILE
    -- function in an UPDATE.
    -- The UPDATE returns rows in the order it meets them, not the order
    -- they were picked in; callers start a batch from its first row.
    SELECT c.id, c.queue, c.key, c.payload, c.epoch, c.attempt, c.lease_until, c.next_at
      FROM claimed c
     ORDER BY c.priority DESC, c.rank, c.next_at, c.id;

    GET DIAGNOSTICS got = ROW_COUNT;
    IF limited AND got > 0 THEN
        PERFORM lease._rate_record(q, per, t, shares, takes, got::integer);
    END IF;
    IF got = 0 THEN
        -- Only an empty claim pays for telling "no work" from "no such queue".
        PERFORM lease._checked_queue(q);
    ELSE
        -- New leases: the reaper has work here once they may expire, and
        -- their rows count towards waking it for a vacuum.
        PERFORM lease._reaper_touch(got);
        -- lease._count's upsert, written out: on the batch-1 path calling
        -- _count cost as much as its upsert (docs/archive/performance-history.md, the
        -- callgrind table).
        INSERT INTO lease.counter AS c (queue, backend, claimed, pending)
        VALUES (q, pg_backend_pid(), got, -got)
            ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
           SET claimed = c.claimed + excluded.claimed, pending = c.pending + excluded.pending;
        -- What this claim and those before it took is behind the head now:
        -- move it up, at most every 50 ms and only where the queue row's
        -- lock ends with this statement (head.sql).
        IF raised < t - interval '50 milliseconds' AND lease._own_transaction() THEN
            PERFORM lease._raise_head(q, false);
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION lease.claim_pending(integer, interval, text, text) IS
$$Leases up to LIMIT claimable rows of QUEUE to OWNER for TTL and returns them with their fencing
token (id, epoch), attempt number, lease_until and eligible_at (when the row became claimable), both by
the database clock. One statement; rows are taken, and returned,
in order of priority (highest first), rank (an attached table's order_by), next-eligible time, id; rows locked by others are skipped,
never waited for; a paused queue (lease.pause) gives none, and a queue with a rate limit (lease.create_queue)
no more than it allows (lease_until - TTL is the time the limit counts the rows claimed at; see
lease.rate_wait): its permits are dealt out in sixteen shares, each held by one claim until its transaction
ends, and a claim that finds every share held for 100 ms gets no rows; a fairness key with a rate limit
(lease.set_key_rate) no more of its rows than its limit allows, the other keys' rows instead. Every claim
gives the row an epoch greater than any it had before, also across a
standby promotion (see lease.epoch_floor).
Errors: 22004 an argument NULL; 22023 limit outside 1..10000, ttl not in (0, 1 day], owner empty or
over 256 characters; 42704 no such queue; 42501 the queue is restricted and the caller may not work it.$$;

CREATE FUNCTION lease.reclaim_own(
    "limit" integer,
    ttl     interval,
    owner   text,
    queue   text DEFAULT 'default'
) RETURNS SETOF lease.claim
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n constant integer := lease._checked_limit("limit");
    d constant interval := lease._checked_ttl(ttl);
    o constant text := lease._checked_owner(owner);
    q constant text := lease._checked_queue(queue);
    f constant bigint := lease.epoch_floor();
    got bigint;
BEGIN
    PERFORM lease._check_access(q, '{work}');
    -- A process restarted under a stable owner name (a StatefulSet
    -- hostname) takes back what its earlier incarnation held, at once and
    -- under new epochs, instead of waiting for those leases to expire. The
    -- earlier incarnation, if it is in fact still running, is fenced off.
    -- Each reclaim spends an attempt; a row that has spent them all is left
    -- to expire, and the reaper dead-letters it, so attempts stay bounded.
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT j.id
          FROM lease.job j
         WHERE j.queue = q AND j.state = 'leased' AND j.owner = o
           AND j.attempt < (SELECT qu.max_attempts FROM lease.queue qu WHERE qu.name = q)
         ORDER BY j.priority DESC, j.rank, j.next_at, j.id
         LIMIT n
           FOR UPDATE SKIP LOCKED
    ), reclaimed AS (
        UPDATE lease.job j
           SET epoch       = greatest(j.epoch + 1, f),
               attempt     = j.attempt + 1,
               lease_until = lease._now() + d
         WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked p)) AND j.queue = q
        RETURNING j.id, j.queue, j.key, j.payload, j.epoch, j.attempt, j.lease_until, j.next_at,
                  j.priority, j.rank
    )
    -- In claim order, as lease.claim_pending returns its rows.
    SELECT r.id, r.queue, r.key, r.payload, r.epoch, r.attempt, r.lease_until, r.next_at
      FROM reclaimed r
     ORDER BY r.priority DESC, r.rank, r.next_at, r.id;
    GET DIAGNOSTICS got = ROW_COUNT;
    PERFORM lease._reaper_touch(got);
    IF got > 0 THEN
        PERFORM lease._count(q, claimed => got);
    END IF;
END
$$;

COMMENT ON FUNCTION lease.reclaim_own(integer, interval, text, text) IS
$$For a process restarted under the same OWNER name: leases again, under new epochs and for TTL, up to
LIMIT rows of QUEUE that OWNER still holds (expired or not, but not yet reaped), so its in-progress work
resumes at once; returned in claim order, as lease.claim_pending. The earlier incarnation's tokens are
fenced. Each reclaim spends an attempt; rows that have spent max_attempts are not reclaimed (they expire
and are dead-lettered). Call it once at start-up,
before any claim: rows the current incarnation holds would be re-issued too.
Errors: 22004 an argument NULL; 22023 limit, ttl or owner invalid; 42704 no such queue; 42501 the queue
is restricted and the caller may not work it.$$;

CREATE FUNCTION lease.release_and_claim(
    ids     bigint[],
    owner   text,
    epochs  bigint[],
    "limit" integer,
    ttl     interval,
    queue   text DEFAULT 'default'
) RETURNS TABLE (released boolean, id bigint, key text, payload jsonb, epoch bigint, attempt integer,
                 lease_until timestamptz, eligible_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- A worker whose handlers finished records them done and fills the
    -- freed slots in one statement and one commit, instead of two.
    IF "limit" IS NULL OR "limit" < 0 THEN
        PERFORM lease._checked_limit("limit");
    END IF;
    RETURN QUERY
    SELECT r.released, r.id, NULL::text, NULL::jsonb, NULL::bigint, NULL::integer, NULL::timestamptz,
           NULL::timestamptz
      FROM lease.release_batch(ids, owner, epochs, queue => release_and_claim.queue)
           WITH ORDINALITY AS r(id, released, ord)
     ORDER BY r.ord;
    IF "limit" > 0 THEN
        RETURN QUERY
        SELECT NULL::boolean, c.id, c.key, c.payload, c.epoch, c.attempt, c.lease_until, c.eligible_at
          FROM lease.claim_pending("limit", ttl, owner, release_and_claim.queue) WITH ORDINALITY AS c
         ORDER BY c.ordinality;
    END IF;
END
$$;

COMMENT ON FUNCTION lease.release_and_claim(bigint[], text, bigint[], integer, interval, text) IS
$$lease.release_batch(IDS, OWNER, EPOCHS, QUEUE) with outcome 'done', then lease.claim_pending(LIMIT, TTL,
OWNER, QUEUE), in one statement: first one row per element of IDS, in order, with RELEASED set and the
claim columns NULL; then one row per claimed row (of QUEUE), in claim order, with RELEASED NULL. LIMIT 0 only releases.
Errors: those of the two functions.$$;
