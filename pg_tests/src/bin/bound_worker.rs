//! `bound_worker`: a `Worker` process whose leases are bound to its
//! session (`WorkerConfig::bind_session`), for the kill test of
//! `pg_tests/tests/session_bound.rs`. Test-only; not part of any product.
//!
//! Each job records its start (row, epoch, this process's pid) with a
//! fenced insert into `bound.starts`, then holds its lease until the
//! process dies. Arguments: `<conn> <owner> <concurrency>`; ttl 60 s. The
//! process exits when its stdin closes, so it never outlives the test; the
//! test kills it with SIGKILL.

use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(conn), Some(owner), Some(concurrency)) = (args.next(), args.next(), args.next())
    else {
        eprintln!("usage: bound_worker <conn> <owner> <concurrency>");
        std::process::exit(2);
    };
    let Ok(concurrency) = concurrency.parse::<usize>() else {
        eprintln!("bound_worker: concurrency {concurrency:?} is not a number");
        std::process::exit(2);
    };
    pg_tests::child::exit_when_stdin_closes();
    let runtime = pg_tests::child::runtime("bound_worker");
    let result = runtime.block_on(async move {
        let client = Client::connect(&conn).await?;
        let mut config = WorkerConfig::new("bound").with_ttl(Duration::from_secs(60));
        config.owner = owner;
        config.concurrency = concurrency;
        config.prefetch = Some(0);
        config.bind_session = true;
        let pid = i32::try_from(std::process::id()).unwrap_or(0);
        let worker = Worker::new(client, config, move |job| async move {
            let tx = job.transaction().await?;
            tx.execute(
                "INSERT INTO bound.starts (row_id, epoch, pid) VALUES ($1, $2, $3)",
                &[&job.lease().id(), &job.lease().epoch(), &pid],
            )
            .await?;
            tx.commit().await?;
            job.cancelled().await;
            Ok(Outcome::retry("cancelled"))
        });
        worker.run(CancellationToken::new()).await.map(drop)
    });
    if let Err(err) = result {
        eprintln!("bound_worker: {err}");
        std::process::exit(1);
    }
}
