//! The client's own retries are jittered: two Workers whose database went
//! away together do not come back in lockstep.
//!
//! Failed before full jitter: both Workers retried their claims after
//! exactly 100, 200, 400, 800 ms, so a restarted database met every
//! replica's reconnect at the same instants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Connector, Outcome, Worker, WorkerConfig};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// A port where no database answers: it accepts each connection, notes
/// when, and closes it.
async fn dead_database() -> (u16, Arc<Mutex<Vec<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let noted = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            noted.lock().expect("lock").push(Instant::now());
            drop(socket);
        }
    });
    (port, seen)
}

/// The gaps between a Worker's first five connection attempts.
fn gaps(attempts: &Mutex<Vec<Instant>>) -> Vec<Duration> {
    let attempts = attempts.lock().expect("lock");
    attempts.windows(2).take(4).map(|w| w[1] - w[0]).collect()
}

#[tokio::test]
async fn two_workers_retry_at_different_times() {
    let shutdown = CancellationToken::new();
    let mut runs = Vec::new();
    let mut attempts = Vec::new();
    for _ in 0..2 {
        let (port, seen) = dead_database().await;
        attempts.push(seen);
        let connector = Connector::no_tls(&format!(
            "host=127.0.0.1 port={port} user=nobody dbname=nothing"
        ))
        .expect("connector");
        let mut config = WorkerConfig::new("q");
        config.listen = false;
        let worker = Worker::new(Client::with_connector(connector), config, |_job| async {
            Ok(Outcome::Done)
        });
        runs.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    pg_tests::until("five attempts each", Duration::from_secs(20), || async {
        attempts.iter().all(|a| a.lock().expect("lock").len() >= 5)
    })
    .await;
    shutdown.cancel();
    for run in runs {
        let _ = run.await;
    }
    let (a, b) = (gaps(&attempts[0]), gaps(&attempts[1]));
    let apart = a
        .iter()
        .zip(&b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or_default();
    assert!(
        apart > Duration::from_millis(20),
        "retries in lockstep: {a:?} and {b:?}"
    );
}
