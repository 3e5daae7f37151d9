//! Batch claims come back in the order they claimed: priority (highest
//! first), rank (an attached table's `order_by`), eligible time, id. The
//! Worker starts its rows in that order.
//!
//! Failed before the fix: `claim_pending(4)` picked the right four rows of
//! an attached table ordered by deadline but returned them in the order the
//! UPDATE met them, the latest deadline first; `release_and_claim` and
//! `reclaim_own` inherited it, and the Worker started its batch so.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_lease_client::{CancellationToken, Outcome, Worker, WorkerConfig};
use pg_tests::Cluster;
use tokio_postgres::Client as Pg;

/// Ten rows whose deadlines run backwards against their ids and physical
/// order (slo-0 due in 10 h, ..., slo-9 in 1 h), attached with
/// `order_by => 'due'`: claim order is slo-9, slo-8, ...
///
/// A distributed install refuses `attach`; there the same order comes from
/// eligible times that run backwards against the ids (slo-9 eligible
/// first), in a queue `slo` of its own.
async fn deadlines(pg: &Pg) {
    let sql = if pg_tests::citus_install_mode() {
        "SELECT lease.create_queue('slo');
         SELECT lease.enqueue('slo', '{}', key => 'slo-' || i, run_at => now() - (i + 1) * interval '1 minute')
           FROM generate_series(0, 9) i;"
    } else {
        "CREATE TABLE slo (id text PRIMARY KEY, due timestamptz NOT NULL, status text NOT NULL);
         INSERT INTO slo SELECT 'slo-' || i, now() + (10 - i) * interval '1 hour', 'todo'
           FROM generate_series(0, 9) i;
         SELECT lease.attach('slo', $$status = 'todo'$$, order_by => 'due');"
    };
    pg.batch_execute(sql).await.expect("rows in deadline order");
}

/// Keys as a claim returned them.
async fn keys(pg: &Pg, sql: &str) -> Vec<String> {
    pg.query(sql, &[])
        .await
        .expect(sql)
        .iter()
        .filter_map(|row| row.get::<_, Option<String>>("key"))
        .collect()
}

fn slo(ids: &[u32]) -> Vec<String> {
    ids.iter().map(|i| format!("slo-{i}")).collect()
}

#[tokio::test]
async fn claim_pending_returns_its_batch_in_claim_order() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    deadlines(&pg).await;
    for _ in 0..2 {
        pg.batch_execute("SELECT lease.claim_pending(1, '1 minute', 'w', 'slo')")
            .await
            .expect("single claim");
    }
    let batch = keys(
        &pg,
        "SELECT key FROM lease.claim_pending(4, '1 minute', 'w', 'slo')",
    )
    .await;
    assert_eq!(batch, slo(&[7, 6, 5, 4]), "earliest deadline first");
}

#[tokio::test]
async fn priorities_come_before_order_within_a_batch() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('p');
         SELECT lease.enqueue('p', jsonb_build_object('n', i), key => 'k' || i,
                              priority => CASE WHEN i % 3 = 0 THEN 5 ELSE 0 END)
           FROM generate_series(1, 9) i;",
    )
    .await
    .expect("queue");
    let batch = keys(
        &pg,
        "SELECT key FROM lease.claim_pending(9, '1 minute', 'w', 'p')",
    )
    .await;
    let expected: Vec<String> = [3, 6, 9, 1, 2, 4, 5, 7, 8]
        .iter()
        .map(|i| format!("k{i}"))
        .collect();
    assert_eq!(batch, expected);
}

#[tokio::test]
async fn release_and_claim_and_reclaim_own_keep_claim_order() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    deadlines(&pg).await;
    let first = pg
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'w', 'slo')",
            &[],
        )
        .await
        .expect("single claim");
    let (id, epoch): (i64, i64) = (first.get(0), first.get(1));
    let refill = keys(
        &pg,
        &format!(
            "SELECT key FROM lease.release_and_claim(ARRAY[{id}], 'w', ARRAY[{epoch}], 4, '1 minute', 'slo')"
        ),
    )
    .await;
    assert_eq!(refill, slo(&[8, 7, 6, 5]));
    let reclaimed = keys(
        &pg,
        "SELECT key FROM lease.reclaim_own(10, '1 minute', 'w', 'slo')",
    )
    .await;
    assert_eq!(reclaimed, slo(&[8, 7, 6, 5]));
}

/// The client's claim, and a Worker with one slot: it starts its rows in
/// claim order (its first claim takes them all, with the prefetch).
#[tokio::test]
async fn the_client_and_the_worker_follow_claim_order() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    deadlines(&pg).await;
    let client = pg_tests::jobs::client(&cluster).await;
    let claimed = client
        .claim(3, Duration::from_secs(60), "c", "slo")
        .await
        .expect("claim");
    let got: Vec<String> = claimed
        .iter()
        .filter_map(|c| c.lease.key().map(str::to_owned))
        .collect();
    assert_eq!(got, slo(&[9, 8, 7]));

    let started = Arc::new(Mutex::new(Vec::new()));
    let mut config = WorkerConfig::new("slo");
    config.concurrency = 1;
    config.prefetch = Some(10);
    config.poll_interval = Duration::from_millis(100);
    let worker = {
        let seen = Arc::clone(&started);
        Worker::new(client, config, move |job| {
            let seen = Arc::clone(&seen);
            async move {
                let key = job.lease().key().unwrap_or_default().to_owned();
                seen.lock().expect("lock").push(key);
                Ok(Outcome::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    pg_tests::until("seven rows started", Duration::from_secs(10), || async {
        started.lock().expect("lock").len() >= 7
    })
    .await;
    shutdown.cancel();
    let _ = run.await;
    assert_eq!(*started.lock().expect("lock"), slo(&[6, 5, 4, 3, 2, 1, 0]));
}
