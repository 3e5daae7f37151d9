// pg_tests: library only: it attacks the library's reaper as other roles.
//! No lock anyone can take stops the reaper, and every step it takes in the
//! background is bounded: attacked by a role that may only connect, by a
//! table owner whose write-back is slow, and by a worker whose ended
//! session left thousands of bindings.
//!
//! Each test failed before its fix; its doc comment says how.

use std::time::{Duration, Instant};

use pg_tests::{eventually, reaper_conf, scalar, Cluster, ClusterConfig, TEST_DB};
use tokio_postgres::Client;

/// A cluster whose reaper sweeps every `interval`, logging worker starts.
fn preloaded(interval: Duration) -> Cluster {
    let mut extra_conf = reaper_conf(interval);
    extra_conf.push("log_min_messages = debug1".into());
    Cluster::start_with(ClusterConfig {
        extra_conf,
        ..Default::default()
    })
}

/// How many background workers named `name` the server started during
/// `span`.
async fn workers_started(cluster: &Cluster, name: &str, span: Duration) -> usize {
    let before = cluster.server_log().len();
    tokio::time::sleep(span).await;
    let log = cluster.server_log();
    log[before..]
        .lines()
        .filter(|l| l.contains("starting background worker process") && l.contains(name))
        .count()
}

/// A lease of `default` that expires in 300 ms; the time until the reaper
/// gave it back.
async fn recovery_time(su: &Client, within: Duration) -> Duration {
    su.batch_execute(
        "DELETE FROM lease.job;
         SELECT lease.enqueue('default', '{}');
         SELECT lease.claim_pending(1, '300 ms', 'crashed');",
    )
    .await
    .expect("a lease that will expire");
    eventually(su, "SELECT state = 'pending' FROM lease.job", within).await
}

/// High: any role that may connect stopped every sweep of a database
/// with `pg_advisory_lock(hashtext('pg_lease sweep'))`, silently (failed
/// before: the lease was never recovered, `reaper_stats.sweeps` froze).
/// Now that key means nothing to pg_lease: its sweep's lock is a row that
/// only its own functions lock. A lease_admin that leaves `lease.sweep()`
/// open in a transaction still holds it: `reaper_stats` names that session,
/// and the launcher looks again once a sweep interval (the review saw it
/// start a sweeper every 100 ms, about a tenth of a core).
#[tokio::test]
async fn no_role_that_may_connect_can_stop_the_sweeps() {
    let cluster = preloaded(Duration::from_secs(1));
    let su = cluster.connect().await;
    su.batch_execute(
        "CREATE ROLE nobody LOGIN;
         CREATE ROLE ops LOGIN IN ROLE lease_admin;",
    )
    .await
    .expect("roles");
    let nobody = cluster.connect_to(TEST_DB, "nobody").await;
    nobody
        .batch_execute("SELECT pg_advisory_lock(hashtext('pg_lease sweep'))")
        .await
        .expect("any role may take an advisory lock");
    let sweeps: i64 = scalar(&su, "SELECT sweeps FROM lease.reaper_stats").await;
    let took = recovery_time(&su, Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(3), "recovered after {took:?}");
    let more: i64 = scalar(&su, "SELECT sweeps FROM lease.reaper_stats").await;
    assert!(more > sweeps, "sweeps {sweeps} -> {more}");

    // A lease that expires once the sweep below is held: due every pass from
    // then on. (Made first: the open sweep holds the queue's row.)
    su.batch_execute(
        "SELECT lease.enqueue('default', '{}'); SELECT lease.claim_pending(1, '1 s', 'crashed')",
    )
    .await
    .expect("a lease that will expire");
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    ops.batch_execute("BEGIN; SELECT * FROM lease.sweep()")
        .await
        .expect("a sweep left open");
    let pid: i32 = scalar(&ops, "SELECT pg_backend_pid()").await;
    let held: bool = scalar(
        &su,
        &format!(
            "SELECT sweep_held_by = {pid} AND sweep_held_since <= now() FROM lease.reaper_stats"
        ),
    )
    .await;
    assert!(held, "reaper_stats names the session that holds the sweep");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let started = workers_started(&cluster, "pg_lease sweeper", Duration::from_secs(3)).await;
    assert!(started <= 6, "{started} sweepers in 3 s");
    ops.batch_execute("COMMIT").await.expect("commit");
    let held: Option<i32> = scalar(&su, "SELECT sweep_held_by FROM lease.reaper_stats").await;
    assert_eq!(held, None);
}

/// `tenant` (LOGIN or not, a lease_admin) with table `t.task` attached with
/// `on_cancel`, one row 'a' pending.
async fn tenant_table(su: &Client, login: bool, on_cancel: &str) {
    let login = if login { "LOGIN" } else { "NOLOGIN" };
    su.batch_execute(&format!(
        "CREATE ROLE tenant {login} IN ROLE lease_admin;
         CREATE SCHEMA t AUTHORIZATION tenant;
         SET ROLE tenant;
         CREATE TABLE t.task (id text PRIMARY KEY, status text NOT NULL);
         SELECT lease.attach('t.task', $$status = 'new'$$, on_cancel => $${on_cancel}$$);
         INSERT INTO t.task VALUES ('a', 'new');
         RESET ROLE;"
    ))
    .await
    .expect("the tenant's attached table");
}

/// Medium: `pg_advisory_lock(hashtext('pg_lease write-back'), <owner
/// oid>)`, which any role may take, blocked that owner's write-backs for
/// good, and the sweeper started a write-back worker every pass (failed
/// before: never applied). Now one worker per owner is kept in shared
/// memory, which no SQL reaches.
#[tokio::test]
async fn no_role_that_may_connect_can_stop_a_tables_write_backs() {
    let cluster = preloaded(Duration::from_millis(100));
    let su = cluster.connect().await;
    tenant_table(&su, true, "status = 'cancelled'").await;
    su.batch_execute("CREATE ROLE nobody LOGIN")
        .await
        .expect("nobody");
    let owner: i32 = scalar(
        &su,
        "SELECT oid::int FROM pg_roles WHERE rolname = 'tenant'",
    )
    .await;
    let nobody = cluster.connect_to(TEST_DB, "nobody").await;
    nobody
        .batch_execute(&format!(
            "SELECT pg_advisory_lock(hashtext('pg_lease write-back'), {owner})"
        ))
        .await
        .expect("any role may take an advisory lock");
    su.batch_execute("SELECT lease.cancel_key('task', 'a')")
        .await
        .expect("cancel");
    eventually(
        &su,
        "SELECT status = 'cancelled' FROM t.task WHERE id = 'a'",
        Duration::from_secs(10),
    )
    .await;
}

/// Medium: a write-back ran as long as its owner liked: `statement_timeout`
/// was set in the write-back worker but never armed, as SPI in a
/// background worker arms no statement timer (failed before: still running
/// after 18 s, holding a worker slot). Now each write-back is cancelled at
/// 10 s, its error (57014) kept against its row, and retried with backoff,
/// by one worker per owner at a time (LOGIN and NOLOGIN owners alike).
#[tokio::test]
async fn a_slow_write_back_is_cancelled_and_kept_for_a_retry() {
    for login in [true, false] {
        let cluster = preloaded(Duration::from_millis(100));
        let su = cluster.connect().await;
        tenant_table(
            &su,
            login,
            "status = (SELECT 'cancelled' FROM pg_sleep(25))",
        )
        .await;
        su.batch_execute("SELECT lease.cancel_key('task', 'a')")
            .await
            .expect("cancel");
        let started = Instant::now();
        eventually(
            &su,
            "SELECT coalesce(bool_or(last_error LIKE '57014:%'), false) FROM lease.write_backs",
            Duration::from_secs(20),
        )
        .await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "login {login}: cancelled after {took:?}"
        );
        let running: i64 = scalar(
            &su,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_lease write-back'",
        )
        .await;
        assert!(
            running <= 1,
            "login {login}: {running} write-back workers at once"
        );
        let status: String = scalar(&su, "SELECT status FROM t.task").await;
        assert_eq!(status, "new", "login {login}: nothing applied");
    }
}

/// Medium: while a write-back was due but could not be taken (here its row
/// is locked by the owner's own session), the sweeper started a write-back
/// worker every pass, each finding nothing (failed before: 44 in 20 s).
/// Now the owner's next worker waits a pause after one that found nothing.
#[tokio::test]
async fn a_write_back_that_cannot_be_taken_starts_no_worker_every_pass() {
    let cluster = preloaded(Duration::from_millis(100));
    let su = cluster.connect().await;
    tenant_table(&su, true, "status = 'cancelled'").await;
    let tenant = cluster.connect_to(TEST_DB, "tenant").await;
    for sql in [
        "ALTER SYSTEM SET lease.reaper_enabled = off",
        "SELECT pg_reload_conf()",
    ] {
        su.batch_execute(sql)
            .await
            .expect("the reaper off while the row is locked");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    su.batch_execute("SELECT lease.cancel_key('task', 'a')")
        .await
        .expect("cancel");
    tenant
        .batch_execute("BEGIN; SELECT lease._take_write_backs('tenant', 10)")
        .await
        .expect("the owner's own session holds the write-back");
    for sql in [
        "ALTER SYSTEM RESET lease.reaper_enabled",
        "SELECT pg_reload_conf()",
    ] {
        su.batch_execute(sql).await.expect("the reaper on");
    }
    let started = workers_started(&cluster, "pg_lease write-back", Duration::from_secs(4)).await;
    assert!(started <= 2, "{started} write-back workers in 4 s");
    tenant.batch_execute("ROLLBACK").await.expect("released");
    eventually(
        &su,
        "SELECT status = 'cancelled' FROM t.task WHERE id = 'a'",
        Duration::from_secs(15),
    )
    .await;
}

/// Medium: ended session bindings stalled the reaper of every database. A
/// worker claims 20,000 rows under 3,000 owner names, binds each name to
/// its session and disconnects: each pass expired up to 1,000 bindings,
/// each by scanning every leased row, while the launcher waited for that
/// database before any other (failed before: another database's recovery
/// took 9.9 s instead of 0.5). Now the leases of an owner are found by an
/// index, a pass ends a bounded number of them, and sweeps of other
/// databases run beside it.
#[tokio::test]
async fn ended_bindings_delay_no_other_database() {
    let cluster = preloaded(Duration::from_millis(100));
    let su = cluster.connect().await;
    su.batch_execute("CREATE DATABASE other").await.expect("db");
    cluster.psql("other", "CREATE EXTENSION pg_lease");
    let other = cluster.connect_to("other", "postgres").await;
    let worker = cluster.connect().await;
    worker
        .batch_execute(
            "SELECT lease.create_queue('bulk');
             INSERT INTO lease.job (queue, payload, next_at, created_at)
             SELECT 'bulk', '{}', clock_timestamp(), clock_timestamp() FROM generate_series(1, 20000);
             SELECT lease.recount();
             DO $$
             BEGIN
                 FOR n IN 1..3000 LOOP
                     PERFORM lease.claim_pending(7, '1 day', 'owner-' || n, 'bulk');
                     PERFORM lease.bind_session('bulk', 'owner-' || n);
                 END LOOP;
             END $$;",
        )
        .await
        .expect("20,000 leases bound to 3,000 names of one session");
    let leased: i64 = scalar(&su, "SELECT count(*) FROM lease.job WHERE state = 'leased'").await;
    assert!(leased >= 19_000, "{leased} leased");
    drop(worker);
    // The worker's session is gone: its bindings are ended from now on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let took = recovery_time(&other, Duration::from_secs(20)).await;
    assert!(
        took < Duration::from_secs(2),
        "the other database recovered after {took:?}"
    );
    eventually(
        &su,
        "SELECT count(*) = 0 FROM lease.job WHERE state = 'leased' AND queue = 'bulk'",
        Duration::from_secs(20),
    )
    .await;
}
