//! The Worker taking back its own leases after a restart
//! (`WorkerConfig::reclaim_own`).
//!
//! Failed before the fix: the Worker kept calling `reclaim_own` while
//! each call came back full, so once its earlier incarnation held as many
//! leases as it has slots, every freed slot re-issued a row it was already
//! running, under a new epoch; the old handler was silently fenced and ran
//! on beside the new one, and the slow row never finished.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{CancellationToken, Outcome, Worker, WorkerConfig};
use pg_tests::{scalar, Cluster};
use serde_json::json;

/// The repro: two rows held by `replica-0` from an earlier run; a
/// Worker restarted as `replica-0` with two slots reclaims them. Row 1 takes
/// 100 ms, row 2 one second and then a fenced write. Each row is started
/// exactly once, the fenced write is accepted, both finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaiming_worker_runs_each_of_its_rows_once() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q', retention => '1 hour');
         SELECT lease.enqueue('q', '{\"work_ms\": 100}');
         SELECT lease.enqueue('q', '{\"work_ms\": 1000}');
         SELECT lease.claim_pending(2, '10 seconds', 'replica-0', 'q');",
    )
    .await
    .expect("two rows held by the earlier incarnation");

    let starts: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let fenced: Arc<Mutex<Vec<bool>>> = Arc::default();
    let mut config = WorkerConfig::new("q").with_ttl(Duration::from_secs(10));
    config.owner = "replica-0".into();
    config.concurrency = 2;
    config.reclaim_own = true;
    config.poll_interval = Duration::from_millis(100);
    let client = pg_tests::jobs::client(&cluster).await;
    let worker = {
        let (starts, fenced) = (Arc::clone(&starts), Arc::clone(&fenced));
        Worker::new(client, config, move |job| {
            let (starts, fenced) = (Arc::clone(&starts), Arc::clone(&fenced));
            async move {
                *starts
                    .lock()
                    .expect("starts")
                    .entry(job.lease().id())
                    .or_default() += 1;
                let ms = job.payload()["work_ms"].as_u64().unwrap_or(0);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    () = job.cancelled() => return Ok(Outcome::Abandon),
                }
                if ms >= 1000 {
                    let write = job.fenced_update(&json!({ "written": true })).await;
                    fenced.lock().expect("fenced").push(write.is_ok());
                }
                Ok(Outcome::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(4)).await;
    shutdown.cancel();
    let summary = run.await.expect("task").expect("run");

    let starts = starts.lock().expect("starts").clone();
    assert_eq!(starts.len(), 2, "both rows ran: {starts:?}");
    assert!(
        starts.values().all(|n| *n == 1),
        "a row started twice: {starts:?}"
    );
    assert_eq!(
        *fenced.lock().expect("fenced"),
        vec![true],
        "the slow row's write"
    );
    let done: i64 = scalar(&pg, "SELECT count(*) FROM lease.job WHERE state = 'done'").await;
    assert_eq!(done, 2, "{summary:?}");
}
