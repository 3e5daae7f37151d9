//! Deferred deletion: claim a deletion, publish it with the attempt id as
//! the broker's de-duplication id, keep the lease renewed until the
//! asynchronous acknowledgement arrives, then record the outcome.
//!
//! ```sh
//! cargo run -p pg_lease_client --example deferred_deletion -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`). The "broker" is simulated in this process: it
//! drops messages whose id it has seen, and acknowledges each deletion
//! 3 to 4.5 s later, longer than the 2 s lease. The fixes for two bugs
//! teams shipped are visible:
//!
//! * the lease is *not* released right after publishing; it is held (and
//!   renewed by the worker) until the acknowledgement says how it went;
//! * every attempt has one stable id (`pgl-<id>-<epoch>`), so a re-publish
//!   within the attempt is de-duplicated by the broker, and the
//!   acknowledgement names the attempt it belongs to.
//!
//! On acknowledgement, the domain row (table `pg_lease_example_instance`,
//! created here) is marked deleted in a transaction guarded by
//! `lease::fence`, so a worker that lost its lease cannot write.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{
    fence, BatchOptions, CancellationToken, Client, FencingToken, Job, Outcome, QueueOptions,
    Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;

const QUEUE: &str = "deletions";
const INSTANCES: [&str; 5] = ["vm-17", "vm-23", "db-4", "cache-9", "vm-31"];

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Serialize, Deserialize)]
struct Deletion {
    instance: String,
}

/// A message broker with de-duplication by message id and asynchronous
/// acknowledgements.
#[derive(Default)]
struct Broker {
    seen: Mutex<HashSet<String>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<()>>>,
    delivered: AtomicUsize,
    duplicates: AtomicUsize,
}

impl Broker {
    /// Publishes "delete `instance`" under `message_id`. Returns a receiver
    /// for the acknowledgement (None for a duplicate, which is dropped).
    fn publish(
        self: &Arc<Self>,
        message_id: &str,
        instance: &str,
    ) -> Option<oneshot::Receiver<()>> {
        if !lock(&self.seen).insert(message_id.to_owned()) {
            self.duplicates.fetch_add(1, Ordering::SeqCst);
            return None;
        }
        self.delivered.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(message_id.to_owned(), tx);
        // The consumer deletes the instance and acknowledges, some time later.
        let delay = Duration::from_millis(3000 + 300 * (instance.len() as u64 % 6));
        let (broker, id) = (Arc::clone(self), message_id.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(ack) = lock(&broker.waiting).remove(&id) {
                let _ = ack.send(());
            }
        });
        Some(rx)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn say(what: impl std::fmt::Display) {
    println!("  {what}");
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let conn = match std::env::args().nth(1) {
        Some(conn) => conn,
        None => std::env::var("PG_LEASE_URL")
            .map_err(|_| "pass a connection string, or set PG_LEASE_URL")?,
    };
    let client = Client::connect(&conn).await?;
    let domain = Arc::new(tokio::sync::Mutex::new(connect(&conn).await?));
    setup(&client, &domain).await?;

    let broker = Arc::new(Broker::default());
    let finished = Arc::new(AtomicUsize::new(0));
    let mut config = WorkerConfig::new(QUEUE).with_ttl(Duration::from_secs(2));
    config.concurrency = 5;
    let worker = {
        let (broker, domain, finished) = (broker.clone(), domain.clone(), finished.clone());
        Worker::new(client.clone(), config, move |job| {
            delete(job, broker.clone(), domain.clone(), finished.clone())
        })
    };
    println!(
        "Deleting {} instances through a broker (lease 2 s, acknowledgements after 3-4.5 s):",
        INSTANCES.len()
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    while finished.load(Ordering::SeqCst) < INSTANCES.len() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    let summary = run.await??;

    println!("\nResult");
    let pg = domain.lock().await;
    for row in pg
        .query(
            "SELECT id, status, deleted_by FROM pg_lease_example_instance ORDER BY id",
            &[],
        )
        .await?
    {
        let (id, status, by): (String, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        say(format!(
            "{id:<8} {status:<8} by attempt {}",
            by.unwrap_or_default()
        ));
    }
    say(format!(
        "broker: {} deletions delivered, {} duplicates dropped; worker: {} claimed, {} done, {} lost",
        broker.delivered.load(Ordering::SeqCst),
        broker.duplicates.load(Ordering::SeqCst),
        summary.claimed,
        summary.done,
        summary.lost
    ));
    Ok(())
}

/// The handler: publish, wait for the acknowledgement with the lease held,
/// then write the domain row under the fence and finish.
async fn delete(
    job: Job,
    broker: Arc<Broker>,
    domain: Arc<tokio::sync::Mutex<tokio_postgres::Client>>,
    finished: Arc<AtomicUsize>,
) -> Result<Outcome, BoxError> {
    let Deletion { instance } = job.payload_as()?;
    let attempt_id = job.attempt_id();
    let started = Instant::now();
    let Some(ack) = broker.publish(&attempt_id, &instance) else {
        return Ok(Outcome::retry("duplicate publish"));
    };
    // A retry of the publish inside the same attempt (say, after a timeout)
    // reuses the id, and the broker drops it.
    let _ = broker.publish(&attempt_id, &instance);
    say(format!(
        "{instance:<8} published as {attempt_id}; holding the lease until the ack"
    ));

    tokio::select! {
        acked = ack => {
            acked?;
            mark_deleted(&domain, job.token(), &instance, &attempt_id).await?;
            say(format!(
                "{instance:<8} acknowledged after {:.1} s, lease still held (attempt {}): done",
                started.elapsed().as_secs_f64(),
                job.lease().attempt()
            ));
            finished.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Done)
        }
        () = job.cancelled() => {
            // The lease could not be kept (or a cancel was requested): give
            // the row back; the next attempt publishes under a new id.
            say(format!("{instance:<8} lease not confirmed ({:?}); retrying later", job.cancel_reason()));
            Ok(Outcome::retry("lease lost before the acknowledgement"))
        }
    }
}

/// The domain write, fenced: `lease.fence` first, in the same transaction.
async fn mark_deleted(
    domain: &tokio::sync::Mutex<tokio_postgres::Client>,
    token: FencingToken,
    instance: &str,
    attempt_id: &str,
) -> Result<(), BoxError> {
    let mut pg = domain.lock().await;
    let tx = pg.transaction().await?;
    fence(&tx, token).await?; // Error::LeaseLost: the transaction rolls back on drop
    tx.execute(
        "UPDATE pg_lease_example_instance SET status = 'DELETED', deleted_by = $2 WHERE id = $1",
        &[&instance, &attempt_id],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn setup(
    client: &Client,
    domain: &tokio::sync::Mutex<tokio_postgres::Client>,
) -> Result<(), BoxError> {
    let _ = client.drop_queue(QUEUE, true).await; // a previous run's leftovers
    client.create_queue(QUEUE, &QueueOptions::default()).await?;
    let pg = domain.lock().await;
    pg.batch_execute(
        "DROP TABLE IF EXISTS pg_lease_example_instance;
         CREATE TABLE pg_lease_example_instance (id text PRIMARY KEY, status text NOT NULL, deleted_by text)",
    )
    .await?;
    for id in INSTANCES {
        pg.execute(
            "INSERT INTO pg_lease_example_instance VALUES ($1, 'SCHEDULED')",
            &[&id],
        )
        .await?;
    }
    let deletions: Vec<Deletion> = INSTANCES
        .iter()
        .map(|i| Deletion {
            instance: (*i).to_owned(),
        })
        .collect();
    client
        .enqueue_batch(QUEUE, &deletions, &BatchOptions::default())
        .await?;
    Ok(())
}

async fn connect(conn: &str) -> Result<tokio_postgres::Client, BoxError> {
    let (pg, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(pg)
}
