//! The Worker tells what it does through `tracing`: errors it handles and
//! does not return (a failed heartbeat, a handler error) are logged, never
//! dropped, with the job's fields on its span. And its sessions say whose
//! they are in `pg_stat_activity`.
//!
//! Failed before the fix, when the client logged nothing at all.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};
use pg_tests::proxy::Proxy;
use pg_tests::{Cluster, TEST_DB};

/// Everything the subscriber writes, for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A handler error and a heartbeat that fails while the network is
/// partitioned show up as events with their fields; start and stop too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_errors_are_logged_with_the_jobs_fields() {
    let captured = Captured::default();
    let writer = captured.clone();
    // Global: the worker's tasks run on every runtime thread. This file
    // is its own process with this one test.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .expect("the only subscriber");

    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q', backoff_base => '1 hour');
         SELECT lease.enqueue('q', '{\"fail\": true}');
         SELECT lease.enqueue('q', '{\"fail\": false}');",
    )
    .await
    .expect("queue");
    let proxy = Proxy::start(cluster.port()).await;
    let client = Client::connect(&proxy.conn_string(TEST_DB))
        .await
        .expect("connect");
    let mut config = WorkerConfig::new("q").with_ttl(Duration::from_secs(3));
    config.owner = "logged".into();
    config.listen = false;
    config.poll_interval = Duration::from_millis(50);
    let worker = Worker::new(client, config, |job| async move {
        if job.payload()["fail"] == true {
            return Err("the mail server said no".into());
        }
        // Held across a partition: its heartbeat fails meanwhile.
        tokio::time::sleep(Duration::from_millis(4000)).await;
        Ok(Outcome::Done)
    });
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    // After the first heartbeat (1 s) has opened its connection.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    proxy.pause();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    proxy.resume();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    run.await.expect("task").expect("run");

    let log = String::from_utf8(captured.0.lock().expect("log").clone()).expect("utf-8");
    for expected in [
        "worker started",
        "handler failed: retry",
        "the mail server said no",
        "heartbeat failed",
        "worker stopped",
    ] {
        assert!(log.contains(expected), "no \"{expected}\" in:\n{log}");
    }
    let failure = log
        .lines()
        .find(|l| l.contains("handler failed: retry"))
        .expect("the handler's failure");
    assert!(
        failure.contains("job{") && failure.contains("queue=q") && failure.contains("attempt=1"),
        "the job's span fields: {failure}"
    );
}

/// The Worker's own sessions (heartbeat and listener) show its owner as
/// `application_name`, so operators can tell replicas apart in
/// pg_stat_activity. Before the fix they carried none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_sessions_carry_its_owner() {
    let cluster = Cluster::start();
    let client = pg_tests::jobs::client(&cluster).await;
    let mut config = WorkerConfig::new("default").with_ttl(Duration::from_secs(3));
    config.owner = "replica-7".into();
    config.poll_interval = Duration::from_millis(100);
    // One job that runs long enough for a heartbeat.
    client
        .enqueue("default", &serde_json::json!({}))
        .await
        .expect("enqueue");
    let worker = Worker::new(client, config, |job| async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(3)) => {}
            () = job.cancelled() => {}
        }
        Ok(Outcome::Done)
    });
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let watch = cluster.connect().await;
    // The listener connects at start, the heartbeat at its first tick.
    pg_tests::eventually(
        &watch,
        "SELECT count(*) >= 2 FROM pg_stat_activity WHERE application_name = 'replica-7'",
        Duration::from_secs(5),
    )
    .await;
    shutdown.cancel();
    run.await.expect("task").expect("run");
}
