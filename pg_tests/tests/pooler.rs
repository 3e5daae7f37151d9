//! pg_lease through a real PgBouncer in transaction mode, the version
//! Debian ships (1.18: no prepared statements across transactions), with
//! fewer server connections than clients, so that consecutive transactions
//! of one client land on different server connections.
//!
//! The client connects with `Connector::with_prepared_statements(false)`
//! and Workers with `listen = false`. Each test also checks the server's
//! log for statements lost between server connections. With the option
//! back at `true` (the deliberate break, checked by hand) the calls still
//! succeed, because the client resends a statement the pooler lost on a
//! new connection, but the log shows the losses (SQLSTATE 26000, "prepared
//! statement ... does not exist", and 42P05): each one a failed round trip
//! and a reconnect, and, between processes whose statement names collide,
//! the risk of binding another process's statement.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{
    tx, Client, Connector, Elector, ElectorConfig, EnqueueOptions, Error, Outcome, Worker,
    WorkerConfig,
};
use pg_tests::pgbouncer::Bouncer;
use pg_tests::{scalar, test_user, Cluster, ClusterConfig, TEST_DB};
use serde_json::json;

/// A client through `bouncer`, without prepared statements.
async fn pooled(bouncer: &Bouncer) -> Client {
    let connector = Connector::no_tls(&bouncer.conn_string(TEST_DB, test_user()))
        .expect("connection string")
        .with_prepared_statements(false);
    let client = Client::with_connector(connector);
    client
        .queue_stats()
        .await
        .expect("first call through pgbouncer");
    client
}

/// A plain tokio-postgres connection through `bouncer`.
async fn raw(bouncer: &Bouncer) -> tokio_postgres::Client {
    let (pg, connection) = tokio_postgres::connect(
        &bouncer.conn_string(TEST_DB, test_user()),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect through pgbouncer");
    tokio::spawn(connection);
    pg
}

/// Panics if the server refused a statement name: a prepared statement
/// that the pooler moved away from its server connection (26000) or onto
/// one that already had that name (42P05).
fn assert_no_statement_lost(cluster: &Cluster) {
    let lost: Vec<String> = cluster
        .server_log()
        .lines()
        .filter(|line| line.contains("ERROR:  prepared statement"))
        .map(str::to_owned)
        .collect();
    assert!(lost.is_empty(), "statements lost in the pooler: {lost:#?}");
}

/// Queue `drain` with 2,000 jobs.
async fn fill_drain(client: &Client) {
    pg_tests::jobs::queue(client, "drain").await;
    let payloads: Vec<_> = (0..2_000).map(|n| json!({ "n": n })).collect();
    client
        .enqueue_batch("drain", &payloads, &Default::default())
        .await
        .expect("enqueue");
}

fn worker_config(queue: &str) -> WorkerConfig {
    let mut config = WorkerConfig::new(queue).with_ttl(Duration::from_secs(10));
    config.listen = false;
    config.poll_interval = Duration::from_millis(50);
    config.concurrency = 8;
    config
}

/// Every call of a lease's life, through the pooler, many times over so
/// that statements cross server connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_functions_work_through_transaction_pooling() {
    let cluster = Cluster::start();
    let bouncer = Bouncer::start(&cluster, &[]);
    let client = pooled(&bouncer).await;
    pg_tests::jobs::queue(&client, "q").await;
    for round in 0..20 {
        let keyed = EnqueueOptions {
            key: Some(format!("k{round}")),
            ..Default::default()
        };
        let id = client
            .enqueue_with("q", &json!({ "round": round }), &keyed)
            .await
            .expect("enqueue");
        let claimed = client
            .claim(1, Duration::from_secs(30), "owner", "q")
            .await
            .expect("claim");
        let lease = &claimed.first().expect("a lease").lease;
        assert_eq!(lease.id(), id);
        assert!(
            client
                .renew(lease, Duration::from_secs(30))
                .await
                .expect("renew")
                .held,
            "renewed"
        );
        client
            .fenced_update(lease.token(), &json!({ "seen": round }))
            .await
            .expect("fenced update");
        client
            .release(lease, &Outcome::Done)
            .await
            .expect("release");
    }
    let done: i64 = scalar(
        &cluster.connect().await,
        "SELECT count(*) FROM lease.job WHERE state = 'done' AND payload ? 'seen'",
    )
    .await;
    assert_eq!(done, 20);
    assert_no_statement_lost(&cluster);
}

/// Two Workers share 2,000 jobs through the pooler (polling, no LISTEN):
/// each job runs exactly once and ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_drain_a_queue_exactly_once_through_the_pooler() {
    let cluster = Cluster::start();
    let bouncer = Bouncer::start(&cluster, &[]);
    let client = pooled(&bouncer).await;
    fill_drain(&client).await;

    let starts: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let mut running = Vec::new();
    for _ in 0..2 {
        let starts = Arc::clone(&starts);
        let worker = Worker::new(pooled(&bouncer).await, worker_config("drain"), move |job| {
            *starts
                .lock()
                .expect("starts")
                .entry(job.lease().id())
                .or_default() += 1;
            async { Ok(Outcome::Done) }
        });
        running.push(pg_tests::workers::spawn(worker));
    }
    let pg = cluster.connect().await;
    pg_tests::eventually(
        &pg,
        "SELECT count(*) = 2000 FROM lease.job WHERE queue = 'drain' AND state = 'done'",
        Duration::from_secs(60),
    )
    .await;
    for (shutdown, handle) in running {
        pg_tests::workers::stop(shutdown, handle).await;
    }
    let starts = starts.lock().expect("starts");
    assert_eq!(starts.len(), 2_000, "every job ran");
    assert!(starts.values().all(|n| *n == 1), "a job ran twice");
    assert_no_statement_lost(&cluster);
}

/// An Elector leads through the pooler and fences its writes; a fence in
/// the caller's transaction through the pooler holds for the current
/// lease and refuses a stale epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elector_and_fenced_transactions_work_through_the_pooler() {
    let cluster = Cluster::start();
    let bouncer = Bouncer::start(&cluster, &[]);
    let client = pooled(&bouncer).await;
    let mut elector = Elector::start(
        client.clone(),
        ElectorConfig::new("leader").with_ttl(Duration::from_secs(3)),
    )
    .expect("elector");
    let term = tokio::time::timeout(Duration::from_secs(10), elector.wait_for_term())
        .await
        .expect("leads within 10 s");
    let mut pg = raw(&bouncer).await;
    let write = pg.transaction().await.expect("begin");
    tx::fence_named(&write, "leader", term.epoch())
        .await
        .expect("the leader's fence");
    write.commit().await.expect("commit");
    // Renewals keep it leading across several terms' worth of time.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        term.is_current(),
        "the leader lost its lease through the pooler"
    );
    elector.stop().await;

    pg_tests::jobs::queue(&client, "q").await;
    client.enqueue("q", &json!({})).await.expect("enqueue");
    let lease = client
        .claim(1, Duration::from_secs(30), "owner", "q")
        .await
        .expect("claim")
        .pop()
        .expect("a lease")
        .lease;
    let write = pg.transaction().await.expect("begin");
    tx::fence(&write, lease.token()).await.expect("fence");
    tx::enqueue(&write, "q", &json!({ "follow_up": true }))
        .await
        .expect("enqueue in the fenced transaction");
    write.commit().await.expect("commit");
    client
        .release(&lease, &Outcome::Done)
        .await
        .expect("release");
    let stale = pg.transaction().await.expect("begin");
    let err = tx::fence(&stale, lease.token())
        .await
        .expect_err("a released lease's fence");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert_no_statement_lost(&cluster);
}

/// PgBouncer killed and started again twice while a Worker drains 2,000
/// jobs: every job ends done, and no job started twice under one epoch. A
/// claim whose answer the kill lost leaves its rows leased to nobody who
/// knows: the reaper takes them back after their ttl, under a new epoch (so
/// the cluster runs it, and the ttl is short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_restart_mid_drain_loses_nothing() {
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(200)));
    let mut bouncer = Bouncer::start(&cluster, &[]);
    let client = pooled(&bouncer).await;
    fill_drain(&client).await;

    let starts: Arc<Mutex<HashMap<(i64, i64), u32>>> = Arc::default();
    let worker = {
        let starts = Arc::clone(&starts);
        let config = worker_config("drain").with_ttl(Duration::from_secs(3));
        Worker::new(client.clone(), config, move |job| {
            let token = job.token();
            *starts
                .lock()
                .expect("starts")
                .entry((token.id, token.epoch))
                .or_default() += 1;
            async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(Outcome::Done)
            }
        })
    };
    let (shutdown, handle) = pg_tests::workers::spawn(worker);
    let pg = cluster.connect().await;
    for _ in 0..2 {
        pg_tests::eventually(
            &pg,
            "SELECT count(*) > 0 FROM lease.job WHERE queue = 'drain' AND state = 'leased'",
            Duration::from_secs(20),
        )
        .await;
        tokio::task::block_in_place(|| bouncer.restart(Duration::from_millis(500)));
    }
    pg_tests::eventually(
        &pg,
        "SELECT count(*) = 2000 FROM lease.job WHERE queue = 'drain' AND state = 'done'",
        Duration::from_secs(90),
    )
    .await;
    let summary = pg_tests::workers::stop(shutdown, handle).await;
    let starts = starts.lock().expect("starts");
    let ids: std::collections::HashSet<i64> = starts.keys().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 2_000, "every job ran");
    let twice: Vec<_> = starts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "started twice under one epoch: {twice:?}");
    eprintln!(
        "{} starts for 2000 jobs across two restarts; summary {summary:?}",
        starts.len()
    );
    assert_no_statement_lost(&cluster);
}

/// The README's sqlx outbox (an INSERT of the service's own and
/// `pg_lease_client::sqlx::enqueue`, in one transaction) through the
/// pooler, 100 times from four tasks over a sqlx pool of four connections
/// built as docs/operations.md says (`statement_cache_capacity(0)`): every
/// order and its job, and no statement lost.
///
/// Failed before, with sqlx's default pool options (the README said nothing
/// was needed): `prepared statement "sqlx_s_1" already exists` (42P05).
#[tokio::test]
async fn a_sqlx_outbox_works_through_the_pooler() {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let cluster = Cluster::start();
    let bouncer = Bouncer::start(&cluster, &[]);
    cluster
        .connect()
        .await
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, total integer)")
        .await
        .expect("orders");
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(bouncer.port())
        .username(test_user())
        .database(TEST_DB)
        .statement_cache_capacity(0);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("sqlx pool through pgbouncer");
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    let mut tx = pool.begin().await.expect("begin");
                    let order: i64 =
                        sqlx::query_scalar("INSERT INTO orders (total) VALUES ($1) RETURNING id")
                            .bind(t * 25 + i)
                            .fetch_one(&mut *tx)
                            .await
                            .expect("the service's insert");
                    pg_lease_client::sqlx::enqueue(&mut *tx, "default", &json!({ "order": order }))
                        .await
                        .expect("enqueue");
                    tx.commit().await.expect("commit");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let su = cluster.connect().await;
    let orders: i64 = scalar(&su, "SELECT count(*) FROM orders").await;
    let jobs: i64 = scalar(&su, "SELECT count(*) FROM lease.job").await;
    assert_eq!((orders, jobs), (100, 100));
    assert_no_statement_lost(&cluster);
}
