// pg_tests: library only: it attacks the library install as other roles.
//! The second security pass: attached tables' write-backs (`on_dead`,
//! `on_cancel`) and NOTIFY, attacked by the roles that would:
//! a table owner who is no superuser (`tenant`, a lease_admin) against a
//! superuser and a worker of a restricted queue; a role that may only
//! connect against the names of restricted queues.
//!
//! Each test reproduces a weakness the review found before the fix, when
//! the write-back ran inside the transaction that ended the row; its doc
//! comment says which, and how severe.

use std::time::Duration;

use pg_tests::{eventually, reaper_conf, scalar, sqlstate, Cluster, ClusterConfig, TEST_DB};
use tokio_postgres::Client;

/// A cluster whose reaper (and so its write-back workers) runs every 100 ms.
fn preloaded() -> Cluster {
    Cluster::start_with(ClusterConfig {
        extra_conf: reaper_conf(Duration::from_millis(100)),
        ..Default::default()
    })
}

/// `tenant`: a lease_admin, no superuser, owning schema `t` with table
/// `t.task` (text key, status, loot) that it attaches with `options`; one
/// row 'a' pending ("new").
async fn tenant_table(cluster: &Cluster, su: &Client, options: &str, before: &str) -> Client {
    su.batch_execute(
        "CREATE ROLE tenant LOGIN IN ROLE lease_admin;
         CREATE SCHEMA t AUTHORIZATION tenant;",
    )
    .await
    .expect("tenant");
    let tenant = cluster.connect_to(TEST_DB, "tenant").await;
    tenant
        .batch_execute(&format!(
            "CREATE TABLE t.task (id text PRIMARY KEY, status text NOT NULL, loot text);
             {before}
             SELECT lease.attach('t.task', $$status = 'new'$$, {options});
             INSERT INTO t.task (id, status) VALUES ('a', 'new');"
        ))
        .await
        .expect("tenant's attached table");
    tenant
}

async fn is_superuser(su: &Client, role: &str) -> bool {
    scalar(
        su,
        &format!("SELECT rolsuper FROM pg_roles WHERE rolname = '{role}'"),
    )
    .await
}

/// Critical: a write-back's session settings leaked into the
/// session of whoever ended the row. The tenant's `on_cancel` sets a
/// session-wide search_path that puts its own `lower` first; a superuser
/// cancels the row and then calls `lower`. On main the superuser's session
/// kept the tenant's search_path and its `lower` made the tenant superuser.
/// Here the cancel only records the write-back, the superuser's session is
/// untouched, and the write-back worker applies it as the tenant.
#[tokio::test]
async fn a_write_back_leaves_no_setting_in_the_session_that_ended_the_row() {
    let cluster = preloaded();
    let su = cluster.connect().await;
    tenant_table(
        &cluster,
        &su,
        "on_cancel => $$status = 'cancelled' || left(set_config('search_path', 't, pg_catalog, public', false), 0)$$",
        "CREATE FUNCTION t.lower(text) RETURNS text LANGUAGE plpgsql AS $f$
         BEGIN
             IF current_user <> 'tenant' THEN
                 EXECUTE 'ALTER ROLE tenant SUPERUSER';
             END IF;
             RETURN pg_catalog.lower($1);
         END $f$;
         GRANT USAGE ON SCHEMA t TO PUBLIC;",
    )
    .await;
    let path_before: String = scalar(&su, "SHOW search_path").await;
    let cancelled: String = scalar(&su, "SELECT lease.cancel_key('task', 'a')").await;
    assert_eq!(cancelled, "cancelled");
    let lowered: String = scalar(&su, "SELECT lower('X')").await;
    assert_eq!(lowered, "x");
    let path_after: String = scalar(&su, "SHOW search_path").await;
    assert_eq!(path_after, path_before, "the superuser's search_path");
    eventually(
        &su,
        "SELECT status = 'cancelled' FROM t.task WHERE id = 'a'",
        Duration::from_secs(10),
    )
    .await;
    assert!(!is_superuser(&su, "tenant").await);
}

/// Critical: a deferred trigger on the attached table fired at
/// the commit of whoever ended the row, as that role. With a benign
/// `on_cancel`, the tenant's constraint trigger (DEFERRABLE INITIALLY
/// DEFERRED) made the tenant superuser when a superuser's cancel committed
/// on main. Here it fires only where the write-back is applied, as the
/// tenant: the escalation it tries there fails (42501), which undoes the
/// write-back and keeps its error for a retry.
#[tokio::test]
async fn a_deferred_trigger_fires_as_the_table_owner_not_as_the_canceller() {
    let cluster = preloaded();
    let su = cluster.connect().await;
    let tenant = tenant_table(
        &cluster,
        &su,
        "on_cancel => $$status = 'cancelled'$$",
        "CREATE TABLE t.fired (who text);
         GRANT INSERT ON t.fired TO PUBLIC;
         GRANT USAGE ON SCHEMA t TO PUBLIC;
         CREATE FUNCTION t.at_commit() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN
             INSERT INTO t.fired VALUES (current_user);
             EXECUTE 'ALTER ROLE tenant SUPERUSER';
             RETURN NULL;
         END $f$;
         CREATE CONSTRAINT TRIGGER z AFTER UPDATE ON t.task DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION t.at_commit();",
    )
    .await;
    su.batch_execute("BEGIN; SELECT lease.cancel_key('task', 'a'); COMMIT")
        .await
        .expect("the superuser's cancel commits");
    assert!(!is_superuser(&su, "tenant").await);
    eventually(
        &su,
        "SELECT coalesce(bool_or(last_error LIKE '42501:%'), false) FROM lease.write_backs",
        Duration::from_secs(10),
    )
    .await;
    assert!(!is_superuser(&su, "tenant").await);
    let status: String = scalar(&su, "SELECT status FROM t.task WHERE id = 'a'").await;
    assert_eq!(status, "new", "the failed write-back was undone");
    let fired: i64 = scalar(&su, "SELECT count(*) FROM t.fired").await;
    assert_eq!(fired, 0, "its trigger's insert was undone with it");

    // Without the escalation the same write-back applies, the trigger
    // firing as the tenant.
    tenant
        .batch_execute(
            "CREATE OR REPLACE FUNCTION t.at_commit() RETURNS trigger LANGUAGE plpgsql AS $f$
             BEGIN
                 INSERT INTO t.fired VALUES (current_user);
                 RETURN NULL;
             END $f$;
             SELECT lease.apply_write_backs()",
        )
        .await
        .expect("applied by the tenant");
    eventually(
        &su,
        "SELECT status = 'cancelled' FROM t.task WHERE id = 'a'",
        Duration::from_secs(30),
    )
    .await;
    let who: Vec<String> = su
        .query("SELECT who FROM t.fired", &[])
        .await
        .expect("fired")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(who, ["tenant"]);
}

/// High: a write-back acted with the grants of the role that
/// ended the row. The tenant, demoted to a plain lease_worker, puts a claim
/// of worker `b`'s restricted queue `qb` into `on_dead`; `b` fails the last
/// attempt of the tenant's row. On main the tenant's code claimed `qb` as
/// `b` and copied its payloads into the tenant's table. Here it runs as the
/// tenant, whose claim on `qb` is refused (42704: to it, qb does not exist): nothing is claimed or
/// copied, and the write-back keeps the error.
#[tokio::test]
async fn a_write_back_does_not_borrow_the_grants_of_the_worker_that_ended_the_row() {
    let cluster = preloaded();
    let su = cluster.connect().await;
    su.batch_execute(
        "CREATE ROLE b LOGIN IN ROLE lease_worker;
         SELECT lease.create_queue('qb');
         SELECT lease.grant('qb', 'b');
         SELECT lease.enqueue('qb', '{\"card\": \"4111-secret\"}');",
    )
    .await
    .expect("b's restricted queue");
    let tenant = tenant_table(
        &cluster,
        &su,
        "max_attempts => 1,
         on_dead => $$loot = (SELECT string_agg(c.payload::text, ',')
                                FROM lease.claim_pending(10, '1 hour', 'thief', 'qb') c)$$",
        "",
    )
    .await;
    su.batch_execute("REVOKE lease_admin FROM tenant; GRANT lease_worker TO tenant")
        .await
        .expect("demoted");
    let err = tenant
        .batch_execute("SELECT lease.claim_pending(10, '1 hour', 'thief', 'qb')")
        .await
        .expect_err("the tenant may not work qb");
    assert_eq!(sqlstate(&err).as_deref(), Some("42704"));

    let b = cluster.connect_to(TEST_DB, "b").await;
    let row = b
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'b', 'task')",
            &[],
        )
        .await
        .expect("b claims the tenant's row");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    b.execute("SELECT lease.release($1, 'b', $2, 'fail')", &[&id, &epoch])
        .await
        .expect("b fails the last attempt");
    let untouched = || async {
        let stolen: i64 = scalar(
            &su,
            "SELECT count(*) FROM lease.job WHERE queue = 'qb' AND state <> 'pending'",
        )
        .await;
        assert_eq!(stolen, 0, "qb's row is untouched");
        let loot: Option<String> = scalar(&su, "SELECT loot FROM t.task WHERE id = 'a'").await;
        assert_eq!(loot, None);
    };
    untouched().await;
    eventually(
        &su,
        "SELECT coalesce(bool_or(last_error LIKE '42704:%'), false) FROM lease.write_backs",
        Duration::from_secs(10),
    )
    .await;
    untouched().await;
}

/// A write-back runs only in a session that logged in as the table's owner:
/// a superuser who takes the owner's role with SET ROLE (and would carry
/// its settings back) is refused, and nothing is applied.
#[tokio::test]
async fn write_backs_are_refused_under_set_role() {
    let cluster = Cluster::start();
    let su = cluster.connect().await;
    tenant_table(&cluster, &su, "on_cancel => $$status = 'cancelled'$$", "").await;
    su.batch_execute("SELECT lease.cancel_key('task', 'a')")
        .await
        .expect("cancel");
    let err = su
        .batch_execute("SET ROLE tenant; SELECT lease.apply_write_backs()")
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err:?}");
    su.batch_execute("RESET ROLE").await.expect("reset");
    let waiting: i64 = scalar(&su, "SELECT count(*) FROM lease.write_backs").await;
    assert_eq!(waiting, 1);
}

/// Informational: every role that could connect learnt restricted
/// queues' names, and when work arrived in them, from `LISTEN
/// pg_lease_ready`. Here each queue has its own channel, without payload,
/// whose name only a role that may work the queue can get: `nobody` (LOGIN
/// only) hears nothing on the old channel and may not ask; `alice`, a
/// worker without a grant on `qb`, is refused; `b` is woken.
#[tokio::test]
async fn only_roles_that_may_work_a_queue_hear_of_its_work() {
    let cluster = Cluster::start();
    let su = cluster.connect().await;
    su.batch_execute(
        "CREATE ROLE nobody LOGIN;
         CREATE ROLE alice LOGIN IN ROLE lease_worker;
         CREATE ROLE b LOGIN IN ROLE lease_worker;
         SELECT lease.create_queue('qb');
         SELECT lease.grant('qb', 'b');",
    )
    .await
    .expect("roles");
    let (nobody, mut heard_by_nobody) = cluster.listener(TEST_DB, "nobody").await;
    nobody
        .batch_execute("LISTEN pg_lease_ready")
        .await
        .expect("anyone may LISTEN");
    su.batch_execute("SELECT lease.enqueue('qb', '{}')")
        .await
        .expect("enqueue");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(heard_by_nobody.try_recv().ok(), None, "nobody heard of qb");
    su.batch_execute("DELETE FROM lease.job")
        .await
        .expect("empty");
    let err = nobody
        .batch_execute("SELECT lease.ready_channel('qb')")
        .await
        .expect_err("nobody may not ask");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"));
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    let err = alice
        .batch_execute("SELECT lease.ready_channel('qb')")
        .await
        .expect_err("alice may not work qb");
    assert_eq!(sqlstate(&err).as_deref(), Some("42704"));

    let (b, mut heard_by_b) = cluster.listener(TEST_DB, "b").await;
    let channel: String = scalar(&b, "SELECT lease.ready_channel('qb')").await;
    assert!(!channel.contains("qb"), "{channel}");
    b.batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .expect("LISTEN");
    su.batch_execute("SELECT lease.enqueue('qb', '{}')")
        .await
        .expect("enqueue");
    let (to, payload) = tokio::time::timeout(Duration::from_secs(5), heard_by_b.recv())
        .await
        .expect("b is woken")
        .expect("alive");
    assert_eq!((to.as_str(), payload.as_str()), (channel.as_str(), ""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(heard_by_nobody.try_recv().ok(), None, "nobody heard of qb");
}

/// An owner that may not log in gets its write-backs applied by a worker
/// that logs in as the bootstrap superuser and becomes the owner in a
/// security-restricted operation. The owner's deferred trigger, which would
/// fire outside the outcome function's SECURITY DEFINER and set the session
/// authorization back to the superuser, is refused (42501, kept as the
/// write-back's error); a benign write-back applies, as the owner.
///
/// Broken on purpose: without the worker's `SetUserIdAndSecContext`, the
/// trigger made the tenant superuser.
#[tokio::test]
async fn a_nologin_owner_cannot_take_the_write_back_workers_superuser() {
    let cluster = preloaded();
    let su = cluster.connect().await;
    su.batch_execute(
        "CREATE ROLE tenant NOLOGIN IN ROLE lease_admin;
         CREATE SCHEMA t AUTHORIZATION tenant;
         SET ROLE tenant;
         CREATE TABLE t.evil (id text PRIMARY KEY, status text NOT NULL);
         CREATE FUNCTION t.take() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN
             PERFORM set_config('session_authorization', 'postgres', false);
             EXECUTE 'ALTER ROLE tenant SUPERUSER';
             RETURN NULL;
         END $f$;
         CREATE CONSTRAINT TRIGGER z AFTER UPDATE ON t.evil DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION t.take();
         SELECT lease.attach('t.evil', $$status = 'new'$$, on_cancel => $$status = 'cancelled'$$);
         CREATE TABLE t.fine (id text PRIMARY KEY, status text NOT NULL, who text);
         SELECT lease.attach('t.fine', $$status = 'new'$$,
             on_cancel => $$status = 'cancelled', who = current_user || '/' || session_user$$);
         INSERT INTO t.evil VALUES ('a', 'new');
         INSERT INTO t.fine VALUES ('a', 'new');
         RESET ROLE;
         SELECT lease.cancel_key('evil', 'a'), lease.cancel_key('fine', 'a');",
    )
    .await
    .expect("a NOLOGIN tenant's tables");
    eventually(
        &su,
        "SELECT status = 'cancelled' FROM t.fine WHERE id = 'a'",
        Duration::from_secs(10),
    )
    .await;
    let who: String = scalar(&su, "SELECT who FROM t.fine").await;
    assert_eq!(who, "tenant/tenant");
    eventually(
        &su,
        "SELECT coalesce(bool_or(last_error LIKE '42501:%'), false) FROM lease.write_backs WHERE queue = 'evil'",
        Duration::from_secs(10),
    )
    .await;
    assert!(!is_superuser(&su, "tenant").await);
    let status: String = scalar(&su, "SELECT status FROM t.evil").await;
    assert_eq!(status, "new");
}
