//! The Worker claiming ahead of its free slots (`WorkerConfig::prefetch`):
//! the invariant "never more leases than slots" becomes "never more
//! handlers than `concurrency`, never more leases than `concurrency +
//! prefetch`", and rows that never started are given back at once on
//! shutdown. New with prefetch; before it the Worker had none and
//! drained no-op jobs at 5.3k/s where it now does 22k/s (docs/performance.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{CancellationToken, Outcome, Worker, WorkerConfig};
use pg_tests::{eventually, scalar, Cluster};

/// Concurrency 3, prefetch 4, 20 slow rows: at most 3 handlers run, at most
/// 7 leases are held (and at least 4 while the backlog lasts, so rows are
/// claimed ahead); prefetched rows are held renewed past their ttl; on
/// shutdown the waiting rows are pending again at once, attempt given back.
///
/// Broken on purpose: with the slots sized `concurrency + 100` (before the
/// actor, in the dispatcher), 7 handlers ran at once and this test failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_rows_wait_for_slots_and_go_back_on_shutdown() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q', retention => '1 hour');
         SELECT lease.enqueue('q', '{}') FROM generate_series(1, 20);",
    )
    .await
    .expect("rows");
    let running = Arc::new(AtomicUsize::new(0));
    let most_running = Arc::new(AtomicUsize::new(0));
    let mut config = WorkerConfig::new("q").with_ttl(Duration::from_secs(2));
    config.owner = "w".into();
    config.concurrency = 3;
    config.prefetch = Some(4);
    config.poll_interval = Duration::from_millis(50);
    let client = pg_tests::jobs::client(&cluster).await;
    let worker = {
        let (running, most) = (Arc::clone(&running), Arc::clone(&most_running));
        Worker::new(client, config, move |job| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(900)) => {}
                    () = job.cancelled() => {}
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(Outcome::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));

    let leased = "SELECT count(*) FROM lease.job WHERE state = 'leased'";
    eventually(
        &pg,
        &format!("SELECT ({leased}) >= 7"),
        Duration::from_secs(10),
    )
    .await;
    let mut most_leased = 0;
    // 3 s: past the 2 s ttl, so waiting rows must have been renewed.
    for _ in 0..60 {
        most_leased = most_leased.max(scalar::<i64>(&pg, leased).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(most_leased <= 7, "{most_leased} leases held");
    assert_eq!(most_running.load(Ordering::SeqCst), 3);
    let reaped: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE last_error LIKE 'lease expired%'",
    )
    .await;
    assert_eq!(reaped, 0);
    let expired: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE state = 'leased' AND lease_until < clock_timestamp()",
    )
    .await;
    assert_eq!(expired, 0, "waiting rows are renewed");

    shutdown.cancel();
    // The waiting rows go back at once, long before the grace period (2 s)
    // would end the running ones.
    eventually(
        &pg,
        &format!("SELECT ({leased}) <= 3"),
        Duration::from_millis(500),
    )
    .await;
    let summary = run.await.expect("task").expect("run");
    let given_back: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE state = 'pending' AND attempt = 0",
    )
    .await;
    assert!(
        given_back >= 4,
        "{given_back} rows back untouched; {summary:?}"
    );
    assert_eq!(scalar::<i64>(&pg, leased).await, 0);
}

/// Two Workers with prefetch drain 4,000 no-op rows side by side without
/// giving any row back: a claim and a release batch in flight at once
/// never hold more than `concurrency + prefetch` leases between them, so no
/// claimed row is over the budget. The poll interval is a minute, so a row
/// given back (pending again, nobody told) would stall the drain.
///
/// Failed with the first version of the actor's accounting, which counted
/// a release batch's done leases beside the refill that replaces them: a
/// claim that returned meanwhile overflowed the budget and abandoned rows
/// (seen in `bin/bench --only worker` as a 2 s stall of the 2 × 8 drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefetching_workers_drain_without_giving_rows_back() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q');
         SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[4000]));",
    )
    .await
    .expect("rows");
    let mut runs = Vec::new();
    for owner in ["a", "b"] {
        let mut config = WorkerConfig::new("q");
        config.owner = owner.into();
        config.concurrency = 4;
        config.prefetch = Some(60);
        config.listen = false;
        config.poll_interval = Duration::from_secs(60);
        let client = pg_tests::jobs::client(&cluster).await;
        let worker = Worker::new(client, config, |_job| async { Ok(Outcome::Done) });
        runs.push(pg_tests::workers::spawn(worker));
    }
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM lease.job WHERE queue = 'q'",
        Duration::from_secs(30),
    )
    .await;
    let mut done = 0;
    for (shutdown, handle) in runs {
        let summary = pg_tests::workers::stop(shutdown, handle).await;
        assert_eq!(summary.abandoned, 0, "{summary:?}");
        done += summary.done;
    }
    assert_eq!(done, 4000);
}

/// The same with the default prefetch, which the Worker sizes itself: a
/// budget that moves while claims are in flight gives no row back either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_the_default_prefetch_drain_without_giving_rows_back() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q');
         SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[4000]));",
    )
    .await
    .expect("rows");
    let mut runs = Vec::new();
    for owner in ["a", "b"] {
        let mut config = WorkerConfig::new("q");
        config.owner = owner.into();
        config.concurrency = 4;
        config.listen = false;
        config.poll_interval = Duration::from_secs(60);
        let client = pg_tests::jobs::client(&cluster).await;
        let worker = Worker::new(client, config, |_job| async { Ok(Outcome::Done) });
        runs.push(pg_tests::workers::spawn(worker));
    }
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM lease.job WHERE queue = 'q'",
        Duration::from_secs(30),
    )
    .await;
    let mut done = 0;
    for (shutdown, handle) in runs {
        let summary = pg_tests::workers::stop(shutdown, handle).await;
        assert_eq!(summary.abandoned, 0, "{summary:?}");
        done += summary.done;
    }
    assert_eq!(done, 4000);
}

/// The default prefetch under a short ttl when handlers turn slow: 200
/// no-op rows make the Worker claim hundreds ahead, so the 12 slow rows
/// (1 s each, 2 slots, ttl 2 s) behind them are claimed long before a slot
/// can start them. None may wait for a slot past its lease's confirmed
/// time: each row that has waited half of it goes back (pending, for any
/// Worker), and once the slots are seen busy the Worker claims no more
/// than they start in time. Every row is done exactly once and none
/// expires.
///
/// Broken on purpose: with rows never given back (`Pace::overdue` always
/// false), the last slow rows waited 5 s for a slot and this failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_row_waits_for_a_slot_past_its_lease() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('q', retention => '1 hour');
         SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{\"slow\": false}'::jsonb, ARRAY[200]));
         SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{\"slow\": true}'::jsonb, ARRAY[12]));",
    )
    .await
    .expect("rows");
    let ttl = Duration::from_secs(2);
    let longest_wait = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let mut config = WorkerConfig::new("q").with_ttl(ttl);
    config.concurrency = 2;
    config.poll_interval = Duration::from_millis(100);
    let client = pg_tests::jobs::client(&cluster).await;
    let worker = {
        let longest = Arc::clone(&longest_wait);
        Worker::new(client, config, move |job| {
            let longest = Arc::clone(&longest);
            async move {
                // Claimed at lease_until − ttl, by the database's clock,
                // which is this machine's.
                let claimed = job.lease().lease_until() - ttl;
                let waited = std::time::SystemTime::now()
                    .duration_since(claimed)
                    .unwrap_or_default();
                {
                    let mut most = longest.lock().expect("lock");
                    *most = (*most).max(waited);
                }
                if job.payload()["slow"] == true {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(Outcome::Done)
            }
        })
    };
    let run = pg_tests::workers::spawn(worker);
    eventually(
        &pg,
        "SELECT count(*) = 212 FROM lease.job WHERE queue = 'q' AND state = 'done'",
        Duration::from_secs(30),
    )
    .await;
    let summary = pg_tests::workers::stop(run.0, run.1).await;
    assert_eq!(summary.done, 212, "{summary:?}");
    let expired: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE last_error LIKE 'lease expired%'",
    )
    .await;
    assert_eq!(expired, 0);
    let waited = *longest_wait.lock().expect("lock");
    assert!(
        waited < ttl - ttl / 6,
        "a row waited {waited:?} for a slot; {summary:?}"
    );
    eprintln!(
        "longest wait for a slot {waited:?}; {} given back",
        summary.abandoned
    );
}
