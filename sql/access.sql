-- Per-queue access: which roles may work a queue (claim, renew, release,
-- fence, fenced writes, reclaim) and which may produce into it (enqueue,
-- cancel).
--
-- A queue nobody was granted on is shared by every lease_worker. From its
-- first lease.grant on it is restricted: only grantees (and their members)
-- and lease_admin may use it, checked by every function that acts on it or
-- on one of its rows. Revoking the last grant leaves it restricted;
-- lease.grant(queue, 'lease_worker') shares it with every worker again.
--
-- The functions run as the extension owner (SECURITY DEFINER), where
-- current_user is that owner. The role that called them is the session's
-- SET ROLE if any, else its session user; a caller reaching pg_lease through
-- another SECURITY DEFINER function is judged as its session's role.

CREATE TABLE lease.queue_grant (
    queue   text NOT NULL REFERENCES lease.queue (name) ON DELETE CASCADE,
    grantee regrole NOT NULL,
    work    boolean NOT NULL,
    produce boolean NOT NULL,
    PRIMARY KEY (queue, grantee)
);

COMMENT ON TABLE lease.queue_grant IS
    'Roles granted work and/or produce rights on a restricted queue. Change it with lease.grant / lease.revoke.';

CREATE FUNCTION lease._caller() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN current_setting('role') = 'none' THEN session_user
            ELSE current_setting('role')::name END;

COMMENT ON FUNCTION lease._caller() IS
    'Internal: the role on whose behalf a SECURITY DEFINER function of pg_lease runs (SET ROLE, else session user).';

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

-- Whether the calling role may act on QUEUE with one of RIGHTS: true; false
-- if it holds another right on it; NULL if it holds none (a restricted queue
-- it is not to learn of).
CREATE FUNCTION lease._access(queue text, rights text[]) RETURNS boolean
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

CREATE FUNCTION lease._check_access(queue text, rights text[]) RETURNS void
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

CREATE FUNCTION lease._check_rows(ids bigint[], rights text[], queue text DEFAULT NULL) RETURNS void
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

CREATE FUNCTION lease.grant(queue text, role regrole, work boolean DEFAULT true, produce boolean DEFAULT true)
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

CREATE FUNCTION lease.revoke(queue text, role regrole) RETURNS boolean
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
