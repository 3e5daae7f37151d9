// pg_tests: library only: it attacks the library install as other roles.
//! The owner of an attached table (`tenant`, a lease_admin and no
//! superuser) against the extension's owner: nothing of the table's (its
//! relation, rules, operators, functions, settings) may run in a frame of
//! the extension owner's. pg_lease touches such a table in two places: the
//! lock `lease.fence` takes on the table's row, and the write-back
//! (`on_dead`/`on_cancel`). Both run as the table's owner now, the first in
//! a security-restricted operation whose settings are undone, the second in
//! the owner's own session and outside every SECURITY DEFINER function of
//! pg_lease's.
//!
//! Each attack is made by a LOGIN and by a NOLOGIN owner (whose write-backs
//! a worker of the bootstrap superuser's applies).

use std::time::Duration;

use pg_tests::{eventually, reaper_conf, scalar, Cluster, ClusterConfig, TEST_DB};
use tokio_postgres::Client;

/// A cluster whose reaper (and so its write-back workers) runs every 100 ms.
fn preloaded() -> Cluster {
    Cluster::start_with(ClusterConfig {
        extra_conf: reaper_conf(Duration::from_millis(100)),
        ..Default::default()
    })
}

/// `t.pwn()`, which makes `tenant` superuser when it runs as anyone else,
/// and records who ran it.
const PWN: &str = "
    CREATE TABLE t.ran (who text);
    GRANT INSERT ON t.ran TO PUBLIC;
    GRANT USAGE ON SCHEMA t TO PUBLIC;
    CREATE FUNCTION t.pwn() RETURNS boolean LANGUAGE plpgsql AS $f$
    BEGIN
        INSERT INTO t.ran VALUES (current_user);
        IF current_user <> 'tenant' THEN
            EXECUTE 'ALTER ROLE tenant SUPERUSER';
        END IF;
        RETURN true;
    END $f$;";

/// Creates `tenant` (LOGIN or not), its schema `t`, [`PWN`], `before`, and
/// `t.task` (text key) attached with `options`, with one pending row 'a'.
/// Everything runs as the tenant (through SET ROLE, as a NOLOGIN role
/// cannot connect); returns the superuser's connection.
async fn tenant_table(cluster: &Cluster, login: bool, options: &str, before: &str) -> Client {
    let su = cluster.connect().await;
    let login = if login { "LOGIN" } else { "NOLOGIN" };
    su.batch_execute(&format!(
        "CREATE ROLE tenant {login} IN ROLE lease_admin;
         CREATE SCHEMA t AUTHORIZATION tenant;
         SET ROLE tenant;
         {PWN}
         {before}
         CREATE TABLE t.task (id text PRIMARY KEY, status text NOT NULL);
         SELECT lease.attach('t.task', $$status = 'new'$$ {options});
         INSERT INTO t.task VALUES ('a', 'new');
         RESET ROLE;"
    ))
    .await
    .expect("the tenant's attached table");
    su
}

async fn is_superuser(su: &Client, role: &str) -> bool {
    scalar(
        su,
        &format!("SELECT rolsuper FROM pg_roles WHERE rolname = '{role}'"),
    )
    .await
}

/// Who ran `t.pwn()`, in order.
async fn ran(su: &Client) -> Vec<String> {
    su.query("SELECT who FROM t.ran", &[])
        .await
        .expect("t.ran")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Turns `t.task` into a view of a row 'a' whose every read calls
/// `t.pwn()`: PostgreSQL 15 converts an empty table without triggers,
/// indexes or key into a view with the same oid when it gets an ON SELECT
/// rule (16 no longer does). Its owner may do each step.
async fn table_to_view(su: &Client) {
    for sql in [
        "SET ROLE tenant;
         DROP TRIGGER pg_lease_start ON t.task;
         DROP TRIGGER pg_lease_stop ON t.task;
         DROP TRIGGER pg_lease_update_start ON t.task;
         DROP TRIGGER pg_lease_update_stop ON t.task;
         DROP TRIGGER pg_lease_truncate ON t.task;
         DELETE FROM t.task;
         ALTER TABLE t.task DROP CONSTRAINT task_pkey;
         CREATE TABLE t.shadow (id text, status text);
         INSERT INTO t.shadow VALUES ('a', 'new');",
        // Clears relhastriggers.
        "VACUUM t.task",
        "CREATE RULE \"_RETURN\" AS ON SELECT TO t.task DO INSTEAD
             SELECT s.id, s.status FROM t.shadow s WHERE t.pwn();
         RESET ROLE;",
    ] {
        su.batch_execute(sql).await.expect("a view now");
    }
}

/// Critical, as a view: `lease.fence` locked the table row of an attached
/// row by selecting it `FOR NO KEY UPDATE` as the extension owner, so the
/// tenant, who had turned its table into a view calling `t.pwn()`, became
/// superuser on its next `fence` (failed before: `ran` was `{postgres}` and
/// the tenant superuser). Now the lock runs as the table's owner: a view
/// is refused at the moment of use (55000) and nothing of the tenant's
/// runs at all.
#[tokio::test]
async fn fence_never_reads_a_tenants_view_as_the_extension_owner() {
    if pg_tests::server_major() >= 16 {
        // A table can no longer become a view.
        return;
    }
    for login in [true, false] {
        let cluster = Cluster::start();
        let su = tenant_table(&cluster, login, "", "").await;
        let row = su
            .query_one(
                "SELECT id, epoch FROM lease.claim_pending(1, '1 hour', 'w', 'task')",
                &[],
            )
            .await
            .expect("a lease on row 'a'");
        let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
        table_to_view(&su).await;
        let relkind: i8 = scalar(
            &su,
            "SELECT relkind::\"char\" FROM pg_class WHERE oid = 't.task'::regclass",
        )
        .await;
        assert_eq!(relkind as u8, b'v', "the attack's premise");
        let fenced = su
            .batch_execute(&format!(
                "SET ROLE tenant; BEGIN; SELECT lease.fence({id}, {epoch}); COMMIT"
            ))
            .await;
        su.batch_execute("ROLLBACK; RESET ROLE")
            .await
            .expect("reset");
        assert!(!is_superuser(&su, "tenant").await, "login {login}");
        let err = fenced.expect_err("a view is not a table");
        assert_eq!(
            pg_tests::sqlstate(&err).as_deref(),
            Some("55000"),
            "{err:?}"
        );
        assert_eq!(ran(&su).await, Vec::<String>::new(), "login {login}");
    }
}

/// Critical, as a view, in the write-back: `lease._apply_write_back`
/// locked the row the same way, inside a SECURITY DEFINER function of the
/// extension owner's (failed before: the tenant became superuser within a
/// sweep). Now the write-back locks its row as the tenant, in the tenant's
/// own session: whatever its view runs, it runs as the tenant.
#[tokio::test]
async fn a_write_back_never_reads_a_tenants_view_as_the_extension_owner() {
    if pg_tests::server_major() >= 16 {
        return;
    }
    for login in [true, false] {
        let cluster = preloaded();
        let su = tenant_table(
            &cluster,
            login,
            ", on_cancel => $$status = 'cancelled'$$",
            "",
        )
        .await;
        table_to_view(&su).await;
        let cancelled: String = scalar(&su, "SELECT lease.cancel_key('task', 'a')").await;
        assert_eq!(cancelled, "cancelled");
        eventually(
            &su,
            "SELECT count(*) = 0 OR bool_or(last_error IS NOT NULL) FROM lease.write_backs",
            Duration::from_secs(20),
        )
        .await;
        assert!(!is_superuser(&su, "tenant").await, "login {login}");
        assert!(
            ran(&su).await.iter().all(|who| who == "tenant"),
            "login {login}: {:?}",
            ran(&su).await
        );
    }
}

/// Critical, through the SET list: a write-back's non-local `set_config`
/// outlived the SET clauses of both its own function and
/// `lease._apply_write_back`, a SECURITY DEFINER function of the extension
/// owner's, whose next statement (`DELETE ... WHERE b.id = w.id`) then
/// resolved `=` to the tenant's `t.=(bigint, bigint)` and ran it as
/// superuser (failed before: the tenant became superuser). Now the
/// tenant's function is called only from the tenant's own frame: its
/// operator runs, if at all, as the tenant.
#[tokio::test]
async fn a_write_backs_search_path_never_reaches_the_extension_owners_frames() {
    const EQ: &str = "
        CREATE FUNCTION t.eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $f$
        BEGIN
            PERFORM t.pwn();
            RETURN $1 OPERATOR(pg_catalog.=) $2;
        END $f$;
        CREATE OPERATOR t.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = t.eq);";
    for login in [true, false] {
        let cluster = preloaded();
        let su = tenant_table(
            &cluster,
            login,
            ", on_cancel => $$status = 'cancelled' || left(set_config('search_path', 't, pg_catalog', false), 0)$$",
            EQ,
        )
        .await;
        let cancelled: String = scalar(&su, "SELECT lease.cancel_key('task', 'a')").await;
        assert_eq!(cancelled, "cancelled");
        eventually(
            &su,
            "SELECT status = 'cancelled' FROM t.task WHERE id = 'a'",
            Duration::from_secs(20),
        )
        .await;
        eventually(
            &su,
            "SELECT count(*) = 0 FROM lease.write_backs",
            Duration::from_secs(20),
        )
        .await;
        assert!(!is_superuser(&su, "tenant").await, "login {login}");
        assert!(
            ran(&su).await.iter().all(|who| who == "tenant"),
            "login {login}: {:?}",
            ran(&su).await
        );
    }
}

/// The same SET list through `lease.fence`'s lock, where the tenant's code
/// is an index predicate that PostgreSQL's planner evaluates (an immutable
/// function of no column) when it plans the lock: before, as the extension
/// owner. Now as the tenant, in a security-restricted operation whose
/// settings are undone when it returns, so the search_path it sets reaches
/// neither `fence`'s next statement nor the worker's session.
#[tokio::test]
async fn fences_lock_runs_a_tenants_planner_code_as_the_tenant_and_undoes_its_settings() {
    const FOLDED: &str = "
        CREATE FUNCTION t.folded() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
        BEGIN
            PERFORM set_config('search_path', 't, pg_catalog', false);
            RETURN t.pwn();
        END $f$;";
    for login in [true, false] {
        let cluster = Cluster::start();
        let su = tenant_table(&cluster, login, "", FOLDED).await;
        su.batch_execute(
            "SET ROLE tenant;
             CREATE INDEX task_folded ON t.task (status) WHERE t.folded();
             TRUNCATE t.ran;
             RESET ROLE;
             CREATE ROLE w LOGIN IN ROLE lease_worker;",
        )
        .await
        .expect("the tenant's index");
        let w = cluster.connect_to(TEST_DB, "w").await;
        let row = w
            .query_one(
                "SELECT id, epoch FROM lease.claim_pending(1, '1 hour', 'w', 'task')",
                &[],
            )
            .await
            .expect("w leases row 'a'");
        let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
        let path_before: String = scalar(&w, "SHOW search_path").await;
        w.batch_execute(&format!("BEGIN; SELECT lease.fence({id}, {epoch}); COMMIT"))
            .await
            .expect("w fences its row");
        let path_after: String = scalar(&w, "SHOW search_path").await;
        assert_eq!(path_after, path_before, "login {login}: w's search_path");
        assert!(!is_superuser(&su, "tenant").await, "login {login}");
        assert!(
            ran(&su).await.iter().all(|who| who == "tenant"),
            "login {login}: {:?}",
            ran(&su).await
        );
    }
}
