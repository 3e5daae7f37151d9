// pg_tests: library only: Citus preloads beside the library on every node.
//! pg_lease on Citus when nodes fail or move: a stopped worker node stops
//! only its own queues, each node's reaper recovers its queues' leases
//! without the coordinator, and a shard move keeps every lease.
//!
//! The tests on a Citus cluster are ignored by default: `bin/test` runs
//! them where `bin/prereqs` could build Citus (PostgreSQL 15) and reports
//! them SKIPPED elsewhere.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use pg_lease_client::{Client, QueueOptions};
use pg_tests::citus::CitusCluster;
use pg_tests::{scalar, Cluster, TEST_DB};

/// A distributed install of two worker nodes, its superuser session on the
/// coordinator, and a client of the coordinator.
async fn distributed() -> (CitusCluster, tokio_postgres::Client, Client) {
    let citus = CitusCluster::start(2, Duration::from_millis(200));
    let su = citus.coordinator.connect().await;
    su.batch_execute("SELECT lease.distribute()")
        .await
        .expect("distribute");
    let client = Client::connect(&citus.coordinator.conn_string(TEST_DB))
        .await
        .expect("client");
    (citus, su, client)
}

/// Queue options whose retries and expiries are due again at once.
fn no_backoff() -> QueueOptions {
    QueueOptions {
        backoff_base: Duration::ZERO,
        backoff_max: Duration::ZERO,
        ..QueueOptions::default()
    }
}

/// A worker node stops: the queues of the other node go on, a call for a
/// queue of the stopped node fails at once with an error, and when the node
/// is back its rows are all there, each handed out once.
///
/// Broken on purpose: with the claim's UPDATE not naming its queue (sent
/// to every shard), claims of the live node's queues failed too.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn a_stopped_node_stops_only_its_own_queues() {
    let (citus, su, client) = distributed().await;
    let queues: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    let mut on: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for q in &queues {
        client
            .create_queue(q, &QueueOptions::default())
            .await
            .expect("create_queue");
        for i in 0..10 {
            client
                .enqueue(q, &serde_json::json!({ "i": i }))
                .await
                .expect("enqueue");
        }
        on.entry(citus.node_of(&su, q).await.port())
            .or_default()
            .push(q);
    }
    let stopped = &citus.workers[1];
    let (Some(down), Some(up)) = (on.get(&stopped.port()), on.get(&citus.workers[0].port())) else {
        panic!("8 queues on one node only: {on:?}");
    };
    let mut seen = HashSet::new();
    let mut claim_all = |rows: Vec<pg_lease_client::Claimed>| {
        for c in rows {
            assert!(
                seen.insert(c.lease.id()),
                "row {} handed out twice",
                c.lease.id()
            );
        }
    };

    stopped.crash();
    for q in up {
        let started = Instant::now();
        client
            .enqueue(q, &serde_json::json!({ "i": 10 }))
            .await
            .expect("enqueue on the live node");
        let rows = client
            .claim(100, Duration::from_secs(60), "w", q)
            .await
            .expect("claim on the live node");
        assert_eq!(rows.len(), 11, "{q}");
        claim_all(rows);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{q}: {:?}",
            started.elapsed()
        );
    }
    for q in down {
        let started = Instant::now();
        let err = client
            .claim(100, Duration::from_secs(60), "w", q)
            .await
            .expect_err("its node is down");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{q}: {:?}",
            started.elapsed()
        );
        // Citus's "connection to the remote node ... failed": a transient
        // error, which a Worker retries.
        assert_eq!(err.sqlstate(), Some("08006"), "{err}");
        assert!(err.is_transient(), "{err}");
    }

    stopped.restart_immediate();
    for q in down {
        let rows = client
            .claim(100, Duration::from_secs(60), "w", q)
            .await
            .expect("claim once the node is back");
        assert_eq!(rows.len(), 10, "{q}: every row of the stopped node, once");
        claim_all(rows);
    }
}

/// Each worker node's reaper recovers the expired leases of the queues that
/// node holds while the coordinator is down, and a client of that node
/// claims them again there: recovery needs no coordinator. Every row comes
/// back once, under a greater epoch, and each node's latest sweep records
/// no failure.
///
/// Broken on purpose: with lease.sweep running its single-node steps on a
/// distributed install, every node's sweep failed in part (bound sessions,
/// purge, concurrency slots: 0A000, Citus cannot run them over every
/// shard); its fallback reaped queue by queue, other nodes' queues too.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn each_node_reaps_its_own_queues_without_the_coordinator() {
    let (citus, su, client) = distributed().await;
    let options = no_backoff();
    let mut held: BTreeMap<String, BTreeMap<i64, i64>> = BTreeMap::new();
    let mut port_of = BTreeMap::new();
    for q in (0..6).map(|i| format!("r{i}")) {
        client
            .create_queue(&q, &options)
            .await
            .expect("create_queue");
        for i in 0..5 {
            client
                .enqueue(&q, &serde_json::json!({ "i": i }))
                .await
                .expect("enqueue");
        }
        let rows = client
            .claim(10, Duration::from_secs(1), "gone", &q)
            .await
            .expect("claim");
        assert_eq!(rows.len(), 5, "{q}");
        held.insert(
            q.clone(),
            rows.iter()
                .map(|c| (c.lease.id(), c.lease.epoch()))
                .collect(),
        );
        port_of.insert(q.clone(), citus.node_of(&su, &q).await.port());
    }
    let nodes: HashSet<u16> = port_of.values().copied().collect();
    assert_eq!(nodes.len(), 2, "6 queues on both nodes: {port_of:?}");
    drop((client, su));
    citus.coordinator.crash();

    for node in &citus.workers {
        let pg = node.connect().await;
        for (q, old) in held.iter().filter(|(q, _)| port_of[*q] == node.port()) {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut again = BTreeMap::new();
            while again.len() < old.len() {
                assert!(
                    Instant::now() < deadline,
                    "{q}: back so far {again:?} of {old:?}"
                );
                for row in pg
                    .query(
                        "SELECT id, epoch FROM lease.claim_pending(10, '1 min', 'heir', $1)",
                        &[q],
                    )
                    .await
                    .expect("claim on the queue's node")
                {
                    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
                    assert!(again.insert(id, epoch).is_none(), "{q}: row {id} twice");
                    assert!(
                        epoch > old[&id],
                        "{q}: row {id} epoch {epoch} after {}",
                        old[&id]
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                again.keys().collect::<Vec<_>>(),
                old.keys().collect::<Vec<_>>(),
                "{q}"
            );
        }
        // The latest sweep recorded no failure (one that ran while
        // lease.distribute() was turning the tables may have).
        let failed: Option<String> = scalar(
            &pg,
            "SELECT CASE WHEN last_error_at >= last_sweep_at THEN last_error END FROM lease.sweep_state",
        )
        .await;
        assert_eq!(failed, None, "node {}", node.port());
        let sweeps: i64 = scalar(&pg, "SELECT sweeps FROM lease.sweep_state").await;
        assert!(sweeps > 0, "node {}", node.port());
    }
}

/// A queue's shards move to the other worker node (the rebalancer's step)
/// while leases of the queue are held: the holder renews and releases them
/// through the coordinator at the new node under the same tokens, the
/// leases that expired meanwhile are recovered there by that node's reaper
/// under new epochs, and no row is lost or handed out twice.
///
/// Failed first: the nodes' reapers had swept once, before
/// `lease.distribute()`, found nothing due and never swept again (forwarded
/// calls mark nothing due on the node), so the expired leases never came
/// back; wherever Citus is installed `_next_sweep_due` now answers one
/// `lease.sweep_interval` from now.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn a_shard_move_keeps_every_lease_and_its_fencing() {
    let (citus, su, client) = distributed().await;
    let options = no_backoff();
    client
        .create_queue("m", &options)
        .await
        .expect("create_queue");
    for i in 0..10 {
        client
            .enqueue("m", &serde_json::json!({ "i": i }))
            .await
            .expect("enqueue");
    }
    let held = client
        .claim(5, Duration::from_secs(120), "holder", "m")
        .await
        .expect("claim");
    let gone = client
        .claim(5, Duration::from_secs(1), "gone", "m")
        .await
        .expect("claim");
    assert_eq!((held.len(), gone.len()), (5, 5));

    let from = citus.node_of(&su, "m").await.port();
    let to = citus
        .workers
        .iter()
        .map(Cluster::port)
        .find(|p| *p != from)
        .expect("another worker node");
    su.execute(
        "SELECT citus_move_shard_placement(
                    get_shard_id_for_distribution_column('lease.job', 'm'),
                    '127.0.0.1', $1, '127.0.0.1', $2, shard_transfer_mode => 'block_writes')",
        &[&i32::from(from), &i32::from(to)],
    )
    .await
    .expect("move the queue's shards");
    assert_eq!(citus.node_of(&su, "m").await.port(), to, "moved");

    let tokens: Vec<_> = held.iter().map(|c| c.lease.token()).collect();
    let renewed = client
        .renew_batch("holder", &tokens, "m", Duration::from_secs(120))
        .await
        .expect("renew after the move");
    assert!(renewed.iter().all(|r| r.held), "{renewed:?}");

    let old: BTreeMap<i64, i64> = gone
        .iter()
        .map(|c| (c.lease.id(), c.lease.epoch()))
        .collect();
    let mut again = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while again.len() < old.len() {
        assert!(
            Instant::now() < deadline,
            "back so far {again:?} of {old:?}"
        );
        for c in client
            .claim(10, Duration::from_secs(120), "heir", "m")
            .await
            .expect("claim after the move")
        {
            let (id, epoch) = (c.lease.id(), c.lease.epoch());
            assert!(old.contains_key(&id), "row {id} was not expired");
            assert!(
                epoch > old[&id],
                "row {id}: epoch {epoch} after {}",
                old[&id]
            );
            assert!(again.insert(id, epoch).is_none(), "row {id} twice");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let released = client
        .release_batch("holder", &tokens, "m", &pg_lease_client::Outcome::Done)
        .await
        .expect("release after the move");
    assert_eq!(released, [true; 5]);
    let stale = client
        .renew_batch(
            "gone",
            &gone.iter().map(|c| c.lease.token()).collect::<Vec<_>>(),
            "m",
            Duration::from_secs(60),
        )
        .await
        .expect("renew of the expired leases");
    assert!(stale.iter().all(|r| !r.held), "fenced: {stale:?}");
    let left: i64 = scalar(
        &su,
        "SELECT count(*) FROM lease.job WHERE queue = 'm' AND state = 'leased'",
    )
    .await;
    assert_eq!(left, 5, "the heir's five leases, nothing else");
}
