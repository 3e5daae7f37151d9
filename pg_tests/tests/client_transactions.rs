//! Enqueueing inside the caller's own transaction (`pg_lease_client::tx`):
//! the outbox pattern, where a job must exist exactly when the service's
//! own row does.
//!
//! Failed before `tx` existed: the client could enqueue only on its own
//! connection, in a transaction of its own, so these tests did not compile;
//! a job enqueued beside a write that then rolled back stayed queued.

use std::time::Duration;

use pg_lease_client::{
    tx, BatchOptions, CancelResult, CancellationToken, EnqueueOptions, Error, Outcome, Worker,
    WorkerConfig,
};
use pg_tests::{scalar, test_user, Cluster, TEST_DB};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{timeout, Instant};

/// A table of the service's own, beside the queue `mail`.
async fn service(cluster: &Cluster) -> tokio_postgres::Client {
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('mail');
         CREATE TABLE orders (id bigserial PRIMARY KEY, total int NOT NULL);",
    )
    .await
    .expect("queue and table");
    pg
}

/// A connection listening on `mail`'s channel, and its notifications.
async fn listen(
    cluster: &Cluster,
) -> (tokio_postgres::Client, UnboundedReceiver<(String, String)>) {
    let (listener, notes) = cluster.listener(TEST_DB, test_user()).await;
    let channel: String = scalar(&listener, "SELECT lease.ready_channel('mail')").await;
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .expect("listen");
    (listener, notes)
}

async fn rows_in_mail(pg: &tokio_postgres::Client) -> i64 {
    scalar(pg, "SELECT count(*) FROM lease.job WHERE queue = 'mail'").await
}

/// A rollback takes the job with the order: no row, no NOTIFY. A commit
/// makes both visible together, and the NOTIFY goes out with it, not
/// before.
#[tokio::test]
async fn a_job_commits_and_rolls_back_with_the_callers_writes() {
    let cluster = Cluster::start();
    let mut pg = service(&cluster).await;
    let observer = cluster.connect().await;
    let (_listener, mut notes) = listen(&cluster).await;

    let order = pg.transaction().await.expect("begin");
    order
        .execute("INSERT INTO orders (total) VALUES (1)", &[])
        .await
        .expect("order");
    tx::enqueue(&order, "mail", &json!({"order": 1}))
        .await
        .expect("enqueue");
    tx::enqueue_batch(
        &order,
        "mail",
        &[json!({"n": 2}), json!({"n": 3})],
        &BatchOptions::default(),
    )
    .await
    .expect("enqueue_batch");
    order.rollback().await.expect("rollback");
    assert_eq!(rows_in_mail(&observer).await, 0, "a rolled back job stayed");
    assert!(
        timeout(Duration::from_millis(500), notes.recv())
            .await
            .is_err(),
        "a rolled back enqueue woke a listener"
    );

    let order = pg.transaction().await.expect("begin");
    let id = tx::enqueue(&order, "mail", &json!({"order": 2}))
        .await
        .expect("enqueue");
    assert_eq!(rows_in_mail(&observer).await, 0, "seen before the commit");
    assert!(
        timeout(Duration::from_millis(300), notes.recv())
            .await
            .is_err(),
        "notified before the commit"
    );
    order.commit().await.expect("commit");
    timeout(Duration::from_secs(2), notes.recv())
        .await
        .expect("notified at the commit")
        .expect("listener open");
    let visible: i64 = scalar(
        &observer,
        &format!("SELECT count(*) FROM lease.job WHERE id = {id} AND state = 'pending'"),
    )
    .await;
    assert_eq!(visible, 1, "the committed job is pending");
}

/// A Worker that would otherwise poll once a minute starts the job as soon
/// as the caller commits, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_wakes_a_listening_worker_at_once() {
    let cluster = Cluster::start();
    let mut pg = service(&cluster).await;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let mut config = WorkerConfig::new("mail");
    config.poll_interval = Duration::from_secs(60);
    let worker = Worker::new(
        pg_tests::jobs::client(&cluster).await,
        config,
        move |_job| {
            let started_tx = started_tx.clone();
            async move {
                let _ = started_tx.send(Instant::now());
                Ok(Outcome::Done)
            }
        },
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    // Its first claim (finding nothing) and its LISTEN are behind it.
    pg_tests::eventually(
        &pg,
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let order = pg.transaction().await.expect("begin");
    tx::enqueue(&order, "mail", &json!({"order": 3}))
        .await
        .expect("enqueue");
    assert!(
        timeout(Duration::from_millis(500), started.recv())
            .await
            .is_err(),
        "the worker ran a job that was not committed"
    );
    order.commit().await.expect("commit");
    let committed = Instant::now();
    let ran = timeout(Duration::from_secs(5), started.recv())
        .await
        .expect("the worker was woken by the commit, not its minute poll")
        .expect("handler");
    shutdown.cancel();
    run.await.expect("task").expect("run");
    eprintln!("started {:?} after the commit", ran - committed);
}

/// Keys, cancel_key and errors behave as the `Client` methods do; a bad
/// argument is refused with its SQLSTATE and nothing is added.
#[tokio::test]
async fn options_and_errors_are_the_clients() {
    let cluster = Cluster::start();
    let mut pg = service(&cluster).await;

    let work = pg.transaction().await.expect("begin");
    let keyed = EnqueueOptions {
        key: Some("order-7".into()),
        priority: 5,
        ..Default::default()
    };
    let first = tx::enqueue_with(&work, "mail", &json!({"n": 1}), &keyed)
        .await
        .expect("keyed");
    let again = tx::enqueue_with(&work, "mail", &json!({"n": 2}), &keyed)
        .await
        .expect("keyed again");
    assert_eq!(first, again, "same key, same row, in one transaction");
    let ids = tx::enqueue_batch(
        &work,
        "mail",
        &[json!({"n": 3}), json!({"n": 4})],
        &BatchOptions {
            keys: Some(vec![Some("b-1".into()), None]),
            ..Default::default()
        },
    )
    .await
    .expect("batch");
    assert_eq!(ids.len(), 2);
    assert!(ids[0] < ids[1], "ids in input order: {ids:?}");
    let cancelled = tx::cancel_key(&work, "mail", "b-1")
        .await
        .expect("cancel_key");
    assert_eq!(cancelled, CancelResult::Cancelled);
    work.commit().await.expect("commit");
    let states: Vec<String> = pg
        .query(
            "SELECT state::text FROM lease.job WHERE queue = 'mail' ORDER BY id",
            &[],
        )
        .await
        .expect("states")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states, ["pending", "cancelled", "pending"]);
    let priority: i32 = scalar(
        &pg,
        &format!("SELECT priority FROM lease.job WHERE id = {first}"),
    )
    .await;
    assert_eq!(priority, 5);

    let before = rows_in_mail(&pg).await;
    let bad = pg.transaction().await.expect("begin");
    let mismatched = BatchOptions {
        keys: Some(vec![None]),
        ..Default::default()
    };
    let err = tx::enqueue_batch(&bad, "mail", &[json!(1), json!(2)], &mismatched)
        .await
        .expect_err("one key for two payloads");
    assert!(
        matches!(err, Error::InvalidInput { .. }),
        "typed as bad input: {err:?}"
    );
    assert_eq!(err.sqlstate(), Some("22023"), "{err}");
    drop(bad);
    let too_long = EnqueueOptions {
        delay: Some(Duration::MAX),
        ..Default::default()
    };
    let empty = pg.transaction().await.expect("begin");
    let err = tx::enqueue_with(&empty, "mail", &json!({}), &too_long)
        .await
        .expect_err("a delay beyond microseconds");
    assert!(err.is_invalid_input(), "{err:?}");
    drop(empty);
    assert_eq!(
        rows_in_mail(&pg).await,
        before,
        "a refused enqueue added a row"
    );
}
