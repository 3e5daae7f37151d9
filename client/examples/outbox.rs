//! The outbox pattern: an order and the job that mails its receipt commit
//! together or not at all, in the service's own transaction, once over
//! tokio-postgres (`pg_lease_client::tx`) and once over sqlx
//! (`pg_lease_client::sqlx`, cargo feature `sqlx`).
//!
//! ```sh
//! cargo run -p pg_lease_client --features sqlx --example outbox -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`; without either, a throwaway PostgreSQL 15 is
//! started). The README's "Use it from your application" shows
//! `place_order` and `place_order_sqlx`. It exits non-zero unless the
//! declined orders left no job and each paid one's job ran exactly once.

use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_cluster, url) = pg_tests::example_database();
    run(&url).await
}

// [outbox]
async fn place_order(db: &mut tokio_postgres::Client, total: i32) -> Result<i64, BoxError> {
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            "INSERT INTO orders (total) VALUES ($1) RETURNING id",
            &[&total],
        )
        .await?;
    let order: i64 = row.get(0);
    pg_lease_client::tx::enqueue(&tx, "receipts", &json!({ "order": order })).await?;
    if total <= 0 {
        return Err("declined".into()); // tx dropped: rolled back, no order, no job
    }
    tx.commit().await?; // the order and its job, together
    Ok(order)
}
// [/outbox]

// [outbox-sqlx]
async fn place_order_sqlx(pool: &sqlx::PgPool, total: i32) -> Result<i64, BoxError> {
    let mut tx = pool.begin().await?;
    let order: i64 = sqlx::query_scalar("INSERT INTO orders (total) VALUES ($1) RETURNING id")
        .bind(total)
        .fetch_one(&mut *tx)
        .await?;
    pg_lease_client::sqlx::enqueue(&mut *tx, "receipts", &json!({ "order": order })).await?;
    if total <= 0 {
        return Err("declined".into()); // tx dropped: rolled back, no order, no job
    }
    tx.commit().await?; // the order and its job, together
    Ok(order)
}
// [/outbox-sqlx]

/// A sqlx pool for the libpq-style connection string the example takes.
async fn sqlx_pool(conn: &str) -> Result<sqlx::PgPool, BoxError> {
    let config: tokio_postgres::Config = conn.parse()?;
    let mut options = sqlx::postgres::PgConnectOptions::new();
    if let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() {
        options = options.host(host);
    }
    if let Some(port) = config.get_ports().first() {
        options = options.port(*port);
    }
    if let Some(user) = config.get_user() {
        options = options.username(user);
    }
    if let Some(password) = config.get_password() {
        options = options.password(&String::from_utf8_lossy(password));
    }
    if let Some(db) = config.get_dbname() {
        options = options.database(db);
    }
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?)
}

async fn run(url: &str) -> Result<(), BoxError> {
    let (mut db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "DROP TABLE IF EXISTS orders;
         CREATE TABLE orders (id bigserial PRIMARY KEY, total int NOT NULL);
         SELECT lease.drop_queue('receipts', force => true) FROM lease.queue WHERE name = 'receipts';
         SELECT lease.create_queue('receipts');",
    )
    .await?;

    let declined = place_order(&mut db, 0).await;
    let paid = place_order(&mut db, 42).await?;
    let pool = sqlx_pool(url).await?;
    let declined_sqlx = place_order_sqlx(&pool, 0).await;
    let paid_sqlx = place_order_sqlx(&pool, 7).await?;

    let (ran_tx, mut ran) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::new(
        Client::connect(url).await?,
        WorkerConfig::new("receipts"),
        move |job| {
            let ran_tx = ran_tx.clone();
            async move {
                let _ = ran_tx.send(job.payload()["order"].as_i64());
                Ok(Outcome::Done)
            }
        },
    );
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let mut receipts = Vec::new();
    for _ in 0..2 {
        let order = tokio::time::timeout(Duration::from_secs(10), ran.recv()).await?;
        receipts.push(order.flatten());
    }
    receipts.sort();
    // Time for a third job, if there were one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    let summary = running.await??;

    let orders: i64 = db
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    let jobs: i64 = db
        .query_one(
            "SELECT count(*) FROM lease.job WHERE queue = 'receipts'",
            &[],
        )
        .await?
        .get(0);
    println!(
        "declined: {declined:?} and {declined_sqlx:?}; paid orders {paid} and {paid_sqlx}; \
         receipts ran for {receipts:?}; {} job(s) done, {orders} order(s), {jobs} job row(s)",
        summary.done
    );
    let ok = declined.is_err()
        && declined_sqlx.is_err()
        && receipts == [Some(paid), Some(paid_sqlx)]
        && summary.done == 2
        && orders == 2;
    if ok {
        Ok(())
    } else {
        Err("the outbox did not hold: see the line above".into())
    }
}
