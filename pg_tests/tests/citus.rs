// pg_tests: library only: Citus preloads beside the library on every node.
//! pg_lease on Citus (`lease.distribute()`, sql/citus.sql): each queue lives
//! on one worker node, and the calls that take a queue are forwarded whole to
//! that node, one round trip, as the Rust client and its `Worker` send them.
//! Faults (a node stopped, the coordinator down) are in `citus_faults.rs`.
//!
//! The tests on a Citus cluster are ignored by default: `bin/test` runs
//! them where `bin/prereqs` could build Citus (PostgreSQL 15) and reports
//! them SKIPPED elsewhere.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use pg_lease_client::{CancelResult, Client, Error, Outcome, QueueOptions, Worker, WorkerConfig};
use pg_tests::citus::{login_role, remote_commands, CitusCluster};
use pg_tests::workers::{spawn, stop};
use pg_tests::{eventually, scalar, sqlstate, Cluster, TEST_DB};

/// Whether lease.job is a Citus distributed table.
async fn job_distributed(client: &tokio_postgres::Client) -> bool {
    scalar(
        client,
        "SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'lease.job'::regclass)",
    )
    .await
}

/// A distributed install of two worker nodes, its superuser session on the
/// coordinator, and a client of the coordinator as `app`, a lease_worker.
async fn distributed_as_app() -> (CitusCluster, tokio_postgres::Client, Client) {
    let citus = CitusCluster::start(2, Duration::from_millis(200));
    let su = citus.coordinator.connect().await;
    su.batch_execute("SELECT lease.distribute()")
        .await
        .expect("distribute");
    login_role(&su, "app", "lease_worker").await;
    let client = Client::connect(&citus.coordinator.conn_string_as(TEST_DB, "app"))
        .await
        .expect("app");
    (citus, su, client)
}

/// Without Citus the call is refused and nothing changes.
#[tokio::test]
async fn distribute_without_citus_is_refused_and_changes_nothing() {
    let cluster = Cluster::start();
    let su = cluster.connect().await;
    let err = su
        .batch_execute("SELECT lease.distribute()")
        .await
        .expect_err("no Citus here");
    assert_eq!(sqlstate(&err).as_deref(), Some("0A000"), "{err}");
    let key: String = scalar(
        &su,
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'job_pkey'",
    )
    .await;
    assert_eq!(key, "PRIMARY KEY (id)");
}

/// Roles of the application may not distribute; the owner does, once, and
/// attach is refused from then on. Then 16 queues spread over both worker
/// nodes; every create_queue, enqueue and claim the Rust client sends is
/// one command to the node holding its queue, never a statement on a
/// table; row ids are unique across nodes (each node's sequence started at
/// its own WAL position before `_assign_id_ranges`); four claimers racing
/// on one queue get every row once.
///
/// Broken on purpose, each once: without `force_custom_plan` on the
/// forwarded functions (`distribute()`), every claim failed ("could not
/// create distributed plan"); with `clock_timestamp()` back in the claim's
/// UPDATE, every claim failed ("must not be VOLATILE"); with that UPDATE
/// not naming its queue, the queue's node sent it to every shard (a remote
/// command that is no forwarded call); without `_assign_id_ranges`, a
/// worker's ids were outside its range. At the end an operator
/// (lease_admin) reads every queue's numbers, its leases in flight and its
/// dead letters; that failed while the client read the views themselves
/// ("permission denied for table counter_102073": Citus reads a view's
/// shards as the querying role), and `lease.metrics` then failed for the
/// owner too until `distribute` allowed `_queue_head` its nested reads
/// ("cannot execute a distributed query from a query on a shard").
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn each_queue_lives_on_one_node_and_its_calls_go_there_whole() {
    let citus = CitusCluster::start(2, Duration::from_millis(200));
    let su = citus.coordinator.connect().await;
    login_role(&su, "app", "lease_worker").await;
    login_role(&su, "ops", "lease_admin").await;
    for role in ["app", "ops"] {
        let attacker = citus.coordinator.connect_to(TEST_DB, role).await;
        let err = attacker
            .batch_execute("SELECT lease.distribute()")
            .await
            .expect_err("only the owner distributes");
        assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{role}: {err}");
    }
    assert!(!job_distributed(&su).await);

    su.batch_execute("SELECT lease.distribute(); SELECT lease.distribute()")
        .await
        .expect("distribute, twice");
    assert!(job_distributed(&su).await);
    let err = su
        .batch_execute(
            "CREATE TABLE invoice (id bigint PRIMARY KEY, status text); \
             SELECT lease.attach('invoice', $$status = 'new'$$)",
        )
        .await
        .expect_err("attach on a distributed install");
    assert_eq!(sqlstate(&err).as_deref(), Some("0A000"), "{err}");
    su.batch_execute(
        "ALTER ROLE app SET citus.log_remote_commands = on; \
         ALTER ROLE ops SET citus.log_remote_commands = on; \
         ALTER ROLE app SET log_min_messages = notice; \
         ALTER ROLE ops SET log_min_messages = notice",
    )
    .await
    .expect("log the remote commands");

    let ops = Client::connect(&citus.coordinator.conn_string_as(TEST_DB, "ops"))
        .await
        .expect("ops");
    let queues: Vec<String> = (0..16).map(|i| format!("q{i:02}")).collect();
    for q in &queues {
        ops.create_queue(q, &QueueOptions::default())
            .await
            .expect("create_queue");
    }
    let app = Client::connect(&citus.coordinator.conn_string_as(TEST_DB, "app"))
        .await
        .expect("app");
    let mut enqueued: BTreeMap<&str, HashSet<i64>> = BTreeMap::new();
    for q in &queues {
        let n = if q == "q00" { 80 } else { 3 };
        for i in 0..n {
            let id = app
                .enqueue(q, &serde_json::json!({ "i": i }))
                .await
                .expect("enqueue");
            enqueued.entry(q).or_default().insert(id);
        }
    }

    // Four claimers race on q00 until it is empty.
    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let conn = citus.coordinator.conn_string_as(TEST_DB, "app");
            tokio::spawn(async move {
                let client = Client::connect(&conn).await.expect("claimer");
                let (mut got, mut calls) = (Vec::new(), 0);
                loop {
                    let rows = client
                        .claim(5, Duration::from_secs(60), &format!("w{w}"), "q00")
                        .await
                        .expect("claim");
                    calls += 1;
                    if rows.is_empty() {
                        return (got, calls);
                    }
                    got.extend(rows.iter().map(|c| c.lease.id()));
                }
            })
        })
        .collect();
    let (mut claimed, mut race_calls) = (Vec::new(), 0);
    for claimer in claimers {
        let (got, calls) = claimer.await.expect("claimer task");
        claimed.extend(got);
        race_calls += calls;
    }
    let distinct: HashSet<i64> = claimed.iter().copied().collect();
    assert_eq!(distinct.len(), claimed.len(), "a row claimed twice");
    assert_eq!(distinct, enqueued["q00"], "every row of q00, once");
    // Each other queue hands out its own rows only.
    for q in &queues[1..] {
        let rows = app
            .claim(10, Duration::from_secs(60), "w9", q)
            .await
            .expect("claim");
        let ids: HashSet<i64> = rows.iter().map(|c| c.lease.id()).collect();
        assert_eq!(ids, enqueued[q.as_str()], "{q}");
    }

    // Where the queues live, and what the coordinator sent where.
    let mut node_of = BTreeMap::new();
    for q in &queues {
        node_of.insert(q.clone(), citus.node_of(&su, q).await.port());
    }
    let nodes: HashSet<u16> = node_of.values().copied().collect();
    assert_eq!(
        nodes.len(),
        2,
        "16 queues on both worker nodes: {node_of:?}"
    );
    // Ids are unique across nodes: each node draws from a range of its own.
    for (q, ids) in &enqueued {
        let group: i32 = su
            .query_one(
                "SELECT groupid FROM pg_dist_node WHERE nodeport = $1",
                &[&i32::from(node_of[*q])],
            )
            .await
            .expect("node group")
            .get(0);
        for id in ids {
            assert_eq!(
                id >> 48,
                i64::from(group),
                "{q}: id {id} outside its node's range"
            );
        }
    }
    let commands = remote_commands(&citus.coordinator);
    let calls = 16 + (80 + 15 * 3) + race_calls + 15;
    for (command, port) in &commands {
        let function = [
            "lease.create_queue(",
            "lease.enqueue(",
            "lease.claim_pending(",
        ]
        .into_iter()
        .find(|f| command.contains(f));
        assert!(
            function.is_some() && command.starts_with("SELECT "),
            "not a forwarded call: {command}"
        );
        let queue = queues
            .iter()
            .find(|q| command.contains(&format!("'{q}'::text")))
            .unwrap_or_else(|| panic!("no queue in {command}"));
        assert_eq!(*port, node_of[queue], "{command}");
    }
    assert_eq!(commands.len(), calls, "one command per call");

    // The operator's numbers of every queue, read through the coordinator.
    let numbers: BTreeMap<String, (i64, i64, i64, i64)> = ops
        .metrics()
        .await
        .expect("metrics")
        .into_iter()
        .map(|m| {
            (
                m.queue,
                (m.ready, m.leased, m.enqueued_total, m.claimed_total),
            )
        })
        .collect();
    let stats: BTreeMap<String, (i64, i64)> = ops
        .queue_stats()
        .await
        .expect("queue_stats")
        .into_iter()
        .map(|s| (s.queue, (s.pending, s.leased)))
        .collect();
    for (q, ids) in &enqueued {
        let n = ids.len() as i64;
        assert_eq!(numbers.get(*q), Some(&(0, n, n, n)), "{q}: {numbers:?}");
        assert_eq!(stats.get(*q), Some(&(0, n)), "{q}: {stats:?}");
    }
    let in_flight = ops.in_flight(Some("q00")).await.expect("in_flight");
    let ids: HashSet<i64> = in_flight.iter().map(|l| l.id).collect();
    assert_eq!(ids, enqueued["q00"]);
    assert!(ops
        .dead_letters(None, 10)
        .await
        .expect("dead_letters")
        .is_empty());
}

/// A `Worker` with the library's defaults (a short ttl so that it renews)
/// runs two queues of a distributed install through the coordinator: every
/// job is done, retried or dead-lettered as its handler says, no lease is
/// lost, and every claim, heartbeat and release it sends is one forwarded
/// call to the node holding its queue.
///
/// Broken on purpose: with lease.release's UPDATE reading clock_timestamp()
/// (not lease._now()), each retry failed on the node ("functions used in
/// the WHERE/ON/WHEN clause of modification queries on distributed tables
/// must not be VOLATILE") and the queues never drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn a_worker_runs_unchanged_on_a_distributed_install() {
    const JOBS: i64 = 40;
    let citus = CitusCluster::start(2, Duration::from_millis(200));
    let su = citus.coordinator.connect().await;
    su.batch_execute("SELECT lease.distribute()")
        .await
        .expect("distribute");
    login_role(&su, "app", "lease_worker").await;
    let admin = Client::connect(&citus.coordinator.conn_string(TEST_DB))
        .await
        .expect("admin");
    let queues = ["wa", "wb"];
    let options = QueueOptions {
        backoff_base: Duration::ZERO,
        backoff_max: Duration::ZERO,
        ..QueueOptions::default()
    };
    for q in queues {
        admin.create_queue(q, &options).await.expect("create_queue");
        for i in 0..JOBS {
            admin
                .enqueue(q, &serde_json::json!({ "i": i }))
                .await
                .expect("enqueue");
        }
    }
    su.batch_execute(
        "ALTER ROLE app SET citus.log_remote_commands = on; \
         ALTER ROLE app SET log_min_messages = notice",
    )
    .await
    .expect("log the remote commands");

    let mut workers = Vec::new();
    for q in queues {
        let client = Client::connect(&citus.coordinator.conn_string_as(TEST_DB, "app"))
            .await
            .expect("app");
        let config = WorkerConfig::new(q).with_ttl(Duration::from_secs(1));
        workers.push(spawn(Worker::new(client, config, |job| async move {
            let i = job.payload()["i"].as_i64().unwrap_or_default();
            Ok(match (i % 10, job.lease().attempt()) {
                // Held across a few heartbeats.
                (0, _) => {
                    tokio::time::sleep(Duration::from_millis(900)).await;
                    Outcome::Done
                }
                (1, 1) => Outcome::retry("once more"),
                (2, _) => Outcome::fail("no"),
                _ => Outcome::Done,
            })
        })));
    }
    let dead_per_queue = JOBS / 10;
    for q in queues {
        eventually(
            &su,
            &format!(
                "SELECT count(*) FILTER (WHERE state <> 'dead') = 0 AND count(*) = {dead_per_queue} \
                 FROM lease.job WHERE queue = '{q}'"
            ),
            Duration::from_secs(60),
        )
        .await;
    }
    for (shutdown, run) in workers {
        let summary = stop(shutdown, run).await;
        assert_eq!(
            (summary.done, summary.retried, summary.failed, summary.lost),
            (
                (JOBS - dead_per_queue) as u64,
                dead_per_queue as u64,
                dead_per_queue as u64,
                0
            ),
            "{summary:?}"
        );
    }

    let node_of: BTreeMap<&str, u16> = {
        let mut m = BTreeMap::new();
        for q in queues {
            m.insert(q, citus.node_of(&su, q).await.port());
        }
        m
    };
    let commands = remote_commands(&citus.coordinator);
    let mut seen = HashSet::new();
    for (command, port) in &commands {
        let function = [
            "lease.claim_pending(",
            "lease.release_and_claim(",
            "lease.renew_batch(",
            "lease.release(",
            "lease.release_batch(",
            "lease.ready_channel(",
            "lease.rate_wait(",
        ]
        .into_iter()
        .find(|f| {
            command.starts_with(&format!("SELECT {f}")) || command.contains(&format!("FROM {f}"))
        })
        .unwrap_or_else(|| panic!("not a forwarded call: {command}"));
        seen.insert(function);
        let queue = queues
            .iter()
            .find(|q| command.contains(&format!("'{q}'::text")))
            .unwrap_or_else(|| panic!("no queue in {command}"));
        assert_eq!(*port, node_of[queue], "{command}");
    }
    assert!(
        seen.contains("lease.renew_batch(") && seen.contains("lease.release_and_claim("),
        "heartbeats and refills went out: {seen:?}"
    );
}

/// On a distributed install a call whose queue is NULL cannot be routed:
/// every forwarded function called so by a lease_worker (create_queue by a
/// lease_admin; the queue written NULL, bound NULL, or left to its NULL
/// default) answers 22004, and fence without its queue 0A000; nothing
/// changes and the coordinator stays up.
///
/// Fails on the code before the refusals: Citus hashes the routing argument
/// while planning the call, and `lease.renew($1, 'o', $2, '1 min')` (queue
/// left to its default) crashed the coordinator with signal 11, as did
/// every forwarded function given a NULL queue.
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn calls_that_name_no_queue_are_refused_and_nothing_crashes() {
    let (citus, su, client) = distributed_as_app().await;
    client
        .enqueue("default", &serde_json::json!({}))
        .await
        .expect("enqueue");
    let claimed = client
        .claim(1, Duration::from_secs(60), "o", "default")
        .await
        .expect("claim");
    let (id, epoch) = (claimed[0].lease.id(), claimed[0].lease.epoch());
    let app = citus.coordinator.connect_to(TEST_DB, "app").await;
    let null_queue: Option<&str> = None;
    let calls = [
        ("SELECT lease.renew($1, 'o', $2, '1 min')", "22004"),
        ("SELECT lease.renew($1, 'o', $2, '1 min', $3)", "22004"),
        ("SELECT * FROM lease.renew_batch(ARRAY[$1::bigint], 'o', ARRAY[$2::bigint], '1 min')", "22004"),
        ("SELECT lease.release($1, 'o', $2, 'retry', queue => $3)", "22004"),
        ("SELECT * FROM lease.release_batch(ARRAY[$1::bigint], 'o', ARRAY[$2::bigint], 'fail')", "22004"),
        ("SELECT * FROM lease.release_and_claim(ARRAY[$1::bigint], 'o', ARRAY[$2::bigint], 1, '1 min', $3)", "22004"),
        ("SELECT * FROM lease.claim_pending(1, '1 min', 'o', $1)", "22004"),
        ("SELECT * FROM lease.reclaim_own(1, '1 min', 'o', NULL)", "22004"),
        ("SELECT lease.enqueue($1, '{}')", "22004"),
        ("SELECT * FROM lease.enqueue_batch(NULL, ARRAY['{}'::jsonb])", "22004"),
        ("SELECT lease.ready_channel($1)", "22004"),
        ("SELECT lease.fenced_update($1, $2, '{}')", "22004"),
        ("SELECT lease.fenced_update($1, $2, '{}', $3)", "22004"),
        ("SELECT lease.cancel($1::bigint + $2::bigint - $2::bigint)", "22004"),
        ("SELECT lease.cancel_key($1, 'k')", "22004"),
        // Not forwarded (it locks the row in the caller's transaction):
        // without its queue it cannot know the row's node.
        ("SELECT lease.fence($1, $2)", "0A000"),
    ];
    for (call, code) in calls {
        let statement = app.prepare(call).await.expect("prepare");
        // (id, epoch, queue), or the queue alone.
        let all: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&id, &epoch, &null_queue];
        let params = match statement.params().len() {
            1 => &all[2..],
            n => &all[..n],
        };
        let err = app
            .query(&statement, params)
            .await
            .expect_err("no queue to route by");
        assert_eq!(sqlstate(&err).as_deref(), Some(code), "{call}: {err}");
    }
    // create_queue is the operators': attacked by one.
    login_role(&su, "ops", "lease_admin").await;
    let ops = citus.coordinator.connect_to(TEST_DB, "ops").await;
    let err = ops
        .batch_execute("SELECT lease.create_queue(NULL)")
        .await
        .expect_err("no queue to route by");
    assert_eq!(sqlstate(&err).as_deref(), Some("22004"), "{err}");
    let (state, now_epoch): (String, i64) = {
        let row = su
            .query_one(
                "SELECT state::text, epoch FROM lease.job WHERE id = $1",
                &[&id],
            )
            .await
            .expect("the row");
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (state.as_str(), now_epoch),
        ("leased", epoch),
        "nothing changed"
    );
    assert!(
        !citus
            .coordinator
            .server_log()
            .contains("terminated by signal"),
        "the coordinator crashed"
    );
}

/// Fenced writes given their queue hold on a distributed install:
/// `fenced_update` is forwarded to the queue's node, `lease.fence` in the
/// caller's transaction on the coordinator locks the row on that node until
/// the transaction ends (a cancel of the row waits for it), and a `Worker`
/// handler's `job.fenced_update` and `job.transaction()` work unchanged.
///
/// Fails on the code before: fence, fenced_update and cancel took only the
/// row's id and refused every call on a distributed install (0A000), so
/// each of these steps failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn fenced_writes_hold_on_the_queues_node() {
    const JOBS: i64 = 10;
    let (citus, su, client) = distributed_as_app().await;
    su.batch_execute(
        "CREATE TABLE sent (id bigint PRIMARY KEY); GRANT INSERT, SELECT ON sent TO app",
    )
    .await
    .expect("the application's table");
    let kept = QueueOptions {
        retention: Duration::from_secs(3600),
        ..QueueOptions::default()
    };
    let admin = Client::connect(&citus.coordinator.conn_string(TEST_DB))
        .await
        .expect("admin");
    admin.create_queue("fq", &kept).await.expect("create_queue");

    // By hand: the fenced write, then the fence in a transaction.
    client
        .enqueue("fq", &serde_json::json!({}))
        .await
        .expect("enqueue");
    let claimed = client
        .claim(1, Duration::from_secs(60), "o", "fq")
        .await
        .expect("claim");
    let lease = &claimed[0].lease;
    client
        .fenced_update_in("fq", lease.token(), &serde_json::json!({ "by": "o" }))
        .await
        .expect("fenced_update_in");
    let stale = pg_lease_client::FencingToken {
        epoch: lease.epoch() - 1,
        ..lease.token()
    };
    assert!(matches!(
        client
            .fenced_update_in("fq", stale, &serde_json::json!({ "by": "zombie" }))
            .await,
        Err(pg_lease_client::Error::LeaseLost { .. })
    ));
    let mut holder = citus.coordinator.connect_to(TEST_DB, "app").await;
    let tx = holder.transaction().await.expect("begin");
    pg_lease_client::fence_in(&tx, "fq", lease.token())
        .await
        .expect("fence_in");
    let canceller = citus.coordinator.connect_to(TEST_DB, "app").await;
    let id = lease.id();
    let cancel = tokio::spawn(async move {
        canceller
            .query_one("SELECT lease.cancel($1, 'fq')", &[&id])
            .await
            .map(|row| row.get::<_, String>(0))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !cancel.is_finished(),
        "the fence's lock on the queue's node holds a cancel off"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        cancel.await.expect("task").expect("cancel"),
        "cancel_requested"
    );
    assert_eq!(
        scalar::<String>(
            &su,
            &format!("SELECT payload->>'by' FROM lease.job WHERE queue = 'fq' AND id = {id}")
        )
        .await,
        "o"
    );

    // A Worker's handler, unchanged.
    for i in 0..JOBS {
        client
            .enqueue("fq", &serde_json::json!({ "i": i }))
            .await
            .expect("enqueue");
    }
    let config = WorkerConfig::new("fq").with_ttl(Duration::from_secs(5));
    let (shutdown, run) = spawn(Worker::new(client, config, |job| async move {
        job.fenced_update(&serde_json::json!({ "seen": true }))
            .await?;
        let tx = job.transaction().await?;
        tx.execute("INSERT INTO sent VALUES ($1)", &[&job.lease().id()])
            .await?;
        tx.commit().await?;
        Ok(Outcome::Done)
    }));
    eventually(
        &su,
        &format!(
            "SELECT count(*) = {JOBS} FROM lease.job \
             WHERE queue = 'fq' AND state = 'done' AND payload ? 'seen'"
        ),
        Duration::from_secs(60),
    )
    .await;
    let summary = stop(shutdown, run).await;
    assert_eq!(
        (summary.done, summary.lost),
        (JOBS as u64, 0),
        "{summary:?}"
    );
    assert_eq!(scalar::<i64>(&su, "SELECT count(*) FROM sent").await, JOBS);
}

/// Calls that name no single queue to forward to run on the coordinator of
/// a distributed install: an operator's (a `lease_admin`) `purge_dead` of
/// one queue, `purge` of every queue's finished rows past their retention
/// and `recount` (with a held row of a concurrency key), and a producer's
/// cancel by id alone (`Client::cancel`): a pending row is cancelled, a
/// leased one marked, an unknown id not found, and a row of a restricted
/// queue the producer holds no right on refused (42501).
///
/// Fails on the code before: `purge_dead` checked its queue inside a read
/// that Citus sent to the queue's node ("cannot execute a distributed query
/// from a query on a shard"), `purge` and `recount` locked rows of every
/// shard in one statement ("could not run distributed query with FOR
/// UPDATE/SHARE commands"), and `Client::cancel` sent a NULL queue (22004).
#[tokio::test]
#[ignore = "needs Citus: bin/test runs it where bin/prereqs built Citus"]
async fn calls_that_forward_to_no_one_queue_run_on_the_coordinator() {
    let (citus, su, app) = distributed_as_app().await;
    login_role(&su, "ops", "lease_admin").await;
    let ops = Client::connect(&citus.coordinator.conn_string_as(TEST_DB, "ops"))
        .await
        .expect("ops");
    let gone_at_once = QueueOptions {
        dead_retention: Duration::ZERO,
        max_attempts: 1,
        ..QueueOptions::default()
    };
    let keyed = QueueOptions {
        concurrency: Some(1),
        ..QueueOptions::default()
    };
    for (q, options) in [
        ("kept", QueueOptions::default()),
        ("swept", gone_at_once),
        ("keyed", keyed),
    ] {
        ops.create_queue(q, &options).await.expect("create_queue");
    }
    for q in ["kept", "swept"] {
        for i in 0..3 {
            app.enqueue(q, &serde_json::json!({ "i": i }))
                .await
                .expect("enqueue");
        }
        for claim in app
            .claim(3, Duration::from_secs(60), "w", q)
            .await
            .expect("claim")
        {
            app.release(&claim.lease, &Outcome::fail("no"))
                .await
                .expect("fail");
        }
    }
    for i in 0..2 {
        app.enqueue_with(
            "keyed",
            &serde_json::json!({ "i": i }),
            &pg_lease_client::EnqueueOptions {
                concurrency_key: Some("k".to_owned()),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue keyed");
    }

    assert_eq!(ops.purge_dead("kept").await.expect("purge_dead"), 3);
    // The nodes' reapers purge too: whoever comes first, they go.
    ops.purge(1000).await.expect("purge");
    eventually(
        &su,
        "SELECT count(*) = 0 FROM lease.job WHERE queue IN ('kept', 'swept')",
        Duration::from_secs(10),
    )
    .await;
    let ops_sql = citus.coordinator.connect_to(TEST_DB, "ops").await;
    let fixed: i64 = scalar(&ops_sql, "SELECT lease.recount()").await;
    assert_eq!(fixed, 0, "the counters were right");
    let held: i64 = scalar(
        &su,
        "SELECT count(*) FILTER (WHERE held) FROM lease.job WHERE queue = 'keyed'",
    )
    .await;
    assert_eq!(held, 1, "one of the key's two rows waits for its slot");

    let leased = app
        .enqueue("kept", &serde_json::json!({}))
        .await
        .expect("enqueue");
    let pending = app
        .enqueue("kept", &serde_json::json!({}))
        .await
        .expect("enqueue");
    let claimed = app
        .claim(1, Duration::from_secs(60), "w", "kept")
        .await
        .expect("claim");
    assert_eq!(claimed[0].lease.id(), leased);
    ops.create_queue("private", &QueueOptions::default())
        .await
        .expect("create_queue");
    let private = ops
        .enqueue("private", &serde_json::json!({}))
        .await
        .expect("enqueue");
    su.batch_execute("CREATE ROLE other; SELECT lease.grant('private', 'other')")
        .await
        .expect("restrict");
    assert_eq!(
        app.cancel(leased).await.expect("cancel leased"),
        CancelResult::CancelRequested
    );
    assert_eq!(
        app.cancel(pending).await.expect("cancel pending"),
        CancelResult::Cancelled
    );
    assert_eq!(
        app.cancel(private + 1_000_000)
            .await
            .expect("cancel unknown"),
        CancelResult::NotFound
    );
    let err = app.cancel(private).await.expect_err("not its queue");
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let state: String = scalar(
        &su,
        &format!("SELECT state::text FROM lease.job WHERE id = {private}"),
    )
    .await;
    assert_eq!(state, "pending");
}
