-- Named leases: one holder per name (singletons, leader election), fenced by
-- an epoch that only ever grows for that name.

-- A name's epochs live in its row, and DROP EXTENSION drops the rows. So
-- that a reinstall never issues a (name, epoch) again, the highest epoch is
-- kept as a setting of the database (which outlives the extension) whenever
-- an extension is dropped, and a name new to this install starts above it.
CREATE FUNCTION lease._named_epoch_watermark() RETURNS bigint
LANGUAGE sql STABLE
RETURN coalesce((SELECT max(substring(c FROM '^pg_lease\.named_epoch_watermark=(\d+)$')::bigint)
                   FROM pg_db_role_setting s, unnest(s.setconfig) AS c
                  WHERE s.setdatabase = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                    AND s.setrole = 0), 0);

COMMENT ON FUNCTION lease._named_epoch_watermark() IS
    'Internal: the highest named-lease epoch an earlier install of pg_lease in this database issued (0 if none).';

CREATE FUNCTION lease._remember_named_epochs() RETURNS event_trigger
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

CREATE EVENT TRIGGER pg_lease_remember_named_epochs ON ddl_command_start
WHEN TAG IN ('DROP EXTENSION')
EXECUTE FUNCTION lease._remember_named_epochs();

CREATE FUNCTION lease.try_acquire(name text, owner text, ttl interval) RETURNS bigint
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

COMMENT ON FUNCTION lease.try_acquire(text, text, interval) IS
$$Takes named lease NAME for OWNER for TTL if it is free, expired, or already OWNER's, and returns its
new epoch (greater than every epoch ever issued for NAME, also across a standby promotion); returns NULL if someone else holds it.
Errors: 22004 an argument NULL; 22023 name or owner empty or too long, ttl not in (0, 1 day].$$;

CREATE FUNCTION lease.renew_named(name text, owner text, epoch bigint, ttl interval) RETURNS timestamptz
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

CREATE FUNCTION lease.release_named(name text, owner text, epoch bigint) RETURNS boolean
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

CREATE FUNCTION lease.fence_named(name text, epoch bigint) RETURNS timestamptz
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

CREATE FUNCTION lease.release_named_batch(names text[], owner text, epochs bigint[])
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
CREATE FUNCTION lease.release_named(names text[], owner text, epochs bigint[])
RETURNS TABLE (name text, released boolean)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT b.name, b.released FROM lease.release_named_batch(names, owner, epochs) b $$;

COMMENT ON FUNCTION lease.release_named(text[], text, bigint[]) IS
$$Deprecated, to be removed in the release after 0.2.0: lease.release_named_batch under its former name (an
overload of lease.release_named); same arguments, result and errors.$$;
