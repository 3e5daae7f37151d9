//! pg_lease inside a sqlx transaction (`pg_lease_client::sqlx`, cargo
//! feature `sqlx`), for services whose pool is sqlx's.
//!
//! Failed before the feature existed (these tests did not compile): a sqlx
//! application could enqueue only on a second, tokio-postgres connection,
//! outside its own transaction.

use std::time::Duration;

use pg_lease_client::{
    sqlx as lease_sqlx, BatchOptions, CancelResult, Client, Error, Outcome, Worker, WorkerConfig,
};
use pg_tests::{scalar, test_user, Cluster, TEST_DB};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

async fn pool(cluster: &Cluster) -> PgPool {
    let url = format!(
        "postgres://{}@127.0.0.1:{}/{TEST_DB}",
        test_user(),
        cluster.port()
    );
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("sqlx pool")
}

/// Rolled back: nothing. Committed: a Worker runs the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_in_a_sqlx_transaction_runs_once_committed() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('mail')")
        .await
        .expect("queue");
    let pool = pool(&cluster).await;

    let mut tx = pool.begin().await.expect("begin");
    lease_sqlx::enqueue(&mut *tx, "mail", &json!({"n": 1}))
        .await
        .expect("enqueue");
    tx.rollback().await.expect("rollback");
    let rows: i64 = scalar(&pg, "SELECT count(*) FROM lease.job").await;
    assert_eq!(rows, 0, "a rolled back enqueue stayed");

    let mut tx = pool.begin().await.expect("begin");
    let id = lease_sqlx::enqueue(&mut *tx, "mail", &json!({"n": 2}))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");

    let (ran_tx, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::new(
        pg_tests::jobs::client(&cluster).await,
        WorkerConfig::new("mail"),
        move |job| {
            let _ = ran_tx.send(job.lease().id());
            async { Ok(Outcome::Done) }
        },
    );
    let (shutdown, handle) = pg_tests::workers::spawn(worker);
    let started = tokio::time::timeout(Duration::from_secs(10), ran.recv())
        .await
        .expect("the worker ran the committed job");
    let summary = pg_tests::workers::stop(shutdown, handle).await;
    assert_eq!(started, Some(id));
    assert_eq!(summary.done, 1);
}

/// A fenced write in a sqlx transaction lands under the current lease and
/// is refused, typed as `LeaseLost`, under a stale epoch.
#[tokio::test]
async fn a_stale_fence_in_a_sqlx_transaction_is_refused() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q');
         CREATE TABLE ledger (note text);",
    )
    .await
    .expect("setup");
    let pool = pool(&cluster).await;
    let client: Client = pg_tests::jobs::client(&cluster).await;
    client.enqueue("q", &json!({})).await.expect("enqueue");
    let lease = client
        .claim(1, Duration::from_secs(30), "a", "q")
        .await
        .expect("claim")
        .pop()
        .expect("a lease")
        .lease;

    let mut tx = pool.begin().await.expect("begin");
    let until = lease_sqlx::fence(&mut *tx, lease.token())
        .await
        .expect("the holder's fence");
    assert!(
        until > std::time::SystemTime::now(),
        "the lease's end: {until:?}"
    );
    sqlx::query("INSERT INTO ledger VALUES ('current')")
        .execute(&mut *tx)
        .await
        .expect("write");
    tx.commit().await.expect("commit");

    client
        .release(&lease, &Outcome::retry("try again"))
        .await
        .expect("release");
    let mut stale = pool.begin().await.expect("begin");
    let err = lease_sqlx::fence(&mut *stale, lease.token())
        .await
        .expect_err("the old epoch's fence");
    assert!(
        matches!(err, Error::LeaseLost { id, .. } if id == lease.id()),
        "{err:?}"
    );
    assert_eq!(err.sqlstate(), Some("LE001"));
    drop(stale);
    let notes: i64 = scalar(&pg, "SELECT count(*) FROM ledger").await;
    assert_eq!(notes, 1, "only the current holder's write");
}

/// Batches, keys, cancel_key and bad input as the `Client` has them.
#[tokio::test]
async fn batches_and_errors_are_the_clients() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('q')")
        .await
        .expect("queue");
    let pool = pool(&cluster).await;

    let mut tx = pool.begin().await.expect("begin");
    let ids = lease_sqlx::enqueue_batch(
        &mut *tx,
        "q",
        &[json!(1), json!(2)],
        &BatchOptions {
            keys: Some(vec![Some("a".into()), None]),
            ..Default::default()
        },
    )
    .await
    .expect("batch");
    assert_eq!(ids.len(), 2);
    assert_eq!(
        lease_sqlx::cancel_key(&mut *tx, "q", "a")
            .await
            .expect("cancel"),
        CancelResult::Cancelled
    );
    tx.commit().await.expect("commit");
    let pending: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE state = 'pending'",
    )
    .await;
    assert_eq!(pending, 1);

    let err = lease_sqlx::enqueue_batch(
        &pool,
        "q",
        &[json!(1), json!(2)],
        &BatchOptions {
            keys: Some(vec![None]),
            ..Default::default()
        },
    )
    .await
    .expect_err("one key for two payloads");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert_eq!(err.sqlstate(), Some("22023"));
    let err = lease_sqlx::enqueue(&pool, "", &json!({}))
        .await
        .expect_err("an empty queue name");
    assert!(err.is_invalid_input(), "{err:?}");
    let rows: i64 = scalar(&pg, "SELECT count(*) FROM lease.job").await;
    assert_eq!(rows, 2, "a refused enqueue added a row");
}
