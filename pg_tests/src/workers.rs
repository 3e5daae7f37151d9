//! Running a [`Worker`] in a test: spawn it, stop it and get its summary.

use std::time::Duration;

use pg_lease_client::{CancellationToken, Summary, Worker};
use tokio::task::JoinHandle;

/// Runs `worker` on a task; stop it with [`stop`].
pub fn spawn(worker: Worker) -> (CancellationToken, JoinHandle<Summary>) {
    let shutdown = CancellationToken::new();
    let run = worker.run(shutdown.clone());
    let handle = tokio::spawn(async move { run.await.expect("worker run") });
    (shutdown, handle)
}

/// Asks the worker to stop and waits (at most 20 s) for its summary.
pub async fn stop(shutdown: CancellationToken, handle: JoinHandle<Summary>) -> Summary {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .expect("worker stops within 20 s")
        .expect("worker task")
}
