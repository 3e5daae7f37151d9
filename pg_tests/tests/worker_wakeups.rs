//! Rows whose wake-up was never sent. An enqueue notifies only when it sees
//! no other ready rows (`lease._wake`), so a row that commits while a claim
//! takes the rows before it, unseen by that claim, arrives unannounced: the
//! Worker must find it soon anyway. Seen in the field's long-horizon
//! benchmark as a pickup p99 of 2 s (the poll interval) at every rate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_lease_client::{CancellationToken, Outcome, Worker, WorkerConfig};
use pg_tests::Cluster;

/// One row ready; a second enqueued in a transaction left open (its wake-up
/// saw the first row ready and stayed silent). A Worker with its defaults
/// starts, runs the first row and finds nothing more; 300 ms later the
/// transaction commits, and no notification comes. The second row must
/// start within 1 s of that commit, not at the poll interval (2 s).
///
/// Failed before the Worker rechecked after work: the second row started
/// about 1.7 s after the commit, at the poll 2 s after the first claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unannounced_row_is_found_soon_after_work() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q');
         SELECT lease.enqueue('q', '{\"n\": 1}');",
    )
    .await
    .expect("first row");
    let late = cluster.connect().await;
    late.batch_execute("BEGIN; SELECT lease.enqueue('q', '{\"n\": 2}');")
        .await
        .expect("second row, not committed");

    let handled = Arc::new(AtomicUsize::new(0));
    let second_started: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let worker = {
        let (handled, second) = (Arc::clone(&handled), Arc::clone(&second_started));
        Worker::new(
            pg_tests::jobs::client(&cluster).await,
            WorkerConfig::new("q"),
            move |job| {
                let (handled, second) = (Arc::clone(&handled), Arc::clone(&second));
                async move {
                    if job.payload()["n"] == 2 {
                        *second.lock().unwrap() = Some(Instant::now());
                    }
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok(Outcome::Done)
                }
            },
        )
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));

    let deadline = Instant::now() + Duration::from_secs(10);
    while handled.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "the first row was never run");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    late.batch_execute("COMMIT").await.expect("commit");
    let committed = Instant::now();

    let deadline = committed + Duration::from_secs(5);
    let started = loop {
        if let Some(at) = *second_started.lock().unwrap() {
            break at;
        }
        assert!(Instant::now() < deadline, "the second row was never run");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let waited = started.saturating_duration_since(committed);
    assert!(
        waited < Duration::from_secs(1),
        "the unannounced row waited {waited:?} after its commit"
    );
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}
