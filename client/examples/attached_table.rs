//! Deferred deletions on your own table: `lease.attach` makes the rows of
//! `service_instances` in status `SCHEDULED` claimable, two workers share
//! them, and each deletion is a fenced write that also finishes the lease.
//!
//! ```sh
//! cargo run -p pg_lease_client --example attached_table -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`; without either, a throwaway PostgreSQL 15 is
//! started). The worked example of docs/attached-tables.md is this file. It exits non-zero
//! unless every scheduled row ends `DELETED` exactly once and no other row
//! was touched.

use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_cluster, url) = pg_tests::example_database();
    run(&url).await
}

async fn run(url: &str) -> Result<(), BoxError> {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "DROP TABLE IF EXISTS service_instances;
         CREATE TABLE service_instances (
             id      bigint PRIMARY KEY,
             status  text NOT NULL,
             deleted_by text
         );
         INSERT INTO service_instances (id, status)
              SELECT g, CASE WHEN g % 3 = 0 THEN 'RUNNING' ELSE 'SCHEDULED' END
                FROM generate_series(1, 30) g;",
    )
    .await?;

    // [attach] -- the part shown in docs/attached-tables.md
    // Rows in status SCHEDULED become claimable in queue "service_instances".
    db.execute(
        "SELECT lease.attach('service_instances', pending => $$status = 'SCHEDULED'$$)",
        &[],
    )
    .await?;

    let db = Arc::new(db);
    let mut workers = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let mut config = WorkerConfig::new("service_instances").with_ttl(Duration::from_secs(10));
        config.owner = name.into();
        let db = Arc::clone(&db);
        let worker = Worker::new(Client::connect(url).await?, config, move |job| {
            let db = Arc::clone(&db);
            async move {
                let id: i64 = job.lease().key().unwrap_or_default().parse()?;
                let token = job.token();
                // ... delete the instance's resources, idempotently, keyed by
                // job.attempt_id() ...
                // One statement: applies only while the lease is current
                // (LE001 otherwise), and leaving status SCHEDULED ends the
                // lease in the same transaction.
                db.execute(
                    "UPDATE service_instances SET status = 'DELETED', deleted_by = $2
                      WHERE id = $1 AND lease.fence($3, $4) IS NOT NULL",
                    &[&id, &job.attempt_id(), &token.id, &token.epoch],
                )
                .await?;
                Ok(Outcome::Released)
            }
        });
        let shutdown = CancellationToken::new();
        workers.push((shutdown.clone(), tokio::spawn(worker.run(shutdown))));
    }
    // [/attach]

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left: i64 = db
            .query_one(
                "SELECT count(*) FROM service_instances WHERE status = 'SCHEDULED'",
                &[],
            )
            .await?
            .get(0);
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{left} rows still scheduled after 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (shutdown, run) in workers {
        shutdown.cancel();
        let summary = run.await??;
        println!(
            "  worker: {} claimed, {} finished, {} lost",
            summary.claimed, summary.done, summary.lost
        );
    }

    let rows = db
        .query(
            "SELECT status, count(*), count(DISTINCT deleted_by) FROM service_instances
              GROUP BY status ORDER BY status",
            &[],
        )
        .await?;
    let counts: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    println!("  status counts (status, rows, distinct attempts): {counts:?}");
    let expected = vec![
        ("DELETED".to_owned(), 20, 20),
        ("RUNNING".to_owned(), 10, 0),
    ];
    if counts != expected {
        return Err(format!("expected {expected:?}").into());
    }
    let leftover: i64 = db
        .query_one(
            "SELECT count(*) FROM lease.job WHERE queue = 'service_instances'",
            &[],
        )
        .await?
        .get(0);
    if leftover != 0 {
        return Err(format!("{leftover} lease rows left").into());
    }
    db.execute("SELECT lease.detach('service_instances')", &[])
        .await?;
    println!("  every scheduled instance deleted once, under a current lease");
    Ok(())
}
