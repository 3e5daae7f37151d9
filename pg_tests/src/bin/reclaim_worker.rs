//! `reclaim_worker`: a `Worker` process with a stable owner name and
//! `reclaim_own`, for the kill-and-restart churn test
//! (`pg_tests/tests/worker_churn.rs`). Test-only; not part of any product.
//!
//! Every job records its start (row, epoch, this process's pid) with a
//! fenced insert into `churn.starts`, works 20–300 ms, and is done.
//! Arguments: `<conn> <owner>`. The process exits when its stdin closes, so
//! it never outlives the test; the test kills it with SIGKILL.

use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(conn), Some(owner)) = (args.next(), args.next()) else {
        eprintln!("usage: reclaim_worker <conn> <owner>");
        std::process::exit(2);
    };
    pg_tests::child::exit_when_stdin_closes();
    let runtime = pg_tests::child::runtime("reclaim_worker");
    let result = runtime.block_on(async move {
        let client = Client::connect(&conn).await?;
        let mut config = WorkerConfig::new("churn").with_ttl(Duration::from_secs(2));
        config.owner = owner;
        config.concurrency = 4;
        config.reclaim_own = true;
        config.poll_interval = Duration::from_millis(50);
        let pid = i32::try_from(std::process::id()).unwrap_or(0);
        let worker = Worker::new(client, config, move |job| async move {
            let tx = job.transaction().await?;
            tx.execute(
                "INSERT INTO churn.starts (row_id, epoch, pid) VALUES ($1, $2, $3)",
                &[&job.lease().id(), &job.lease().epoch(), &pid],
            )
            .await?;
            tx.commit().await?;
            let ms = 20 + (job.lease().id() * 7919 % 281) as u64;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(Outcome::Done)
        });
        worker.run(CancellationToken::new()).await.map(drop)
    });
    if let Err(err) = result {
        eprintln!("reclaim_worker: {err}");
        std::process::exit(1);
    }
}
