//! The source systems of `attach` (tests/attach.rs) with the domain's other
//! writers running beside the Workers: a control plane whose broker
//! acknowledgements arrive late and are applied by a separate consumer,
//! several rows per transaction; and a batch processor whose users cancel
//! items while their processors write progress under `lease.fence`, whose
//! items are claimed by SLO deadline, and whose failures and cancels must
//! show in the items themselves.
//!
//! Deadlocks are counted by the server (`pg_stat_database.deadlocks`), so a
//! deadlock is seen whichever side PostgreSQL aborts, a heartbeat included.
//! Each test failed before its fix and against the deliberate break
//! named in its doc comment ("Broken on purpose").

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use pg_lease_client::{
    CancellationToken, Client, HandlerResult, Job, Outcome, Summary, Worker, WorkerConfig,
};
use pg_tests::service_instances::{self, publish_under_fence};
use pg_tests::workers::{self, stop};
use pg_tests::{eventually, scalar, sqlstate, Cluster, ClusterConfig, TEST_DB};
use tokio::time::{sleep, timeout};
use tokio_postgres::NoTls;

/// A cluster whose reaper sweeps every 100 ms and that detects deadlocks
/// after 100 ms.
fn cluster() -> Cluster {
    let mut config = ClusterConfig::with_reaper(Duration::from_millis(100));
    config.extra_conf.push("deadlock_timeout = '100ms'".into());
    Cluster::start_with(config)
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

fn spawn<F, Fut>(
    client: Client,
    queue: &str,
    owner: String,
    concurrency: usize,
    handler: F,
) -> (CancellationToken, tokio::task::JoinHandle<Summary>)
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    let mut config = WorkerConfig::new(queue).with_ttl(Duration::from_millis(900));
    config.owner = owner;
    config.concurrency = concurrency;
    config.poll_interval = Duration::from_millis(50);
    workers::spawn(Worker::new(client, config, handler))
}

async fn deadlocks(pg: &tokio_postgres::Client) -> i64 {
    scalar(
        pg,
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )
    .await
}

/// Deferred deletions whose acknowledgement a separate consumer applies:
/// three replicas publish each SCHEDULED row (fenced) and hold it until the
/// row leaves SCHEDULED; the consumer marks acknowledged rows DELETED four
/// at a time, in descending order, slowly, in one transaction, while the
/// replicas' heartbeats renew the same rows in ascending order. Every row
/// is published once and deleted, and the server detects no deadlock.
///
/// Broken on purpose: with `lease.renew_batch` waiting for locked rows
/// (no SKIP LOCKED), the server detected deadlocks between heartbeats and
/// the consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledgements_applied_by_a_consumer_never_deadlock() {
    const SCHEDULED: i64 = 80;
    let cluster = cluster();
    let pg = cluster.connect().await;
    service_instances::create(&pg, SCHEDULED, 0, "").await;
    let url = cluster.conn_string(TEST_DB);

    let mut replicas = Vec::new();
    for n in 0..3 {
        let client = Client::connect(&url).await.expect("client");
        let domain = Arc::new(connect(&url).await);
        replicas.push(spawn(
            client,
            "service_instances",
            format!("replica-{n}"),
            16,
            move |job| {
                let domain = Arc::clone(&domain);
                async move {
                    let key: i64 = job.lease().key().unwrap_or_default().parse()?;
                    publish_under_fence(&domain, key, &job).await?;
                    // Held until the consumer moves the row on: the lease
                    // then ends and the heartbeat reports it lost.
                    let _ = timeout(Duration::from_secs(30), job.cancelled()).await;
                    Ok(Outcome::Released)
                }
            },
        ));
    }

    // The acknowledgement consumer.
    let consumer = connect(&url).await;
    let consumer_errors = Arc::new(AtomicU64::new(0));
    let deleted = timeout(Duration::from_secs(60), async {
        loop {
            let acked: Vec<i64> = consumer
                .query(
                    "SELECT p.instance FROM published p JOIN service_instances s ON s.id = p.instance
                      WHERE s.status = 'SCHEDULED' ORDER BY p.instance DESC LIMIT 4",
                    &[],
                )
                .await
                .expect("acked")
                .iter()
                .map(|r| r.get(0))
                .collect();
            let left: i64 = scalar(
                &consumer,
                "SELECT count(*) FROM service_instances WHERE status = 'SCHEDULED'",
            )
            .await;
            if left == 0 {
                break;
            }
            consumer.batch_execute("BEGIN").await.expect("begin");
            let mut failed = false;
            for id in &acked {
                let moved = consumer
                    .execute(
                        "UPDATE service_instances SET status = 'DELETED' WHERE id = $1",
                        &[id],
                    )
                    .await;
                if moved.is_err() {
                    failed = true;
                    break;
                }
                sleep(Duration::from_millis(40)).await;
            }
            let end = if failed { "ROLLBACK" } else { "COMMIT" };
            if failed || consumer.batch_execute(end).await.is_err() {
                consumer.batch_execute("ROLLBACK").await.ok();
                consumer_errors.fetch_add(1, Ordering::Relaxed);
            }
            if acked.is_empty() {
                sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
    assert!(
        deleted.is_ok(),
        "every row acknowledged and deleted in 60 s"
    );
    for (shutdown, run) in replicas {
        stop(shutdown, run).await;
    }
    assert_eq!(deadlocks(&pg).await, 0, "no deadlock anywhere");
    assert_eq!(consumer_errors.load(Ordering::Relaxed), 0);
    let published: i64 = scalar(&pg, "SELECT count(DISTINCT instance) FROM published").await;
    let twice: i64 = scalar(
        &pg,
        "SELECT count(*) FROM (SELECT instance FROM published GROUP BY 1 HAVING count(*) > 1) t",
    )
    .await;
    assert_eq!((published, twice), (SCHEDULED, 0));
    assert_eq!(
        scalar::<i64>(&pg, "SELECT count(*) FROM lease.job").await,
        0
    );
}

/// A batch processor: two processors write progress to their items under
/// `lease.fence`, one transaction per step; users cancel a third of the
/// items meanwhile, half by writing the item (status 'cancelled'), half
/// with `lease.cancel_key`; poison items fail. Claims follow the SLO
/// deadline, and every outcome shows in the item: done, failed (on_dead),
/// cancelled (on_cancel or the user's write), with no progress written
/// after a user's cancel and no deadlock detected.
///
/// Broken on purpose, one at a time: with `lease.fence` locking the lease
/// row before the item, the server detected deadlocks between fenced writes
/// and cancels; with the `pg_lease_outcome` trigger dropped, poison items
/// never left the predicate (60 s timeout); with `claim_pending` ordering
/// without `rank`, the first items started were not the earliest deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_processor_under_cancels_shows_every_outcome_in_its_items() {
    const ITEMS: i32 = 60;
    let cluster = cluster();
    let pg = cluster.connect().await;
    pg.batch_execute(&format!(
        "CREATE TABLE items (
             id int PRIMARY KEY, status text NOT NULL DEFAULT 'validating',
             deadline timestamptz NOT NULL, progress int NOT NULL DEFAULT 0,
             progress_at_cancel int, poison boolean NOT NULL DEFAULT false);
         -- Deadlines in an order unrelated to the ids, microseconds apart.
         INSERT INTO items (id, deadline, poison)
              SELECT g, '2030-01-01'::timestamptz + ((g * 37) % {ITEMS}) * interval '1 microsecond',
                     g % 10 = 0
                FROM generate_series(1, {ITEMS}) g;
         CREATE TABLE started (id int, at timestamptz DEFAULT clock_timestamp(), n bigserial);
         SELECT lease.attach('items', $$status IN ('validating', 'in_progress')$$,
                             order_by => 'deadline', max_attempts => 2, backoff_base => '0',
                             on_dead => $$status = 'failed'$$, on_cancel => $$status = 'cancelled'$$);"
    ))
    .await
    .expect("items");
    let url = cluster.conn_string(TEST_DB);

    let mut processors = Vec::new();
    for n in 0..2 {
        let client = Client::connect(&url).await.expect("client");
        let url = url.clone();
        processors.push(spawn(client, "items", format!("processor-{n}"), 4, move |job| {
            let url = url.clone();
            async move {
                let key: i32 = job.lease().key().unwrap_or_default().parse()?;
                let token = job.token();
                let mut db = connect(&url).await;
                db.execute("INSERT INTO started (id) VALUES ($1)", &[&key])
                    .await?;
                for _ in 0..5 {
                    if job.is_cancelled() {
                        return Ok(Outcome::Abandon);
                    }
                    let tx = db.transaction().await?;
                    tx.query_one("SELECT lease.fence($1, $2)", &[&token.id, &token.epoch])
                        .await?;
                    tx.execute(
                        "UPDATE items SET status = 'in_progress', progress = progress + 1 WHERE id = $1",
                        &[&key],
                    )
                    .await?;
                    tx.commit().await?;
                    sleep(Duration::from_millis(30)).await;
                }
                let poison: bool = db
                    .query_one("SELECT poison FROM items WHERE id = $1", &[&key])
                    .await?
                    .get(0);
                if poison {
                    return Ok(Outcome::fail("poison"));
                }
                db.execute(
                    "UPDATE items SET status = 'done' WHERE id = $1 AND lease.fence($2, $3) IS NOT NULL",
                    &[&key, &token.id, &token.epoch],
                )
                .await?;
                Ok(Outcome::Released)
            }
        }));
    }

    // Users cancel every third item once processing is under way.
    eventually(
        &pg,
        "SELECT count(*) >= 8 FROM started",
        Duration::from_secs(20),
    )
    .await;
    let user = connect(&url).await;
    let mut by_write = HashSet::new();
    let mut by_key = std::collections::HashMap::new();
    for id in (3..=ITEMS).step_by(3) {
        if id % 2 == 0 {
            let n = user
                .execute(
                    "UPDATE items SET status = 'cancelled', progress_at_cancel = progress
                      WHERE id = $1 AND status IN ('validating', 'in_progress')",
                    &[&id],
                )
                .await
                .unwrap_or_else(|e| panic!("cancel {id}: {:?}", sqlstate(&e)));
            if n == 1 {
                by_write.insert(id);
            }
        } else {
            let r: Option<String> = user
                .query_one(
                    "SELECT lease.cancel_key('items', $1::text)",
                    &[&id.to_string()],
                )
                .await
                .unwrap_or_else(|e| panic!("cancel_key {id}: {:?}", sqlstate(&e)))
                .get(0);
            if let Some(result) = r {
                by_key.insert(id, result);
            }
        }
        sleep(Duration::from_millis(15)).await;
    }

    eventually(
        &pg,
        "SELECT count(*) = 0 FROM items WHERE status IN ('validating', 'in_progress')",
        Duration::from_secs(60),
    )
    .await;
    for (shutdown, run) in processors {
        stop(shutdown, run).await;
    }
    assert_eq!(deadlocks(&pg).await, 0, "no deadlock anywhere");

    // The first eight items started (two claims of four) are the eight
    // earliest deadlines.
    let first: Vec<i32> = pg
        .query("SELECT id FROM started ORDER BY n LIMIT 8", &[])
        .await
        .expect("started")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let earliest: Vec<i32> = pg
        .query("SELECT id FROM items ORDER BY deadline LIMIT 8", &[])
        .await
        .expect("earliest")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (mut a, mut b) = (first.clone(), earliest.clone());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "first claims follow the deadline");

    for row in pg
        .query(
            "SELECT id, status, progress, progress_at_cancel, poison FROM items",
            &[],
        )
        .await
        .expect("items")
    {
        let (id, status): (i32, String) = (row.get(0), row.get(1));
        let poison: bool = row.get(4);
        if by_write.contains(&id) {
            assert_eq!(status, "cancelled", "item {id}");
            let (progress, at_cancel): (i32, Option<i32>) = (row.get(2), row.get(3));
            assert_eq!(
                Some(progress),
                at_cancel,
                "item {id}: no write after the cancel"
            );
        } else if let Some(result) = by_key.get(&id) {
            // A pending item is cancelled at once; a running one when its
            // processor sees the request, unless it finished first.
            if result == "cancelled" {
                assert_eq!(status, "cancelled", "item {id}: on_cancel");
            } else {
                assert!(
                    ["cancelled", "done", "failed"].contains(&status.as_str()),
                    "item {id}: {result} then {status}"
                );
            }
        } else if poison {
            assert_eq!(status, "failed", "item {id}: on_dead");
        } else {
            assert_eq!(status, "done", "item {id}");
        }
    }
    assert_eq!(
        scalar::<i64>(&pg, "SELECT count(*) FROM lease.job").await,
        0
    );
}
