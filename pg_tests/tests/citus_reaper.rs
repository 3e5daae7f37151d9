// pg_tests: library only: Citus preloads beside the library on every node.
//! The reaper on a distributed install of Citus: what it costs when
//! nothing happens (one sweep per `lease.sweep_interval` on each node, each
//! on that node's own shards, with no connection to any node), and the
//! schedules, which the coordinator's reaper runs.
//!
//! The tests on a Citus cluster are ignored by default: `bin/test` runs
//! them where `bin/prereqs` could build Citus (PostgreSQL 15) and reports
//! them SKIPPED elsewhere.

use std::time::Duration;

use pg_tests::citus::CitusCluster;
use pg_tests::{eventually, scalar, Cluster};

/// The sweeps `node` has run in its database so far.
async fn sweeps(node: &Cluster) -> i64 {
    scalar(
        &node.connect().await,
        "SELECT sweeps FROM lease.reaper_stats",
    )
    .await
}

/// The connections that processes of the node with id `node_id` opened to
/// `to` (Citus names the node of the process in `application_name`:
/// `citus_internal gpid=<node id × 10^10 + pid>`).
fn connections_from(node_id: i64, to: &Cluster) -> usize {
    to.server_log()
        .lines()
        .filter(|line| line.contains("connection authorized"))
        .filter_map(|line| line.split_once("application_name=citus_internal gpid="))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<i64>().ok())
        .filter(|gpid| gpid / 10_000_000_000 == node_id)
        .count()
}

/// An idle distributed install: each worker node sweeps about once per
/// `lease.sweep_interval`, and its sweeps open no connection to any node,
/// itself included.
///
/// Fails on the code before: where Citus was installed the reaper was due
/// again at once after every sweep, so each node swept every 100 ms, and
/// each sweep read `lease.counter` (its vacuum's count of changed rows)
/// across every shard, over new connections to every node holding one,
/// its own included: an idle worker node spent half a core on it.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn an_idle_distributed_install_sweeps_each_interval_on_its_own_shards() {
    const INTERVAL: Duration = Duration::from_secs(1);
    const WINDOW: Duration = Duration::from_secs(6);
    let citus = CitusCluster::start_with(2, INTERVAL, &["log_connections = on"]);
    let su = citus.coordinator.connect().await;
    su.batch_execute(
        "SELECT lease.distribute();
         SELECT lease.create_queue('q' || i) FROM generate_series(1, 8) AS i;",
    )
    .await
    .expect("distribute");
    // What distributing and creating queues asked of the reaper is done.
    tokio::time::sleep(3 * INTERVAL).await;

    let mut before = Vec::new();
    for worker in &citus.workers {
        let id: i32 = su
            .query_one(
                "SELECT nodeid FROM pg_dist_node WHERE nodeport = $1",
                &[&i32::from(worker.port())],
            )
            .await
            .expect("node id")
            .get(0);
        let nodes = std::iter::once(&citus.coordinator).chain(&citus.workers);
        let opened: usize = nodes.map(|to| connections_from(id.into(), to)).sum();
        before.push((id, sweeps(worker).await, opened));
    }
    tokio::time::sleep(WINDOW).await;
    let most = (WINDOW.as_millis() / INTERVAL.as_millis()) as i64 + 2;
    for (worker, (id, swept, opened)) in citus.workers.iter().zip(before) {
        let now = sweeps(worker).await;
        let nodes = std::iter::once(&citus.coordinator).chain(&citus.workers);
        let now_opened: usize = nodes.map(|to| connections_from(id.into(), to)).sum();
        eprintln!(
            "node {id}: {} sweeps, {} connections opened in {WINDOW:?}",
            now - swept,
            now_opened - opened
        );
        assert!(now > swept, "node {id} swept in {WINDOW:?}");
        assert!(
            now - swept <= most,
            "node {id} swept {} times in {WINDOW:?} (interval {INTERVAL:?})",
            now - swept
        );
        assert_eq!(
            now_opened - opened,
            0,
            "connections opened by node {id}'s processes while idle"
        );
    }
}

/// Schedules on a distributed install: the coordinator holds them, and its
/// reaper enqueues each occurrence once, on time, into the node that holds
/// the schedule's queue.
///
/// Fails on the code before: a distributed install's sweep ran no
/// schedules, and no occurrence was ever enqueued.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn the_coordinator_enqueues_each_occurrence_of_a_schedule() {
    let citus = CitusCluster::start(2, Duration::from_secs(1));
    let su = citus.coordinator.connect().await;
    su.batch_execute(
        "SELECT lease.distribute();
         SELECT lease.create_queue('ticks');
         SELECT lease.schedule('second', 'ticks', every => '1 second');",
    )
    .await
    .expect("set up");
    eventually(
        &su,
        "SELECT count(*) >= 5 FROM lease.job WHERE queue = 'ticks'",
        Duration::from_secs(20),
    )
    .await;
    pg_tests::jobs::assert_occurrences(&su, "ticks", 0.5).await;
    let errors: Option<String> = scalar(&su, "SELECT last_error FROM lease.schedule").await;
    assert_eq!(errors, None);
}
