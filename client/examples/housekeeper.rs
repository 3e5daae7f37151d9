//! A housekeeper singleton with [`Elector`]: of all replicas, only the
//! leader sweeps, and each sweep is fenced by the leader's epoch.
//!
//! ```sh
//! cargo run -p pg_lease_client --example housekeeper -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`). Two replicas, `a` and `b`, run in this process
//! (in production each replica process runs one). `a` leads and sweeps
//! every half second; then `a` is stopped and releases the lease, and `b`
//! takes over on its next attempt (no wait for the ttl) with a higher
//! epoch; finally a late write from `a`'s
//! old term is rejected by `lease.fence_named`. Every sweep is a row in
//! table `pg_lease_example_sweep` (created here).

use std::time::Duration;

use pg_lease_client::{fence_named, CancellationToken, Client, Elector, ElectorConfig};

const NAME: &str = "housekeeper";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let conn = match std::env::args().nth(1) {
        Some(conn) => conn,
        None => std::env::var("PG_LEASE_URL")
            .map_err(|_| "pass a connection string, or set PG_LEASE_URL")?,
    };
    connect(&conn)
        .await?
        .batch_execute(
            "DROP TABLE IF EXISTS pg_lease_example_sweep;
             CREATE TABLE pg_lease_example_sweep (
                 at timestamptz NOT NULL DEFAULT clock_timestamp(), replica text, epoch bigint)",
        )
        .await?;

    let stop_a = CancellationToken::new();
    let a = tokio::spawn(replica("a", conn.clone(), stop_a.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stop_b = CancellationToken::new();
    let b = tokio::spawn(replica("b", conn.clone(), stop_b.clone()));

    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("  (stopping a)");
    stop_a.cancel();
    let old_epoch = a.await??;

    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(epoch) = old_epoch {
        let mut pg = connect(&conn).await?;
        let tx = pg.transaction().await?;
        match fence_named(&tx, NAME, epoch).await {
            Ok(_) => println!("  a (late)  sweep with old epoch {epoch} ACCEPTED (bug!)"),
            Err(e) if e.is_lease_lost() => {
                println!("  a (late)  sweep with old epoch {epoch} rejected: {e}")
            }
            Err(e) => return Err(e.into()),
        }
    }
    stop_b.cancel();
    b.await??;

    println!("\nSweeps (one leader at a time, epochs only grow):");
    for row in connect(&conn)
        .await?
        .query(
            "SELECT replica, epoch, count(*), min(at)::time(1)::text, max(at)::time(1)::text
               FROM pg_lease_example_sweep GROUP BY 1, 2 ORDER BY min(at)",
            &[],
        )
        .await?
    {
        let (who, epoch, n, from, to): (String, i64, i64, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        println!("  {who}  epoch {epoch}: {n} sweeps from {from} to {to}");
    }
    Ok(())
}

/// One replica: contends for the lease; while leading, sweeps every half
/// second inside a transaction fenced by its epoch. Returns the epoch of
/// its last term.
async fn replica(
    me: &'static str,
    conn: String,
    stop: CancellationToken,
) -> Result<Option<i64>, BoxError> {
    let mut config = ElectorConfig::new(NAME).with_ttl(Duration::from_secs(3));
    config.owner = format!("replica-{me}");
    let mut elector = Elector::start(Client::connect(&conn).await?, config)?;
    let mut pg = connect(&conn).await?;
    let mut last_epoch = None;
    'contend: loop {
        let term = tokio::select! {
            term = elector.wait_for_term() => term,
            () = stop.cancelled() => break 'contend,
        };
        println!("  {me}         leads with epoch {}", term.epoch());
        last_epoch = Some(term.epoch());
        loop {
            tokio::select! {
                () = term.ended() => {
                    println!("  {me}         stepped down");
                    continue 'contend;
                }
                () = stop.cancelled() => break 'contend,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            let tx = pg.transaction().await?;
            match fence_named(&tx, NAME, term.epoch()).await {
                Ok(_) => {
                    tx.execute(
                        "INSERT INTO pg_lease_example_sweep (replica, epoch) VALUES ($1, $2)",
                        &[&me, &term.epoch()],
                    )
                    .await?;
                    tx.commit().await?;
                    println!("  {me}         swept (epoch {})", term.epoch());
                }
                Err(e) if e.is_lease_lost() => println!("  {me}         fenced off: {e}"),
                Err(e) => return Err(e.into()),
            }
        }
    }
    elector.stop().await; // releases the lease: the next leader need not wait for the ttl
    println!("  {me}         stopped");
    Ok(last_epoch)
}

async fn connect(conn: &str) -> Result<tokio_postgres::Client, BoxError> {
    let (pg, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(pg)
}
