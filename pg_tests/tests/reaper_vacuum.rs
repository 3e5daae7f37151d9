//! The sweeper's vacuum of `lease.job` (extension/src/vacuum.rs), against
//! preloaded clusters with autovacuum off, so that nothing else vacuums.
//!
//! Issue 15 reported the defect: under sustained churn `lease.job` grew from
//! 1.5 MB to 185 MB in 120 s, because only autovacuum cleaned it, once per
//! naptime. Both tests failed before the sweeper vacuumed (no vacuum ever
//! ran). Broken on purpose: with the horizon check removed from
//! `vacuum::due`, the pinned-snapshot test saw a vacuum on nearly every pass
//! and failed.

use std::time::{Duration, Instant};

use pg_tests::{eventually, reaper_conf, scalar, Cluster, ClusterConfig};
use tokio_postgres::Client;

/// Rows each round of churn puts through the queue.
const ROUND: i64 = 1000;

/// A preloaded cluster sweeping every 100 ms, with autovacuum off and the
/// sweeper vacuuming at 2,000 dead rows beyond the live ones.
async fn churning_cluster() -> (Cluster, Client) {
    let mut extra_conf = reaper_conf(Duration::from_millis(100));
    extra_conf.push("autovacuum = off".into());
    extra_conf.push("lease.vacuum_dead_rows = 2000".into());
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf,
        ..ClusterConfig::default()
    });
    let client = cluster.connect().await;
    client
        .batch_execute("SELECT lease.create_queue('churn')")
        .await
        .expect("queue");
    (cluster, client)
}

/// One round: enqueue [`ROUND`] rows, claim them, complete them. Each row
/// leaves two dead versions (its claim's and its deletion's). The claim
/// marks the database for the reaper.
async fn churn_round(client: &Client) {
    client
        .batch_execute(&format!(
            "SELECT lease.enqueue_batch('churn', array_fill('{{}}'::jsonb, ARRAY[{ROUND}]));
             SELECT lease.release_batch(array_agg(id), 'w', array_agg(epoch))
               FROM lease.claim_pending({ROUND}, '1 minute', 'w', 'churn');"
        ))
        .await
        .expect("a round of churn");
}

/// How often `lease.job` was vacuumed by hand (the sweeper's vacuum counts
/// as manual; autovacuum is off).
async fn vacuums(client: &Client) -> i64 {
    scalar(
        client,
        "SELECT pg_stat_get_vacuum_count('lease.job'::regclass)",
    )
    .await
}

/// Fails on the code before the fix: nothing vacuumed `lease.job`, so after
/// 40 rounds (80,000 dead versions) it held every one of them.
#[tokio::test]
async fn the_sweeper_vacuums_a_churning_job_table() {
    let (_cluster, client) = churning_cluster().await;
    for _ in 0..40 {
        churn_round(&client).await;
        // Room for a pass and for the backends' statistics to arrive.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(
        &client,
        "SELECT pg_stat_get_vacuum_count('lease.job'::regclass) > 0",
        Duration::from_secs(15),
    )
    .await;
    // Every vacuum made room that the next rounds filled again, so the table
    // holds a few rounds' versions, not all 80,000 (~11 MB here).
    let bytes: i64 = scalar(&client, "SELECT pg_relation_size('lease.job')").await;
    assert!(
        bytes < 4 << 20,
        "lease.job is {bytes} bytes after {} vacuums",
        vacuums(&client).await
    );
}

/// With a snapshot held open, vacuums remove nothing; the sweeper must not
/// vacuum again while the removal horizon stands still. Fails on the code
/// before the fix (no vacuum at all) and with the horizon check removed
/// (49 vacuums in the 8 s run).
#[tokio::test]
async fn a_pinned_snapshot_does_not_make_the_sweeper_vacuum_every_pass() {
    let (cluster, client) = churning_cluster().await;
    let pinner = cluster.connect().await;
    pinner
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lease.job")
        .await
        .expect("a held snapshot");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        churn_round(&client).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = vacuums(&client).await;
    assert!(
        done >= 1,
        "the dead rows were over the threshold: one vacuum at least"
    );
    // The first vacuum ran at the pinned horizon; nothing could move it.
    assert!(
        done <= 2,
        "{done} vacuums while a snapshot pinned every dead row"
    );
    pinner.batch_execute("COMMIT").await.expect("commit");
}
