//! Per-key concurrency under contention: producers, claimers that end their
//! leases every way there is (done, retry, fail, abandon, expiry), a
//! canceller and the reaper all at once, while a monitor checks in every
//! snapshot that no key has more than its limit of rows leased — and that
//! the limit was reached, so the check had something to catch. At the end
//! every row has finished, none is left held, and the slot bookkeeping
//! agrees with the rows.
//!
//! Failed before per-key concurrency existed. Proven once against a
//! deliberate break: with `lease._hold` admitting a new row when a plain
//! read of the key's `active` count was below the limit, and locking the
//! slot row only afterwards to add to it (check, then act), the monitor saw
//! a key with 3 rows leased at a limit of 2.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{Client, EnqueueOptions, Error, Outcome, QueueOptions};
use pg_tests::{scalar, Cluster, ClusterConfig, Rng, TEST_DB};

const LIMIT: i64 = 2;
const KEYS: u64 = 4;
const PRODUCERS: u64 = 3;
const ROWS_PER_PRODUCER: u64 = 120;
const CLAIMERS: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_ever_has_more_than_its_limit_leased() {
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(200)));
    let conn = cluster.conn_string(TEST_DB);
    let admin = Client::connect(&conn).await.expect("client");
    admin
        .create_queue(
            "serial",
            &QueueOptions {
                concurrency: Some(LIMIT as i32),
                backoff_base: Duration::from_millis(10),
                backoff_max: Duration::from_millis(50),
                max_attempts: 4,
                ..QueueOptions::default()
            },
        )
        .await
        .expect("queue");

    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(AtomicI64::new(0));
    let monitor = {
        let (stop, worst, pg) = (stop.clone(), worst.clone(), cluster.connect().await);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let most: i64 = scalar(
                    &pg,
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM lease.job
                      WHERE queue = 'serial' AND state = 'leased' GROUP BY concurrency_key) k",
                )
                .await;
                worst.fetch_max(most, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };

    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let conn = conn.clone();
        producers.push(tokio::spawn(async move {
            let client = Client::connect(&conn).await.expect("producer");
            let mut rng = Rng::new(p);
            for i in 0..ROWS_PER_PRODUCER {
                let options = EnqueueOptions {
                    concurrency_key: Some(format!("tenant-{}", rng.below(KEYS))),
                    ..EnqueueOptions::default()
                };
                client
                    .enqueue_with("serial", &serde_json::json!({ "p": p, "i": i }), &options)
                    .await
                    .expect("enqueue");
            }
        }));
    }
    let mut tasks = Vec::new();
    for c in 0..CLAIMERS {
        let (conn, stop) = (conn.clone(), stop.clone());
        tasks.push(tokio::spawn(
            async move { claim_and_end(&conn, c, &stop).await },
        ));
    }
    {
        let (pg, stop) = (cluster.connect().await, stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(99);
            while !stop.load(Ordering::Relaxed) {
                // Pending rows, held or admitted, and leased ones alike;
                // found first, then cancelled by a call of its own, as a
                // distributed install needs (a call inside a query over
                // lease.job would run on the queue's node, in the shard's
                // query).
                let picked = pg
                    .query_opt(
                        "SELECT id FROM lease.job
                          WHERE queue = 'serial' AND state IN ('pending', 'leased')
                          ORDER BY random() LIMIT 1",
                        &[],
                    )
                    .await
                    .expect("pick a row");
                if let Some(row) = picked {
                    pg.execute(
                        "SELECT lease.cancel($1, 'serial')",
                        &[&row.get::<_, i64>(0)],
                    )
                    .await
                    .expect("cancel");
                }
                tokio::time::sleep(Duration::from_millis(20 + rng.below(30))).await;
            }
        }));
    }

    for p in producers {
        p.await.expect("producer");
    }
    let pg = cluster.connect().await;
    let finished = "SELECT NOT EXISTS (SELECT FROM lease.job
                                        WHERE queue = 'serial' AND state IN ('pending', 'leased'))";
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !scalar::<bool>(&pg, finished).await {
        if std::time::Instant::now() > deadline {
            let state = cluster.psql(
                TEST_DB,
                "SELECT concurrency_key, state, held, count(*) FROM lease.job GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
                 SELECT * FROM lease.key_slot ORDER BY key;",
            );
            panic!("rows still open after 90 s:\n{state}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    monitor.await.expect("monitor");

    let worst = worst.load(Ordering::Relaxed);
    assert!(
        worst <= LIMIT,
        "a key had {worst} rows leased at once (limit {LIMIT})"
    );
    assert_eq!(
        worst, LIMIT,
        "the limit was never reached: the test saw no contention"
    );
    // Everything is back to zero (or swept away), nothing is held.
    let drift: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.key_slot WHERE active <> 0 OR waiting <> 0",
    )
    .await;
    assert_eq!(
        drift, 0,
        "slot bookkeeping left non-zero after every row ended"
    );
    let held: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE held AND state = 'pending'",
    )
    .await;
    assert_eq!(held, 0);
}

/// Claims up to 3 rows at a time and ends each one way or another:
/// done, retry, fail, abandon, or a lease left to expire.
async fn claim_and_end(conn: &str, seed: u64, stop: &AtomicBool) {
    let client = Client::connect(conn).await.expect("claimer");
    let owner = format!("claimer-{seed}");
    let mut rng = Rng::new(1000 + seed);
    while !stop.load(Ordering::Relaxed) {
        let claimed = client
            .claim(3, Duration::from_millis(300), &owner, "serial")
            .await
            .expect("claim");
        if claimed.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
        for c in claimed {
            let outcome = match rng.below(20) {
                0..=11 => Outcome::Done,
                12..=14 => Outcome::Retry {
                    delay: None,
                    error: None,
                },
                15 => Outcome::Fail { error: None },
                16..=17 => Outcome::Abandon,
                // Left to expire: the reaper gives it back (or dead-letters it).
                _ => continue,
            };
            match client.release(&c.lease, &outcome).await {
                // A lease that ran out under load is the reaper's now.
                Ok(()) | Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("release: {e}"),
            }
        }
    }
}
