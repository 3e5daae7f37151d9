-- pg_lease 0.1.0 -> 0.2.0 (the security pass; see CHANGELOG.md).
--
-- Held leases, named leases, queues and attachments carry over: no row of
-- lease.job or lease.named_lease is rewritten, and every token stays valid.
-- The end state must equal a fresh 0.2.0 install (pg_tests/tests/upgrade.rs
-- compares the catalogs); how to write such a script is in CONTRIBUTING.md.
--
-- Sections: tables; what 0.2.0 no longer has; functions and views new or
-- changed in 0.2.0, as in sql/ (an upgrade script must repeat them: an
-- extension script cannot include another file); the attached tables'
-- triggers, recreated for the new trigger function; privileges.

-- Tables --------------------------------------------------------------------

ALTER TABLE lease.queue
    ADD COLUMN restricted boolean NOT NULL DEFAULT false,
    ADD COLUMN attached   boolean NOT NULL DEFAULT false,
    -- Queues that exist keep exact retry delays; new ones get jitter.
    ADD COLUMN jitter     text NOT NULL DEFAULT 'none' CHECK (jitter IN ('full', 'none')),
    ADD COLUMN concurrency integer CHECK (concurrency BETWEEN 1 AND 100000),
    -- A constant default: no table rewrite.
    ADD COLUMN max_payload_bytes integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes BETWEEN 1 AND 268435455),
    ADD COLUMN paused boolean NOT NULL DEFAULT false;
ALTER TABLE lease.queue ALTER COLUMN jitter SET DEFAULT 'full';
-- Each queue's head (sql/head.sql), at the start: claims read from there
-- until the first sweep moves it.
ALTER TABLE lease.queue
    ADD COLUMN head_priority   integer NOT NULL DEFAULT 2147483647,
    ADD COLUMN head_rank       bigint NOT NULL DEFAULT -9223372036854775808,
    ADD COLUMN head_next_at    timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN head_id         bigint NOT NULL DEFAULT -9223372036854775808,
    ADD COLUMN head_raised_at  timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN head_checked_at timestamptz NOT NULL DEFAULT '-infinity';
-- Rate limits (sql/rate.sql): none until create_queue sets one.
ALTER TABLE lease.queue
    ADD COLUMN rate_limit  integer CHECK (rate_limit BETWEEN 1 AND 100000),
    ADD COLUMN rate_period interval NOT NULL DEFAULT '1 second' CHECK (rate_period > interval '0');
-- Fairness (sql/fairness.sql): no queue is fair until a row has a fairness_key,
-- and none has a key with a rate limit (sql/key_rate.sql).
ALTER TABLE lease.queue ADD COLUMN fair boolean NOT NULL DEFAULT false;
ALTER TABLE lease.queue ADD COLUMN key_limited boolean NOT NULL DEFAULT false;

-- Constant defaults: no table rewrite. The claim index follows the new
-- claim order (priority, rank, next_at, id) and leaves out rows held for a
-- concurrency slot (sql/concurrency.sql).
ALTER TABLE lease.job ADD COLUMN rank bigint NOT NULL DEFAULT 0;
ALTER TABLE lease.job ADD COLUMN unique_key text;
ALTER TABLE lease.job ADD COLUMN concurrency_key text, ADD COLUMN held boolean NOT NULL DEFAULT false;
ALTER TABLE lease.job ADD COLUMN fairness_key text;
-- Autovacuum must not hold the table for seconds (schema.sql).
ALTER TABLE lease.job SET (autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
DROP INDEX lease.job_ready;
CREATE INDEX job_ready ON lease.job (queue, priority DESC, rank, next_at, id)
    WHERE state = 'pending' AND NOT held;
CREATE INDEX job_held ON lease.job (queue, concurrency_key, priority DESC, id)
    WHERE state = 'pending' AND held;
CREATE INDEX job_dead_or_cancelled ON lease.job (queue, state, id)
    WHERE state IN ('dead', 'cancelled');

CREATE TABLE lease.key_slot (
    queue   text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key     text NOT NULL,
    active  integer NOT NULL DEFAULT 0 CHECK (active >= 0),
    waiting integer NOT NULL DEFAULT 0 CHECK (waiting >= 0),
    PRIMARY KEY (queue, key)
)
WITH (fillfactor = 70);
COMMENT ON TABLE lease.key_slot IS
    'Per (queue, concurrency_key): admitted and held rows (see lease.enqueue''s concurrency_key). Kept by the lease.* functions; empty rows are removed by lease.sweep.';

CREATE TABLE lease.rate_share (
    queue  text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    share  integer NOT NULL CHECK (share BETWEEN 0 AND 15),
    -- This share's part of the queue's rate_limit: their sum is the limit.
    permits integer NOT NULL CHECK (permits >= 0),
    -- The claims of the last rate_period, oldest first: when (the database
    -- clock, as the claim stamped its rows) and how many rows each took.
    starts timestamptz[] NOT NULL DEFAULT '{}',
    counts integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (queue, share)
)
-- Rewritten on every claim of its queue: room for HOT.
WITH (fillfactor = 50);

COMMENT ON TABLE lease.rate_share IS
    'Per queue with a rate limit: the sixteen shares of its permits and the claims each let through in the last rate_period. Kept by lease.create_queue and lease.claim_pending.';

CREATE TABLE lease.fairness_key (
    queue     text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key       text NOT NULL,
    weight    integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    -- The rank the key's next row gets unless the head is past it.
    next_rank bigint NOT NULL DEFAULT 0,
    -- At most rate_limit of the key's rows claimed in any span of
    -- rate_period; NULL: no limit (key_rate.sql).
    rate_limit  integer CHECK (rate_limit BETWEEN 1 AND 100000),
    rate_period interval NOT NULL DEFAULT '1 second' CHECK (rate_period > interval '0'),
    -- The claims of the last rate_period, oldest first, as a rate share's.
    starts timestamptz[] NOT NULL DEFAULT '{}',
    counts integer[] NOT NULL DEFAULT '{}',
    -- Until when the window is full: claims leave the key's rows out.
    full_until timestamptz,
    PRIMARY KEY (queue, key)
)
-- A limited key's row is rewritten by its claims: room for HOT.
WITH (fillfactor = 70);

-- A queue claimed empty starts its keys past the last of their rows.
CREATE INDEX fairness_key_next ON lease.fairness_key (queue, next_rank);
-- The limited keys a claim leaves out (key_rate.sql).
CREATE INDEX fairness_key_full ON lease.fairness_key (queue, full_until) WHERE rate_limit IS NOT NULL;

COMMENT ON TABLE lease.fairness_key IS
    'Per (queue, fairness_key): its weight (lease.set_weight), the rank its next row gets, and its rate limit and the claims that count towards it (lease.set_key_rate). Kept by lease.enqueue, lease.enqueue_batch and lease.claim_pending.';


CREATE UNIQUE INDEX job_unique_active ON lease.job (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'leased');

CREATE TABLE lease.queue_grant (
    queue   text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    grantee regrole NOT NULL,
    work    boolean NOT NULL,
    produce boolean NOT NULL,
    PRIMARY KEY (queue, grantee)
);

COMMENT ON TABLE lease.queue_grant IS
    'Roles granted work and/or produce rights on a restricted queue. Change it with lease.grant / lease.revoke.';

ALTER TABLE lease.attachment ADD COLUMN key_attnum smallint, ADD COLUMN order_attnum smallint,
    ADD COLUMN on_dead text, ADD COLUMN on_cancel text, ADD COLUMN outcome_function regprocedure;
UPDATE lease.attachment a
   SET key_attnum = (SELECT c.attnum FROM pg_catalog.pg_attribute c
                      WHERE c.attrelid = a.rel AND c.attname = a.key_column);
UPDATE lease.queue q SET attached = true
 WHERE q.name IN (SELECT a.queue FROM lease.attachment a);

COMMENT ON TABLE lease.attachment IS
    'Domain tables attached with lease.attach(): their queue, primary-key column and order_by column (by number), pending predicate, on_dead/on_cancel SET lists and the function applying them.';

CREATE TABLE lease.schedule (
    name        text PRIMARY KEY CHECK (name <> '' AND length(name) <= 128),
    queue       text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    cron        text,
    every       interval CHECK (every > interval '0'),
    anchor      timestamptz NOT NULL,
    payload     jsonb NOT NULL,
    priority    integer NOT NULL DEFAULT 0,
    missed      text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'catch_up')),
    next_at     timestamptz,
    enqueued    bigint NOT NULL DEFAULT 0,
    last_run_at timestamptz,
    last_job_id bigint,
    last_error  text,
    last_error_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((cron IS NULL) <> (every IS NULL))
);

CREATE INDEX schedule_due ON lease.schedule (next_at);

COMMENT ON TABLE lease.schedule IS
    'Periodic enqueues, one row per schedule. Change them with lease.schedule() and lease.unschedule().';

-- lease.metrics' counters (sql/metrics.sql), started from the rows as they
-- are: the gauges must match them; the totals count from the update on.
CREATE TABLE lease.counter (
    queue     text NOT NULL,
    -- pg_backend_pid() of the writer; 0 for the folded sums.
    backend   integer NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    claimed   bigint NOT NULL DEFAULT 0,
    done      bigint NOT NULL DEFAULT 0,
    retried   bigint NOT NULL DEFAULT 0,
    died      bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    -- Deltas of the number of pending and of dead rows.
    pending   bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, backend)
)
-- Room for HOT updates: a counter row is rewritten by every call.
WITH (fillfactor = 50);

COMMENT ON TABLE lease.counter IS
    'Per queue and writing backend: totals of state changes and deltas of pending and dead rows. Read them through lease.metrics.';

INSERT INTO lease.counter (queue, backend, pending, dead)
SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'pending'), count(*) FILTER (WHERE j.state = 'dead')
  FROM lease.job j
 GROUP BY j.queue;

-- The leases of one owner in one queue (schema.sql).
CREATE INDEX job_owner ON lease.job (queue, owner)
    WHERE state = 'leased';

-- Claims say when each row became claimable.
ALTER TYPE lease.claim ADD ATTRIBUTE eligible_at timestamptz;
COMMENT ON TYPE lease.claim IS
    'A row handed out by lease.claim_pending, with its fencing token (id, epoch), the database time its lease ends, and when it became claimable.';

-- Write-backs recorded, to be applied as the table's owner (outcome.sql).
CREATE TABLE lease.write_back (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    key         text NOT NULL,
    outcome     lease.job_state NOT NULL CHECK (outcome IN ('dead', 'cancelled')),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts    integer NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error  text
);

CREATE INDEX write_back_queue ON lease.write_back (queue);

COMMENT ON TABLE lease.write_back IS
    'on_dead/on_cancel write-backs recorded and not yet applied to their table rows (read them through lease.write_backs).';

-- The secret of the queues' NOTIFY channels (wake.sql).
CREATE TABLE lease.channel_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   text NOT NULL DEFAULT md5(gen_random_uuid()::text)
);

COMMENT ON TABLE lease.channel_secret IS
    'The secret that the NOTIFY channel names of the queues are derived from (lease.ready_channel); readable by the extension''s owner only.';

INSERT INTO lease.channel_secret DEFAULT VALUES;

-- Leases bound to a session (session.sql).
CREATE TABLE lease.session (
    queue         text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    owner         text NOT NULL,
    -- The keeper: its backend, and that backend's start where the binding
    -- role could read it (so that a reused pid is not taken for it).
    pid           integer NOT NULL,
    backend_start timestamptz,
    -- The server's start: after a restart no pid of before is alive.
    server_start  timestamptz NOT NULL,
    bound_at      timestamptz NOT NULL,
    PRIMARY KEY (queue, owner)
);

COMMENT ON TABLE lease.session IS
    'Leases bound to a session (lease.bind_session): per queue and owner, the backend whose end ends them.';

-- What 0.2.0 no longer has --------------------------------------------------

-- The old triggers call the old trigger function; they are recreated below.
DO $$
DECLARE
    a record;
BEGIN
    FOR a IN SELECT * FROM lease.attachment LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_start ON %1$s;
                        DROP TRIGGER IF EXISTS pg_lease_stop ON %1$s;
                        DROP TRIGGER IF EXISTS pg_lease_update_start ON %1$s;
                        DROP TRIGGER IF EXISTS pg_lease_update_stop ON %1$s', a.rel);
    END LOOP;
END
$$;

ALTER TABLE lease.attachment DROP COLUMN key_column;
ALTER TABLE lease.attachment ALTER COLUMN key_attnum SET NOT NULL;

DROP FUNCTION lease.attached_row_changed();
DROP FUNCTION lease.sync_attached(text, text[], text[]);
DROP FUNCTION lease.register_attachment(regclass, text, name, text, integer, interval, interval, interval);
DROP FUNCTION lease.unregister_attachment(text);
DROP FUNCTION lease.next_state(text, boolean, integer, integer);
DROP FUNCTION lease.attach(regclass, text, text, integer, interval, interval, interval);
-- Gained jitter, concurrency and max_payload_bytes.
DROP FUNCTION lease.create_queue(text, integer, interval, interval, interval, interval);
-- Gained unique_key and concurrency_key.
DROP FUNCTION lease.enqueue(text, jsonb, text, timestamptz, integer);
-- Gained concurrency_keys.
DROP FUNCTION lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer);
-- Changes language and body; its signature stays, but dropping is simplest.
DROP FUNCTION lease.reap(integer);
-- Gained eligible_at in its result.
DROP FUNCTION lease.release_and_claim(bigint[], text, bigint[], integer, interval, text);
-- Gained queue, which routes them on a distributed install.
DROP FUNCTION lease.renew(bigint, text, bigint, interval);
DROP FUNCTION lease.renew_batch(bigint[], text, bigint[], interval);
DROP FUNCTION lease.release(bigint, text, bigint, text, timestamptz, text);
DROP FUNCTION lease.release_batch(bigint[], text, bigint[], text, timestamptz, text);
DROP FUNCTION lease.fenced_update(bigint, bigint, jsonb);
DROP FUNCTION lease.fence(bigint, bigint);
DROP FUNCTION lease.cancel(bigint);
DROP VIEW lease.reaper_stats;

-- Internal helpers take the `_` prefix of the internal functions. A
-- rename keeps each one's identity: callers with SQL-standard bodies
-- follow it; plpgsql callers are replaced below.
ALTER FUNCTION lease.valid_owner(text) RENAME TO _valid_owner;
ALTER FUNCTION lease.valid_ttl(interval) RENAME TO _valid_ttl;
ALTER FUNCTION lease.valid_limit(integer) RENAME TO _valid_limit;
ALTER FUNCTION lease.valid_outcome(text) RENAME TO _valid_outcome;
ALTER FUNCTION lease.checked_owner(text) RENAME TO _checked_owner;
ALTER FUNCTION lease.checked_ttl(interval) RENAME TO _checked_ttl;
ALTER FUNCTION lease.checked_limit(integer) RENAME TO _checked_limit;
ALTER FUNCTION lease.checked_queue(text) RENAME TO _checked_queue;
ALTER FUNCTION lease.checked_not_null(anyelement, text) RENAME TO _checked_not_null;
ALTER FUNCTION lease.checked_same_length(bigint[], bigint[]) RENAME TO _checked_same_length;
ALTER FUNCTION lease.checked_outcome(text) RENAME TO _checked_outcome;
ALTER FUNCTION lease.checked_name(text) RENAME TO _checked_name;
ALTER FUNCTION lease.backoff(integer, interval, interval) RENAME TO _backoff;
ALTER FUNCTION lease.wake(text, integer) RENAME TO _wake;

-- The renamed checks and 0.1.0's plpgsql callers that 0.2.0 does not
-- otherwise change, as in sql/check.sql and sql/named.sql.

CREATE OR REPLACE FUNCTION lease._checked_owner(owner text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF owner IS NULL THEN
        RAISE EXCEPTION 'owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_owner(owner) THEN
        RAISE EXCEPTION 'owner must be 1 to 256 characters long (got %)', length(owner)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN owner;
END
$$;

COMMENT ON FUNCTION lease._checked_owner(text) IS
    'Internal: returns owner, or raises 22004 if NULL, 22023 if empty or longer than 256 characters.';

CREATE OR REPLACE FUNCTION lease._checked_limit(n integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF n IS NULL THEN
        RAISE EXCEPTION 'limit must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_limit(n) THEN
        RAISE EXCEPTION 'limit must be between 1 and 10000 (got %)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END
$$;

COMMENT ON FUNCTION lease._checked_limit(integer) IS
    'Internal: returns n, or raises 22004 if NULL, 22023 unless 1 <= n <= 10000.';

CREATE OR REPLACE FUNCTION lease._checked_queue(queue text) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM lease.queue q WHERE q.name = _checked_queue.queue) THEN
        PERFORM lease._no_such_queue(queue);
    END IF;
    RETURN queue;
END
$$;

COMMENT ON FUNCTION lease._checked_queue(text) IS
    'Internal: returns queue, or raises 22004 if NULL, 42704 if no such queue exists.';

CREATE OR REPLACE FUNCTION lease._no_such_queue(queue text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    RAISE EXCEPTION 'queue "%" does not exist', queue
        USING ERRCODE = 'undefined_object',
              HINT = 'Create it with lease.create_queue(); a restricted queue exists only for the roles granted on it.';
END
$$;

COMMENT ON FUNCTION lease._no_such_queue(text) IS
    'Internal: raises 42704, queue QUEUE does not exist (also for a restricted queue the caller holds no right on).';

CREATE OR REPLACE FUNCTION lease._checked_not_null(value anyelement, what text) RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN value;
END
$$;

COMMENT ON FUNCTION lease._checked_not_null(anyelement, text) IS
    'Internal: returns value, or raises 22004 naming the argument when it is NULL.';

CREATE OR REPLACE FUNCTION lease._checked_same_length(ids bigint[], epochs bigint[]) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF ids IS NULL OR epochs IS NULL THEN
        RAISE EXCEPTION 'ids and epochs must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(ids) <> cardinality(epochs) THEN
        RAISE EXCEPTION 'ids has % elements, epochs has %', cardinality(ids), cardinality(epochs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(ids) > 10000 THEN
        RAISE EXCEPTION 'at most 10000 leases per call (got %)', cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(ids, NULL) IS NOT NULL OR array_position(epochs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ids and epochs must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN cardinality(ids);
END
$$;

COMMENT ON FUNCTION lease._checked_same_length(bigint[], bigint[]) IS
    'Internal: returns the length of ids, or raises 22004 for NULL arrays/elements, 22023 for unequal lengths or more than 10000 elements.';

CREATE OR REPLACE FUNCTION lease._checked_outcome(outcome text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF outcome IS NULL THEN
        RAISE EXCEPTION 'outcome must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_outcome(outcome) THEN
        RAISE EXCEPTION 'outcome must be one of done, retry, fail, abandon (got "%")', outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN outcome;
END
$$;

COMMENT ON FUNCTION lease._checked_outcome(text) IS
    'Internal: returns outcome, or raises 22004 if NULL, 22023 unless done/retry/fail/abandon.';

CREATE OR REPLACE FUNCTION lease._checked_name(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF name = '' OR length(name) > 128 THEN
        RAISE EXCEPTION 'name must be 1 to 128 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN name;
END
$$;

COMMENT ON FUNCTION lease._checked_name(text) IS
    'Internal: returns name, or raises 22004 if NULL, 22023 if empty or longer than 128 characters.';

CREATE OR REPLACE FUNCTION lease.renew_named(name text, owner text, epoch bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nm constant text := lease._checked_name(name);
    o  constant text := lease._checked_owner(owner);
    d  constant interval := lease._checked_ttl(ttl);
    until timestamptz;
BEGIN
    PERFORM lease._checked_not_null(epoch, 'epoch');
    UPDATE lease.named_lease n
       SET lease_until = clock_timestamp() + d
     WHERE n.name = nm AND n.owner = o AND n.epoch = renew_named.epoch
       AND n.lease_until > clock_timestamp()
    RETURNING n.lease_until INTO until;
    RETURN until;
END
$$;

COMMENT ON FUNCTION lease.renew_named(text, text, bigint, interval) IS
$$Extends OWNER's hold on NAME at EPOCH to now + TTL and returns the new lease_until; returns NULL (lost:
expired, released or taken over) and changes nothing otherwise. A holder must step down on NULL.
Errors: 22004 an argument NULL; 22023 name, owner or ttl invalid.$$;

CREATE OR REPLACE FUNCTION lease.release_named(name text, owner text, epoch bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nm constant text := lease._checked_name(name);
    o  constant text := lease._checked_owner(owner);
BEGIN
    PERFORM lease._checked_not_null(epoch, 'epoch');
    -- Expire rather than delete: the row carries the epoch forward.
    UPDATE lease.named_lease n
       SET lease_until = clock_timestamp()
     WHERE n.name = nm AND n.owner = o AND n.epoch = release_named.epoch
       AND n.lease_until > clock_timestamp();
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.release_named(text, text, bigint) IS
$$Gives up OWNER's hold on NAME at EPOCH so another contender can take it at once. Returns false and
changes nothing if that hold is already lost. Errors: 22004 an argument NULL; 22023 name or owner invalid.$$;

CREATE OR REPLACE FUNCTION lease.fence_named(name text, epoch bigint) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nm constant text := lease._checked_name(name);
    until timestamptz;
BEGIN
    PERFORM lease._checked_not_null(epoch, 'epoch');
    SELECT n.lease_until INTO until
      FROM lease.named_lease n
     WHERE n.name = nm AND n.epoch = fence_named.epoch
       AND n.lease_until > clock_timestamp()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'named lease "%" at epoch % is not held', name, epoch
            USING ERRCODE = 'LE001',
                  HINT = 'Roll back: a leader that lost its lease must not write.';
    END IF;
    RETURN until;
END
$$;

COMMENT ON FUNCTION lease.fence_named(text, bigint) IS
$$Guard for a leader's own transaction: succeeds (returning lease_until) only while EPOCH is the current,
unexpired hold on NAME, and locks it until the transaction ends so no new holder can be elected before
the leader's writes commit. Errors: LE001 not held (roll back); 22004 an argument NULL; 22023 name invalid.$$;

-- Functions and views new or changed in 0.2.0 -----------------------------

-- In Rust (extension/src/predicate.rs, shared.rs, cron.rs, statement.rs, as_owner.rs).
CREATE FUNCTION lease."_cron_next"("spec" TEXT, "after" double precision) RETURNS double precision
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'cron_next_wrapper';

CREATE FUNCTION lease."_cron_last"("spec" TEXT, "at" double precision) RETURNS double precision
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'cron_last_wrapper';

CREATE FUNCTION lease."_qualified_predicate"("view" oid, "table" oid, "alias" TEXT) RETURNS TEXT
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'qualified_predicate_wrapper';

CREATE FUNCTION lease."_reaper_discover"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reaper_discover_wrapper';

CREATE FUNCTION lease."_reaper_last_slot_shortage"() RETURNS bigint
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reaper_last_slot_shortage_wrapper';

CREATE FUNCTION lease."_reaper_touch"("rows" bigint DEFAULT 0) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reaper_touch_wrapper';

CREATE FUNCTION lease."_reaper_wake"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reaper_wake_wrapper';

CREATE FUNCTION lease."_reaper_slot_shortages"() RETURNS bigint
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reaper_slot_shortages_wrapper';

CREATE FUNCTION lease."_own_transaction"() RETURNS bool
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'own_transaction_wrapper';

CREATE FUNCTION lease."_lock_table_rows"("rel" oid, "key_column" TEXT, "keys" TEXT[]) RETURNS TEXT[]
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_table_rows_wrapper';

COMMENT ON FUNCTION lease._own_transaction() IS
$$Internal: whether the running statement is a transaction of its own (not inside BEGIN ... COMMIT or a
multi-statement query string), so that a lock it takes is held only until it ends.$$;

COMMENT ON FUNCTION lease._lock_table_rows(oid, text, text[]) IS
$$Internal (lease.fence): locks the rows of table REL whose KEY_COLUMN is among KEYS, FOR NO KEY UPDATE in
key order, as the table's owner in a security-restricted operation whose settings are undone, and returns
the keys it locked; raises 55000 if REL is no longer a table or its key column is gone or retyped.$$;

-- In sql/, in the order of the install script.
-- head.sql: where claims start (new).
CREATE OR REPLACE FUNCTION lease._lower_head(queue text, priority integer, rank bigint, next_at timestamptz, id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The lock keeps a raise from committing until this transaction
        -- has; the next statement's snapshot sees any raise before it.
        PERFORM FROM lease.queue q WHERE q.name = _lower_head.queue FOR KEY SHARE;
    ELSE
        -- One snapshot for the whole transaction: a raise committed since
        -- would go unseen, so take a lock that fails (40001) if there was
        -- one rather than read a stale head.
        PERFORM FROM lease.queue q WHERE q.name = _lower_head.queue FOR SHARE;
    END IF;
    UPDATE lease.queue q
       SET head_priority = _lower_head.priority, head_rank = _lower_head.rank,
           head_next_at = _lower_head.next_at, head_id = _lower_head.id
     WHERE q.name = _lower_head.queue
       AND (-_lower_head.priority::bigint, _lower_head.rank, _lower_head.next_at, _lower_head.id)
           < (-q.head_priority::bigint, q.head_rank, q.head_next_at, q.head_id);
END
$$;

COMMENT ON FUNCTION lease._lower_head(text, integer, bigint, timestamptz, bigint) IS
$$Internal: the caller's transaction made a row of QUEUE pending (and not held) at claim position
(PRIORITY, RANK, NEXT_AT, ID): moves the queue's head back to it if it is before the head. Call it after
the change, in the same transaction; a lower bound of the position (an id of 0) is fine.$$;

CREATE OR REPLACE FUNCTION lease._raise_head(queue text, from_start boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h lease.queue;
    -- The first pending row's position.
    p integer;
    r bigint;
    n timestamptz;
    i bigint;
    t timestamptz;
BEGIN
    -- Only a statement snapshot taken after the lock sees every writer that
    -- made rows pending; a transaction snapshot may predate them.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN false;
    END IF;
    -- A writer between its change and its commit holds the row: try later.
    SELECT * INTO h FROM lease.queue q WHERE q.name = _raise_head.queue FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF from_start THEN
        h.head_priority := 2147483647;
        h.head_rank := -9223372036854775808;
        h.head_next_at := '-infinity';
        h.head_id := -9223372036854775808;
    END IF;
    -- The first pending row at or after the head (claim.sql's two arms,
    -- without the eligibility test and the locks).
    SELECT a.priority, a.rank, a.next_at, a.id INTO p, r, n, i
      FROM ((SELECT j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.queue = _raise_head.queue AND j.priority = h.head_priority
                AND (j.rank, j.next_at, j.id) >= (h.head_rank, h.head_next_at, h.head_id)
                AND j.state = 'pending' AND NOT j.held
              ORDER BY j.rank, j.next_at, j.id
              LIMIT 1)
            UNION ALL
            (SELECT j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.queue = _raise_head.queue AND j.priority < h.head_priority
                AND j.state = 'pending' AND NOT j.held
              ORDER BY j.priority DESC, j.rank, j.next_at, j.id
              LIMIT 1)) AS a
     LIMIT 1;
    IF NOT FOUND THEN
        -- Nothing pending: the end of the order, until a writer lowers it.
        p := -2147483648;
        r := 9223372036854775807;
        n := 'infinity';
        i := 9223372036854775807;
    END IF;
    -- A variable, not clock_timestamp() in the UPDATE: Citus refuses a
    -- VOLATILE function there (citus.sql).
    t := clock_timestamp();
    UPDATE lease.queue q
       SET head_priority = p, head_rank = r, head_next_at = n, head_id = i, head_raised_at = t,
           head_checked_at = CASE WHEN from_start THEN t ELSE q.head_checked_at END
     WHERE q.name = _raise_head.queue;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease._raise_head(text, boolean) IS
$$Internal (lease.sweep, lease.claim_pending): moves the head of QUEUE forward to its first pending row, or to the end of the
claim order if it has none, searching from the head or, with FROM_START, from the start of the queue.
Returns false, changing nothing, when a writer holds the queue row or the transaction is not READ
COMMITTED.$$;

CREATE OR REPLACE FUNCTION lease._lower_heads(ids bigint[], queue text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    -- Queue by queue in name order, so that two callers cannot deadlock on
    -- the queue rows they lower.
    FOR f IN SELECT DISTINCT ON (j.queue) j.queue, j.priority, j.rank, j.next_at, j.id
               FROM lease.job j
              WHERE j.id = ANY (ids) AND j.state = 'pending' AND NOT j.held
                -- Named, the queue keeps the read on its shard (citus.sql).
                AND (_lower_heads.queue IS NULL OR j.queue = _lower_heads.queue)
              ORDER BY j.queue, j.priority DESC, j.rank, j.next_at, j.id LOOP
        PERFORM lease._lower_head(f.queue, f.priority, f.rank, f.next_at, f.id);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._lower_heads(bigint[], text) IS
$$Internal: lease._lower_head for the rows IDS (of QUEUE, when given) that the caller's transaction made pending
(those not pending, or held, are passed over), once per queue with its earliest row.$$;

-- sweep.sql's step that raises them (new).
CREATE OR REPLACE FUNCTION lease._raise_heads(only_queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- A variable: Citus refuses a VOLATILE function in a subquery.
    stale_before constant timestamptz := clock_timestamp() - interval '1 minute';
    q record;
    raised integer := 0;
    from_start boolean;
BEGIN
    IF only_queue IS NOT NULL THEN
        -- One queue, as a distributed install sweeps (citus.sql): each
        -- statement names it, and so runs on its shard alone. The query
        -- below, with its EXISTS under an OR, went to every shard of
        -- lease.queue there, over connections to every node.
        SELECT qu.head_checked_at < stale_before AND qu.head_priority <> 2147483647 INTO from_start
          FROM lease.queue qu WHERE qu.name = only_queue;
        IF from_start OR EXISTS (SELECT FROM lease.counter c
                                  WHERE c.queue = only_queue AND c.backend <> 0
                                    AND (c.claimed > 0 OR c.cancelled > 0)) THEN
            IF lease._raise_head(only_queue, coalesce(from_start, false)) THEN
                raised := 1;
            END IF;
        END IF;
        RETURN raised;
    END IF;
    -- Queues whose rows were claimed or cancelled since the counters were
    -- last folded (lease.metrics), and once a minute every raised head.
    FOR q IN SELECT qu.name, checked.stale AS from_start
               FROM lease.queue qu
              CROSS JOIN LATERAL (SELECT qu.head_checked_at < stale_before
                                         -- A head at the start has nothing to heal.
                                         AND qu.head_priority <> 2147483647 AS stale) AS checked
              WHERE (only_queue IS NULL OR qu.name = only_queue)
                AND (checked.stale
                     OR EXISTS (SELECT FROM lease.counter c
                                 WHERE c.queue = qu.name AND c.backend <> 0 AND (c.claimed > 0 OR c.cancelled > 0)))
              ORDER BY qu.name LOOP
        IF lease._raise_head(q.name, q.from_start) THEN
            raised := raised + 1;
        END IF;
    END LOOP;
    RETURN raised;
END
$$;

COMMENT ON FUNCTION lease._raise_heads(text) IS
$$Internal (lease.sweep): lease._raise_head for each queue (or ONLY_QUEUE) whose rows were claimed or cancelled since the
metrics counters were last folded, and from the start for each raised head not so checked for a minute;
returns how many heads it could look at.$$;

CREATE OR REPLACE FUNCTION lease._valid_ttl(ttl interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', ttl) > 0 AND date_part('epoch', ttl) <= 86400
                AND date_part('year', ttl) = 0 AND date_part('month', ttl) = 0, false);

COMMENT ON FUNCTION lease._valid_ttl(interval) IS
    'Internal: whether ttl adds more than 0 and at most 86400 seconds, with no month part (false for NULL).';

CREATE OR REPLACE FUNCTION lease._valid_span(span interval, longest interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(date_part('epoch', span) >= 0 AND date_part('epoch', span) <= date_part('epoch', longest)
                AND date_part('year', span) = 0 AND date_part('month', span) = 0, false);

COMMENT ON FUNCTION lease._valid_span(interval, interval) IS
    'Internal: whether span is finite, without a month part, and between 0 and longest seconds (false for NULL).';

CREATE OR REPLACE FUNCTION lease._valid_time(t timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NULL OR isfinite(t);

COMMENT ON FUNCTION lease._valid_time(timestamptz) IS
    'Internal: whether an optional time is NULL or finite (''infinity'' and ''-infinity'' are not).';

CREATE OR REPLACE FUNCTION lease._checked_ttl(ttl interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION 'ttl must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_ttl(ttl) THEN
        RAISE EXCEPTION 'ttl must be greater than 0 and at most 1 day, without months (got %)', ttl
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Renew long work with lease.renew instead of taking a long lease.';
    END IF;
    RETURN ttl;
END
$$;

COMMENT ON FUNCTION lease._checked_ttl(interval) IS
    'Internal: returns ttl, or raises 22004 if NULL, 22023 unless it adds more than 0 and at most 1 day (no months).';

CREATE OR REPLACE FUNCTION lease._checked_time(t timestamptz, what text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF NOT lease._valid_time(t) THEN
        RAISE EXCEPTION '% must be a finite time (got %)', what, t USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN t;
END
$$;

COMMENT ON FUNCTION lease._checked_time(timestamptz, text) IS
    'Internal: returns t, or raises 22023 naming the argument when it is infinity or -infinity.';

CREATE OR REPLACE FUNCTION lease._checked_span(span interval, longest interval, what text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF span IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT lease._valid_span(span, longest) THEN
        RAISE EXCEPTION '% must be between 0 and %, without months (got %)', what, longest, span
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN span;
END
$$;

COMMENT ON FUNCTION lease._checked_span(interval, interval, text) IS
    'Internal: returns span, or raises 22004 if NULL, 22023 unless it is finite, has no month part and lies in [0, longest].';

CREATE OR REPLACE FUNCTION lease._next_state(outcome text, cancel_requested boolean, attempt integer, max_attempts integer,
                                 attached boolean)
RETURNS lease.job_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    -- An attached row is done when its domain row stops matching (the
    -- trigger then removes it). Released as done while it still matches,
    -- it would be neither claimable nor visible: a dead letter says so.
    WHEN outcome = 'done' AND attached THEN 'dead'::lease.job_state
    WHEN outcome = 'done' THEN 'done'::lease.job_state
    WHEN outcome = 'fail' THEN 'dead'::lease.job_state
    -- Cancel intent wins over every way back to pending.
    WHEN cancel_requested THEN 'cancelled'::lease.job_state
    WHEN outcome = 'retry' AND attempt >= max_attempts THEN 'dead'::lease.job_state
    ELSE 'pending'::lease.job_state
END;

COMMENT ON FUNCTION lease._next_state(text, boolean, integer, integer, boolean) IS
    'Internal: the state a leased row moves to for outcome done/retry/fail/abandon, given its cancel flag, attempts and whether its queue is an attached table''s.';

CREATE OR REPLACE FUNCTION lease._stranded_done() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'released as done while its table row still matches the pending predicate: move the row on (that is the completion), or requeue it';

COMMENT ON FUNCTION lease._stranded_done() IS
    'Internal: last_error of an attached row released as done while its domain row still matches.';

CREATE OR REPLACE FUNCTION lease._backoff(attempt integer, base interval, cap interval) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN make_interval(secs => least(date_part('epoch', cap),
                                   date_part('epoch', base) * power(2::float8, least(greatest(attempt - 1, 0), 60))));

CREATE OR REPLACE FUNCTION lease._retry_at(at timestamptz, attempt integer, base interval, cap interval, jitter text,
                                id bigint, epoch bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((at AT TIME ZONE 'UTC')
        + CASE WHEN jitter = 'full'
               THEN lease._backoff(attempt, base, cap)
                    * ((hashint8extended(id, epoch) & 9007199254740991)::float8 / 9007199254740992)
               ELSE lease._backoff(attempt, base, cap) END) AT TIME ZONE 'UTC';

COMMENT ON FUNCTION lease._retry_at(timestamptz, integer, interval, interval, text, bigint, bigint) IS
    'Internal: AT + lease._backoff, the backoff times a factor in [0, 1) drawn uniformly from the lease''s (id, epoch) with jitter ''full'' (the default of a queue), exact with ''none''.';

-- The database clock, read where the statement reads it: per row, after
-- any wait for the row's lock, so a renewal or release that waited past the
-- expiry finds the lease lost. clock_timestamp(), declared STABLE: Citus
-- refuses a VOLATILE function in an UPDATE or DELETE of a distributed table,
-- and evaluates a STABLE one once, when the statement starts
-- (docs/operations.md, "Outgrowing one PostgreSQL: Citus"). SQL, not an
-- alias of the C function: the install without the library is run by a
-- database owner, who may not use LANGUAGE internal. A STABLE function with
-- a VOLATILE body is never inlined, so it is called per row.
CREATE OR REPLACE FUNCTION lease._now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pg_catalog.clock_timestamp();

COMMENT ON FUNCTION lease._now() IS
    'Internal: clock_timestamp(), declared STABLE so that statements on a distributed install may read it.';

CREATE OR REPLACE FUNCTION lease._reap(max_rows integer, only_queue text)
RETURNS TABLE (queue text, requeued bigint, dead bigint, cancelled bigint)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    f constant bigint := lease.epoch_floor();
    r record;
BEGIN
    FOR r IN
    WITH expired AS MATERIALIZED (
        SELECT j.id
          FROM lease.job j
         WHERE j.state = 'leased' AND j.lease_until <= t
           AND (only_queue IS NULL OR j.queue = only_queue)
         ORDER BY j.lease_until
         LIMIT n
           FOR UPDATE SKIP LOCKED
    ), recovered AS (
        -- An expiry is a retry that nobody reported: same accounting as
        -- lease.release(..., 'retry'), and a new epoch fences the old owner.
        UPDATE lease.job j
           SET state       = lease._next_state('retry', j.cancel_requested, j.attempt, q.max_attempts, q.attached),
               finished_at = CASE WHEN lease._next_state('retry', j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                                  THEN t END,
               next_at     = lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch),
               epoch       = greatest(j.epoch + 1, f),
               lease_until = NULL,
               -- Concatenated, not format()ted: Citus allows no STABLE
               -- function of a column in an UPDATE of a distributed table.
               last_error  = 'lease expired: owner ' || j.owner || ', epoch ' || j.epoch::text
                             || ', attempt ' || j.attempt::text
          FROM lease.queue q
         WHERE j.id = ANY (ARRAY(SELECT e.id FROM expired e))
           AND (only_queue IS NULL OR j.queue = only_queue)
           AND q.name = j.queue
        RETURNING j.id, j.queue, j.state, j.concurrency_key
    ), counted AS (
        SELECT r.queue,
               array_agg(r.id) FILTER (WHERE r.state = 'pending') AS requeued_ids,
               count(*) FILTER (WHERE r.state = 'pending')   AS requeued,
               count(*) FILTER (WHERE r.state = 'dead')      AS dead,
               count(*) FILTER (WHERE r.state = 'cancelled') AS cancelled,
               -- Requeued rows keep their concurrency slots; the others free them.
               array_agg(r.concurrency_key) FILTER (WHERE r.state <> 'pending' AND r.concurrency_key IS NOT NULL)
                                                             AS freed
          FROM recovered r
         GROUP BY r.queue
    ), totals AS (
        UPDATE lease.queue q
           SET recovered_total = q.recovered_total + c.requeued + c.dead + c.cancelled
          FROM counted c
         WHERE q.name = c.queue AND (only_queue IS NULL OR q.name = only_queue)
    )
    SELECT c.queue, c.requeued, c.dead, c.cancelled, c.freed, c.requeued_ids FROM counted c ORDER BY c.queue
    LOOP
        queue := r.queue;
        requeued := r.requeued;
        dead := r.dead;
        cancelled := r.cancelled;
        PERFORM lease._count(queue, died => dead, cancelled => cancelled, pending => requeued, dead => dead);
        IF r.freed IS NOT NULL THEN
            PERFORM lease._free_slots(queue, r.freed);
        END IF;
        -- Idle workers LISTENing on the channel wake up instead of polling;
        -- at most one notification per queue and sweep.
        IF requeued > 0 THEN
            -- With a zero backoff they may be due before the queue's head.
            PERFORM lease._lower_heads(r.requeued_ids, queue), pg_notify(lease._ready_channel(queue), '');
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._reap(integer, text) IS
$$Internal: lease.reap, limited to queue ONLY_QUEUE unless it is NULL (lease.sweep uses it to isolate a failing
queue).$$;

CREATE OR REPLACE FUNCTION lease.reap(max_rows integer DEFAULT 1000)
RETURNS TABLE (queue text, requeued bigint, dead bigint, cancelled bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- On a distributed install each statement of lease._reap names its queue;
-- planned for it, it runs on that queue's node alone (citus.sql).
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    q text;
    left_over integer := lease._checked_limit(max_rows);
    r record;
BEGIN
    IF NOT lease._distributed() THEN
        RETURN QUERY SELECT * FROM lease._reap(max_rows, NULL);
        RETURN;
    END IF;
    -- One statement over every queue's rows would run on every node,
    -- which Citus refuses for FOR UPDATE: queue by queue instead.
    FOR q IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        FOR r IN SELECT * FROM lease._reap(left_over, q) LOOP
            queue := r.queue;
            requeued := r.requeued;
            dead := r.dead;
            cancelled := r.cancelled;
            RETURN NEXT;
            left_over := left_over - (r.requeued + r.dead + r.cancelled)::integer;
        END LOOP;
        EXIT WHEN left_over <= 0;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease.reap(integer) IS
$$Recovers up to MAX_ROWS expired leases (lease_until passed, by the database clock) and returns per queue
how many went back to pending (with backoff), to the dead letters (attempts reached max_attempts) and to
cancelled (cancel was requested). Each recovered row gets a new epoch, so its old owner is fenced at once.
Rows locked by others are skipped. Sends a NOTIFY on the queue's channel (lease.ready_channel) for each queue
that got rows back. Run it from any scheduler; the pg_lease background worker calls it too. On a
distributed install it goes queue by queue, each queue's rows on the node holding them.
Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE OR REPLACE FUNCTION lease._purge(max_rows integer, only_queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    removed bigint := 0;
    r record;
BEGIN
    FOR r IN
    WITH old AS MATERIALIZED (
        SELECT j.id
          FROM lease.job j JOIN lease.queue q ON q.name = j.queue
         WHERE j.state IN ('done', 'dead', 'cancelled')
           -- An attached table's finished rows go when their table row stops
           -- matching; purging them earlier would leave that row unleased.
           AND NOT q.attached
           AND j.finished_at < t - CASE WHEN j.state = 'done' THEN q.retention ELSE q.dead_retention END
           AND (only_queue IS NULL OR j.queue = only_queue)
         LIMIT n
           FOR UPDATE OF j SKIP LOCKED
    ), gone AS (
        DELETE FROM lease.job j
         WHERE j.id = ANY (ARRAY(SELECT o.id FROM old o)) AND (only_queue IS NULL OR j.queue = only_queue)
        RETURNING j.queue, j.state
    )
    SELECT g.queue, count(*) AS n, count(*) FILTER (WHERE g.state = 'dead') AS dead
      FROM gone g GROUP BY g.queue
    LOOP
        removed := removed + r.n;
        IF r.dead > 0 THEN
            PERFORM lease._count(r.queue, dead => -r.dead);
        END IF;
    END LOOP;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease._purge(integer, text) IS
$$Internal: lease.purge, of ONLY_QUEUE when it is not NULL.$$;

CREATE OR REPLACE FUNCTION lease.purge(max_rows integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text;
    removed bigint := 0;
BEGIN
    IF NOT lease._distributed() THEN
        RETURN lease._purge(max_rows, NULL);
    END IF;
    -- Citus locks rows (FOR UPDATE SKIP LOCKED) only on one shard: queue by
    -- queue, as each node's reaper purges.
    PERFORM lease._checked_limit(max_rows);
    FOR qn IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        EXIT WHEN removed >= max_rows;
        removed := removed + lease._purge((max_rows - removed)::integer, qn);
    END LOOP;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.purge(integer) IS
$$Deletes up to MAX_ROWS finished rows older than their queue's retention (done rows) or dead_retention
(dead and cancelled rows) and returns how many. Rows of attached tables are left to their triggers. Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE OR REPLACE FUNCTION lease._named_epoch_watermark() RETURNS bigint
LANGUAGE sql STABLE
RETURN coalesce((SELECT max(substring(c FROM '^pg_lease\.named_epoch_watermark=(\d+)$')::bigint)
                   FROM pg_db_role_setting s, unnest(s.setconfig) AS c
                  WHERE s.setdatabase = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                    AND s.setrole = 0), 0);

COMMENT ON FUNCTION lease._named_epoch_watermark() IS
    'Internal: the highest named-lease epoch an earlier install of pg_lease in this database issued (0 if none).';

CREATE OR REPLACE FUNCTION lease._remember_named_epochs() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    highest constant bigint := (SELECT max(n.epoch) FROM lease.named_lease n);
BEGIN
    -- At ddl_command_start it is not known yet which extension goes; any
    -- DROP EXTENSION records (rare, and harmless for the others).
    IF highest > lease._named_epoch_watermark() THEN
        EXECUTE format('ALTER DATABASE %I SET pg_lease.named_epoch_watermark = %L',
                       current_database(), highest);
    END IF;
END
$$;

COMMENT ON FUNCTION lease._remember_named_epochs() IS
    'Internal event trigger function (DROP EXTENSION): keeps the highest named-lease epoch as a database setting.';

CREATE OR REPLACE FUNCTION lease.try_acquire(name text, owner text, ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    nm constant text := lease._checked_name(name);
    o  constant text := lease._checked_owner(owner);
    d  constant interval := lease._checked_ttl(ttl);
    f  constant bigint := lease.epoch_floor();
    got bigint;
BEGIN
    INSERT INTO lease.named_lease AS n (name, owner, epoch, lease_until, acquired_at)
    VALUES (nm, o, greatest(f, lease._named_epoch_watermark() + 1), clock_timestamp() + d, clock_timestamp())
    ON CONFLICT (name) DO UPDATE
        SET owner       = EXCLUDED.owner,
            epoch       = greatest(n.epoch + 1, f),
            lease_until = clock_timestamp() + d,
            acquired_at = clock_timestamp()
        -- Free, or held by this owner name (a restarted process): either way
        -- the new epoch fences every earlier holder.
        WHERE n.lease_until <= clock_timestamp() OR n.owner = EXCLUDED.owner
    RETURNING n.epoch INTO got;
    RETURN got;
END
$$;

CREATE OR REPLACE FUNCTION lease.release_named_batch(names text[], owner text, epochs bigint[])
RETURNS TABLE (name text, released boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    o constant text := lease._checked_owner(owner);
BEGIN
    IF names IS NULL OR epochs IS NULL OR array_position(names, NULL) IS NOT NULL
       OR array_position(epochs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'names and epochs must not be NULL nor contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(names) <> cardinality(epochs) OR cardinality(names) > 10000 THEN
        RAISE EXCEPTION 'names (%) and epochs (%) must have the same length, at most 10000',
            cardinality(names), cardinality(epochs) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH released AS (
        UPDATE lease.named_lease n
           SET lease_until = clock_timestamp()
          FROM unnest(names, epochs) AS w(name, epoch)
         WHERE n.name = w.name AND n.epoch = w.epoch AND n.owner = o
           AND n.lease_until > clock_timestamp()
        RETURNING n.name, n.epoch
    )
    SELECT w.name, EXISTS (SELECT FROM released r WHERE r.name = w.name AND r.epoch = w.epoch)
      FROM unnest(names, epochs) WITH ORDINALITY AS w(name, epoch, ord)
     ORDER BY w.ord;
END
$$;

COMMENT ON FUNCTION lease.release_named_batch(text[], text, bigint[]) IS
$$lease.release_named for many names of one owner in one statement (a housekeeper unlocking what it holds):
names[i] goes with epochs[i]; returns (name, released) per element in input order.
Errors: 22004 an argument or element NULL; 22023 arrays of different lengths or over 10000 elements,
owner invalid.$$;

-- The batch form's first name, an overload of release_named; kept for one
-- release so that callers can move at their pace.
CREATE OR REPLACE FUNCTION lease.release_named(names text[], owner text, epochs bigint[])
RETURNS TABLE (name text, released boolean)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT b.name, b.released FROM lease.release_named_batch(names, owner, epochs) b $$;

COMMENT ON FUNCTION lease.release_named(text[], text, bigint[]) IS
$$Deprecated, to be removed in the release after 0.2.0: lease.release_named_batch under its former name (an
overload of lease.release_named); same arguments, result and errors.$$;

CREATE OR REPLACE FUNCTION lease._caller() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN current_setting('role') = 'none' THEN session_user
            ELSE current_setting('role')::name END;

COMMENT ON FUNCTION lease._caller() IS
    'Internal: the role on whose behalf a SECURITY DEFINER function of pg_lease runs (SET ROLE, else session user).';

CREATE OR REPLACE FUNCTION lease._access(queue text, rights text[]) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    who constant name := lease._caller();
BEGIN
    IF NOT coalesce((SELECT q.restricted FROM lease.queue q WHERE q.name = _access.queue), false)
       OR pg_has_role(who, 'lease_admin', 'MEMBER') THEN
        RETURN true;
    END IF;
    RETURN (SELECT bool_or((g.work AND 'work' = ANY (rights)) OR (g.produce AND 'produce' = ANY (rights)))
              FROM lease.queue_grant g
             WHERE g.queue = _access.queue AND pg_has_role(who, g.grantee::oid, 'MEMBER'));
END
$$;

COMMENT ON FUNCTION lease._access(text, text[]) IS
    'Internal: true if QUEUE is unrestricted or the calling role holds one of RIGHTS (work, produce) on it; false if it holds only another right; NULL if none.';

CREATE OR REPLACE FUNCTION lease._check_access(queue text, rights text[]) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    allowed constant boolean := lease._access(queue, rights);
BEGIN
    IF allowed IS NULL THEN
        PERFORM lease._no_such_queue(queue);
    ELSIF NOT allowed THEN
        RAISE EXCEPTION 'role "%" has no % right on queue "%"', lease._caller(), array_to_string(rights, ' or '), queue
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An admin grants it with lease.grant(queue, role).';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_access(text, text[]) IS
$$Internal: raises 42501 unless QUEUE is unrestricted or the calling role holds one of RIGHTS (work, produce) on
it; 42704, as for a queue that does not exist, if the role holds no right on it at all.$$;

CREATE OR REPLACE FUNCTION lease._check_rows(ids bigint[], rights text[], queue text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    q text;
    allowed boolean;
BEGIN
    -- The common case, no restricted queue at all, costs one small scan.
    -- Given the rows' queue, both statements name it: on a distributed
    -- install they then read that queue's shard alone (citus.sql).
    IF EXISTS (SELECT FROM lease.queue qu
                WHERE qu.restricted AND (_check_rows.queue IS NULL OR qu.name = _check_rows.queue)) THEN
        FOR q IN SELECT DISTINCT j.queue FROM lease.job j
                  WHERE j.id = ANY (ids) AND (_check_rows.queue IS NULL OR j.queue = _check_rows.queue) LOOP
            allowed := lease._access(q, rights);
            -- A queue the role holds no right on is not named.
            IF allowed IS NULL THEN
                RAISE EXCEPTION 'role "%" may not act on these rows', lease._caller()
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'Their queue is restricted: an admin grants it with lease.grant(queue, role).';
            ELSIF NOT allowed THEN
                PERFORM lease._check_access(q, rights);
            END IF;
        END LOOP;
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_rows(bigint[], text[], text) IS
    'Internal: lease._check_access for the queue of every row in IDS (of those in QUEUE, when given), without naming a queue the role holds no right on.';

CREATE OR REPLACE FUNCTION lease.grant(queue text, role regrole, work boolean DEFAULT true, produce boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- "grant" is a reserved word, so the arguments cannot be qualified by it.
DECLARE
    qn constant text := lease._checked_queue(queue);
    r  constant regrole := lease._checked_not_null(role, 'role');
    w  constant boolean := lease._checked_not_null(work, 'work');
    p  constant boolean := lease._checked_not_null(produce, 'produce');
BEGIN
    UPDATE lease.queue q SET restricted = true WHERE q.name = qn AND NOT q.restricted;
    INSERT INTO lease.queue_grant AS g (queue, grantee, work, produce)
    VALUES (qn, r, w, p)
    ON CONFLICT ON CONSTRAINT queue_grant_pkey DO UPDATE
        SET work = EXCLUDED.work, produce = EXCLUDED.produce;
END
$$;

COMMENT ON FUNCTION lease.grant(text, regrole, boolean, boolean) IS
$$Grants ROLE (and its members) the right to work QUEUE (claim, reclaim_own, renew, release, fence,
fenced_update) and/or to produce into it (enqueue, cancel), replacing ROLE's earlier grant. The first
grant on a queue restricts it: from then on only grantees and lease_admin may use it.
lease.grant(queue, 'lease_worker') shares it with every worker.
Errors: 22004 an argument NULL; 42704 no such queue or role.$$;

CREATE OR REPLACE FUNCTION lease.revoke(queue text, role regrole) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn constant text := lease._checked_queue(queue);
    r  constant regrole := lease._checked_not_null(role, 'role');
BEGIN
    DELETE FROM lease.queue_grant g WHERE g.queue = qn AND g.grantee = r;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.revoke(text, regrole) IS
$$Removes ROLE's grant on QUEUE; returns whether there was one. The queue stays restricted (only
lease_admin may use it once its last grant is gone). Errors: 22004 an argument NULL; 42704 no such queue.$$;

CREATE OR REPLACE FUNCTION lease._ready_channel(queue text) RETURNS text
LANGUAGE sql STABLE
RETURN 'pg_lease_' || md5((SELECT s.secret FROM lease.channel_secret s) || queue);

COMMENT ON FUNCTION lease._ready_channel(text) IS
    'Internal: the NOTIFY channel of QUEUE, a hash of its name and the database''s channel secret.';

CREATE OR REPLACE FUNCTION lease.ready_channel(queue text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_access(lease._checked_queue(queue), '{work}');
    RETURN lease._ready_channel(queue);
END
$$;

COMMENT ON FUNCTION lease.ready_channel(text) IS
$$The channel to LISTEN on for QUEUE: a NOTIFY without payload arrives there, on commit, when the queue
gets claimable rows while it had none (an enqueue, a reap's retries). The name is derived from a secret of
the database, so only roles that may work the queue can learn it. Errors: 22004 queue NULL; 42704 no such
queue; 42501 the queue is restricted and the caller may not work it.$$;

CREATE OR REPLACE FUNCTION lease.fenced_update(id bigint, epoch bigint, patch jsonb, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    qn text;
    q lease.queue;
    bytes integer;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF fenced_update.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.fenced_update without its queue');
    END IF;
    PERFORM lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch'),
            lease._checked_not_null(patch, 'patch'),
            lease._check_rows(ARRAY[id], '{work}', fenced_update.queue);
    IF jsonb_typeof(patch) <> 'object' THEN
        RAISE EXCEPTION 'patch must be a JSON object (got %)', jsonb_typeof(patch)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE lease.job j
       SET payload = j.payload || patch
     WHERE j.id = fenced_update.id AND j.epoch = fenced_update.epoch
       AND (fenced_update.queue IS NULL OR j.queue = fenced_update.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
    RETURNING j.queue, octet_length(j.payload::text) INTO qn, bytes;
    IF bytes IS NULL THEN
        RETURN false;
    END IF;
    SELECT qu.* INTO q FROM lease.queue qu WHERE qu.name = qn;
    -- Raised here, the error undoes the update.
    PERFORM lease._check_payload_size(q, bytes);
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.fenced_update(bigint, bigint, jsonb, text) IS
$$Merges PATCH (a JSON object; top-level keys replace) into row ID's payload, but only while (id, epoch)
is the current, unexpired lease. QUEUE, when given, is the row's queue (a lease of another is lost), and
routes the call on a distributed install. Returns true if applied, false (nothing changed) if the lease
is lost.
Errors: 22004 an argument NULL; 22023 patch is not a JSON object, or the payload would grow over the
queue's max_payload_bytes; 42501 the row's queue is restricted
and the caller may not work it; 0A000 a distributed install and no QUEUE.$$;

CREATE OR REPLACE FUNCTION lease.fence(id bigint, epoch bigint, queue text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until timestamptz;
BEGIN
    -- Only the queue can route a statement on a distributed install. There
    -- the function runs where the caller's transaction does, and the lock
    -- below is taken on the queue's node inside that transaction.
    IF fence.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.fence without its queue');
    END IF;
    PERFORM lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch'),
            lease._check_rows(ARRAY[id], '{work}', fence.queue);
    -- Lock order for an attached table's row: the table row first, then
    -- its lease row. Every other writer of the table takes them in that
    -- order (its UPDATE locks the table row, then its trigger the lease
    -- row), so fence must too, or a holder's fenced write and a user's
    -- cancel of the same row deadlock.
    -- (A distributed install has no attached tables, and joins no table to
    -- lease.job without a queue.)
    IF EXISTS (SELECT FROM lease.attachment) THEN
        PERFORM lease._lock_attached_rows(ARRAY[id]);
    END IF;
    -- FOR SHARE holds the row until the caller's transaction ends: the reaper
    -- and claimers skip or wait for it, so no new epoch can be issued before
    -- the caller's own writes commit.
    SELECT j.lease_until INTO until
      FROM lease.job j
     WHERE j.id = fence.id AND j.epoch = fence.epoch
       AND (fence.queue IS NULL OR j.queue = fence.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease % at epoch % is not held', id, epoch
            USING ERRCODE = 'LE001',
                  DETAIL = 'The lease expired, was released, or a newer epoch took over.',
                  HINT = 'Roll back: this transaction must not write on behalf of a lost lease.';
    END IF;
    RETURN until;
END
$$;

COMMENT ON FUNCTION lease.fence(bigint, bigint, text) IS
$$Guard for the caller's own transaction: succeeds (returning lease_until) only while (id, epoch) is the
current, unexpired lease (of QUEUE, when given: a lease of another is not held), and keeps the row locked FOR SHARE until the transaction ends, so writes that
follow in the same transaction are ordered before any takeover. For a row of an attached table it first
locks that table's row FOR NO KEY UPDATE, the order every writer of the table follows, so a fenced write
cannot deadlock with a concurrent cancel or acknowledgement of the same row. Call it first, then write
your tables.
Errors: LE001 lease not held (roll back); 22004 an argument NULL; 42501 the row's queue is restricted
and the caller may not work it; 0A000 a distributed install and no QUEUE.$$;

CREATE OR REPLACE FUNCTION lease.drop_queue(name text, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._checked_queue(name);
    -- Lock the queue row first: enqueue's foreign key check waits on it, so no
    -- row can slip in between the check below and the delete.
    IF (SELECT q.attached FROM lease.queue q WHERE q.name = drop_queue.name FOR UPDATE) THEN
        RAISE EXCEPTION 'queue "%" belongs to an attached table', name
            USING ERRCODE = 'object_in_use', HINT = 'Use lease.detach(table).';
    END IF;
    IF NOT coalesce(force, false) AND EXISTS (
        SELECT FROM lease.job j
         WHERE j.queue = drop_queue.name AND j.state IN ('pending', 'leased'))
    THEN
        RAISE EXCEPTION 'queue "%" still has pending or leased rows', name
            USING ERRCODE = 'object_in_use',
                  HINT = 'Pass force => true to delete them with the queue.';
    END IF;
    RETURN lease._delete_queue(name);
END
$$;

CREATE OR REPLACE FUNCTION lease._check_payload_size(q lease.queue, payload_bytes bigint) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF payload_bytes > q.max_payload_bytes THEN
        RAISE EXCEPTION 'a payload of % bytes is over the limit of queue "%" (% bytes)',
                        payload_bytes, q.name, q.max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Keep large data elsewhere and pass a reference, or raise the limit with lease.create_queue(..., max_payload_bytes => ...).';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_payload_size(lease.queue, bigint) IS
    'Internal: raises 22023 if PAYLOAD_BYTES is over the max_payload_bytes of queue Q.';

CREATE OR REPLACE FUNCTION lease._checked_fairness_key(key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF length(key) > 256 THEN
        RAISE EXCEPTION 'fairness_key must be at most 256 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN key;
END
$$;

COMMENT ON FUNCTION lease._checked_fairness_key(text) IS
    'Internal: returns KEY (NULL too), or raises 22023 if it is over 256 characters.';

CREATE OR REPLACE FUNCTION lease._fair_ranks(q lease.queue, keys text[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Where claims are, and a key with nothing left before it starts:
    -- the head (head.sql), or, in a queue claimed empty (its head at the
    -- end of the order), past every key's last row.
    now_rank constant bigint := greatest(
        CASE WHEN q.head_id < 9223372036854775807 THEN q.head_rank
             ELSE (SELECT max(f.next_rank) FROM lease.fairness_key f WHERE f.queue = q.name) END, 0);
    ranks bigint[];
    first bigint;
BEGIN
    IF NOT q.fair THEN
        UPDATE lease.queue qu SET fair = true WHERE qu.name = q.name AND NOT qu.fair;
    END IF;
    IF cardinality(keys) = 1 THEN
        -- One row (lease.enqueue): a plain upsert, which a distributed
        -- install sends to the queue's node as it is (the statement below
        -- went through the coordinator there, 25 ms a row).
        INSERT INTO lease.fairness_key AS f (queue, key, next_rank)
        VALUES (q.name, coalesce(keys[1], ''), now_rank + 1000000)
            ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
           SET next_rank = greatest(f.next_rank, now_rank) + 1000000 / f.weight
        RETURNING f.next_rank - 1000000 / f.weight INTO first;
        RETURN ARRAY[first];
    END IF;
    -- One upsert for every key (in key order, so that two enqueues naming
    -- the same keys cannot deadlock): each key's row is this transaction's
    -- until it ends, so the enqueues of one key take turns and its ranks
    -- never repeat. A new key's next_rank says how many rows it has (a
    -- step of 1,000,000 each), which the update reads back from excluded.
    -- The i-th row of a key in KEYS gets that key's i-th step.
    WITH n AS (SELECT coalesce(u.k, '') AS k, count(*) AS c FROM unnest(keys) AS u(k) GROUP BY 1),
    placed AS (
        INSERT INTO lease.fairness_key AS f (queue, key, next_rank)
        SELECT q.name, n.k, now_rank + n.c * 1000000 FROM n ORDER BY n.k
            ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
           SET next_rank = greatest(f.next_rank, now_rank)
                           + (excluded.next_rank - now_rank) / 1000000 * (1000000 / f.weight)
        RETURNING f.key, f.next_rank, 1000000 / f.weight AS step
    )
    SELECT array_agg(p.next_rank - (n.c - r.nth + 1) * p.step ORDER BY r.o) INTO ranks
      FROM (SELECT coalesce(u.k, '') AS k, u.o, row_number() OVER (PARTITION BY coalesce(u.k, '') ORDER BY u.o) AS nth
              FROM unnest(keys) WITH ORDINALITY AS u(k, o)) r
      JOIN n ON n.k = r.k
      JOIN placed p ON p.key = r.k;
    RETURN ranks;
END
$$;

COMMENT ON FUNCTION lease._fair_ranks(lease.queue, text[]) IS
$$Internal (lease.enqueue, lease.enqueue_batch): the ranks of new rows of queue Q whose fairness keys are KEYS
(NULL: the key ''), in order; moves each key's next rank on and makes the queue fair.$$;

CREATE OR REPLACE FUNCTION lease._forget_idle_keys(max_rows integer, only_queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    now_rank bigint;
    idle text[];
    n integer;
    gone integer := 0;
BEGIN
    -- A key behind where its next row would start anyway (the head, or
    -- the last key's place in a queue claimed empty), of weight 1 and no
    -- rate limit, is what a key without a row is (lease._fair_ranks): its
    -- row can go. Keys in an enqueue's hands are left for the next sweep.
    FOR q IN SELECT qu.name, CASE WHEN qu.head_id < 9223372036854775807 THEN qu.head_rank END AS head_rank
               FROM lease.queue qu
              WHERE qu.fair AND (only_queue IS NULL OR qu.name = only_queue)
              ORDER BY qu.name LOOP
        EXIT WHEN gone >= max_rows;
        now_rank := coalesce(q.head_rank, (SELECT max(m.next_rank) FROM lease.fairness_key m WHERE m.queue = q.name));
        -- Two statements, each on the queue's shard alone (citus.sql).
        idle := ARRAY(SELECT k.key FROM lease.fairness_key k
                       WHERE k.queue = q.name AND k.next_rank < now_rank
                         AND k.weight = 1 AND k.rate_limit IS NULL
                       LIMIT max_rows - gone
                         FOR UPDATE SKIP LOCKED);
        DELETE FROM lease.fairness_key f WHERE f.queue = q.name AND f.key = ANY (idle);
        GET DIAGNOSTICS n = ROW_COUNT;
        gone := gone + n;
    END LOOP;
    RETURN gone;
END
$$;

COMMENT ON FUNCTION lease._forget_idle_keys(integer, text) IS
$$Internal (lease.sweep): removes up to MAX_ROWS rows of lease.fairness_key (of ONLY_QUEUE, or of every queue) whose
keys have fallen idle and carry no weight or rate limit, so keys seen once do not pile up; returns how many.$$;

CREATE OR REPLACE FUNCTION lease.set_weight(queue text, fairness_key text, weight integer) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
BEGIN
    PERFORM lease._checked_fairness_key(lease._checked_not_null(fairness_key, 'fairness_key')),
            lease._checked_not_null(weight, 'weight');
    IF weight NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'weight must be between 1 and 1000 (got %)', weight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO lease.fairness_key AS f (queue, key, weight)
    VALUES (q, set_weight.fairness_key, set_weight.weight)
        ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
       SET weight = excluded.weight;
END
$$;

COMMENT ON FUNCTION lease.set_weight(text, text, integer) IS
$$Gives FAIRNESS_KEY of QUEUE the weight WEIGHT (1..1000; a key never weighed weighs 1): while several keys
have ready rows, claims take rows of each in proportion to their weights (see lease.enqueue's
fairness_key). Rows enqueued from now on follow it; rows already enqueued keep their place.
Errors: 22004 an argument NULL; 22023 weight out of range or fairness_key over 256 characters; 42704 no
such queue.$$;

CREATE OR REPLACE FUNCTION lease._checked_producer_queue(queue text, payload_bytes bigint) RETURNS lease.queue
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    q lease.queue;
BEGIN
    SELECT * INTO q FROM lease.queue qu WHERE qu.name = _checked_producer_queue.queue;
    IF NOT FOUND THEN
        PERFORM lease._checked_queue(queue);
    END IF;
    -- First, so that a role that may not produce into it learns nothing of
    -- it.
    IF q.restricted THEN
        PERFORM lease._check_access(queue, '{produce}');
    END IF;
    IF q.attached THEN
        -- Its rows are the table's rows that match the predicate; a row
        -- enqueued by key would hand out one that does not.
        RAISE EXCEPTION 'queue "%" is fed by an attached table', queue
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Insert or update rows of the table so that they match its pending predicate.';
    END IF;
    PERFORM lease._check_payload_size(q, payload_bytes);
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease._checked_producer_queue(text, bigint) IS
    'Internal: returns queue''s row, or raises 22004/42704 as lease._checked_queue, 42809 if an attached table feeds it, 42501 if the caller may not produce into it, 22023 if PAYLOAD_BYTES is over its max_payload_bytes.';

CREATE FUNCTION lease.enqueue(
    queue    text,
    payload  jsonb,
    key      text        DEFAULT NULL,
    run_at   timestamptz DEFAULT NULL,
    priority integer     DEFAULT 0,
    unique_key text      DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    fairness_key text    DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p  constant jsonb := lease._checked_not_null(payload, 'payload');
    qr constant lease.queue := lease._checked_producer_queue(queue, octet_length(p::text));
    q  constant text := qr.name;
    r  constant timestamptz := lease._checked_time(run_at, 'run_at');
    t  constant timestamptz := clock_timestamp();
    ck constant text := CASE WHEN concurrency_key IS NOT NULL
                             THEN lease._checked_concurrency_key(q, concurrency_key) END;
    -- Its place among the rows of its priority (fairness.sql).
    rk bigint := 0;
    new_id bigint;
BEGIN
    IF fairness_key IS NOT NULL OR qr.fair THEN
        rk := (lease._fair_ranks(qr, ARRAY[lease._checked_fairness_key(fairness_key)]))[1];
    END IF;
    -- A row in the way is either the same key (any state, while retained)
    -- or the same unique_key while pending or leased; the insert waits for
    -- a concurrent producer's row and then sees it, so one row wins. The
    -- row found may finish before it is read: then try again.
    FOR tries IN 1..3 LOOP
        INSERT INTO lease.job AS j (queue, key, payload, priority, rank, next_at, created_at, unique_key,
                                    concurrency_key, held, fairness_key)
        VALUES (q, enqueue.key, p, coalesce(enqueue.priority, 0), rk, coalesce(r, t), t, enqueue.unique_key,
                ck, ck IS NOT NULL, enqueue.fairness_key)
        ON CONFLICT DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            PERFORM lease._count(q, enqueued => 1, pending => 1);
            IF ck IS NOT NULL THEN
                PERFORM lease._hold(q, ARRAY[ck]);
            ELSE
                PERFORM lease._lower_head(q, coalesce(enqueue.priority, 0), rk, coalesce(r, t), new_id);
                IF coalesce(r, t) <= t THEN
                    PERFORM lease._wake(q, 1);
                END IF;
            END IF;
            RETURN new_id;
        END IF;
        -- Hand back the row in the way, change nothing.
        SELECT j.id INTO new_id
          FROM lease.job j
         WHERE j.queue = q
           AND (j.key = enqueue.key
                OR (j.unique_key = enqueue.unique_key AND j.state IN ('pending', 'leased')))
         ORDER BY j.key IS NOT DISTINCT FROM enqueue.key DESC
         LIMIT 1;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'enqueue into "%" kept conflicting with rows that finished before they could be read', q
        USING ERRCODE = 'serialization_failure', HINT = 'Retry the enqueue.';
END
$$;

COMMENT ON FUNCTION lease.enqueue(text, jsonb, text, timestamptz, integer, text, text, text) IS
$$Adds one row to QUEUE and returns its id. Claimable from run_at (default: now, by the database clock).
Higher priority is claimed first. With a key, enqueue is idempotent on (queue, key): a second call
returns the existing row's id and changes nothing (for as long as that row is retained, whatever its
state). With a unique_key, at most one row per (queue, unique_key) is pending or leased: while one is,
enqueue returns its id and changes nothing; once it has finished (done, dead, cancelled), the same
unique_key enqueues a new row. Concurrent producers of one key or unique_key get one row and one id.
With a concurrency_key (the queue needs a concurrency limit k, see lease.create_queue), at most k rows of
that key are admitted at once; the others are held, never claimed, until an admitted one ends (done,
dead, cancelled) and gives up its slot (highest priority, then oldest, first). A retry or expiry keeps the
slot, so k = 1 runs a key's rows one at a time, in order.
With a fairness_key (a tenant, say), claims share themselves among the keys with ready rows in proportion
to their weights (lease.set_weight; round-robin while all weigh 1), among the rows of one priority,
whatever each key's backlog: a key's rows are placed one step apart, a step of 1,000,000 / weight, from
where claims are now. Once a queue has a row with a fairness_key, its rows without one are of the key ''.
A row claimable at once sends a NOTIFY on the queue's channel (lease.ready_channel), on commit.
Errors: 22004 queue or payload NULL; 22023 run_at infinite, or payload over the queue's max_payload_bytes; 42704 no such queue; 42809 the queue is
fed by an attached table (write the table instead); 42501 the queue is restricted and the caller may
not produce into it; 22023 concurrency_key empty or over 256 characters, or the queue has no concurrency
limit; 22023 fairness_key over 256 characters; 22P02 payload is not valid JSON; 40001 (rare: retry) the
row in the way kept finishing before it could be read.$$;

CREATE OR REPLACE FUNCTION lease.enqueue_batch(
    queue    text,
    payloads jsonb[],
    keys     text[]      DEFAULT NULL,
    run_at   timestamptz DEFAULT NULL,
    priority integer     DEFAULT 0,
    concurrency_keys text[] DEFAULT NULL,
    fairness_keys text[] DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- ON CONFLICT (queue, key) names columns, not this function's arguments.
#variable_conflict use_column
DECLARE
    n  constant integer := cardinality(lease._checked_not_null(payloads, 'payloads'));
    qr constant lease.queue := lease._checked_producer_queue(queue, (SELECT max(octet_length(u.p::text))
                                                                       FROM unnest(payloads) AS u(p)));
    q  constant text := qr.name;
    r  constant timestamptz := lease._checked_time(run_at, 'run_at');
    t  constant timestamptz := clock_timestamp();
    ranks bigint[];
    ids bigint[];
    added bigint;
    held_keys text[];
BEGIN
    IF keys IS NOT NULL AND cardinality(keys) <> n THEN
        RAISE EXCEPTION 'keys has % elements, payloads has %', cardinality(keys), n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concurrency_keys IS NOT NULL THEN
        IF cardinality(concurrency_keys) <> n THEN
            RAISE EXCEPTION 'concurrency_keys has % elements, payloads has %', cardinality(concurrency_keys), n
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM lease._checked_concurrency_key(q, c) FROM unnest(concurrency_keys) AS u(c) WHERE c IS NOT NULL;
    END IF;
    IF fairness_keys IS NOT NULL THEN
        IF cardinality(fairness_keys) <> n THEN
            RAISE EXCEPTION 'fairness_keys has % elements, payloads has %', cardinality(fairness_keys), n
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM lease._checked_fairness_key(f) FROM unnest(fairness_keys) AS u(f) WHERE f IS NOT NULL;
    END IF;
    IF n > 100000 THEN
        RAISE EXCEPTION 'at most 100000 rows per batch (got %)', n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(payloads, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'payloads must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Their places among the rows of their priority (fairness.sql).
    IF fairness_keys IS NOT NULL OR qr.fair THEN
        ranks := lease._fair_ranks(qr, coalesce(fairness_keys, array_fill(NULL::text, ARRAY[n])));
    END IF;

    -- Ids are drawn up front so that the result can be returned in input
    -- order, including for rows without a key.
    ids := ARRAY(SELECT nextval('lease.job_id_seq') FROM generate_series(1, n));
    WITH inserted AS (
        INSERT INTO lease.job (id, queue, key, payload, priority, rank, next_at, created_at, concurrency_key, held,
                               fairness_key)
        SELECT ids[u.ord], q, u.k, u.p, coalesce(enqueue_batch.priority, 0), coalesce(ranks[u.ord], 0),
               coalesce(r, t), t, u.c, u.c IS NOT NULL, u.f
          FROM unnest(payloads, keys, concurrency_keys, fairness_keys) WITH ORDINALITY AS u(p, k, c, f, ord)
         ORDER BY u.ord
            ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING concurrency_key
    )
    SELECT count(*), array_agg(i.concurrency_key) FILTER (WHERE i.concurrency_key IS NOT NULL)
      INTO added, held_keys
      FROM inserted i;
    IF added > 0 THEN
        PERFORM lease._count(q, enqueued => added, pending => added);
    END IF;
    IF held_keys IS NOT NULL THEN
        PERFORM lease._hold(q, held_keys);
    END IF;
    IF added > coalesce(cardinality(held_keys), 0) THEN
        -- Every row has the same priority and next_at, and ids in input
        -- order: the least rank and the first id are at or before all of
        -- them.
        PERFORM lease._lower_head(q, coalesce(enqueue_batch.priority, 0),
                                  coalesce((SELECT min(x) FROM unnest(ranks) AS x), 0), coalesce(r, t), ids[1]);
        IF coalesce(r, t) <= t THEN
            PERFORM lease._wake(q, n);
        END IF;
    END IF;

    -- A new statement sees the rows just inserted, so keys that collided (with
    -- an older row or earlier in this batch) resolve to the row that won.
    RETURN QUERY
    SELECT CASE WHEN u.k IS NULL THEN u.id
                ELSE (SELECT j.id FROM lease.job j WHERE j.queue = q AND j.key = u.k) END
      FROM unnest(ids, keys) WITH ORDINALITY AS u(id, k, ord)
     ORDER BY u.ord;
END
$$;

COMMENT ON FUNCTION lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer, text[], text[]) IS
$$Adds many rows to QUEUE in one statement and returns their ids in input order.
keys (optional, same length as payloads, NULL elements allowed) make each row idempotent as in lease.enqueue;
concurrency_keys and fairness_keys (same shape) give rows a concurrency_key and a fairness_key as in
lease.enqueue.
Errors: 22004 queue, payloads or a payload NULL; 22023 keys, concurrency_keys or fairness_keys length
differs, a concurrency or fairness key invalid or the queue without a concurrency limit, more than 100000 rows, run_at
infinite or a payload over the queue's max_payload_bytes; 42704 no such queue; 42809 attached queue; 42501 no produce right on a restricted queue.$$;

CREATE OR REPLACE FUNCTION lease.cancel(id bigint, queue text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Taken once: Citus allows no VOLATILE function in an UPDATE.
    t constant timestamptz := clock_timestamp();
    qn text := cancel.queue;
    result text;
    q text;
    ck text;
    was_held boolean;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    -- On a distributed install a call reaches here without its queue only
    -- unforwarded, on the coordinator (lease.queue_of(id) as the queue, or a
    -- NULL Citus could not see coming): find the row's node there.
    IF qn IS NULL AND lease._distributed() THEN
        qn := (SELECT j.queue FROM lease.job j WHERE j.id = cancel.id);
        IF qn IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM lease._check_rows(ARRAY[id], '{produce,work}', qn);
    UPDATE lease.job j
       SET cancel_requested = true,
           state = CASE WHEN j.state = 'pending' THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN j.state = 'pending' THEN t ELSE j.finished_at END
     WHERE j.id = cancel.id AND (qn IS NULL OR j.queue = qn)
       AND j.state IN ('pending', 'leased')
    RETURNING CASE WHEN j.state = 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END, j.queue,
              j.concurrency_key, j.held
      INTO result, q, ck, was_held;
    IF result IS NULL THEN
        SELECT j.state::text INTO result FROM lease.job j
         WHERE j.id = cancel.id AND (qn IS NULL OR j.queue = qn);
    ELSE
        IF result = 'cancelled' THEN
            PERFORM lease._count(q, cancelled => 1, pending => -1);
            IF ck IS NOT NULL THEN
                PERFORM lease._free_slots(q, ARRAY[ck], was_held);
            END IF;
        END IF;
        -- A cancelled row is purged after dead_retention: work for the reaper.
        PERFORM lease._reaper_touch();
    END IF;
    RETURN result;
END
$$;

COMMENT ON FUNCTION lease.cancel(bigint, text) IS
$$Cancels row ID. A pending row becomes cancelled at once ('cancelled'). A leased row keeps its lease
but is marked ('cancel_requested'): its owner sees the flag on renew, and a retry, abandon or
expiry ends it as cancelled, never pending again. A finished row is left alone and its state is
returned ('done', 'dead', 'cancelled'); NULL means no such row (in QUEUE, when given: QUEUE also routes
the call on a distributed install, where a NULL written or bound is refused: give lease.queue_of(ID)
instead, and the call runs on the coordinator). Errors: 22004 id NULL, or QUEUE NULL as a constant or
parameter on a distributed install; 42501 the row's queue is restricted and the caller may neither produce
into nor work it.$$;

CREATE FUNCTION lease.queue_of(id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := (SELECT j.queue FROM lease.job j WHERE j.id = queue_of.id);
BEGIN
    -- A restricted queue the caller holds no right on stays unnamed.
    IF q IS NULL OR NOT coalesce(lease._access(q, '{produce,work}'), false) THEN
        RETURN NULL;
    END IF;
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease.queue_of(bigint) IS
$$The queue of row ID; NULL if there is no such row, or its queue is restricted and the caller may neither
produce into nor work it. For calls by id on a distributed install: lease.cancel(ID, lease.queue_of(ID)).$$;

CREATE OR REPLACE FUNCTION lease.cancel_key(queue text, key text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target bigint;
BEGIN
    PERFORM lease._checked_queue(queue), lease._checked_not_null(key, 'key');
    -- Before the key is looked up: a role that may not cancel here gets the
    -- same answer whether the key exists or not.
    PERFORM lease._check_access(queue, '{work,produce}');
    SELECT j.id INTO target FROM lease.job j WHERE j.queue = cancel_key.queue AND j.key = cancel_key.key;
    IF target IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN lease.cancel(target, cancel_key.queue);
END
$$;

COMMENT ON FUNCTION lease.cancel_key(text, text) IS
$$lease.cancel for the row of QUEUE with KEY (for an attached table: its primary key as text), for callers
that know the key but not the row id. Returns what lease.cancel returns; NULL if no such row.
Errors: 22004 an argument NULL; 42704 no such queue (or a restricted one the caller holds no right on);
42501 as lease.cancel, whether the key exists or not.$$;

CREATE OR REPLACE FUNCTION lease.requeue(id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    q text;
    ck text;
    pr integer;
    rk bigint;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    -- A fresh start: attempts from zero, claimable now. The epoch stays, so
    -- the next claim still issues a greater one.
    UPDATE lease.job j
       SET state = 'pending', attempt = 0, next_at = t, finished_at = NULL,
           cancel_requested = false, owner = NULL, lease_until = NULL,
           -- Back in line for its key's slots, as if enqueued now.
           held = j.concurrency_key IS NOT NULL
     WHERE j.id = requeue.id AND j.state = 'dead'
    RETURNING j.queue, j.concurrency_key, j.priority, j.rank INTO q, ck, pr, rk;
    IF q IS NULL THEN
        RETURN false;
    END IF;
    PERFORM lease._count(q, pending => 1, dead => -1);
    IF ck IS NOT NULL THEN
        PERFORM lease._hold(q, ARRAY[ck]);
    ELSE
        PERFORM lease._lower_head(q, pr, rk, t, requeue.id), lease._wake(q, 1);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.requeue(bigint) IS
$$Puts dead letter ID back to pending, claimable now, with its attempts reset (last_error is kept). Returns
false and changes nothing unless the row is dead. For any queue, attached tables' included. Errors: 22004 id
NULL.$$;

CREATE OR REPLACE FUNCTION lease.renew(id bigint, owner text, epoch bigint, ttl interval, queue text DEFAULT NULL)
RETURNS lease.renewal
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o constant text := owner;
    d constant interval := ttl;
    result lease.renewal;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF renew.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.renew without its queue');
    END IF;
    -- The checks run only when an argument is off (see lease.claim_pending).
    IF NOT (id IS NOT NULL AND epoch IS NOT NULL AND lease._valid_owner(o) AND lease._valid_ttl(d)) THEN
        PERFORM lease._checked_owner(o), lease._checked_ttl(d),
                lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch');
    END IF;
    -- Inline, not a call of lease._check_rows: this runs on every renewal.
    IF EXISTS (SELECT FROM lease.queue qu WHERE qu.restricted AND (renew.queue IS NULL OR qu.name = renew.queue)) THEN
        PERFORM lease._check_rows(ARRAY[id], '{work}', renew.queue);
    END IF;
    UPDATE lease.job j
       SET lease_until = lease._now() + d
     WHERE j.id = renew.id AND j.owner = o AND j.epoch = renew.epoch
       AND (renew.queue IS NULL OR j.queue = renew.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
    RETURNING j.id, true, j.lease_until, j.cancel_requested
      INTO result;
    IF NOT FOUND THEN
        result := ROW(renew.id, false, NULL, NULL);
    END IF;
    RETURN result;
END
$$;

COMMENT ON FUNCTION lease.renew(bigint, text, bigint, interval, text) IS
$$Extends OWNER's lease on row ID at EPOCH to now + TTL (database clock); QUEUE, when given, is the row's
queue (a lease of another is lost), and routes the call on a distributed install. Returns (id, held, lease_until,
cancel_requested): held = false means the lease is lost and nothing changed; cancel_requested = true
means lease.cancel was called and the owner should stop and release.
Errors: 22004 an argument NULL; 22023 ttl not in (0, 1 day], owner empty or over 256 characters;
42501 the row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE OR REPLACE FUNCTION lease.renew_batch(ids bigint[], owner text, epochs bigint[], ttl interval, queue text DEFAULT NULL)
RETURNS SETOF lease.renewal
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o constant text := lease._checked_owner(owner);
    d constant interval := lease._checked_ttl(ttl);
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF renew_batch.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.renew_batch without its queue');
    END IF;
    PERFORM lease._checked_same_length(ids, epochs), lease._check_rows(ids, '{work}', renew_batch.queue);
    RETURN QUERY
    WITH held AS MATERIALIZED (
        -- A heartbeat locks many rows; waiting for one that another
        -- transaction holds (a writer of an attached table removing it, in
        -- its own order) while holding the others can deadlock. So rows
        -- locked by others are skipped and reported as busy (held NULL).
        SELECT j.id
          FROM lease.job j
         WHERE j.id = ANY (ids)
           AND (j.epoch = epochs[array_position(ids, j.id)]
                OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
           AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
           AND (renew_batch.queue IS NULL OR j.queue = renew_batch.queue)
           FOR NO KEY UPDATE SKIP LOCKED
    ), renewed AS (
        UPDATE lease.job j
           SET lease_until = lease._now() + d
         WHERE j.id = ANY (ARRAY(SELECT h.id FROM held h))
           AND (renew_batch.queue IS NULL OR j.queue = renew_batch.queue)
        RETURNING j.id, j.epoch, j.lease_until, j.cancel_requested
    )
    -- Matched on (id, epoch): a stale epoch listed beside the current one
    -- for the same id is reported as lost. A row not renewed that this
    -- statement still sees held was skipped as locked: busy.
    SELECT w.id,
           CASE WHEN r.id IS NOT NULL THEN true WHEN s.id IS NOT NULL THEN NULL ELSE false END,
           coalesce(r.lease_until, s.lease_until),
           coalesce(r.cancel_requested, s.cancel_requested)
      FROM unnest(ids, epochs) WITH ORDINALITY AS w(id, epoch, ord)
      LEFT JOIN renewed r ON r.id = w.id AND r.epoch = w.epoch
      LEFT JOIN (SELECT s.id, s.epoch, s.lease_until, s.cancel_requested
                   FROM lease.job s
                  WHERE s.id = ANY (ids) AND s.owner = o AND s.state = 'leased' AND s.lease_until > lease._now()
                    AND (renew_batch.queue IS NULL OR s.queue = renew_batch.queue)) s
             ON r.id IS NULL AND s.id = w.id AND s.epoch = w.epoch
     ORDER BY w.ord;
END
$$;

COMMENT ON FUNCTION lease.renew_batch(bigint[], text, bigint[], interval, text) IS
$$lease.renew for many leases of one owner (of QUEUE, when given) in one statement (one round trip per
heartbeat). ids[i] goes
with epochs[i]; returns one lease.renewal per element, in input order. It never waits for a row another
transaction holds locked (the owner's own open fence, a writer of an attached table removing the row):
such a lease is reported with held NULL (busy: still held, not extended; try again soon) and its current
lease_until.
Errors: 22004 an argument NULL or an element NULL; 22023 arrays of different lengths or over 10000
elements, ttl or owner invalid; 42501 a row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE OR REPLACE FUNCTION lease.release(
    id       bigint,
    owner    text,
    epoch    bigint,
    outcome  text        DEFAULT 'done',
    retry_at timestamptz DEFAULT NULL,
    error    text        DEFAULT NULL,
    queue    text        DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o  constant text := owner;
    oc constant text := outcome;
    -- The time the SET lists record (Citus allows no lease._now() in a
    -- CASE or COALESCE); the WHERE clauses read the clock per row.
    t  constant timestamptz := clock_timestamp();
    q  text;
    st lease.job_state;
    ck text;
    pr integer;
    rk bigint;
    na timestamptz;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF release.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.release without its queue');
    END IF;
    -- The checks run only when an argument is off (see lease.claim_pending).
    IF NOT (id IS NOT NULL AND epoch IS NOT NULL AND lease._valid_owner(o) AND lease._valid_outcome(oc)) THEN
        PERFORM lease._checked_owner(o), lease._checked_outcome(oc),
                lease._checked_not_null(id, 'id'), lease._checked_not_null(epoch, 'epoch');
    END IF;
    IF NOT lease._valid_time(retry_at) THEN
        PERFORM lease._checked_time(retry_at, 'retry_at');
    END IF;
    IF EXISTS (SELECT FROM lease.queue qu WHERE qu.restricted AND (release.queue IS NULL OR qu.name = release.queue)) THEN
        PERFORM lease._check_rows(ARRAY[id], '{work}', release.queue);
    END IF;
    IF oc = 'done' THEN
        -- Queues that keep no history drop done rows at once: one write, not two.
        DELETE FROM lease.job j
         USING lease.queue q
         WHERE j.id = release.id AND j.owner = o AND j.epoch = release.epoch
           AND (release.queue IS NULL OR j.queue = release.queue)
           AND j.state = 'leased' AND j.lease_until > lease._now()
           AND q.name = j.queue AND q.retention = interval '0' AND NOT q.attached
        RETURNING j.queue, j.concurrency_key INTO q, ck;
        IF q IS NOT NULL THEN
            -- lease._count's upsert, written out (see lease.claim_pending).
            INSERT INTO lease.counter AS c (queue, backend, done)
            VALUES (q, pg_backend_pid(), 1)
                ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE SET done = c.done + 1;
            IF ck IS NOT NULL THEN
                PERFORM lease._free_slots(q, ARRAY[ck]);
            END IF;
            RETURN true;
        END IF;
    END IF;

    UPDATE lease.job j
       SET state       = lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached),
           finished_at = CASE WHEN lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                              THEN t END,
           attempt     = CASE WHEN oc = 'abandon' THEN j.attempt - 1 ELSE j.attempt END,
           next_at     = CASE WHEN oc = 'retry'
                              THEN coalesce(retry_at, lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch))
                              ELSE j.next_at END,
           lease_until = NULL,
           last_error  = coalesce(error, CASE WHEN oc = 'done' AND q.attached THEN lease._stranded_done() END, j.last_error)
      FROM lease.queue q
     WHERE j.id = release.id AND j.owner = o AND j.epoch = release.epoch
       AND (release.queue IS NULL OR j.queue = release.queue)
       AND j.state = 'leased' AND j.lease_until > lease._now()
       AND q.name = j.queue
    RETURNING j.queue, j.state, j.concurrency_key, j.priority, j.rank, j.next_at INTO q, st, ck, pr, rk, na;
    IF st IS NULL THEN
        RETURN false;
    END IF;
    PERFORM lease._count_moved(q, 'leased', st, 1, oc);
    IF st = 'pending' THEN
        -- A retry (or an abandon, which keeps its place) may be due before
        -- the queue's head.
        PERFORM lease._lower_head(q, pr, rk, na, release.id);
    ELSIF ck IS NOT NULL THEN
        PERFORM lease._free_slots(q, ARRAY[ck]);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease.release(bigint, text, bigint, text, timestamptz, text, text) IS
$$Ends OWNER's lease on row ID at EPOCH with an outcome, and returns true; returns false and changes
nothing if the lease is lost (stale epoch, wrong owner, expired, already released, not of QUEUE when that
is given; QUEUE routes the call on a distributed install).
Outcomes: 'done' (finished; deleted at once if the queue's retention is 0; on an attached table's row,
which is finished only when the table's row stops matching, a dead letter instead), 'retry' (pending again at
retry_at, default now + backoff; dead once attempts reach max_attempts), 'fail' (dead letter now),
'abandon' (pending again at once, the attempt is given back). A cancel request turns retry and abandon
into 'cancelled'. error is kept in last_error.
Errors: 22004 an argument NULL; 22023 unknown outcome, owner empty or over 256 characters, retry_at
infinite; 42501 the row's queue is restricted and the caller may not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE OR REPLACE FUNCTION lease.release_batch(
    ids      bigint[],
    owner    text,
    epochs   bigint[],
    outcome  text        DEFAULT 'done',
    retry_at timestamptz DEFAULT NULL,
    error    text        DEFAULT NULL,
    queue    text        DEFAULT NULL
) RETURNS TABLE (id bigint, released boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    o  constant text := lease._checked_owner(owner);
    oc constant text := lease._checked_outcome(outcome);
    -- As in lease.release.
    t  constant timestamptz := clock_timestamp();
    gone bigint[] := '{}';
    gone_epochs bigint[] := '{}';
    gone_queues text[];
    -- Concurrency keys of the deleted rows (NULL where none).
    gone_keys text[];
    -- Rows the UPDATE ended: their tokens and the states they went to.
    ended_ids bigint[];
    ended_epochs bigint[];
    states lease.job_state[];
    updated_queues text[];
    updated_keys text[];
    keyed boolean := false;
    moved record;
BEGIN
    -- Only the queue can route a call on a distributed install.
    IF release_batch.queue IS NULL THEN
        PERFORM lease._refuse_if_distributed('lease.release_batch without its queue');
    END IF;
    PERFORM lease._checked_same_length(ids, epochs), lease._checked_time(retry_at, 'retry_at');
    IF EXISTS (SELECT FROM lease.queue qu
                WHERE qu.restricted AND (release_batch.queue IS NULL OR qu.name = release_batch.queue)) THEN
        PERFORM lease._check_rows(ids, '{work}', release_batch.queue);
    END IF;
    IF oc = 'done' THEN
        WITH deleted AS (
            DELETE FROM lease.job j
             USING lease.queue q
             WHERE j.id = ANY (ids)
               AND (j.epoch = epochs[array_position(ids, j.id)]
                    OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
               AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
               AND (release_batch.queue IS NULL OR j.queue = release_batch.queue)
               AND q.name = j.queue AND q.retention = interval '0' AND NOT q.attached
            RETURNING j.id, j.epoch, j.queue, j.concurrency_key
        )
        SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.epoch), '{}'), array_agg(d.queue),
               array_agg(d.concurrency_key), coalesce(bool_or(d.concurrency_key IS NOT NULL), false)
          INTO gone, gone_epochs, gone_queues, gone_keys, keyed
          FROM deleted d;
        FOR moved IN SELECT g.queue, count(*) AS n FROM unnest(gone_queues) AS g(queue) GROUP BY g.queue LOOP
            PERFORM lease._count(moved.queue, done => moved.n);
        END LOOP;
        IF cardinality(gone) = cardinality(ids) THEN
            IF keyed THEN
                PERFORM lease._free_slots_of(gone_queues, gone_keys);
            END IF;
            -- The common case (all completions accepted): skip the UPDATE.
            RETURN QUERY SELECT u.id, true FROM unnest(ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
            RETURN;
        END IF;
    END IF;

    -- The SET list is lease.release's, for many rows: each function keeps
    -- its statement whole so the planner sees it (a shared function per row
    -- would cost the single release, the hot path at batch 1).
    WITH updated AS (
        UPDATE lease.job j
           SET state       = lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached),
               finished_at = CASE WHEN lease._next_state(oc, j.cancel_requested, j.attempt, q.max_attempts, q.attached) <> 'pending'
                                  THEN t END,
               attempt     = CASE WHEN oc = 'abandon' THEN j.attempt - 1 ELSE j.attempt END,
               next_at     = CASE WHEN oc = 'retry'
                                  THEN coalesce(retry_at, lease._retry_at(t, j.attempt, q.backoff_base, q.backoff_max, q.jitter, j.id, j.epoch))
                                  ELSE j.next_at END,
               lease_until = NULL,
               last_error  = coalesce(error, CASE WHEN oc = 'done' AND q.attached THEN lease._stranded_done() END, j.last_error)
          FROM lease.queue q
         WHERE j.id = ANY (ids)
           AND (j.epoch = epochs[array_position(ids, j.id)]
                OR (j.id, j.epoch) IN (SELECT u.id, u.epoch FROM unnest(ids, epochs) AS u(id, epoch)))
           AND j.owner = o AND j.state = 'leased' AND j.lease_until > lease._now()
           AND (release_batch.queue IS NULL OR j.queue = release_batch.queue)
           AND q.name = j.queue
        RETURNING j.id, j.epoch, j.queue, j.state, j.concurrency_key
    )
    SELECT coalesce(array_agg(u.id), '{}'), coalesce(array_agg(u.epoch), '{}'), array_agg(u.queue), array_agg(u.state),
           array_agg(u.concurrency_key), keyed OR coalesce(bool_or(u.concurrency_key IS NOT NULL), false)
      INTO ended_ids, ended_epochs, updated_queues, states, updated_keys, keyed
      FROM updated u;
    FOR moved IN SELECT m.queue, m.state, count(*) AS n
                   FROM unnest(updated_queues, states) AS m(queue, state) GROUP BY m.queue, m.state LOOP
        PERFORM lease._count_moved(moved.queue, 'leased', moved.state, moved.n, oc);
    END LOOP;
    -- Retries and abandons may be due before their queue's head.
    IF 'pending' = ANY (states) THEN
        PERFORM lease._lower_heads(ARRAY(SELECT m.id FROM unnest(ended_ids, states) AS m(id, state)
                                          WHERE m.state = 'pending'), release_batch.queue);
    END IF;
    -- The deleted rows and those the UPDATE ended give up their slots; rows
    -- that went back to pending keep theirs.
    IF keyed THEN
        PERFORM lease._free_slots_of(
            coalesce(gone_queues, '{}')
                || ARRAY(SELECT m.queue FROM unnest(updated_queues, states) AS m(queue, state)
                          WHERE m.state <> 'pending'),
            coalesce(gone_keys, '{}')
                || ARRAY(SELECT m.key FROM unnest(updated_keys, states) AS m(key, state)
                          WHERE m.state <> 'pending'));
    END IF;
    RETURN QUERY
    SELECT w.id, (w.id, w.epoch) IN (SELECT * FROM unnest(gone, gone_epochs))
                 OR (w.id, w.epoch) IN (SELECT * FROM unnest(ended_ids, ended_epochs))
      FROM unnest(ids, epochs) WITH ORDINALITY AS w(id, epoch, ord)
     ORDER BY w.ord;
END
$$;

COMMENT ON FUNCTION lease.release_batch(bigint[], text, bigint[], text, timestamptz, text, text) IS
$$lease.release for many leases of one owner (of QUEUE, when given) with one outcome, in one statement
(batched completions).
ids[i] goes with epochs[i]; returns (id, released) per element in input order.
Errors: 22004 an argument or element NULL; 22023 arrays of different lengths or over 10000 elements,
unknown outcome, owner invalid, retry_at infinite; 42501 a row's queue is restricted and the caller may
not work it;
22004 (0A000 if not a plain call) QUEUE NULL on a distributed install.$$;

CREATE OR REPLACE FUNCTION lease._rate_used(starts timestamptz[], counts integer[], since timestamptz) RETURNS bigint
-- plpgsql, whose plan a session keeps: a SQL function with a subquery is
-- never inlined, and was parsed and planned again on every claim (60 us).
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(sum(u.n), 0) FROM unnest(starts, counts) AS u(s, n) WHERE u.s > since);
END
$$;

COMMENT ON FUNCTION lease._rate_used(timestamptz[], integer[], timestamptz) IS
    'Internal: how many rows the claims of STARTS (when) and COUNTS (how many) took after SINCE.';

CREATE OR REPLACE FUNCTION lease._window(starts timestamptz[], counts integer[], since timestamptz, at timestamptz,
                              period interval, took integer,
                              OUT kept_starts timestamptz[], OUT kept_counts integer[])
-- IMMUTABLE, of its arguments alone: a distributed install (citus.sql)
-- takes no other function in an UPDATE.
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    last integer;
BEGIN
    -- Claims after this one read their times after it ends: an entry older
    -- than SINCE (a period before AT) is old for all of them too.
    SELECT coalesce(array_agg(u.s ORDER BY u.o), '{}'), coalesce(array_agg(u.n ORDER BY u.o), '{}')
      INTO kept_starts, kept_counts
      FROM unnest(starts, counts) WITH ORDINALITY AS u(s, n, o)
     WHERE u.s > since;
    IF took = 0 THEN
        RETURN;
    END IF;
    -- A claim within a hundredth of a period of the last one joins its
    -- entry, at its own (later) time: those rows count a little longer,
    -- never shorter, and a record keeps about a hundred entries at any
    -- claim rate.
    last := cardinality(kept_starts);
    IF last > 0 AND kept_starts[last] > at - period / 100 THEN
        kept_starts[last] := at;
        kept_counts[last] := kept_counts[last] + took;
    ELSE
        kept_starts := kept_starts || at;
        kept_counts := kept_counts || took;
    END IF;
END
$$;

COMMENT ON FUNCTION lease._window(timestamptz[], integer[], timestamptz, timestamptz, interval, integer) IS
$$Internal (rate limits): a sliding window's record of claims, STARTS (when) and COUNTS (how many rows), without the
entries of SINCE or earlier, and with TOOK rows claimed at AT added (to the last entry, if within a hundredth of
PERIOD of it).$$;

CREATE OR REPLACE FUNCTION lease._rate_take(queue text, period interval, wanted integer,
                                 OUT permitted integer, OUT at timestamptz,
                                 OUT shares integer[], OUT takes integer[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deadline constant timestamptz := clock_timestamp() + interval '100 milliseconds';
    -- Claimers start at different shares, and so rarely meet.
    first constant integer := pg_backend_pid() % 16;
    nap float8 := 0.001;
    seen integer[] := '{}';
    s integer;
    share_permits integer;
    kept_starts timestamptz[];
    kept_counts integer[];
    take integer;
BEGIN
    permitted := 0;
    shares := '{}';
    takes := '{}';
    LOOP
        -- NO KEY: a queue dropped meanwhile waits for this claim.
        SELECT r.share, r.permits, r.starts, r.counts INTO s, share_permits, kept_starts, kept_counts
          FROM lease.rate_share r
         WHERE r.queue = _rate_take.queue AND r.permits > 0 AND r.share <> ALL (seen)
         ORDER BY (r.share - first + 16) % 16
         LIMIT 1
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Every share was looked at, or the rest are other claims'.
            -- Having none, wait for them (they end with their claims),
            -- but never for a claim left in an open transaction.
            EXIT WHEN cardinality(seen) > 0 OR clock_timestamp() > deadline
                   OR NOT EXISTS (SELECT FROM lease.rate_share r
                                   WHERE r.queue = _rate_take.queue AND r.permits > 0);
            PERFORM pg_sleep(nap);
            nap := least(nap * 2, 0.02);
            CONTINUE;
        END IF;
        seen := seen || s;
        -- Counted from the time of the lock, before AT: a little more than
        -- AT's window, never less. (In the locking SELECT, this counted
        -- every share's record before taking one.)
        take := least(wanted - permitted,
                      greatest(share_permits - lease._rate_used(kept_starts, kept_counts, clock_timestamp() - period), 0));
        CONTINUE WHEN take = 0;
        permitted := permitted + take;
        shares := shares || s;
        takes := takes || take;
        EXIT WHEN permitted = wanted;
    END LOOP;
    -- Read once the shares are this claim's: the times of one share's
    -- claims rise in the order they hold it, so its record (and the
    -- window each claim counts) keeps their order.
    at := clock_timestamp();
END
$$;

COMMENT ON FUNCTION lease._rate_take(text, interval, integer) IS
$$Internal (lease.claim_pending): finds how many of WANTED rows QUEUE's rate limit (counting PERIOD) lets a
claim take now from the shares (lease.rate_share) no other transaction holds, locking them until the
transaction ends (waiting up to 100 ms if other transactions hold every share), and returns how many
(PERMITTED), from which shares (SHARES, TAKES), and the time to stamp the rows with (AT, the database clock,
read after the locks).$$;

CREATE OR REPLACE FUNCTION lease._rate_record(queue text, period interval, at timestamptz,
                                   shares integer[], takes integer[], claimed integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    since constant timestamptz := at - period;
    take integer;
BEGIN
    FOR i IN 1 .. cardinality(shares) LOOP
        EXIT WHEN claimed = 0;
        take := least(claimed, takes[i]);
        claimed := claimed - take;
        -- Two calls, not a multi-column SET from a subquery, which crashed
        -- Citus 13.2.2 (signal 11) on a distributed install.
        UPDATE lease.rate_share r
           SET starts = (lease._window(r.starts, r.counts, since, at, period, take)).kept_starts,
               counts = (lease._window(r.starts, r.counts, since, at, period, take)).kept_counts
         WHERE r.queue = _rate_record.queue AND r.share = shares[i];
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._rate_record(text, interval, timestamptz, integer[], integer[], integer) IS
$$Internal (lease.claim_pending): records CLAIMED rows, taken at AT, in the shares of QUEUE (whose limit
counts PERIOD) that lease._rate_take locked for them in this transaction (TAKES of SHARES, in order).$$;

CREATE OR REPLACE FUNCTION lease._rate_wait_of(queue text, period interval, t timestamptz) RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    free boolean;
    soonest timestamptz;
BEGIN
    -- A share's permits come back oldest claim first.
    SELECT bool_or(lease._rate_used(r.starts, r.counts, t - period) < r.permits),
           min((SELECT min(u.s) FROM unnest(r.starts) AS u(s) WHERE u.s > t - period))
      INTO free, soonest
      FROM lease.rate_share r
     WHERE r.queue = _rate_wait_of.queue AND r.permits > 0;
    RETURN CASE WHEN free THEN interval '0' ELSE greatest(soonest + period - t, interval '0') END;
END
$$;

COMMENT ON FUNCTION lease._rate_wait_of(text, interval, timestamptz) IS
$$Internal (lease.rate_wait, lease.wait_reason): how long after T until QUEUE's rate limit (counting PERIOD) lets
a claim take a row: 0 if a share has room.$$;

CREATE OR REPLACE FUNCTION lease.rate_wait(queue text DEFAULT 'default') RETURNS interval
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
    t constant timestamptz := clock_timestamp();
    lim integer;
    period interval;
    restricted boolean;
    keyed boolean;
    queue_wait interval;
    key_wait interval;
BEGIN
    SELECT qu.rate_limit, qu.rate_period, qu.restricted, qu.key_limited INTO lim, period, restricted, keyed
      FROM lease.queue qu
     WHERE qu.name = q;
    IF restricted THEN
        PERFORM lease._check_access(q, '{work}');
    END IF;
    IF lim IS NOT NULL THEN
        queue_wait := lease._rate_wait_of(q, period, t);
    END IF;
    IF keyed THEN
        -- The first full key to have room again (key_rate.sql).
        key_wait := (SELECT min(f.full_until) - t FROM lease.fairness_key f
                      WHERE f.queue = q AND f.rate_limit IS NOT NULL AND f.full_until > t);
    END IF;
    -- A row needs room in both.
    RETURN CASE WHEN queue_wait IS NULL THEN key_wait
                WHEN key_wait IS NULL THEN queue_wait
                ELSE greatest(queue_wait, key_wait) END;
END
$$;

COMMENT ON FUNCTION lease.rate_wait(text) IS
$$How long until QUEUE's rate limit lets a claim take a row again (by the database clock): 0 if it would now,
NULL if the queue has no rate limit; where fairness keys of QUEUE are full (lease.set_key_rate), until the
first of them has room again, if later. A worker whose claim came back empty sleeps this long rather than
polling. Errors: 22004 queue NULL; 42704 no such queue; 42501 the queue is restricted and the caller may not
work it.$$;

CREATE OR REPLACE FUNCTION lease._key_rate_take(queue text, ids bigint[], keys text[],
                                     OUT kept bigint[], OUT at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := queue;
    named constant text[] := ARRAY(SELECT DISTINCT coalesce(k, '') FROM unnest(keys) AS u(k));
    limited text[];
    -- Per limited key this claim holds, in one order: its limit and
    -- period, where its window starts, the room left in it, its oldest
    -- claim still in it (AT if none), and how many rows it keeps.
    held text[];
    lims integer[];
    periods interval[];
    sinces timestamptz[] := '{}';
    rooms bigint[];
    firsts timestamptz[];
    tooks bigint[];
    fulls timestamptz[] := '{}';
BEGIN
    SELECT array_agg(f.key) INTO limited
      FROM lease.fairness_key f
     WHERE f.queue = q AND f.key = ANY (named) AND f.rate_limit IS NOT NULL;
    IF limited IS NULL THEN
        kept := ids;
        at := clock_timestamp();
        RETURN;
    END IF;
    -- In no order: SKIP LOCKED never waits, so claims cannot deadlock here.
    -- (ORDER BY key made the planner read every key of the queue in the
    -- index's order, filtering, 3 ms a claim at 10,000 keys.)
    SELECT coalesce(array_agg(l.key), '{}'), array_agg(l.rate_limit), array_agg(l.rate_period)
      INTO held, lims, periods
      FROM (SELECT f.key, f.rate_limit, f.rate_period
              FROM lease.fairness_key f
             WHERE f.queue = q AND f.key = ANY (limited) AND f.rate_limit IS NOT NULL
               FOR NO KEY UPDATE SKIP LOCKED) AS l;
    -- Read once the keys are this claim's (rate.sql, _rate_take).
    at := clock_timestamp();
    FOR i IN 1 .. cardinality(held) LOOP
        sinces[i] := at - periods[i];
    END LOOP;
    SELECT array_agg(greatest(h.lim - w.used, 0) ORDER BY h.o), array_agg(coalesce(w.first, at) ORDER BY h.o)
      INTO rooms, firsts
      FROM unnest(held, lims, sinces) WITH ORDINALITY AS h(key, lim, since, o)
      JOIN lease.fairness_key f ON f.queue = q AND f.key = h.key
     CROSS JOIN LATERAL (SELECT coalesce(sum(u.n), 0) AS used, min(u.s) AS first
                           FROM unnest(f.starts, f.counts) AS u(s, n)
                          WHERE u.s > h.since) AS w;
    -- A limited key's rows up to its room, in claim order; a limited key
    -- another claim holds gets none.
    WITH u AS (
        SELECT x.id, x.o, coalesce(x.k, '') AS k,
               row_number() OVER (PARTITION BY coalesce(x.k, '') ORDER BY x.o) AS nth
          FROM unnest(ids, keys) WITH ORDINALITY AS x(id, k, o)
    ), k AS (
        SELECT u.id, u.o, u.k
          FROM u
          LEFT JOIN unnest(held, rooms) AS r(key, room) ON r.key = u.k
         WHERE u.k <> ALL (limited) OR u.nth <= r.room
    )
    SELECT coalesce((SELECT array_agg(k.id ORDER BY k.o) FROM k), '{}'),
           ARRAY(SELECT (SELECT count(*) FROM k WHERE k.k = h.key)
                   FROM unnest(held) WITH ORDINALITY AS h(key, o) ORDER BY h.o)
      INTO kept, tooks;
    -- Full: claims leave the key out until its oldest claim ages out.
    FOR i IN 1 .. cardinality(held) LOOP
        fulls[i] := CASE WHEN rooms[i] - tooks[i] <= 0 THEN firsts[i] + periods[i] END;
    END LOOP;
    -- One statement for every key, of IMMUTABLE functions of the row and
    -- the arrays above: Citus takes no STABLE expression in it, and crashed
    -- (signal 11, 13.2.2) on an array element picked by a column in SET and
    -- on a multi-column SET from a subquery (rate.sql, _rate_record).
    UPDATE lease.fairness_key f
       SET starts = (lease._window(f.starts, f.counts, h.since, at, h.period, h.took::integer)).kept_starts,
           counts = (lease._window(f.starts, f.counts, h.since, at, h.period, h.took::integer)).kept_counts,
           full_until = h.full_at
      FROM unnest(held, sinces, periods, tooks, fulls) AS h(key, since, period, took, full_at)
     WHERE f.queue = q AND f.key = h.key;
END
$$;

COMMENT ON FUNCTION lease._key_rate_take(text, bigint[], text[]) IS
$$Internal (lease.claim_pending): of the rows IDS picked from QUEUE, whose fairness keys are KEYS (in claim
order), keeps (KEPT, in order) those that their keys' rate limits let through now, locking each limited key
(skipping keys other transactions hold, whose rows it drops) and recording the rows kept in its window;
AT is the database clock read after the locks, the time the rows are claimed at.$$;

CREATE OR REPLACE FUNCTION lease.set_key_rate(queue text, fairness_key text, rate_limit integer,
                                   rate_period interval DEFAULT '1 second') RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := lease._checked_queue(queue);
BEGIN
    PERFORM lease._checked_fairness_key(lease._checked_not_null(fairness_key, 'fairness_key')),
            lease._checked_not_null(rate_period, 'rate_period');
    IF rate_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'rate_limit must be between 1 and 100000 (got %)', rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF rate_period <= interval '0' OR rate_period > interval '1 day' THEN
        RAISE EXCEPTION 'rate_period must be in (0, 1 day] (got %)', rate_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The record stays: claims made under the old limit count on under
    -- the new one.
    INSERT INTO lease.fairness_key AS f (queue, key, rate_limit, rate_period)
    VALUES (q, set_key_rate.fairness_key, set_key_rate.rate_limit, set_key_rate.rate_period)
        ON CONFLICT ON CONSTRAINT fairness_key_pkey DO UPDATE
       SET rate_limit = excluded.rate_limit,
           rate_period = excluded.rate_period,
           full_until = NULL;
    IF set_key_rate.rate_limit IS NOT NULL THEN
        UPDATE lease.queue qu SET key_limited = true WHERE qu.name = q AND NOT qu.key_limited;
    END IF;
END
$$;

COMMENT ON FUNCTION lease.set_key_rate(text, text, integer, interval) IS
$$Limits the rows of FAIRNESS_KEY (see lease.enqueue) of QUEUE to at most RATE_LIMIT (1..100000) claimed in any
span of RATE_PERIOD (default 1 second, at most 1 day), by the database clock: a sliding window, from the
claims that start after this call commits on (with those an earlier limit of the key recorded). Rows held
back stay pending and are claimable again as
soon as the window has room (lease.rate_wait); a claim that meets a full key takes other keys' rows
instead. RATE_LIMIT NULL lifts the key's limit. Applies with the queue's own rate limit, if any: a row
needs room in both.
Errors: 22004 queue, fairness_key or rate_period NULL; 22023 rate_limit or rate_period out of range, or
fairness_key over 256 characters; 42704 no such queue.$$;

CREATE OR REPLACE FUNCTION lease.claim_pending(
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

CREATE OR REPLACE FUNCTION lease.reclaim_own(
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

CREATE OR REPLACE FUNCTION lease._attached_key_column(queue text, rel oid) RETURNS name
LANGUAGE sql STABLE
RETURN (SELECT a.attname
          FROM lease.attachment t
          JOIN pg_catalog.pg_attribute a ON a.attrelid = t.rel AND a.attnum = t.key_attnum
         WHERE t.queue = _attached_key_column.queue AND t.rel = _attached_key_column.rel
           AND NOT a.attisdropped
           AND a.atttypid IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype,
                              'uuid'::regtype, 'text'::regtype, 'character varying'::regtype));

COMMENT ON FUNCTION lease._attached_key_column(text, oid) IS
    'Internal: the current name of the key column of table REL attached to QUEUE; NULL if there is no such attachment or the column was dropped or retyped to a type attach does not support.';

CREATE OR REPLACE FUNCTION lease._rank_sql(rel oid, attnum smallint, row_ref text) RETURNS text
LANGUAGE sql STABLE
RETURN CASE WHEN attnum IS NULL THEN '0' ELSE (
    SELECT CASE WHEN a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype, 'date'::regtype)
                    THEN format('(date_part(''epoch'', (%s).%I) * 1000000)::bigint', row_ref, a.attname)
                WHEN a.atttypid IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype)
                    THEN format('(%s).%I::bigint', row_ref, a.attname)
           END
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = _rank_sql.rel AND a.attnum = _rank_sql.attnum AND NOT a.attisdropped) END;

COMMENT ON FUNCTION lease._rank_sql(oid, smallint, text) IS
    'Internal: SQL computing lease.job.rank from order_by column ATTNUM of table REL for the row ROW_REF (''0'' without one); NULL if the column is gone or not a time or integer type.';

CREATE OR REPLACE FUNCTION lease._attached_row_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q constant text := TG_ARGV[0];
    col constant name := lease._attached_key_column(q, TG_RELID);
    k text;
    r bigint;
    rank_sql text;
    st lease.job_state;
    n bigint;
    jid bigint;
BEGIN
    IF col IS NULL THEN
        RAISE EXCEPTION 'trigger "%" on % is not the trigger of an attachment of queue "%"', TG_NAME, TG_RELID::regclass, q
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Only lease.attach creates these triggers; the key column must keep a supported type.';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        FOR st, n IN WITH gone AS (DELETE FROM lease.job j WHERE j.queue = q RETURNING j.state)
                     SELECT g.state, count(*) FROM gone g GROUP BY g.state LOOP
            PERFORM lease._count_moved(q, st, NULL, n);
        END LOOP;
        RETURN NULL;
    END IF;
    IF TG_ARGV[1] IN ('start', 'reorder') THEN
        rank_sql := lease._rank_sql(TG_RELID, (SELECT t.order_attnum FROM lease.attachment t WHERE t.queue = q), '$1');
        IF rank_sql IS NULL THEN
            RAISE EXCEPTION 'the order_by column of % was dropped or retyped', TG_RELID::regclass
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Give it a time or integer type again, or detach and attach the table.';
        END IF;
        EXECUTE format('SELECT ($1).%I::text, %s', col, rank_sql) INTO k, r USING NEW;
    END IF;
    IF TG_ARGV[1] = 'start' THEN
        -- A row that still has a job row (dead or cancelled) keeps it: it
        -- is not new work.
        INSERT INTO lease.job AS j (queue, key, payload, rank, next_at, created_at)
        VALUES (q, k, '{}', r, clock_timestamp(), clock_timestamp())
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING j.id INTO jid;
    ELSIF TG_ARGV[1] = 'reorder' THEN
        UPDATE lease.job j SET rank = r WHERE j.queue = q AND j.key = k RETURNING j.id INTO jid;
    ELSE
        -- Stopped matching (the domain moved on, or the row is gone): the
        -- row is no longer claimable and any lease on it ends now.
        EXECUTE format('SELECT ($1).%I::text', col) INTO k USING OLD;
        DELETE FROM lease.job j WHERE j.queue = q AND j.key = k RETURNING j.state INTO st;
        -- A leased row that stops matching is its job's completion.
        PERFORM lease._count_moved(q, st, NULL, 1, 'done');
    END IF;
    IF TG_ARGV[1] = 'start' AND jid IS NOT NULL THEN
        PERFORM lease._count(q, enqueued => 1, pending => 1), lease._wake(q, 1);
    END IF;
    -- A new row, or a pending one that moved up, may be before the head.
    IF jid IS NOT NULL THEN
        PERFORM lease._lower_heads(ARRAY[jid]);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease._attached_row_changed() IS
$$Internal trigger function of attached tables, arguments (queue, 'start' | 'stop' | 'reorder'): adds the
pending job row of a row that started matching the predicate, removes that of a row that stopped matching,
or updates its rank when its order_by column changed; on TRUNCATE removes them all. Refuses (55000) to act unless it fires on the table attached to that queue.
EXECUTE is granted to lease_admin only so that lease.attach can create the triggers; a trigger function
cannot be called directly.$$;

CREATE OR REPLACE FUNCTION lease._attach_triggers(rel regclass, queue text, pending text, key_col name, order_col name)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_in text;
    was_in text;
    key_moved constant text := format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', key_col);
BEGIN
    -- PostgreSQL parses the predicate (as the caller: an unknown column or a
    -- syntax error fails here, 42703 or 42601), and lease._qualified_predicate
    -- prints the parse tree back with the columns qualified by NEW and OLD.
    EXECUTE format('CREATE TEMP VIEW pg_lease_predicate AS SELECT coalesce((%s), false) AS m FROM %s',
                   pending, rel);
    now_in := lease._qualified_predicate('pg_temp.pg_lease_predicate'::regclass, rel, 'new');
    was_in := lease._qualified_predicate('pg_temp.pg_lease_predicate'::regclass, rel, 'old');
    DROP VIEW pg_temp.pg_lease_predicate;
    -- A predicate that a trigger condition cannot hold (a subquery) fails
    -- here: 0A000.
    EXECUTE format('CREATE TRIGGER pg_lease_start AFTER INSERT ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''start'')',
                   rel, now_in, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_stop AFTER DELETE ON %s FOR EACH ROW WHEN (%s)
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''stop'')',
                   rel, was_in, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_update_start AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''start'')',
                   rel, now_in, was_in, key_moved, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_update_stop AFTER UPDATE ON %s FOR EACH ROW
                    WHEN ((%s) AND (NOT (%s) OR %s))
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''stop'')',
                   rel, was_in, now_in, key_moved, queue);
    EXECUTE format('CREATE TRIGGER pg_lease_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT
                    EXECUTE FUNCTION lease._attached_row_changed(%L, ''truncate'')',
                   rel, queue);
    IF order_col IS NOT NULL THEN
        -- A matching row whose order_by value changes keeps its lease row
        -- and gets the new rank.
        EXECUTE format('CREATE TRIGGER pg_lease_reorder AFTER UPDATE OF %I ON %s FOR EACH ROW
                        WHEN ((%s) AND (%s) AND NOT (%s) AND OLD.%I IS DISTINCT FROM NEW.%I)
                        EXECUTE FUNCTION lease._attached_row_changed(%L, ''reorder'')',
                       order_col, rel, now_in, was_in, key_moved, order_col, order_col, queue);
    END IF;
END
$$;

COMMENT ON FUNCTION lease._attach_triggers(regclass, text, text, name, name) IS
$$Internal part of lease.attach (and of the 0.1.0 upgrade): creates the triggers of table REL attached to
QUEUE with predicate PENDING (and ORDER_COL, if any, followed by claims), as the caller, who must own the
table. Granted to lease_admin because
lease.attach runs as its caller; the triggers it creates act only for an attached table.$$;

CREATE OR REPLACE FUNCTION lease.attach(
    "table"        regclass,
    pending        text,
    queue          text     DEFAULT NULL,
    max_attempts   integer  DEFAULT 25,
    backoff_base   interval DEFAULT '1 second',
    backoff_max    interval DEFAULT '1 hour',
    dead_retention interval DEFAULT '7 days',
    order_by       name     DEFAULT NULL,
    on_dead        text     DEFAULT NULL,
    on_cancel      text     DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := queue;
    key_attnum smallint;
    key_col name;
    key_type regtype;
    order_attnum smallint;
    rank_sql text;
    existing text[];
    ranks bigint[];
    outcome_function regprocedure;
BEGIN
    -- Runs as the caller: creating triggers proves the caller may, and the
    -- predicate is parsed and first evaluated with the caller's rights.
    IF "table" IS NULL OR pending IS NULL THEN
        RAISE EXCEPTION 'table and pending must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM lease._refuse_if_distributed('attach');
    SELECT a.attnum, a.attname, a.atttypid::regtype INTO key_attnum, key_col, key_type
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
    IF order_by IS NOT NULL THEN
        SELECT a.attnum INTO order_attnum
          FROM pg_attribute a
         WHERE a.attrelid = "table" AND a.attname = order_by AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'column "%" of % does not exist', order_by, "table" USING ERRCODE = 'undefined_column';
        END IF;
    END IF;
    rank_sql := lease._rank_sql("table", order_attnum, 't');
    IF rank_sql IS NULL THEN
        RAISE EXCEPTION 'order_by column "%" of % must have a time or integer type', order_by, "table"
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Supported: timestamptz, timestamp, date, bigint, integer, smallint.';
    END IF;

    -- Creating the triggers needs the caller to own the table. The lock it
    -- takes (SHARE ROW EXCLUSIVE, until commit) keeps concurrent writes, and
    -- a concurrent attach, out until the triggers and the initial rows are
    -- in place.
    BEGIN
        PERFORM lease._attach_triggers("table", q, pending, key_col, order_by);
    EXCEPTION WHEN duplicate_object THEN
        RAISE EXCEPTION 'table % is already attached', "table" USING ERRCODE = 'duplicate_object';
    END;
    IF on_dead IS NOT NULL OR on_cancel IS NOT NULL THEN
        outcome_function := lease._create_outcome_function("table", key_col, pending, on_dead, on_cancel);
    END IF;
    -- The rows matching now become claimable.
    EXECUTE format('SELECT coalesce(array_agg(t.%I::text), ''{}''), coalesce(array_agg(%s), ''{}'')
                      FROM %s AS t WHERE (%s)', key_col, rank_sql, "table", pending)
       INTO existing, ranks;
    PERFORM lease._attach_register("table", q, key_attnum, order_attnum, pending, max_attempts, backoff_base,
                                   backoff_max, dead_retention, existing, ranks, on_dead, on_cancel,
                                   outcome_function);
    RETURN q;
END
$$;

COMMENT ON FUNCTION lease.attach(regclass, text, text, integer, interval, interval, interval, name, text, text) IS
$$Makes the rows of TABLE for which PENDING (an SQL boolean expression over the table's columns, e.g.
'status = ''SCHEDULED''') holds claimable in queue QUEUE (default: the table's name without schema), with the queue
options given. claim_pending returns them with key = the primary key as text; renew, release,
fenced_update, fence, cancel and the reaper work as for any queue. Rows that start matching later
become claimable; rows that stop matching (or are deleted, or truncated) stop being claimable and their
lease ends; DROP TABLE detaches. lease.enqueue refuses the queue (42809).
The predicate may use the row's columns and functions of them, no subqueries; it is evaluated when a
row is written, as the writing role, so it must not depend on the time or on other tables. Returns the
queue name. ORDER_BY names a column (time or integer) that claims follow, lowest first, within a
priority (e.g. an SLO deadline); a change of it on a matching row moves the row in the order.
ON_DEAD and ON_CANCEL are SET lists (e.g. 'status = ''FAILED'', error = now()::text') applied to the
table row, if it still matches, after its lease row became a dead letter or cancelled: that transaction
records a write-back (lease.write_backs), which lease.apply_write_backs applies once, as the table's owner
and only in a session of the owner's, in a function <table>_pg_lease_outcome that attach creates in the
table's schema.
The caller must own the table and be a lease_admin. Errors: 22004 table or pending NULL; 42703 no
such order_by column; 0A000 order_by not a time or integer type; 0A000 a distributed install
(lease.distribute); 0A000 no single-column primary key of type bigint, integer, smallint, uuid, text or varchar; 42710
already attached, or the queue exists; 42601, 42703, 42804: the predicate does not parse as a boolean
over the table's columns; 0A000: it contains a subquery; 42501 not the table's owner, no CREATE on its
schema (with on_dead/on_cancel, and always without the library) or, without the library, the installing role
has no SELECT and UPDATE on it; 42601, 42703: a bad on_dead/on_cancel; 42723 the outcome function's name
is taken; 22023 bad queue option.$$;

CREATE OR REPLACE FUNCTION lease._check_table_owner(rel regclass) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT pg_has_role(lease._caller(), (SELECT c.relowner FROM pg_class c WHERE c.oid = rel), 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', rel USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_table_owner(regclass) IS
    'Internal: raises 42501 unless the calling role (see lease._caller) owns table REL.';

CREATE OR REPLACE FUNCTION lease._attach_register(
    rel regclass, queue text, key_attnum smallint, order_attnum smallint, pending text, max_attempts integer,
    backoff_base interval, backoff_max interval, dead_retention interval, existing text[], ranks bigint[],
    on_dead text, on_cancel text, outcome_function regprocedure
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- ON CONFLICT (queue, key) names columns.
#variable_conflict use_column
DECLARE
    added bigint;
BEGIN
    -- Callable by any lease_admin, so it checks for itself what lease.attach
    -- established: the calling role owns the table.
    PERFORM lease._check_table_owner(rel);
    -- Releases, fenced writes and the reaper lock the table's rows as the
    -- extension's owner, this function's user: a superuser with the
    -- library, the installing role without it, whom the table's owner must
    -- grant as much (a release refused later would strand the lease).
    IF NOT (has_table_privilege(rel, 'SELECT') AND has_table_privilege(rel, 'UPDATE')) THEN
        RAISE EXCEPTION 'role "%", which owns pg_lease, may not read and lock the rows of %', current_user, rel
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('As the table''s owner: GRANT SELECT, UPDATE ON %s TO %I;', rel, current_user);
    END IF;
    IF EXISTS (SELECT FROM lease.attachment a WHERE a.rel = _attach_register.rel) THEN
        RAISE EXCEPTION 'table % is already attached', rel USING ERRCODE = 'duplicate_object';
    END IF;
    IF outcome_function IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_proc p JOIN pg_class c ON c.oid = rel
         WHERE p.oid = outcome_function AND p.prosecdef AND p.proowner = c.relowner) THEN
        RAISE EXCEPTION 'function % is not a SECURITY DEFINER function of the owner of %', outcome_function, rel
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT FROM lease.queue q WHERE q.name = _attach_register.queue) THEN
        RAISE EXCEPTION 'queue "%" already exists', queue
            USING ERRCODE = 'duplicate_object', HINT = 'Pass another queue name to attach.';
    END IF;
    -- Retention 0: a finished row is deleted, so the domain row starts
    -- afresh (a new id, hence a new token) when it matches again.
    PERFORM lease.create_queue(queue, max_attempts, backoff_base, backoff_max, '0', dead_retention);
    UPDATE lease.queue q SET attached = true WHERE q.name = _attach_register.queue;
    INSERT INTO lease.attachment (queue, rel, key_attnum, order_attnum, pending, on_dead, on_cancel, outcome_function)
    VALUES (_attach_register.queue, rel, _attach_register.key_attnum, _attach_register.order_attnum,
            _attach_register.pending, _attach_register.on_dead, _attach_register.on_cancel,
            _attach_register.outcome_function);
    -- The queue is new, its head the start: nothing to lower.
    INSERT INTO lease.job (queue, key, payload, rank, next_at, created_at)
    SELECT _attach_register.queue, u.k, '{}', coalesce(u.r, 0), clock_timestamp(), clock_timestamp()
      FROM unnest(existing, ranks) AS u(k, r)
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    IF added > 0 THEN
        PERFORM lease._count(_attach_register.queue, enqueued => added, pending => added);
    END IF;
    IF cardinality(existing) > 0 THEN
        PERFORM lease._wake(_attach_register.queue, cardinality(existing));
    END IF;
END
$$;

COMMENT ON FUNCTION lease._attach_register(regclass, text, smallint, smallint, text, integer, interval, interval, interval, text[], bigint[], text, text, regprocedure) IS
$$Internal part of lease.attach that needs the extension owner's rights: creates the queue, records the
attachment (with its outcome function, which must be a SECURITY DEFINER function of the table's owner) and
makes the EXISTING keys claimable with their RANKS. Granted to lease_admin because lease.attach runs as
its caller; refuses (42501) unless the calling role owns the table and the extension's owner may read and
update it (installs without the library). Errors: 42710 the table is attached
or the queue exists; 22023 bad queue option.$$;

CREATE OR REPLACE FUNCTION lease.detach("table" regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn regprocedure;
    match regprocedure;
    removed bigint;
BEGIN
    IF "table" IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Without the library the triggers' WHEN clauses call the predicate's
    -- function of the table's (sql/without_library.sql): it goes with them.
    SELECT p.oid INTO match
      FROM pg_trigger t
      JOIN pg_depend d ON d.classid = 'pg_trigger'::regclass AND d.objid = t.oid
                      AND d.refclassid = 'pg_proc'::regclass
      JOIN pg_proc p ON p.oid = d.refobjid
      JOIN pg_class c ON c.oid = t.tgrelid
     WHERE t.tgrelid = "table" AND t.tgname = 'pg_lease_start'
       AND p.pronamespace = c.relnamespace AND p.proname = left(c.relname || '_pg_lease_match', 63)
       AND p.pronargs = 1 AND p.proargtypes[0] = 'jsonb'::regtype;
    -- Dropping the triggers needs the caller to own the table.
    EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_start ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_stop ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_update_start ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_update_stop ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_truncate ON %1$s;
                    DROP TRIGGER IF EXISTS pg_lease_reorder ON %1$s', "table");
    SELECT a.outcome_function INTO fn FROM lease.attachment a WHERE a.rel = "table";
    removed := lease._detach_unregister("table");
    IF fn IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION IF EXISTS %s', fn);
    END IF;
    IF match IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION %s', match);
    END IF;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.detach(regclass) IS
$$Undoes lease.attach on TABLE: drops its triggers, its outcome function (on_dead/on_cancel), its predicate's
function (installs without the library), its queue and
every lease.job row of it (held leases end), and returns how many rows were removed. The domain table's data is not touched. The caller must
own the table. Errors: 22004 table NULL; 42704 not attached; 42501 not the table's owner.$$;

CREATE OR REPLACE FUNCTION lease._detach_unregister(rel regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    PERFORM lease._check_table_owner(rel);
    DELETE FROM lease.attachment a WHERE a.rel = _detach_unregister.rel RETURNING a.queue INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not attached', rel USING ERRCODE = 'undefined_object';
    END IF;
    RETURN lease._delete_queue(q);
END
$$;

COMMENT ON FUNCTION lease._detach_unregister(regclass) IS
$$Internal part of lease.detach that needs the extension owner's rights: removes the attachment, its queue
and its rows. Granted to lease_admin because lease.detach runs as its caller; refuses (42501) unless the
calling role owns the table.$$;

CREATE OR REPLACE FUNCTION lease._delete_queue(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    removed bigint;
BEGIN
    DELETE FROM lease.job j WHERE j.queue = _delete_queue.queue;
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM lease.counter c WHERE c.queue = _delete_queue.queue;
    DELETE FROM lease.queue q WHERE q.name = _delete_queue.queue;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease._delete_queue(text) IS
    'Internal: deletes queue QUEUE with its rows and counters; returns how many rows.';

CREATE OR REPLACE FUNCTION lease._forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone record;
    fn text;
BEGIN
    FOR gone IN
        DELETE FROM lease.attachment a
         USING pg_event_trigger_dropped_objects() d
         WHERE d.classid = 'pg_class'::regclass AND d.objid = a.rel::oid AND d.objsubid = 0
        RETURNING a.queue, a.outcome_function::oid AS fn_oid
    LOOP
        PERFORM lease._delete_queue(gone.queue);
        -- Its outcome function writes the dropped table: drop it too, unless
        -- the same command (DROP SCHEMA ... CASCADE) already did.
        SELECT p.oid::regprocedure::text INTO fn FROM pg_proc p WHERE p.oid = gone.fn_oid;
        IF fn IS NOT NULL THEN
            EXECUTE format('DROP FUNCTION %s', fn);
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._forget_dropped_tables() IS
    'Internal event trigger function (sql_drop): forgets the attachments of dropped tables with their queues, rows and outcome functions.';

CREATE OR REPLACE FUNCTION lease._create_outcome_function(
    rel regclass, key_col name, pending text, on_dead text, on_cancel text
) RETURNS regprocedure
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nsp name;
    fn text;
    key_type text;
    body text := '';
BEGIN
    SELECT n.nspname, format('%I.%I', n.nspname, left(c.relname || '_pg_lease_outcome', 63)),
           format_type(a.atttypid, NULL)
      INTO nsp, fn, key_type
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = key_col
     WHERE c.oid = rel;
    IF on_dead IS NOT NULL THEN
        body := body || format('UPDATE %s SET %s WHERE %I = $1::%s AND $2 = ''dead'' AND (%s);',
                               rel, on_dead, key_col, key_type, pending);
    END IF;
    IF on_cancel IS NOT NULL THEN
        body := body || format('UPDATE %s SET %s WHERE %I = $1::%s AND $2 = ''cancelled'' AND (%s);',
                               rel, on_cancel, key_col, key_type, pending);
    END IF;
    -- The caller's search_path is the one the SET lists were written for.
    EXECUTE format('CREATE FUNCTION %s(key text, outcome text) RETURNS void
                    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS %L',
                   fn, body);
    EXECUTE format('REVOKE ALL ON FUNCTION %s(text, text) FROM PUBLIC', fn);
    EXECUTE format('COMMENT ON FUNCTION %s(text, text) IS %L', fn,
                   format('pg_lease: writes the outcome of a lease of %s back to its row (attach on_dead/on_cancel). Dropped by lease.detach.', rel));
    RETURN format('%s(text, text)', fn)::regprocedure;
END
$$;

COMMENT ON FUNCTION lease._create_outcome_function(regclass, name, text, text, text) IS
$$Internal part of lease.attach: creates, as the caller, the SECURITY DEFINER function <table>_pg_lease_outcome(key,
outcome) in the table's schema that applies ON_DEAD or ON_CANCEL to a row still matching PENDING.$$;

CREATE OR REPLACE FUNCTION lease._outcome_function(queue text) RETURNS regproc
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a lease.attachment;
BEGIN
    SELECT * INTO a FROM lease.attachment t WHERE t.queue = _outcome_function.queue;
    IF a.outcome_function IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_proc p JOIN pg_class c ON c.oid = a.rel
                    WHERE p.oid = a.outcome_function AND p.prosecdef AND p.proowner = c.relowner) THEN
        RAISE EXCEPTION 'the outcome function of % is gone, or no longer SECURITY DEFINER and owned by the table''s owner', a.rel
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Detach and attach the table again.';
    END IF;
    RETURN a.outcome_function::oid::regproc;
END
$$;

COMMENT ON FUNCTION lease._outcome_function(text) IS
    'Internal: the on_dead/on_cancel function of the table attached to QUEUE, NULL if none; raises 55000 if it was dropped or altered.';

CREATE OR REPLACE FUNCTION lease._job_finished() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM lease.attachment a WHERE a.queue = NEW.queue AND a.outcome_function IS NOT NULL) THEN
        INSERT INTO lease.write_back (queue, key, outcome) VALUES (NEW.queue, NEW.key, NEW.state);
        PERFORM lease._reaper_touch();
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION lease._job_finished() IS
    'Internal trigger function on lease.job: records the write-back of a row of an attached table with on_dead/on_cancel that became dead or cancelled.';

CREATE OR REPLACE FUNCTION lease._write_back_owner(invoker name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF invoker IS DISTINCT FROM session_user OR current_setting('role') <> 'none' THEN
        RAISE EXCEPTION 'write-backs are applied only in a session that logged in as the table''s owner'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Session user "%s", acting as "%s".', session_user, invoker),
                  HINT = 'Connect as the owner of the attached table, without SET ROLE.';
    END IF;
    RETURN (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user);
END
$$;

COMMENT ON FUNCTION lease._write_back_owner(name) IS
    'Internal: the oid of the session user if INVOKER (the current_user of lease.apply_write_backs) is that user and no SET ROLE is in force; else 42501.';

CREATE OR REPLACE FUNCTION lease._take_write_backs(invoker name, max_rows integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    n constant integer := lease._checked_limit(max_rows);
BEGIN
    RETURN QUERY
    UPDATE lease.write_back w
       SET attempts = w.attempts + 1,
           next_try_at = clock_timestamp() + lease._backoff(w.attempts + 1, '1 second', '10 minutes')
     WHERE w.id = ANY (ARRAY(SELECT d.id
                               FROM lease.write_back d
                               JOIN lease.attachment a ON a.queue = d.queue
                               JOIN pg_class c ON c.oid = a.rel
                              WHERE c.relowner = owner AND d.next_try_at <= clock_timestamp()
                              ORDER BY d.next_try_at, d.id
                              LIMIT n
                                FOR UPDATE OF d SKIP LOCKED))
    RETURNING w.id;
END
$$;

COMMENT ON FUNCTION lease._take_write_backs(name, integer) IS
    'Internal part of lease.apply_write_backs: locks up to MAX_ROWS due write-backs of tables the session user owns, counts an attempt on each and returns their ids.';

CREATE OR REPLACE FUNCTION lease._write_back_target(invoker name, id bigint)
RETURNS TABLE (lock_sql text, apply_sql text, key text, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    w lease.write_back;
    target record;
    fn regproc;
BEGIN
    SELECT * INTO w FROM lease.write_back b WHERE b.id = _write_back_target.id;
    SELECT a.rel, c.relowner, c.relkind, format_type(k.atttypid, NULL) AS key_type,
           lease._attached_key_column(a.queue, a.rel) AS key_col
      INTO target
      FROM lease.attachment a
      JOIN pg_class c ON c.oid = a.rel
      JOIN pg_attribute k ON k.attrelid = a.rel AND k.attnum = a.key_attnum
     WHERE a.queue = w.queue;
    IF w.id IS NULL OR target.rel IS NULL THEN
        RETURN;
    END IF;
    IF target.relowner <> owner THEN
        RAISE EXCEPTION 'write-back % is for table %, which role "%" does not own', id, target.rel, session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF target.relkind NOT IN ('r', 'p') OR target.key_col IS NULL THEN
        RAISE EXCEPTION '% is no longer a table with the key attach saw', target.rel
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Detach it.';
    END IF;
    fn := lease._outcome_function(w.queue);
    IF fn IS NULL THEN
        DELETE FROM lease.write_back b WHERE b.id = w.id;
        RETURN;
    END IF;
    -- The key type is one attach supports, so = and the cast are built in.
    lock_sql := format('SELECT FROM %s t WHERE t.%I OPERATOR(pg_catalog.=) $1::%s FOR NO KEY UPDATE OF t',
                       target.rel, target.key_col, target.key_type);
    apply_sql := format('SELECT %s($1, $2)', fn);
    key := w.key;
    outcome := w.outcome::text;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION lease._write_back_target(name, bigint) IS
$$Internal part of lease.apply_write_backs: the statements that lock the table row of write-back ID and apply
its on_dead/on_cancel function (with their arguments), for the table's owner to run; no row if the write-back
is gone (or deleted here, its table having no outcome function any more). 42501 unless the session user owns the table and acts as itself; 55000 if the table is no longer a
table, or its outcome function is gone or altered.$$;

CREATE OR REPLACE FUNCTION lease._write_back_wanted(invoker name, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
    w lease.write_back;
BEGIN
    SELECT b.* INTO w
      FROM lease.write_back b
      JOIN lease.attachment a ON a.queue = b.queue
      JOIN pg_class c ON c.oid = a.rel
     WHERE b.id = _write_back_wanted.id AND c.relowner = owner;
    IF w.id IS NULL THEN
        RETURN false;
    END IF;
    PERFORM FROM lease.job j WHERE j.queue = w.queue AND j.key = w.key FOR SHARE;
    -- Work again under this key (requeued, or a new row) is not undone.
    IF EXISTS (SELECT FROM lease.job j
                WHERE j.queue = w.queue AND j.key = w.key AND j.state IN ('pending', 'leased')) THEN
        DELETE FROM lease.write_back b WHERE b.id = w.id;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION lease._write_back_wanted(name, bigint) IS
$$Internal part of lease.apply_write_backs, after the table row is locked: locks the key's lease row and says
whether write-back ID is still to be applied; deletes it, unapplied, if its key has work again. Acts only on
tables the session user owns.$$;

CREATE OR REPLACE FUNCTION lease._write_back_applied(invoker name, id bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
BEGIN
    DELETE FROM lease.write_back w
     WHERE w.id = _write_back_applied.id
       AND EXISTS (SELECT FROM lease.attachment a JOIN pg_class c ON c.oid = a.rel
                    WHERE a.queue = w.queue AND c.relowner = owner);
END
$$;

COMMENT ON FUNCTION lease._write_back_applied(name, bigint) IS
    'Internal part of lease.apply_write_backs: deletes write-back ID, applied, of a table the session user owns.';

CREATE OR REPLACE FUNCTION lease._write_back_failed(invoker name, id bigint, error text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner constant oid := lease._write_back_owner(invoker);
BEGIN
    UPDATE lease.write_back w SET last_error = left(error, 2000)
     WHERE w.id = _write_back_failed.id
       AND EXISTS (SELECT FROM lease.attachment a JOIN pg_class c ON c.oid = a.rel
                    WHERE a.queue = w.queue AND c.relowner = owner);
END
$$;

COMMENT ON FUNCTION lease._write_back_failed(name, bigint, text) IS
    'Internal part of lease.apply_write_backs: records ERROR on write-back ID of a table the session user owns.';

CREATE OR REPLACE FUNCTION lease.apply_write_backs(max_rows integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    me constant name := current_user;
    w bigint;
    target record;
    handled integer := 0;
    problem text;
BEGIN
    FOR w IN SELECT * FROM lease._take_write_backs(me, max_rows) LOOP
        BEGIN
            SELECT * INTO target FROM lease._write_back_target(me, w);
            IF FOUND THEN
                EXECUTE target.lock_sql USING target.key;
                IF lease._write_back_wanted(me, w) THEN
                    EXECUTE target.apply_sql USING target.key, target.outcome;
                    PERFORM lease._write_back_applied(me, w);
                END IF;
            END IF;
            SET CONSTRAINTS ALL IMMEDIATE;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            PERFORM lease._write_back_failed(me, w, format('%s: %s', SQLSTATE, problem));
        END;
        handled := handled + 1;
    END LOOP;
    RETURN handled;
END
$$;

COMMENT ON FUNCTION lease.apply_write_backs(integer) IS
$$Applies up to MAX_ROWS due on_dead/on_cancel write-backs (see lease.attach) of the tables the session user
owns and returns how many it handled. Each runs in a subtransaction of its own, with the deferred constraints of
its UPDATE checked at once; one that fails keeps its error (lease.write_backs) and is tried again after a
backoff (1 s, doubling to 10 min). With the library a background worker calls it as each table's owner; without
it, call it as the owner from a scheduler (pg_cron, or the client's Sweeper connected as the owner). It must run
in a session that logged in as the owner, without SET ROLE: the owner's code never runs in another role's
session. Leaves SET CONSTRAINTS ALL IMMEDIATE in force for the rest of the transaction.
Errors: 42501 called under SET ROLE or from another role's function; 22004/22023 max_rows NULL or outside
1..10000.$$;

CREATE OR REPLACE FUNCTION lease._write_back_owners() RETURNS SETOF oid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT DISTINCT c.relowner
      FROM lease.write_back w
      JOIN lease.attachment a ON a.queue = w.queue
      JOIN pg_class c ON c.oid = a.rel
     WHERE w.next_try_at <= clock_timestamp()
       AND has_schema_privilege(c.relowner, 'lease', 'USAGE')
       AND has_function_privilege(c.relowner, 'lease.apply_write_backs(integer)', 'EXECUTE');
END;

COMMENT ON FUNCTION lease._write_back_owners() IS
    'Internal: the roles that own attached tables with due write-backs and may apply them (lease.apply_write_backs).';

CREATE OR REPLACE FUNCTION lease._lock_attached_rows(ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target record;
    locked_keys text[];
    locked bigint[] := '{}';
BEGIN
    FOR target IN
        SELECT a.queue, a.rel, c.attname, array_agg(j.key) AS keys
          FROM lease.job j
          JOIN lease.attachment a ON a.queue = j.queue
          JOIN pg_attribute c ON c.attrelid = a.rel AND c.attnum = a.key_attnum
         WHERE j.id = ANY (ids)
           AND c.attname = lease._attached_key_column(a.queue, a.rel)
         GROUP BY a.queue, a.rel, c.attname
    LOOP
        locked_keys := lease._lock_table_rows(target.rel, target.attname, target.keys);
        locked := locked || ARRAY(SELECT j.id FROM lease.job j
                                   WHERE j.queue = target.queue AND j.key = ANY (locked_keys) AND j.id = ANY (ids));
    END LOOP;
    RETURN locked;
END
$$;

COMMENT ON FUNCTION lease._lock_attached_rows(bigint[]) IS
$$Internal: locks the table rows of the attached-table rows among IDS FOR NO KEY UPDATE, in key order, each
table's as its owner (lease._lock_table_rows); returns the ids whose table rows are now locked. The lock
order of lease.fence: table row, then lease row.$$;
COMMENT ON FUNCTION lease._cron_next(text, double precision) IS
$$Internal (lease.schedule): the first time strictly after AFTER (Unix epoch seconds, UTC) that the cron
expression SPEC fires, as epoch seconds; NULL if it never fires again. Five fields, or six with seconds
first. Errors: 22023 SPEC is not a cron expression.$$;

COMMENT ON FUNCTION lease._cron_last(text, double precision) IS
$$Internal (lease.schedule): the last time at or before AT (Unix epoch seconds, UTC) that the cron
expression SPEC fires, as epoch seconds; NULL if none. Errors: 22023 SPEC is not a cron expression.$$;

COMMENT ON FUNCTION lease._qualified_predicate(oid, oid, text) IS
$$Internal: the expression of the first column of VIEW, printed with every column of TABLE qualified by
ALIAS (lease.attach turns a predicate into trigger WHEN clauses with it). Errors: 42809 not a view.$$;

COMMENT ON FUNCTION lease._reaper_discover() IS
$$Internal: asks the preloaded reaper to look for pg_lease in this database now (the install script
calls it); does nothing where pg_lease is not preloaded.$$;

COMMENT ON FUNCTION lease._reaper_slot_shortages() IS
    'Internal: sweeps the reaper could not start for want of a worker slot since the server started (NULL: not preloaded).';

COMMENT ON FUNCTION lease._reaper_last_slot_shortage() IS
    'Internal: Unix time of the last such shortage (NULL: never, or not preloaded).';

CREATE OR REPLACE FUNCTION lease._schedule_next(cron text, every interval, anchor timestamptz, after timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN cron IS NOT NULL
    THEN to_timestamp(lease._cron_next(cron, extract(epoch FROM after)::double precision))
    ELSE anchor + every * (floor(extract(epoch FROM after - anchor) / extract(epoch FROM every)) + 1)::double precision
END;

COMMENT ON FUNCTION lease._schedule_next(text, interval, timestamptz, timestamptz) IS
    'Internal: the first occurrence strictly after AFTER of a schedule (CRON, or EVERY counted from ANCHOR); NULL if none.';

CREATE OR REPLACE FUNCTION lease._schedule_last(cron text, every interval, anchor timestamptz, at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN cron IS NOT NULL
    THEN to_timestamp(lease._cron_last(cron, extract(epoch FROM at)::double precision))
    ELSE anchor + every * floor(extract(epoch FROM at - anchor) / extract(epoch FROM every))::double precision
END;

COMMENT ON FUNCTION lease._schedule_last(text, interval, timestamptz, timestamptz) IS
    'Internal: the last occurrence at or before AT of a schedule (CRON, or EVERY counted from ANCHOR); NULL if none.';

CREATE OR REPLACE FUNCTION lease.schedule(
    name     text,
    queue    text,
    cron     text     DEFAULT NULL,
    every    interval DEFAULT NULL,
    payload  jsonb    DEFAULT '{}',
    priority integer  DEFAULT 0,
    missed   text     DEFAULT 'skip'
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n constant text := lease._checked_not_null(name, 'name');
    p constant jsonb := lease._checked_not_null(payload, 'payload');
    q constant text := (lease._checked_producer_queue(queue, octet_length(p::text))).name;
    t constant timestamptz := clock_timestamp();
    first timestamptz;
BEGIN
    IF n = '' OR length(n) > 128 THEN
        RAISE EXCEPTION 'schedule name must have 1 to 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (cron IS NULL) = (every IS NULL) THEN
        RAISE EXCEPTION 'give exactly one of cron and every' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The reaper sweeps at a schedule's next occurrence, a few milliseconds
    -- late; a shorter period would leave it no margin.
    IF every IS NOT NULL AND (lease._checked_span(every, interval '366 days', 'every') < interval '1 second') THEN
        RAISE EXCEPTION 'every must be at least 1 second (got %)', every USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF missed IS NULL OR missed NOT IN ('skip', 'catch_up') THEN
        RAISE EXCEPTION 'missed must be ''skip'' or ''catch_up'' (got %)', coalesce(missed, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first := lease._schedule_next(cron, every, t, t);
    IF first IS NULL THEN
        RAISE EXCEPTION 'cron expression "%" never fires', cron USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO lease.schedule AS s (name, queue, cron, every, anchor, payload, priority, missed, next_at)
    VALUES (n, q, schedule.cron, schedule.every, t, p, coalesce(schedule.priority, 0), schedule.missed, first)
    ON CONFLICT (name) DO UPDATE
       SET queue = excluded.queue, cron = excluded.cron, every = excluded.every,
           anchor = excluded.anchor, payload = excluded.payload, priority = excluded.priority,
           missed = excluded.missed, next_at = excluded.next_at, last_error = NULL, last_error_at = NULL;
    -- Have the reaper (where preloaded) look at this database's next due time.
    -- Its first occurrence may come before the reaper's next pass.
    PERFORM lease._reaper_wake();
    RETURN first;
END
$$;

COMMENT ON FUNCTION lease.schedule(text, text, text, interval, jsonb, integer, text) IS
$$Creates or replaces the schedule NAME: enqueue PAYLOAD (with PRIORITY) into QUEUE at every occurrence
of CRON (a cron expression in UTC: five fields, or six with seconds first) or EVERY (a fixed period,
counted from now). Returns the first occurrence. lease.sweep() (the reaper, pg_cron, or any caller)
enqueues each due occurrence exactly once, keyed 'schedule:NAME@<occurrence in UTC>', with the
occurrence as run_at; the reaper sweeps at the next occurrence. An occurrence more than 5 seconds
overdue counts as missed (no reaper or sweep ran): MISSED = 'skip' enqueues only the latest of those,
'catch_up' every one of them, oldest first (at most 100 per schedule and sweep).
Errors: 22004 name, queue or payload NULL; 22023 not exactly one of cron and every, an invalid or
never-firing cron expression (five or six fields), every not in [1 second, 366 days] or with months, missed unknown, name empty or
over 128 characters; 42704 no such queue; 42809 the queue is fed by an attached table; 42501 the queue
is restricted and the caller may not produce into it.$$;

CREATE OR REPLACE FUNCTION lease.unschedule(name text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH gone AS (DELETE FROM lease.schedule s WHERE s.name = unschedule.name RETURNING 1)
    SELECT count(*) > 0 FROM gone;
END;

COMMENT ON FUNCTION lease.unschedule(text) IS
    'Deletes the schedule NAME; returns false if there was none. Rows it already enqueued stay.';

CREATE OR REPLACE FUNCTION lease._enqueue_occurrence(s lease.schedule, at timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE
RETURN lease.enqueue(s.queue, s.payload,
                     key => format('schedule:%s@%s', s.name,
                                   to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
                     run_at => at, priority => s.priority);

COMMENT ON FUNCTION lease._enqueue_occurrence(lease.schedule, timestamptz) IS
    'Internal: enqueues the occurrence AT of schedule S, keyed by its name and time; returns the row id.';

CREATE OR REPLACE FUNCTION lease._enqueue_due(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    s lease.schedule;
    at timestamptz;
    job bigint;
    made integer;
    total bigint := 0;
    problem text;
BEGIN
    -- A locked schedule is being run by another sweeper: skip it.
    FOR s IN SELECT * FROM lease.schedule sc
              WHERE sc.next_at <= t
              ORDER BY sc.next_at
              LIMIT max_rows
                FOR UPDATE SKIP LOCKED LOOP
        made := 0;
        BEGIN
            -- An occurrence less than a few seconds overdue is a sweep
            -- that came late, not an outage: it is enqueued either way.
            at := CASE s.missed
                      WHEN 'skip' THEN greatest(s.next_at,
                                                lease._schedule_last(s.cron, s.every, s.anchor, t - interval '5 seconds'))
                      ELSE s.next_at END;
            WHILE at IS NOT NULL AND at <= t AND made < 100 LOOP
                job := lease._enqueue_occurrence(s, at);
                made := made + 1;
                at := lease._schedule_next(s.cron, s.every, s.anchor, at);
            END LOOP;
            UPDATE lease.schedule sc
               SET next_at = at, enqueued = sc.enqueued + made, last_run_at = t, last_job_id = job
             WHERE sc.name = s.name;
        EXCEPTION WHEN OTHERS THEN
            -- One schedule (its queue attached since, say) must not stop
            -- the others; its due occurrences are dropped, and the reason
            -- kept where operators look.
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            UPDATE lease.schedule sc
               SET next_at = lease._schedule_next(s.cron, s.every, s.anchor, t),
                   last_error = format('%s: %s', SQLSTATE, problem), last_error_at = t
             WHERE sc.name = s.name;
            RAISE WARNING 'pg_lease: schedule "%" could not enqueue: %', s.name, problem;
        END;
        total := total + made;
    END LOOP;
    RETURN total;
END
$$;

COMMENT ON FUNCTION lease._enqueue_due(integer) IS
$$Internal (lease.sweep): enqueues the due occurrences of up to MAX_ROWS schedules, each exactly once,
and returns how many rows it enqueued. A schedule whose enqueue fails records the error and moves on.$$;

COMMENT ON FUNCTION lease._reaper_wake() IS
$$Internal: asks the preloaded reaper to look at this database as soon as the current transaction commits
(lease.schedule calls it); does nothing where pg_lease is not preloaded.$$;

-- session.sql: leases bound to a session (new).
CREATE OR REPLACE FUNCTION lease._ended_sessions() RETURNS TABLE (queue text, owner text)
LANGUAGE sql STABLE
BEGIN ATOMIC
    -- One anti-join: the backends are read once, however many sessions a
    -- queue's workers have bound.
    SELECT se.queue, se.owner
      FROM lease.session se
     -- After a restart no backend of before is alive.
     WHERE se.server_start <> pg_postmaster_start_time()
        OR NOT EXISTS (SELECT FROM pg_stat_activity a
                        WHERE a.pid = se.pid
                          -- NULL where the reader may not see it: the pid alone decides.
                          AND (a.backend_start IS NULL OR se.backend_start IS NULL
                               OR a.backend_start = se.backend_start));
END;

COMMENT ON FUNCTION lease._ended_sessions() IS
    'Internal: the bindings (queue, owner) whose session has ended: its backend is gone, or the server restarted since.';

CREATE OR REPLACE FUNCTION lease._end_bound_leases(queue text, owner text, max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    ended bigint;
BEGIN
    -- Expired as of now: the reaper recovers them as it recovers any
    -- expiry (a new epoch, the attempt counted, the retry backoff). Rows
    -- locked by others, and those past MAX_ROWS, are left for the next pass.
    UPDATE lease.job j
       SET lease_until = t
     WHERE j.id = ANY (ARRAY(SELECT b.id
                               FROM lease.job b
                              WHERE b.queue = _end_bound_leases.queue AND b.owner = _end_bound_leases.owner
                                AND b.state = 'leased' AND b.lease_until > t
                              LIMIT max_rows
                                FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS ended = ROW_COUNT;
    RETURN ended;
END
$$;

COMMENT ON FUNCTION lease._end_bound_leases(text, text, integer) IS
    'Internal: sets up to MAX_ROWS of the leases OWNER holds in QUEUE to expire now (rows locked by others are skipped); returns how many.';

CREATE OR REPLACE FUNCTION lease.bind_session(queue text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    q constant text := lease._checked_queue(queue);
    o constant text := lease._checked_owner(owner);
    me constant integer := pg_backend_pid();
    started constant timestamptz := (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = me);
    prior lease.session;
    ended bigint := 0;
BEGIN
    -- The session would be looked for on the node holding the queue, where
    -- it does not run.
    PERFORM lease._refuse_if_distributed('lease.bind_session');
    PERFORM lease._check_access(q, '{work}');
    SELECT * INTO prior FROM lease.session s WHERE s.queue = q AND s.owner = o FOR UPDATE;
    IF FOUND AND prior.pid = me AND prior.server_start = pg_postmaster_start_time() THEN
        RETURN true;
    END IF;
    -- The session the leases were bound to has ended: so have they, even
    -- if the reaper has not got to them yet. A live one (the holder
    -- reconnected while its old backend still ran) hands them over.
    IF FOUND AND EXISTS (SELECT FROM lease._ended_sessions() e WHERE e.queue = q AND e.owner = o) THEN
        ended := lease._end_bound_leases(q, o, 2147483647);
    END IF;
    -- The reaper looks at this database from now on (lease._next_sweep_due).
    PERFORM lease._reaper_touch(ended);
    INSERT INTO lease.session AS s (queue, owner, pid, backend_start, server_start, bound_at)
    VALUES (q, o, me, started, pg_postmaster_start_time(), clock_timestamp())
    ON CONFLICT (queue, owner) DO UPDATE
       SET pid = excluded.pid, backend_start = excluded.backend_start,
           server_start = excluded.server_start, bound_at = excluded.bound_at;
    RETURN ended = 0;
END
$$;

COMMENT ON FUNCTION lease.bind_session(text, text) IS
$$Binds the leases OWNER holds in QUEUE, now and later, to the calling session: when its backend ends (process
killed, connection closed, host gone and TCP keepalive fired, server restarted) the reaper expires them within
a sweep interval instead of at their ttl, and they are retried as after any expiry. Call it on a connection
that stays open as long as the holder runs, and again after that connection is replaced. Binding a new
session while the old one still runs moves the leases to it; if the old one has ended, its leases end at once.
Returns false when it ended leases that way, true otherwise. Any role that may work QUEUE may bind any owner
name in it (as with lease.reclaim_own): owner names are not secrets between a queue's workers. Errors: 22004
an argument NULL; 22023 owner invalid; 42704 no such queue; 42501 the queue is restricted and the caller may
not work it; 0A000 on a distributed install (lease.distribute).$$;

CREATE OR REPLACE FUNCTION lease._end_lost_sessions(max_rows integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    s record;
    ended bigint := 0;
BEGIN
    -- Bounded in bindings and in leases: each costs an index probe and the
    -- rows it ends, and the pass stops at MAX_ROWS of either; the rest wait
    -- for the next one.
    FOR s IN SELECT se.queue, se.owner
               FROM lease.session se
              WHERE (se.queue, se.owner) IN (SELECT e.queue, e.owner FROM lease._ended_sessions() e)
              LIMIT max_rows
                FOR UPDATE OF se SKIP LOCKED LOOP
        EXIT WHEN ended >= max_rows;
        ended := ended + lease._end_bound_leases(s.queue, s.owner, (max_rows - ended)::integer);
        -- Kept while a lease of it is left (locked by someone else, or past
        -- this pass's bound).
        DELETE FROM lease.session se
         WHERE se.queue = s.queue AND se.owner = s.owner
           AND NOT EXISTS (SELECT FROM lease.job j
                            WHERE j.queue = s.queue AND j.owner = s.owner
                              AND j.state = 'leased' AND j.lease_until > clock_timestamp());
    END LOOP;
    RETURN ended;
END
$$;

COMMENT ON FUNCTION lease._end_lost_sessions(integer) IS
    'Internal (lease.sweep, before it reaps): expires the leases bound to sessions that have ended, up to MAX_ROWS bindings and MAX_ROWS leases a call, and forgets those sessions once none is left; returns how many leases.';
CREATE OR REPLACE FUNCTION lease._log_reaped(queue text, requeued bigint, dead bigint, cancelled bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE LOG 'pg_lease: expired leases in queue "%" of database "%": % back to pending, % dead-lettered, % cancelled',
        queue, current_database(), requeued, dead, cancelled;
    RETURN requeued + dead + cancelled;
END
$$;

COMMENT ON FUNCTION lease._log_reaped(text, bigint, bigint, bigint) IS
    'Internal: logs what lease.sweep recovered in one queue and returns how many rows that was.';

CREATE OR REPLACE FUNCTION lease._sweep_all(max_rows integer, t timestamptz,
                                 OUT recovered bigint, OUT purged bigint, OUT failures text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n constant integer := max_rows;
    r record;
    q text;
    step record;
    done bigint;
    problem text;
BEGIN
    recovered := 0;
    purged := 0;
    failures := '{}';
    -- Leases whose session has ended expire first, so that this pass
    -- already recovers them.
    BEGIN
        PERFORM lease._end_lost_sessions(n);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        failures := failures || format('sessions: %s: %s', SQLSTATE, problem);
    END;
    BEGIN
        FOR r IN SELECT * FROM lease._reap(n, NULL) LOOP
            recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        -- One queue's rows must not stop the others: reap queue by queue,
        -- each in its own subtransaction, and record what failed.
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        problem := format('%s: %s', SQLSTATE, problem);
        -- The loop above again, once per queue.
        FOR q IN SELECT DISTINCT j.queue FROM lease.job j WHERE j.state = 'leased' AND j.lease_until <= t LOOP
            BEGIN
                FOR r IN SELECT * FROM lease._reap(n, q) LOOP
                    recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
                END LOOP;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
                problem := format('queue "%s": %s: %s', q, SQLSTATE, problem);
                failures := failures || problem;
            END;
        END LOOP;
    END;
    -- The other steps, each in a subtransaction of its own: one that fails
    -- is recorded and stops none of the others. Each answers how many rows
    -- it purged (only purge does).
    FOR step IN SELECT * FROM (VALUES ('schedules', 'SELECT 0 FROM lease._enqueue_due($1)'),
                                      ('purge', 'SELECT lease.purge($1)'),
                                      ('concurrency slots', 'SELECT 0 FROM lease._top_up_slots()'),
                                      -- Before the fold: it reads which queues had claims.
                                      -- Late in the pass: it holds queue rows until commit.
                                      ('heads', 'SELECT 0 FROM lease._raise_heads()'),
                                      ('counters', 'SELECT 0 FROM lease._fold_counters()'),
                                      -- After the heads: it reads where they are.
                                      ('fairness keys', 'SELECT 0 FROM lease._forget_idle_keys($1)')) AS v(name, call)
    LOOP
        BEGIN
            EXECUTE step.call INTO done USING n;
            purged := purged + coalesce(done, 0);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            failures := failures || format('%s: %s: %s', step.name, SQLSTATE, problem);
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._sweep_all(integer, timestamptz) IS
$$Internal (lease.sweep on a single node): the leases of ended sessions expired, then lease.reap, due
schedules, lease.purge, concurrency slots, queue heads and counters, MAX_ROWS rows per step, each step in a
subtransaction of its own (T: when the sweep started); returns the rows recovered and purged and what failed.$$;

CREATE OR REPLACE FUNCTION lease.sweep(max_rows integer DEFAULT 1000)
RETURNS TABLE (recovered bigint, purged bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n constant integer := lease._checked_limit(max_rows);
    t constant timestamptz := clock_timestamp();
    problem text;
    failures text[];
BEGIN
    recovered := 0;
    purged := 0;
    -- One sweep per database at a time, and never a wait for another one:
    -- a session that left a sweep open in its transaction must not hold up
    -- the reaper (nor, through it, other databases). The lock is the row of
    -- sweep_state, which only pg_lease's own functions (and superusers) can
    -- lock: an advisory lock's key any role could take first.
    PERFORM FROM lease.sweep_state s FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- Each node of a distributed install sweeps the queues it holds (citus.sql).
    IF lease._distributed() THEN
        SELECT d.recovered, d.purged, d.failures INTO recovered, purged, failures FROM lease._sweep_queues(n) d;
    ELSE
        SELECT d.recovered, d.purged, d.failures INTO recovered, purged, failures FROM lease._sweep_all(n, t) d;
    END IF;
    IF cardinality(failures) > 0 THEN
        -- Keep the reason where operators look (reaper_stats and the log).
        problem := array_to_string(failures, '; ');
        RAISE WARNING 'pg_lease: sweep of database "%" failed in part: %', current_database(), problem;
    END IF;
    UPDATE lease.sweep_state s
       SET sweeps        = s.sweeps + 1,
           recovered     = s.recovered + sweep.recovered,
           purged        = s.purged + sweep.purged,
           last_sweep_at = t,
           last_duration = clock_timestamp() - t,
           last_error    = CASE WHEN cardinality(failures) > 0 THEN problem ELSE s.last_error END,
           last_error_at = CASE WHEN cardinality(failures) > 0 THEN clock_timestamp() ELSE s.last_error_at END;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION lease.sweep(integer) IS
$$One bounded housekeeping pass: the leases of ended sessions expired (lease.bind_session), lease.reap(max_rows), due schedules, lease.purge(max_rows), the removal of up to max_rows fairness keys
fallen idle (of weight 1 and no rate limit), moving the heads
of queues whose rows were claimed past them (where claims start reading), and the folding of lease.metrics'
counter rows; returns how many leases
were recovered and rows purged, and adds them to lease.reaper_stats. An error inside is caught, logged and
recorded as last_error, so the pass itself never fails: if reaping fails, each queue is reaped on its own,
so one queue's rows cannot stop the others. Returns (0, 0) at once while another sweep of this database runs. The pg_lease background worker calls this every
lease.sweep_interval; without preloading, call it from any scheduler.
Errors: 22004 max_rows NULL; 22023 max_rows outside 1..10000.$$;

CREATE OR REPLACE FUNCTION lease._sweep_queues(max_rows integer, OUT recovered bigint, OUT purged bigint, OUT failures text[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Every statement names its queue; planned for it, it runs on that
-- queue's shard alone (citus.sql).
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    q text;
    r record;
    problem text;
BEGIN
    recovered := 0;
    purged := 0;
    failures := '{}';
    -- Schedules live on the coordinator (lease.schedule is not distributed;
    -- elsewhere it is empty): their occurrences are enqueued on the nodes of
    -- their queues, in this transaction.
    BEGIN
        PERFORM lease._enqueue_due(max_rows);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
        failures := failures || format('schedules: %s: %s', SQLSTATE, problem);
    END;
    -- Queue by queue, each in a subtransaction: one that fails stops none of
    -- the others. No bound sessions on a distributed install.
    FOR q IN SELECT lease._local_queues() LOOP
        BEGIN
            FOR r IN SELECT * FROM lease._reap(max_rows, q) LOOP
                recovered := recovered + lease._log_reaped(r.queue, r.requeued, r.dead, r.cancelled);
            END LOOP;
            purged := purged + lease._purge(max_rows, q);
            PERFORM lease._top_up_slots(q);
            PERFORM lease._raise_heads(q);
            PERFORM lease._fold_counters(q);
            PERFORM lease._forget_idle_keys(max_rows, q);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            failures := failures || format('queue "%s": %s: %s', q, SQLSTATE, problem);
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._sweep_queues(integer) IS
$$Internal (lease.sweep on a distributed install): enqueues the due occurrences of schedules (on the
coordinator, which holds them), then reaps, purges, tops up the concurrency slots, raises the head, folds
the counters and forgets idle fairness keys of each queue this node holds, MAX_ROWS rows per step and queue; returns the rows
recovered and purged and what failed.$$;

CREATE OR REPLACE FUNCTION lease._next_sweep_due() RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        -- Where Citus is, every lease.sweep_interval: on a distributed
        -- install the reads below would ask every node, and a worker node
        -- learns that it is one (lease.distribute) only from DDL, which
        -- marks nothing due. (Due at once, each node would sweep back to
        -- back.)
        -- Schedules are the coordinator's own table, read here alone.
        RETURN least(now() + coalesce(pg_catalog.current_setting('lease.sweep_interval', true), '1s')::interval,
                     (SELECT min(s.next_at) FROM lease.schedule s));
    END IF;
    RETURN least(
        (SELECT min(j.lease_until) FROM lease.job j WHERE j.state = 'leased'),
        -- Per queue, so that it costs O(queues); either retention bounds it.
        (SELECT min(f.first + least(q.retention, q.dead_retention))
           FROM lease.queue q
           CROSS JOIN LATERAL (SELECT min(j.finished_at) AS first
                                 FROM lease.job j
                                WHERE j.queue = q.name AND j.state IN ('done', 'dead', 'cancelled')) AS f
          WHERE NOT q.attached),
        (SELECT min(s.next_at) FROM lease.schedule s),
        -- At most once a second for write-backs: one that stays due while its
        -- owner's worker runs, waits or finds no worker slot would make every
        -- pass a sweep of this database.
        (SELECT greatest(min(w.next_try_at), clock_timestamp() + interval '1 second')
           FROM lease.write_back w HAVING count(*) > 0),
        -- Sessions that leases are bound to are looked at on every pass.
        (SELECT now() WHERE EXISTS (SELECT FROM lease.session)));
END
$$;

COMMENT ON FUNCTION lease._next_sweep_due() IS
    'Internal: when this database next has work for the reaper (a lease expiry, a purge, a scheduled enqueue, a write-back to retry, a bound session to look at); NULL if none until something changes; where Citus is installed, one lease.sweep_interval from now or a schedule''s next occurrence if sooner.';

CREATE OR REPLACE FUNCTION lease._sweep_holder(OUT pid integer, OUT since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT l.pid, a.xact_start
      FROM lease.sweep_state s
      JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = s.xmax AND l.granted
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.pid <> pg_backend_pid()
     LIMIT 1;
END;

COMMENT ON FUNCTION lease._sweep_holder() IS
    'Internal (lease.reaper_stats): the backend of another session that holds this database''s sweep now, and since when its transaction runs; no row if none.';

CREATE OR REPLACE VIEW lease.reaper_stats AS
SELECT current_database() AS database, s.sweeps, s.recovered, s.purged,
       s.last_sweep_at, s.last_duration, s.last_error, s.last_error_at,
       lease._reaper_slot_shortages() AS slot_shortages,
       to_timestamp(lease._reaper_last_slot_shortage()) AS last_slot_shortage_at,
       h.pid AS sweep_held_by, h.since AS sweep_held_since
  FROM lease.sweep_state s
  LEFT JOIN lease._sweep_holder() h ON true;

COMMENT ON VIEW lease.reaper_stats IS
$$Housekeeping in this database: sweeps run, leases recovered, rows purged, last sweep time and duration,
last error; server-wide, how often the reaper found no free worker slot (NULL: not preloaded); and the
backend of another session that holds this database's sweep (a lease.sweep() left open in a transaction),
with its transaction's start: while it holds it, no sweep runs here.$$;

COMMENT ON FUNCTION lease._reaper_touch(bigint) IS
$$Internal: tells the preloaded reaper, when the current transaction commits, that this database may
have work for it (claims, cancels and write-backs call it), counting ROWS claimed so that a burst wakes
the reaper at once; does nothing where pg_lease is not preloaded.$$;

CREATE OR REPLACE FUNCTION lease.create_queue(
    name           text,
    max_attempts   integer  DEFAULT 25,
    backoff_base   interval DEFAULT '1 second',
    backoff_max    interval DEFAULT '1 hour',
    retention      interval DEFAULT '0',
    dead_retention interval DEFAULT '7 days',
    jitter         text     DEFAULT 'full',
    concurrency    integer  DEFAULT NULL,
    max_payload_bytes integer DEFAULT 1048576,
    rate_limit     integer  DEFAULT NULL,
    rate_period    interval DEFAULT '1 second'
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._checked_not_null(name, 'name');
    IF name = '' OR length(name) > 128 THEN
        RAISE EXCEPTION 'queue name must be 1 to 128 characters long' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000000 (got %)', max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- By value (see lease._valid_span): what these add to a timestamp must
    -- stay far from overflow, whatever units they were written in.
    PERFORM lease._checked_span(backoff_base, interval '365 days', 'backoff_base'),
            lease._checked_span(backoff_max, interval '365 days', 'backoff_max'),
            lease._checked_span(retention, interval '36500 days', 'retention'),
            lease._checked_span(dead_retention, interval '36500 days', 'dead_retention');
    IF jitter IS NULL OR jitter NOT IN ('full', 'none') THEN
        RAISE EXCEPTION 'jitter must be full or none (got %)', coalesce(jitter, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_payload_bytes IS NULL OR max_payload_bytes NOT BETWEEN 1 AND 268435455 THEN
        RAISE EXCEPTION 'max_payload_bytes must be between 1 and 268435455 (got %)', max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concurrency NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'concurrency must be between 1 and 100000 (got %)', concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF rate_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'rate_limit must be between 1 and 100000 (got %)', rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM lease._checked_span(rate_period, interval '1 day', 'rate_period');
    IF date_part('epoch', rate_period) <= 0 THEN
        RAISE EXCEPTION 'rate_period must be longer than 0 (got %)', rate_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF date_part('epoch', backoff_max) < date_part('epoch', backoff_base) THEN
        RAISE EXCEPTION 'need backoff_base <= backoff_max (got % and %)', backoff_base, backoff_max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Create or reconfigure: every replica can call this at start-up.
    INSERT INTO lease.queue AS q (name, max_attempts, backoff_base, backoff_max, retention, dead_retention, jitter,
                                  concurrency, max_payload_bytes, rate_limit, rate_period)
    VALUES (create_queue.name, create_queue.max_attempts, create_queue.backoff_base,
            create_queue.backoff_max, create_queue.retention, create_queue.dead_retention, create_queue.jitter,
            create_queue.concurrency, create_queue.max_payload_bytes, create_queue.rate_limit,
            create_queue.rate_period)
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
        SET max_attempts   = EXCLUDED.max_attempts,
            backoff_base   = EXCLUDED.backoff_base,
            backoff_max    = EXCLUDED.backoff_max,
            retention      = EXCLUDED.retention,
            dead_retention = EXCLUDED.dead_retention,
            jitter         = EXCLUDED.jitter,
            concurrency    = EXCLUDED.concurrency,
            max_payload_bytes = EXCLUDED.max_payload_bytes,
            rate_limit     = EXCLUDED.rate_limit,
            rate_period    = EXCLUDED.rate_period;
    IF rate_limit IS NOT NULL THEN
        -- Dealt out over the sixteen shares (rate.sql). The claims already
        -- counted keep counting under a new limit: a share over its new
        -- part lets nothing through until it is below.
        INSERT INTO lease.rate_share AS r (queue, share, permits)
        SELECT create_queue.name, s, create_queue.rate_limit / 16 + (s < create_queue.rate_limit % 16)::integer
          FROM generate_series(0, 15) AS s
            ON CONFLICT ON CONSTRAINT rate_share_pkey DO UPDATE
           SET permits = excluded.permits
         WHERE r.permits <> excluded.permits;
    END IF;
    -- A raised (or removed) limit admits held rows now.
    PERFORM lease._top_up_slots(name);
END
$$;

COMMENT ON FUNCTION lease.create_queue(text, integer, interval, interval, interval, interval, text, integer, integer, integer, interval) IS
$$Creates queue NAME, or updates the policy of an existing one.
max_attempts: claims a row may spend before retry/expiry dead-letters it (1..1000000).
backoff_base, backoff_max: delay after attempt n is min(backoff_max, backoff_base * 2^(n-1)); each at most 365 days.
jitter: 'full' (default) makes each retry delay uniform in [0, that delay), so rows that failed together do
not come back together; 'none' keeps it exact.
retention: how long done rows are kept (0 = deleted at release). dead_retention: same for dead and cancelled rows.
Both at most 36500 days. Intervals are judged by the time they add and may not have a month part.
concurrency: at most this many rows of one concurrency_key (see lease.enqueue) are admitted at once,
1..100000; NULL (default): no limit, and enqueues may not name a concurrency_key. Raising or removing it
admits held rows at once; lowering it admits no more until the key is below the new limit.
max_payload_bytes: the largest payload an enqueue (or a fenced_update's result) may have, in bytes of its text
form (octet_length(payload::text), whether or not it would be stored compressed), 1..268435455; default 1 MiB.
rate_limit, rate_period: claims take at most rate_limit rows (1..100000) in any span of rate_period (more than
0, at most 1 day; default 1 second), whatever the number of workers: each row claimed counts from its claim
until rate_period later (a sliding window; see lease.rate_wait). NULL (default): no limit. Rows held back stay
pending and are claimable as soon as the limit allows. The limit is dealt out in sixteen shares, each held
by one claim from its count to the end of its transaction: up to sixteen claims count side by side, and a
claim that finds every share held waits at most 100 ms and then takes nothing, so claim such a queue in
short transactions. The rate limit applies after lease.pause and before
concurrency (held rows are never claimed) and priorities; lease.reclaim_own, which takes back leases already
started, is not counted.
Errors: 22004 name or an option NULL; 22023 empty or over-long name, option out of range.$$;

CREATE OR REPLACE FUNCTION lease.pause(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE lease.queue q SET paused = true WHERE q.name = lease._checked_queue(pause.queue) AND NOT q.paused;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.pause(text) IS
$$Pauses QUEUE: claims (claim_pending, release_and_claim) take none of its rows until lease.resume; leases
held run on (renew, release, fence as before) and enqueues go on. Returns false if it was paused already.
Errors: 22004 queue NULL; 42704 no such queue.$$;

CREATE OR REPLACE FUNCTION lease.resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE lease.queue q SET paused = false WHERE q.name = lease._checked_queue(resume.queue) AND q.paused;
    IF FOUND THEN
        -- Idle workers may have stopped at an empty claim: wake them.
        PERFORM pg_notify(lease._ready_channel(resume.queue), '');
    END IF;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION lease.resume(text) IS
$$Ends lease.pause of QUEUE: claims take its rows again, and idle workers listening on its channel are woken.
Returns false if it was not paused. Errors: 22004 queue NULL; 42704 no such queue.$$;

CREATE OR REPLACE FUNCTION lease.purge_dead(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Checked first: on a distributed install Citus would send the check
    -- inside the read below to the queue's node, where its own read of
    -- lease.queue is a refused nested query.
    qn constant text := lease._checked_queue(purge_dead.queue);
    q lease.queue;
    removed bigint;
BEGIN
    SELECT * INTO q FROM lease.queue qu WHERE qu.name = qn;
    IF q.attached THEN
        -- Its dead rows go when their table rows stop matching; deleting
        -- them now would make those rows claimable again.
        RAISE EXCEPTION 'queue "%" is fed by an attached table', q.name
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Move the table rows out of the pending predicate instead.';
    END IF;
    DELETE FROM lease.job j WHERE j.queue = q.name AND j.state = 'dead';
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed > 0 THEN
        PERFORM lease._count(q.name, dead => -removed);
    END IF;
    RETURN removed;
END
$$;

COMMENT ON FUNCTION lease.purge_dead(text) IS
$$Deletes every dead letter of QUEUE now, whatever its dead_retention, and returns how many. Errors: 22004
queue NULL; 42704 no such queue; 42809 the queue is fed by an attached table.$$;

COMMENT ON TYPE lease.renewal IS
    'Result of lease.renew: held = false means the lease is lost (expired, taken over or released) and nothing changed; NULL (renew_batch only) that the row was locked by another transaction and not extended this time.';

CREATE OR REPLACE FUNCTION lease.release_and_claim(
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

CREATE OR REPLACE FUNCTION lease._count(
    queue     text,
    enqueued  bigint DEFAULT 0,
    claimed   bigint DEFAULT 0,
    done      bigint DEFAULT 0,
    retried   bigint DEFAULT 0,
    died      bigint DEFAULT 0,
    cancelled bigint DEFAULT 0,
    pending   bigint DEFAULT 0,
    dead      bigint DEFAULT 0
) RETURNS void
LANGUAGE plpgsql VOLATILE
-- No SET search_path: only lease's SECURITY DEFINER functions call it, with
-- theirs already set, and not being SECURITY DEFINER it can do nothing its
-- caller could not. A SET here cost each call ~20,000 instructions (two
-- search-path switches; docs/archive/performance-history.md, the callgrind table).
AS $$
BEGIN
    INSERT INTO lease.counter AS c (queue, backend, enqueued, claimed, done, retried, died, cancelled, pending, dead)
    VALUES (_count.queue, pg_backend_pid(), _count.enqueued, _count.claimed, _count.done, _count.retried,
            _count.died, _count.cancelled, _count.pending, _count.dead)
        ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
       SET enqueued  = c.enqueued + excluded.enqueued,
           claimed   = c.claimed + excluded.claimed,
           done      = c.done + excluded.done,
           retried   = c.retried + excluded.retried,
           died      = c.died + excluded.died,
           cancelled = c.cancelled + excluded.cancelled,
           pending   = c.pending + excluded.pending,
           dead      = c.dead + excluded.dead;
END
$$;

COMMENT ON FUNCTION lease._count(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
    'Internal: adds one call''s state changes in QUEUE to this backend''s counter row (see lease.metrics).';

CREATE OR REPLACE FUNCTION lease._count_moved(queue text, from_state lease.job_state, to_state lease.job_state, n bigint,
                                   outcome text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF n = 0 OR from_state IS NOT DISTINCT FROM to_state THEN
        RETURN;
    END IF;
    PERFORM lease._count(
        queue,
        enqueued  => CASE WHEN from_state IS NULL AND to_state = 'pending' THEN n ELSE 0 END,
        claimed   => CASE WHEN to_state = 'leased' THEN n ELSE 0 END,
        done      => CASE WHEN to_state = 'done' OR (to_state IS NULL AND from_state = 'leased' AND outcome = 'done')
                          THEN n ELSE 0 END,
        retried   => CASE WHEN from_state = 'leased' AND to_state = 'pending' AND outcome = 'retry' THEN n ELSE 0 END,
        died      => CASE WHEN to_state = 'dead' THEN n ELSE 0 END,
        cancelled => CASE WHEN to_state = 'cancelled' THEN n ELSE 0 END,
        pending   => (CASE WHEN to_state = 'pending' THEN n ELSE 0 END) - (CASE WHEN from_state = 'pending' THEN n ELSE 0 END),
        dead      => (CASE WHEN to_state = 'dead' THEN n ELSE 0 END) - (CASE WHEN from_state = 'dead' THEN n ELSE 0 END));
END
$$;

COMMENT ON FUNCTION lease._count_moved(text, lease.job_state, lease.job_state, bigint, text) IS
$$Internal: counts N rows of QUEUE that went from FROM_STATE to TO_STATE (NULL: inserted, or deleted);
OUTCOME 'retry' counts a return to pending as a retry, OUTCOME 'done' a leased row deleted as done.$$;

CREATE OR REPLACE FUNCTION lease._fold_counters(only_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    folded bigint := 0;
    r record;
BEGIN
    -- Rows a backend's open transaction holds are left for the next sweep.
    -- The upsert is lease._count's, for summed rows: _count stays one
    -- statement on every state change's path. One upsert per queue, not an
    -- INSERT ... SELECT from the DELETE: on a distributed install (citus.sql)
    -- Citus would run that one through the coordinator.
    FOR r IN
    WITH gone AS (
        DELETE FROM lease.counter c
         WHERE (only_queue IS NULL OR c.queue = only_queue)
           AND (c.queue, c.backend) IN (SELECT k.queue, k.backend FROM lease.counter k
                                         WHERE k.backend <> 0 AND (only_queue IS NULL OR k.queue = only_queue)
                                           FOR UPDATE SKIP LOCKED)
        RETURNING c.*
    )
    SELECT g.queue, count(*) AS n, sum(g.enqueued) AS enqueued, sum(g.claimed) AS claimed, sum(g.done) AS done,
           sum(g.retried) AS retried, sum(g.died) AS died, sum(g.cancelled) AS cancelled,
           sum(g.pending) AS pending, sum(g.dead) AS dead
      FROM gone g
     GROUP BY g.queue
    LOOP
        INSERT INTO lease.counter AS c (queue, backend, enqueued, claimed, done, retried, died, cancelled, pending, dead)
        VALUES (r.queue, 0, r.enqueued, r.claimed, r.done, r.retried, r.died, r.cancelled, r.pending, r.dead)
            ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
           SET enqueued  = c.enqueued + excluded.enqueued,
               claimed   = c.claimed + excluded.claimed,
               done      = c.done + excluded.done,
               retried   = c.retried + excluded.retried,
               died      = c.died + excluded.died,
               cancelled = c.cancelled + excluded.cancelled,
               pending   = c.pending + excluded.pending,
               dead      = c.dead + excluded.dead;
        folded := folded + r.n;
    END LOOP;
    RETURN folded;
END
$$;

COMMENT ON FUNCTION lease._fold_counters(text) IS
    'Internal: adds the counter rows of every backend into the folded row of their queue (of ONLY_QUEUE, or all) (lease.sweep calls it); returns how many rows were folded.';

CREATE OR REPLACE FUNCTION lease.recount() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fixed bigint;
    qn text;
BEGIN
    -- The gauges as the rows say, against the counters; a queue lock keeps
    -- writers out while both are read.
    LOCK TABLE lease.job IN SHARE MODE;
    WITH actual AS (
        SELECT q.name AS queue,
               count(j.id) FILTER (WHERE j.state = 'pending') AS pending,
               count(j.id) FILTER (WHERE j.state = 'dead')    AS dead
          FROM lease.queue q LEFT JOIN lease.job j ON j.queue = q.name
         GROUP BY q.name
    ), counted AS (
        SELECT c.queue, sum(c.pending) AS pending, sum(c.dead) AS dead
          FROM lease.counter c GROUP BY c.queue
    ), off AS (
        SELECT a.queue, a.pending - coalesce(k.pending, 0) AS pending, a.dead - coalesce(k.dead, 0) AS dead
          FROM actual a LEFT JOIN counted k ON k.queue = a.queue
         WHERE a.pending <> coalesce(k.pending, 0) OR a.dead <> coalesce(k.dead, 0)
    ), fixes AS (
        INSERT INTO lease.counter AS c (queue, backend, pending, dead)
        SELECT o.queue, 0, o.pending, o.dead FROM off o
            ON CONFLICT ON CONSTRAINT counter_pkey DO UPDATE
           SET pending = c.pending + excluded.pending,
               dead    = c.dead + excluded.dead
    )
    SELECT count(*) INTO fixed FROM off;
    -- The concurrency slots as the rows say, then whatever they now admit.
    DELETE FROM lease.key_slot;
    INSERT INTO lease.key_slot (queue, key, active, waiting)
    SELECT j.queue, j.concurrency_key,
           count(*) FILTER (WHERE j.state IN ('pending', 'leased') AND NOT j.held),
           count(*) FILTER (WHERE j.state = 'pending' AND j.held)
      FROM lease.job j
     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('pending', 'leased')
     GROUP BY j.queue, j.concurrency_key;
    -- Queue by queue: a distributed install (citus.sql) locks rows of one
    -- shard at a time.
    FOR qn IN SELECT qu.name FROM lease.queue qu ORDER BY qu.name LOOP
        PERFORM lease._top_up_slots(qn);
    END LOOP;
    -- Rows made pending by hand may be before a queue's head (head.sql):
    -- claims start from the start again until the next sweep.
    UPDATE lease.queue q
       SET head_priority = DEFAULT, head_rank = DEFAULT, head_next_at = DEFAULT, head_id = DEFAULT;
    RETURN fixed;
END
$$;

COMMENT ON FUNCTION lease.recount() IS
$$Admin: recounts the pending and dead rows of every queue (O(rows), locks out writers of lease.job
while it runs) and corrects lease.metrics' gauges where they differ; returns how many queues needed it.
Rebuilds the concurrency slots (lease.key_slot) from the rows too, and admits held rows they leave room for,
and moves every queue's head (where claims start reading) back to its start. Never needed in normal operation: for after rows were changed other than through lease.* functions.$$;

CREATE OR REPLACE FUNCTION lease._queue_head(queue text, OUT delayed bigint, OUT oldest_ready timestamptz)
-- The owner's rights: lease_admin reads the metrics view but not lease.job.
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    p integer;
    first timestamptz;
BEGIN
    delayed := 0;
    p := (SELECT max(j.priority) FROM lease.job j
           WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held);
    WHILE p IS NOT NULL LOOP
        SELECT j.next_at INTO first
          FROM lease.job j
         WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held AND j.priority = p
         ORDER BY j.priority DESC, j.rank, j.next_at, j.id
         LIMIT 1;
        IF first <= t THEN
            oldest_ready := least(oldest_ready, first);
        END IF;
        delayed := delayed + (SELECT count(*) FROM lease.job j
                               WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held
                                 AND j.priority = p AND j.rank = 0 AND j.next_at > t);
        p := (SELECT max(j.priority) FROM lease.job j
               WHERE j.queue = _queue_head.queue AND j.state = 'pending' AND NOT j.held AND j.priority < p);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._queue_head(text) IS
$$Internal: for lease.metrics, how many pending rows of QUEUE wait for a later next_at, and the earliest
next_at among ready rows at the head of each priority; one index probe per distinct priority.$$;

CREATE OR REPLACE VIEW lease.metrics AS
SELECT q.name AS queue,
       greatest(coalesce(c.pending, 0) - h.delayed - coalesce(k.held, 0), 0) AS ready,
       h.delayed,
       coalesce(l.leased, 0)  AS leased,
       coalesce(l.expired, 0) AS expired,
       coalesce(c.dead, 0)    AS dead,
       clock_timestamp() - h.oldest_ready AS oldest_ready_age,
       clock_timestamp() - l.oldest_expiry AS reap_lag,
       coalesce(c.enqueued, 0)  AS enqueued_total,
       coalesce(c.claimed, 0)   AS claimed_total,
       coalesce(c.done, 0)      AS done_total,
       coalesce(c.retried, 0)   AS retried_total,
       coalesce(c.died, 0)      AS dead_total,
       coalesce(c.cancelled, 0) AS cancelled_total,
       q.recovered_total,
       coalesce(k.held, 0) AS held,
       q.paused,
       q.rate_limit,
       q.rate_period,
       coalesce(r.used, 0) AS rate_used
  FROM lease.queue q
  -- sum(bigint) is numeric; the counts stay bigint.
  LEFT JOIN (SELECT k.queue, sum(k.enqueued)::bigint AS enqueued, sum(k.claimed)::bigint AS claimed,
                    sum(k.done)::bigint AS done, sum(k.retried)::bigint AS retried, sum(k.died)::bigint AS died,
                    sum(k.cancelled)::bigint AS cancelled, sum(k.pending)::bigint AS pending,
                    sum(k.dead)::bigint AS dead
               FROM lease.counter k GROUP BY k.queue) c ON c.queue = q.name
  LEFT JOIN (SELECT j.queue, count(*) AS leased,
                    count(*) FILTER (WHERE j.lease_until <= clock_timestamp()) AS expired,
                    min(j.lease_until) FILTER (WHERE j.lease_until <= clock_timestamp()) AS oldest_expiry
               FROM lease.job j WHERE j.state = 'leased' GROUP BY j.queue) l ON l.queue = q.name
  LEFT JOIN (SELECT s.queue, sum(s.waiting)::bigint AS held FROM lease.key_slot s GROUP BY s.queue) k
         ON k.queue = q.name
  CROSS JOIN LATERAL lease._queue_head(q.name) h
  -- Sixteen rows of at most about a hundred entries each (rate.sql).
  -- Counted here, not by lease._rate_used: the view's readers may not
  -- execute internal functions.
  LEFT JOIN (SELECT s.queue, sum(u.n)::bigint AS used
               FROM lease.rate_share s
               JOIN lease.queue sq ON sq.name = s.queue
              CROSS JOIN LATERAL unnest(s.starts, s.counts) AS u(st, n)
              WHERE sq.rate_limit IS NOT NULL AND u.st > clock_timestamp() - sq.rate_period
              GROUP BY s.queue) r ON r.queue = q.name;

COMMENT ON VIEW lease.metrics IS
$$Per queue, at O(queues + leases in flight + distinct priorities) cost: ready rows (pending, next_at
reached), delayed rows (pending, next_at later), held rows (pending, waiting for a slot of their
concurrency_key; O(keys) to count), leased rows and those past expiry not yet reaped, dead
letters, age of the oldest ready row, how long the oldest expired lease has waited for the reaper
(reap_lag), and monotonic totals since install (enqueued, claimed, done, retried, dead, cancelled,
recovered by reap), whether the queue is paused (lease.pause: claims take none of its rows), and its rate
limit (rate_limit rows per rate_period, NULL if none; see lease.create_queue) with the rows claimed in the
last rate_period (rate_used). Totals and gauges change only when a transaction that moved rows commits.$$;

CREATE FUNCTION lease._check_reader(view regclass) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT has_table_privilege(lease._caller(), view, 'SELECT') THEN
        RAISE EXCEPTION 'permission denied for view %', view
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'lease_admin may read it; so may a role granted SELECT on it, or pg_read_all_data.';
    END IF;
END
$$;

COMMENT ON FUNCTION lease._check_reader(regclass) IS
$$Internal: raises 42501 unless the calling role may SELECT from VIEW (for the read_ functions, which read a
view with its owner's rights).$$;

CREATE FUNCTION lease.read_metrics() RETURNS SETOF lease.metrics
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_reader('lease.metrics');
    RETURN QUERY
    SELECT * FROM lease.metrics;
END
$$;

COMMENT ON FUNCTION lease.read_metrics() IS
$$The rows of lease.metrics for a role that may read the view, read with the view's owner's rights: on a
distributed install the view itself fails for its readers (views.sql). Errors: 42501 the caller may not read
lease.metrics.$$;

CREATE OR REPLACE FUNCTION lease._checked_concurrency_key(queue text, key text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key = '' OR length(key) > 256 THEN
        RAISE EXCEPTION 'concurrency_key must be 1 to 256 characters long'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT qu.concurrency FROM lease.queue qu WHERE qu.name = _checked_concurrency_key.queue) IS NULL THEN
        RAISE EXCEPTION 'queue "%" has no concurrency limit', queue
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Set one with lease.create_queue(name, ..., concurrency => k).';
    END IF;
    RETURN key;
END
$$;

COMMENT ON FUNCTION lease._checked_concurrency_key(text, text) IS
    'Internal: returns KEY, or raises 22023 if it is empty or over 256 characters or QUEUE has no concurrency limit.';

CREATE OR REPLACE FUNCTION lease._admit(queue text, keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lim constant integer := (SELECT qu.concurrency FROM lease.queue qu WHERE qu.name = _admit.queue);
    admitted integer;
    ids bigint[];
BEGIN
    -- Rows a concurrent cancel holds are skipped: if that cancel rolls
    -- back, lease.sweep admits the row later (lease._top_up_slots).
    WITH open AS (
        SELECT t.key, coalesce(lim - t.active, t.waiting) AS free
          FROM lease.key_slot t
         WHERE t.queue = _admit.queue AND t.key = ANY (keys)
           AND t.waiting > 0 AND t.active < coalesce(lim, t.active + 1)
    ), next AS MATERIALIZED (
        SELECT n.id
          FROM open o
         CROSS JOIN LATERAL (
            SELECT j.id
              FROM lease.job j
             WHERE j.queue = _admit.queue AND j.concurrency_key = o.key
               AND j.state = 'pending' AND j.held
             ORDER BY j.priority DESC, j.id
             LIMIT o.free
               FOR UPDATE SKIP LOCKED) n
    ), promoted AS (
        UPDATE lease.job j SET held = false
         WHERE j.id = ANY (ARRAY(SELECT n.id FROM next n))
        RETURNING j.id, j.concurrency_key
    ), counted AS (
        SELECT p.concurrency_key AS key, count(*)::integer AS n FROM promoted p GROUP BY p.concurrency_key
    ), slots AS (
        UPDATE lease.key_slot t
           SET active = t.active + c.n, waiting = t.waiting - c.n
          FROM counted c
         WHERE t.queue = _admit.queue AND t.key = c.key
    )
    SELECT coalesce(sum(c.n), 0), (SELECT array_agg(p.id) FROM promoted p) INTO admitted, ids FROM counted c;
    IF admitted > 0 THEN
        -- An admitted row keeps the place it was enqueued at, which may be
        -- before the queue's head.
        PERFORM lease._lower_heads(ids, queue), lease._wake(queue, admitted);
    END IF;
    RETURN admitted;
END
$$;

COMMENT ON FUNCTION lease._admit(text, text[]) IS
    'Internal: admits held rows of the concurrency KEYS of QUEUE (per key: highest priority, then oldest first) into their free slots and wakes idle workers; returns how many. The caller holds the keys'' lease.key_slot rows locked.';

CREATE OR REPLACE FUNCTION lease._hold(queue text, keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Rows are inserted, and so locked, in key order.
    INSERT INTO lease.key_slot AS t (queue, key, waiting)
    SELECT _hold.queue, u.key, count(*)
      FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL
     GROUP BY u.key ORDER BY u.key
        ON CONFLICT ON CONSTRAINT key_slot_pkey DO UPDATE SET waiting = t.waiting + excluded.waiting;
    PERFORM lease._admit(queue, keys);
END
$$;

COMMENT ON FUNCTION lease._hold(text, text[]) IS
    'Internal: this transaction just made rows of QUEUE with these concurrency KEYS (one element per row) pending and held; counts them and admits what the keys'' free slots allow.';

CREATE OR REPLACE FUNCTION lease._free_slots(queue text, keys text[], were_held boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Lock first, in key order: two calls over the same keys cannot deadlock.
    PERFORM FROM lease.key_slot t
      WHERE t.queue = _free_slots.queue AND t.key = ANY (keys)
      ORDER BY t.key
        FOR UPDATE;
    WITH ended AS (
        SELECT u.key, count(*)::integer AS n FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL GROUP BY u.key
    )
    UPDATE lease.key_slot t
       SET active  = t.active  - CASE WHEN were_held THEN 0 ELSE e.n END,
           waiting = t.waiting - CASE WHEN were_held THEN e.n ELSE 0 END
      FROM ended e
     WHERE t.queue = _free_slots.queue AND t.key = e.key;
    PERFORM lease._admit(queue, keys);
END
$$;

COMMENT ON FUNCTION lease._free_slots(text, text[], boolean) IS
    'Internal: rows of QUEUE with these concurrency KEYS (one element per row) just ended (done, dead, cancelled; held ones if WERE_HELD); gives their slots to the keys'' next held rows.';

CREATE OR REPLACE FUNCTION lease._top_up_slots(only_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    locked text[];
    admitted bigint := 0;
BEGIN
    -- Keys with held rows and free slots: after a raised limit, or a row
    -- _admit skipped because a cancel that then rolled back held it.
    FOR q IN SELECT qu.name, qu.concurrency FROM lease.queue qu
              WHERE (only_queue IS NULL OR qu.name = only_queue)
                AND EXISTS (SELECT FROM lease.key_slot k WHERE k.queue = qu.name AND k.waiting > 0)
              ORDER BY qu.name
    LOOP
        WITH open AS (
            SELECT k.key FROM lease.key_slot k
             WHERE k.queue = q.name AND k.waiting > 0 AND k.active < coalesce(q.concurrency, k.active + 1)
             ORDER BY k.key
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(o.key) INTO locked FROM open o;
        admitted := admitted + lease._admit(q.name, locked);
    END LOOP;
    -- Keys with nothing admitted or held; a producer that is about to use
    -- one holds it locked, or re-creates it.
    -- The queue in the outer WHERE too: on a distributed install (citus.sql)
    -- only then does the DELETE go to that queue's shard alone.
    DELETE FROM lease.key_slot k
     WHERE (only_queue IS NULL OR k.queue = only_queue)
       AND (k.queue, k.key) IN (SELECT e.queue, e.key FROM lease.key_slot e
                                 WHERE e.active = 0 AND e.waiting = 0
                                   AND (only_queue IS NULL OR e.queue = only_queue)
                                 LIMIT 10000
                                   FOR UPDATE SKIP LOCKED);
    RETURN admitted;
END
$$;

COMMENT ON FUNCTION lease._top_up_slots(text) IS
    'Internal, run by lease.sweep and lease.create_queue: admits held rows into free slots (of ONLY_QUEUE, or all queues) and removes empty lease.key_slot rows; returns how many rows it admitted. Skips keys others hold locked.';

CREATE OR REPLACE FUNCTION lease._free_slots_of(queues text[], keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
BEGIN
    FOR q IN SELECT u.queue, array_agg(u.key) AS keys
               FROM unnest(queues, keys) AS u(queue, key) WHERE u.key IS NOT NULL
              GROUP BY u.queue ORDER BY u.queue
    LOOP
        PERFORM lease._free_slots(q.queue, q.keys);
    END LOOP;
END
$$;

COMMENT ON FUNCTION lease._free_slots_of(text[], text[]) IS
    'Internal: lease._free_slots for rows of several queues (QUEUES[i] goes with KEYS[i]), queue by queue in name order.';

CREATE OR REPLACE VIEW lease.queue_stats AS
SELECT q.name AS queue,
       count(j.id) FILTER (WHERE j.state = 'pending')                                   AS pending,
       count(j.id) FILTER (WHERE j.state = 'pending' AND NOT j.held AND j.next_at <= clock_timestamp()) AS ready,
       count(j.id) FILTER (WHERE j.state = 'leased')                                    AS leased,
       count(j.id) FILTER (WHERE j.state = 'leased' AND j.lease_until <= clock_timestamp()) AS expired,
       count(j.id) FILTER (WHERE j.state = 'done')                                      AS done,
       count(j.id) FILTER (WHERE j.state = 'dead')                                      AS dead,
       count(j.id) FILTER (WHERE j.state = 'cancelled')                                 AS cancelled,
       clock_timestamp() - min(j.next_at) FILTER (WHERE j.state = 'pending' AND NOT j.held
                                                    AND j.next_at <= clock_timestamp())
                                                                                        AS oldest_ready_age,
       q.recovered_total,
       q.paused
  FROM lease.queue q
  LEFT JOIN lease.job j ON j.queue = q.name
 GROUP BY q.name, q.recovered_total, q.paused;

COMMENT ON VIEW lease.queue_stats IS
    'Per queue: rows by state, how many are claimable now (ready; not counting rows held for a concurrency slot), leases past expiry not yet reaped (expired), age of the oldest ready row, leases recovered by reap so far, and whether the queue is paused (lease.pause: claims take none of its rows).';

CREATE FUNCTION lease.read_queue_stats() RETURNS SETOF lease.queue_stats
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._check_reader('lease.queue_stats');
    RETURN QUERY
    SELECT * FROM lease.queue_stats;
END
$$;

COMMENT ON FUNCTION lease.read_queue_stats() IS
$$lease.read_metrics for lease.queue_stats. Errors: 42501 the caller may not read lease.queue_stats.$$;

CREATE VIEW lease.fairness_keys AS
SELECT coalesce(f.queue, r.queue) AS queue,
       coalesce(f.key, r.fairness_key) AS fairness_key,
       coalesce(f.weight, 1) AS weight,
       coalesce(r.pending, 0) AS pending,
       coalesce(r.ready, 0) AS ready,
       coalesce(r.leased, 0) AS leased,
       f.rate_limit,
       CASE WHEN f.rate_limit IS NOT NULL THEN f.rate_period END AS rate_period,
       -- The key's window, counted as its claims count it (key_rate.sql).
       CASE WHEN f.rate_limit IS NOT NULL THEN
            (SELECT coalesce(sum(u.n), 0) FROM unnest(f.starts, f.counts) AS u(s, n)
              WHERE u.s > clock_timestamp() - f.rate_period) END AS claimed_in_period,
       CASE WHEN f.full_until > clock_timestamp() THEN f.full_until END AS held_until
  FROM lease.fairness_key f
  FULL JOIN (SELECT j.queue, coalesce(j.fairness_key, '') AS fairness_key,
                    count(*) FILTER (WHERE j.state = 'pending') AS pending,
                    count(*) FILTER (WHERE j.state = 'pending' AND NOT j.held
                                       AND j.next_at <= clock_timestamp()) AS ready,
                    count(*) FILTER (WHERE j.state = 'leased') AS leased
               FROM lease.job j
              WHERE j.state IN ('pending', 'leased')
                AND j.queue IN (SELECT q.name FROM lease.queue q WHERE q.fair)
              GROUP BY j.queue, coalesce(j.fairness_key, '')) AS r
    ON r.queue = f.queue AND r.fairness_key = f.key;

COMMENT ON VIEW lease.fairness_keys IS
    'Per fairness key of a queue that has them (lease.enqueue''s fairness_key; rows without one are of the key ''''): its weight, its rows pending, ready (claimable now) and leased, its rate limit (lease.set_key_rate), the rows claimed in its window now, and, while its window is full, until when claims hold its rows back (held_until).';

CREATE FUNCTION lease.read_fairness_keys(queue text DEFAULT NULL) RETURNS SETOF lease.fairness_keys
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- As read_in_flight: planned for the call's queue.
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    PERFORM lease._check_reader('lease.fairness_keys');
    RETURN QUERY
    SELECT * FROM lease.fairness_keys v
     WHERE read_fairness_keys.queue IS NULL OR v.queue = read_fairness_keys.queue
     ORDER BY v.queue, v.fairness_key;
END
$$;

COMMENT ON FUNCTION lease.read_fairness_keys(text) IS
$$lease.read_metrics for lease.fairness_keys: its rows (of QUEUE, when given) by queue and key. Errors: 42501
the caller may not read lease.fairness_keys.$$;

CREATE FUNCTION lease.wait_reason(id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t constant timestamptz := clock_timestamp();
    j lease.job;
    qu lease.queue;
    k lease.key_slot;
    queue_wait interval;
    key_room timestamptz;
BEGIN
    PERFORM lease._checked_not_null(id, 'id');
    SELECT * INTO j FROM lease.job r WHERE r.id = wait_reason.id;
    IF NOT FOUND OR j.state <> 'pending' THEN
        RETURN NULL;
    END IF;
    SELECT * INTO qu FROM lease.queue r WHERE r.name = j.queue;
    -- In the order the claim decides (sql.md, "Fairness": precedence).
    IF j.held THEN
        SELECT * INTO k FROM lease.key_slot s WHERE s.queue = j.queue AND s.key = j.concurrency_key;
        RETURN format('held: concurrency key %s has %s of its %s slots in use',
                      quote_literal(j.concurrency_key), k.active, qu.concurrency);
    END IF;
    IF qu.paused THEN
        RETURN format('paused: queue %s is paused (lease.resume)', quote_literal(qu.name));
    END IF;
    IF j.next_at > t THEN
        RETURN format('not due: claimable from %s', j.next_at);
    END IF;
    IF qu.rate_limit IS NOT NULL THEN
        queue_wait := lease._rate_wait_of(qu.name, qu.rate_period, t);
        IF queue_wait > interval '0' THEN
            RETURN format('rate limit: queue %s has no room until %s', quote_literal(qu.name), t + queue_wait);
        END IF;
    END IF;
    SELECT f.full_until INTO key_room
      FROM lease.fairness_key f
     WHERE f.queue = j.queue AND f.key = coalesce(j.fairness_key, '') AND f.rate_limit IS NOT NULL
       AND f.full_until > t;
    IF key_room IS NOT NULL THEN
        RETURN format('rate limit: fairness key %s has no room until %s',
                      quote_literal(coalesce(j.fairness_key, '')), key_room);
    END IF;
    RETURN 'ready: claimable now';
END
$$;

COMMENT ON FUNCTION lease.wait_reason(bigint) IS
$$Why pending row ID has not been claimed, as the claim would decide it now: held (its concurrency key's slots
all in use), paused (its queue), not due (run_at or a retry's backoff), rate limit (of its queue or of its
fairness key, with the time it has room again), or ready; NULL if the row is not pending or does not exist.
For lease_admin. Errors: 22004 id NULL.$$;

CREATE FUNCTION lease.read_in_flight(queue text DEFAULT NULL) RETURNS SETOF lease.in_flight
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Citus plans no parameter of an SQL function, and those of plpgsql only
-- in a plan made for their values.
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    PERFORM lease._check_reader('lease.in_flight');
    RETURN QUERY
    SELECT * FROM lease.in_flight v
     WHERE read_in_flight.queue IS NULL OR v.queue = read_in_flight.queue
     ORDER BY v.id;
END
$$;

COMMENT ON FUNCTION lease.read_in_flight(text) IS
$$lease.read_metrics for lease.in_flight: its rows (of QUEUE, when given) by id. Errors: 42501 the caller may
not read lease.in_flight.$$;

CREATE FUNCTION lease.read_dead_letters(queue text DEFAULT NULL, "limit" bigint DEFAULT NULL) RETURNS SETOF lease.dead_letters
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan  -- as lease.read_in_flight
AS $$
BEGIN
    PERFORM lease._check_reader('lease.dead_letters');
    RETURN QUERY
    SELECT * FROM lease.dead_letters v
     WHERE read_dead_letters.queue IS NULL OR v.queue = read_dead_letters.queue
     ORDER BY v.id
     LIMIT read_dead_letters."limit";
END
$$;

COMMENT ON FUNCTION lease.read_dead_letters(text, bigint) IS
$$lease.read_metrics for lease.dead_letters: its first LIMIT rows (all when NULL; of QUEUE, when given) by id.
Errors: 42501 the caller may not read lease.dead_letters; 2201W LIMIT negative.$$;

CREATE OR REPLACE VIEW lease.write_backs AS
SELECT w.id, w.queue, a.rel AS "table", w.key, w.outcome, w.created_at, w.attempts, w.next_try_at, w.last_error
  FROM lease.write_back w
  JOIN lease.attachment a ON a.queue = w.queue;

COMMENT ON VIEW lease.write_backs IS
$$on_dead/on_cancel write-backs recorded and not yet applied to their table rows (lease.apply_write_backs): the
row's key, the outcome, attempts so far, when the next is due and the last one's error.$$;

CREATE OR REPLACE FUNCTION lease._wake(queue text, added integer) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF (SELECT count(*)
          FROM (SELECT FROM lease.job j
                 WHERE j.queue = _wake.queue AND j.state = 'pending' AND NOT j.held
                   AND j.next_at <= clock_timestamp()
                 LIMIT added + 1) AS ready) <= added THEN
        PERFORM pg_notify(lease._ready_channel(queue), '');
    END IF;
END
$$;

COMMENT ON FUNCTION lease._wake(text, integer) IS
$$Internal: sends a NOTIFY on QUEUE's channel (lease.ready_channel) unless QUEUE had ready rows besides the
ADDED ones the caller just inserted.$$;

-- The attached tables' triggers, for the new trigger function -----------------

DO $$
DECLARE
    a record;
BEGIN
    FOR a IN
        SELECT t.rel, t.queue, t.pending, c.attname
          FROM lease.attachment t
          JOIN pg_catalog.pg_attribute c ON c.attrelid = t.rel AND c.attnum = t.key_attnum
    LOOP
        PERFORM lease._attach_triggers(a.rel, a.queue, a.pending, a.attname, NULL);
    END LOOP;
END
$$;

CREATE TRIGGER pg_lease_outcome AFTER UPDATE OF finished_at ON lease.job
FOR EACH ROW
WHEN (NEW.state IN ('dead', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state AND NEW.key IS NOT NULL)
EXECUTE FUNCTION lease._job_finished();

CREATE EVENT TRIGGER pg_lease_forget_dropped_tables ON sql_drop
EXECUTE FUNCTION lease._forget_dropped_tables();

CREATE EVENT TRIGGER pg_lease_remember_named_epochs ON ddl_command_start
WHEN TAG IN ('DROP EXTENSION')
EXECUTE FUNCTION lease._remember_named_epochs();

-- citus.sql: a distributed install on Citus (new).

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

-- Privileges ----------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA lease FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA lease FROM PUBLIC;
REVOKE SELECT ON lease.attachment FROM lease_worker;

GRANT EXECUTE ON FUNCTION
    lease.enqueue(text, jsonb, text, timestamptz, integer, text, text, text),
    lease.enqueue_batch(text, jsonb[], text[], timestamptz, integer, text[], text[]),
    lease.rate_wait(text),
    lease.release_and_claim(bigint[], text, bigint[], integer, interval, text),
    lease.renew(bigint, text, bigint, interval, text),
    lease.renew_batch(bigint[], text, bigint[], interval, text),
    lease.release(bigint, text, bigint, text, timestamptz, text, text),
    lease.release_batch(bigint[], text, bigint[], text, timestamptz, text, text),
    lease.fenced_update(bigint, bigint, jsonb, text),
    lease.fence(bigint, bigint, text),
    lease.cancel(bigint, text),
    lease.queue_of(bigint),
    lease.bind_session(text, text),
    lease.release_named_batch(text[], text, bigint[]),
    lease.release_named(text[], text, bigint[]),
    lease.cancel_key(text, text),
    lease.ready_channel(text),
    lease.apply_write_backs(integer),
    lease._take_write_backs(name, integer),
    lease._write_back_target(name, bigint),
    lease._write_back_wanted(name, bigint),
    lease._write_back_applied(name, bigint),
    lease._write_back_failed(name, bigint, text)
TO lease_worker;

GRANT EXECUTE ON FUNCTION
    lease.grant(text, regrole, boolean, boolean),
    lease.revoke(text, regrole),
    lease.create_queue(text, integer, interval, interval, interval, interval, text, integer, integer, integer, interval),
    lease.pause(text),
    lease.resume(text),
    lease.set_weight(text, text, integer),
    lease.set_key_rate(text, text, integer, interval),
    lease.wait_reason(bigint),
    lease.purge_dead(text),
    lease.requeue(bigint),
    lease.recount(),
    lease.reap(integer),
    lease.schedule(text, text, text, interval, jsonb, integer, text),
    lease.unschedule(text),
    lease.attach(regclass, text, text, integer, interval, interval, interval, name, text, text),
    lease._attach_register(regclass, text, smallint, smallint, text, integer, interval, interval, interval,
                           text[], bigint[], text, text, regprocedure),
    lease._attach_triggers(regclass, text, text, name, name),
    lease._create_outcome_function(regclass, name, text, text, text),
    lease._rank_sql(oid, smallint, text),
    lease._detach_unregister(regclass),
    lease._attached_row_changed(),
    lease._qualified_predicate(oid, oid, text),
    lease._refuse_if_distributed(text),
    lease._distributed(),
    lease._reaper_slot_shortages(),
    lease._reaper_last_slot_shortage(),
    lease._sweep_holder(),
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

GRANT SELECT ON lease.metrics, lease.reaper_stats, lease.write_backs, lease.queue_grant, lease.attachment, lease.schedule
TO lease_admin;
GRANT SELECT ON lease.fairness_keys TO lease_admin;

SELECT pg_catalog.pg_extension_config_dump('lease.queue', $$WHERE name <> 'default'$$);
SELECT pg_catalog.pg_extension_config_dump('lease.queue_grant', '');
SELECT pg_catalog.pg_extension_config_dump('lease.job', '');
SELECT pg_catalog.pg_extension_config_dump('lease.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('lease.named_lease', '');
SELECT pg_catalog.pg_extension_config_dump('lease.attachment', '');
SELECT pg_catalog.pg_extension_config_dump('lease.schedule', '');
SELECT pg_catalog.pg_extension_config_dump('lease.counter', '');
SELECT pg_catalog.pg_extension_config_dump('lease.key_slot', '');
SELECT pg_catalog.pg_extension_config_dump('lease.rate_share', '');
SELECT pg_catalog.pg_extension_config_dump('lease.fairness_key', '');

SELECT lease._reaper_discover();
