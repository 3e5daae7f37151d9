// pg_tests: library only: the background reaper is the library.
//! The background reaper against real clusters started with
//! `shared_preload_libraries = 'pg_lease'`: nothing but the server itself
//! recovers expired leases here; no test calls `lease.reap()`.
//!
//! Broken on purpose: with the launcher not starting sweepers, every test
//! here failed; with the launcher exiting with code 0 on SIGTERM (so the
//! postmaster does not restart it), `a_terminated_launcher_comes_back` failed.

use std::time::Duration;

use pg_tests::{eventually, scalar, Cluster, ClusterConfig, TEST_DB};
use tokio_postgres::Client;

/// A cluster with the reaper on and sweeping every 100 ms.
fn preloaded() -> Cluster {
    Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(100)))
}

/// [`preloaded`], and a connection to it that has run `setup`.
async fn preloaded_with(setup: &str) -> (Cluster, Client) {
    let cluster = preloaded();
    let client = cluster.connect().await;
    client.batch_execute(setup).await.expect("setup");
    (cluster, client)
}

/// Claims one row of `queue` with the given ttl; returns (id, epoch).
async fn claim_one(client: &Client, queue: &str, ttl: &str) -> (i64, i64) {
    let row = client
        .query_one(
            &format!("SELECT id, epoch FROM lease.claim_pending(1, '{ttl}', 'crashed', '{queue}')"),
            &[],
        )
        .await
        .expect("a claimable row");
    (row.get(0), row.get(1))
}

/// Leaves a lease in queue `default` that expires in 100 ms: work for
/// the reaper.
async fn leave_an_expiring_lease(client: &Client) {
    client
        .batch_execute(
            "SELECT lease.enqueue('default', '{}'); SELECT lease.claim_pending(1, '100 ms', 'w')",
        )
        .await
        .expect("a lease");
}

/// Waits (at most 5 s) until row `id` is in `state`; how long it took.
async fn state_becomes(client: &Client, id: i64, state: &str) -> Duration {
    eventually(
        client,
        &format!("SELECT state = '{state}' FROM lease.job WHERE id = {id}"),
        Duration::from_secs(5),
    )
    .await
}

#[tokio::test]
async fn an_expired_lease_is_recovered_by_the_server_alone() {
    let (cluster, client) = preloaded_with("SELECT lease.create_queue('q', backoff_base => '0', backoff_max => '0'); SELECT lease.enqueue('q', '{}')").await;
    let (id, epoch) = claim_one(&client, "q", "300 milliseconds").await;
    // The claimer "crashes": it never renews or releases.
    let took = state_becomes(&client, id, "pending").await;
    // ttl + sweep interval + slack for a loaded 2-core machine.
    assert!(
        took < Duration::from_millis(300 + 100 + 1500),
        "recovered after {took:?}"
    );
    let row = client
        .query_one(
            "SELECT epoch, attempt, last_error FROM lease.job WHERE id = $1",
            &[&id],
        )
        .await
        .expect("row");
    assert_eq!(
        row.get::<_, i64>(0),
        epoch + 1,
        "epoch bumped: the crashed owner is fenced"
    );
    assert_eq!(row.get::<_, i32>(1), 1, "the attempt stays counted");
    assert!(row.get::<_, String>(2).starts_with("lease expired"));
    assert!(scalar::<i64>(&client, "SELECT recovered FROM lease.reaper_stats").await >= 1);
    assert!(
        cluster.server_log().contains("back to pending"),
        "the recovery is logged"
    );
}

#[tokio::test]
async fn databases_created_later_are_swept_and_can_be_dropped() {
    let cluster = preloaded();
    let admin = cluster.connect_to("postgres", "postgres").await;
    admin
        .batch_execute("CREATE DATABASE later")
        .await
        .expect("create database");
    let later = cluster.connect_to("later", "postgres").await;
    later
        .batch_execute("CREATE EXTENSION pg_lease; SELECT lease.enqueue('default', '{}')")
        .await
        .expect("extension in the new database");
    let (id, _) = claim_one(&later, "default", "200 milliseconds").await;
    state_becomes(&later, id, "pending").await;
    drop(later);

    // A plain DROP DATABASE while the reaper keeps sweeping: never blocked
    // for good (it waits at most 5 s for sessions to leave, sweepers live
    // for milliseconds).
    for _ in 0..3 {
        admin
            .batch_execute("CREATE DATABASE doomed")
            .await
            .expect("create");
        let doomed = cluster.connect_to("doomed", "postgres").await;
        // A short lease keeps the reaper coming back to this database.
        doomed
            .batch_execute(
                "CREATE EXTENSION pg_lease; SELECT lease.enqueue('default', '{}');
                 SELECT lease.claim_pending(1, '100 milliseconds', 'w')",
            )
            .await
            .expect("extension and a lease");
        eventually(
            &doomed,
            "SELECT recovered > 0 FROM lease.reaper_stats",
            Duration::from_secs(5),
        )
        .await;
        drop(doomed);
        admin
            .batch_execute("DROP DATABASE doomed")
            .await
            .expect("DROP DATABASE while the reaper runs");
    }
    // Dropped databases leave nothing alarming behind: a sweeper that
    // raced the drop ends quietly (the launcher used to fork one into the
    // dropped database, which died with FATAL and exit code 1).
    let log = cluster.server_log();
    let alarming: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains("FATAL") && l.contains("does not exist"))
                || (l.contains("pg_lease") && l.contains("exited with exit code 1"))
        })
        .collect();
    assert!(
        alarming.is_empty(),
        "server log after DROP DATABASE: {alarming:#?}"
    );
    // And CREATE DATABASE (template1 is never connected to) keeps working.
    let dbs = scalar::<i64>(
        &admin,
        "SELECT count(*) FROM pg_database WHERE datname IN ('later', 'doomed')",
    )
    .await;
    assert_eq!(dbs, 1);
}

#[tokio::test]
async fn a_terminated_launcher_comes_back() {
    let cluster = preloaded();
    let client = cluster.connect().await;
    let launcher = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_lease launcher'";
    eventually(
        &client,
        &format!("SELECT EXISTS ({launcher})"),
        Duration::from_secs(5),
    )
    .await;
    let old: i32 = scalar(&client, launcher).await;
    let killed: bool = scalar(&client, &format!("SELECT pg_terminate_backend({old})")).await;
    assert!(killed);
    eventually(
        &client,
        &format!("SELECT EXISTS ({launcher} AND pid <> {old})"),
        Duration::from_secs(10),
    )
    .await;
    // And it recovers expired leases again.
    leave_an_expiring_lease(&client).await;
    eventually(
        &client,
        "SELECT state = 'pending' FROM lease.job",
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test]
async fn poison_work_is_dead_lettered_and_cancelled_work_stays_cancelled() {
    let (_cluster, client) = preloaded_with(
            "SELECT lease.create_queue('q', max_attempts => 2, backoff_base => '0', backoff_max => '0');
             SELECT lease.enqueue('q', '{\"poison\": true}');",
        ).await;
    // Two claimers crash on the poison row, one after the other.
    for attempt in 1..=2 {
        let (id, _) = claim_one(&client, "q", "150 milliseconds").await;
        let want = if attempt == 1 { "pending" } else { "dead" };
        state_becomes(&client, id, want).await;
    }
    assert_eq!(
        scalar::<i64>(&client, "SELECT count(*) FROM lease.dead_letters").await,
        1
    );

    client
        .batch_execute("SELECT lease.enqueue('q', '{}')")
        .await
        .expect("enqueue");
    let (id, _) = claim_one(&client, "q", "300 milliseconds").await;
    let said: String = scalar(&client, &format!("SELECT lease.cancel({id})")).await;
    assert_eq!(said, "cancel_requested");
    state_becomes(&client, id, "cancelled").await;
}

#[tokio::test]
async fn finished_rows_are_purged_after_retention() {
    let (_cluster, client) = preloaded_with("SELECT lease.create_queue('q', retention => '200 milliseconds'); SELECT lease.enqueue('q', '{}')").await;
    let (id, epoch) = claim_one(&client, "q", "1 minute").await;
    let done: bool = scalar(
        &client,
        &format!("SELECT lease.release({id}, 'crashed', {epoch})"),
    )
    .await;
    assert!(done);
    assert_eq!(
        scalar::<i64>(
            &client,
            &format!("SELECT count(*) FROM lease.job WHERE id = {id}")
        )
        .await,
        1
    );
    eventually(
        &client,
        &format!("SELECT NOT EXISTS (SELECT FROM lease.job WHERE id = {id})"),
        Duration::from_secs(5),
    )
    .await;
    assert!(scalar::<i64>(&client, "SELECT purged FROM lease.reaper_stats").await >= 1);
}

#[tokio::test]
async fn listeners_are_notified_when_expired_work_is_claimable_again() {
    let (cluster, client) = preloaded_with("SELECT lease.create_queue('wake', backoff_base => '0', backoff_max => '0'); SELECT lease.enqueue('wake', '{}')").await;
    let (id, _) = claim_one(&client, "wake", "300 milliseconds").await;

    let (listener, mut rx) = cluster.listener(TEST_DB, pg_tests::test_user()).await;
    let channel: String = scalar(&client, "SELECT lease.ready_channel('wake')").await;
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .expect("LISTEN");

    let (notified, payload) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a notification within 5 s")
        .expect("the listener is alive");
    assert_eq!(
        (notified.as_str(), payload.as_str()),
        (channel.as_str(), "")
    );
    assert!(
        scalar::<bool>(
            &client,
            &format!("SELECT state = 'pending' FROM lease.job WHERE id = {id}")
        )
        .await
    );
}

#[tokio::test]
async fn settings_reload_on_sighup() {
    let cluster = preloaded();
    let admin = cluster.connect_to("postgres", "postgres").await;
    let client = cluster.connect().await;
    eventually(
        &client,
        "SELECT sweeps > 0 FROM lease.reaper_stats",
        Duration::from_secs(5),
    )
    .await;

    for sql in [
        "ALTER SYSTEM SET lease.reaper_enabled = off",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.expect(sql);
    }
    // Let a pass that was already under way finish, then expect silence.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let paused: i64 = scalar(&client, "SELECT sweeps FROM lease.reaper_stats").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        scalar::<i64>(&client, "SELECT sweeps FROM lease.reaper_stats").await,
        paused
    );

    for sql in [
        "ALTER SYSTEM SET lease.reaper_enabled = on",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.expect(sql);
    }
    // An idle database is swept only when it has work: give it some.
    leave_an_expiring_lease(&client).await;
    eventually(
        &client,
        &format!("SELECT sweeps > {paused} FROM lease.reaper_stats"),
        Duration::from_secs(5),
    )
    .await;
}
