//! Rate limits in the claim (sql/rate.sql): a queue created with
//! `rate_limit => N, rate_period => P` hands out at most N rows in any span
//! of P, by the database clock, whatever the number of claimers; rows held
//! back are claimable as soon as the limit lets them through, and
//! `lease.rate_wait` says when that is.
//!
//! Each row's claim time is `lease_until - ttl`: the instant the limit
//! counts it at.

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use pg_lease_client::{CancellationToken, Outcome, Worker, WorkerConfig};
use pg_tests::claims::{busiest_window, claim_in_loops};
use pg_tests::{scalar, skipped_on_citus, sqlstate, Cluster, ClusterConfig};

/// The tests that measure how much of a limit claims use share the
/// machine's two cores with nothing else of this suite.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Claim times (microseconds) of the rows `claim` returned; `claim` is a
/// claim of ttl one minute.
async fn claim_times(pg: &tokio_postgres::Client, claim: &str) -> Vec<i64> {
    pg.query(
        &format!(
            "SELECT (extract(epoch FROM c.lease_until - interval '1 minute') * 1e6)::bigint
               FROM {claim} c"
        ),
        &[],
    )
    .await
    .expect("claim")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A claim takes what the limit allows and no more, the rest comes when
/// the first claims are a period old, `rate_wait` says when, and a queue
/// whose limit is removed gives everything at once.
///
/// Failed before: `create_queue` had no `rate_limit` (42883), and a claim
/// took all ten rows.
#[tokio::test]
async fn a_claim_takes_what_the_limit_allows_and_the_rest_later() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 3, rate_period => '600 milliseconds');
         SELECT lease.create_queue('free');
         SELECT lease.enqueue('r', jsonb_build_object('n', g)) FROM generate_series(1, 10) g;",
    )
    .await
    .expect("a limited queue with ten rows");
    let claim = "lease.claim_pending(10, '1 minute', 'w', 'r')";
    let wait = "SELECT (extract(epoch FROM lease.rate_wait('r')) * 1e3)::float8";

    assert_eq!(scalar::<f64>(&pg, wait).await, 0.0, "nothing claimed yet");
    let first = claim_times(&pg, claim).await;
    assert_eq!(first.len(), 3, "the limit's worth");
    assert!(
        claim_times(&pg, claim).await.is_empty(),
        "none left this period"
    );
    let ms = scalar::<f64>(&pg, wait).await;
    assert!(ms > 0.0 && ms <= 600.0, "rate_wait {ms} ms");
    let free: Option<String> = scalar(&pg, "SELECT lease.rate_wait('free')::text").await;
    assert_eq!(free, None, "no limit, no wait");

    tokio::time::sleep(Duration::from_secs_f64(ms / 1e3 + 0.02)).await;
    let second = claim_times(&pg, claim).await;
    assert_eq!(second.len(), 3, "the permits came back");
    assert!(second[0] - first[0] >= 600_000, "{first:?} {second:?}");

    pg.batch_execute("SELECT lease.create_queue('r')")
        .await
        .expect("limit removed");
    assert_eq!(claim_times(&pg, claim).await.len(), 4, "the rest at once");
}

/// A claim of a limited queue left in an open transaction holds only the
/// shares of the limit it took from: another claim meanwhile gets rows at
/// once.
///
/// Failed before: the claims of a limited queue took turns on the queue's
/// row until their transactions ended, so the other claim waited 100 ms
/// and got none while rows were ready (under load, drains of sixteen
/// claimers left rows behind).
#[tokio::test]
async fn an_open_transaction_leaves_other_claims_their_permits() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 100);
         SELECT lease.enqueue('r', '{}') FROM generate_series(1, 10);",
    )
    .await
    .expect("a limited queue");
    pg.batch_execute("BEGIN; SELECT lease.claim_pending(1, '1 minute', 'a', 'r');")
        .await
        .expect("a claim in an open transaction");
    let other = cluster.connect().await;
    let got = claim_times(&other, "lease.claim_pending(5, '1 minute', 'b', 'r')").await;
    assert_eq!(got.len(), 5);
    pg.batch_execute("COMMIT").await.expect("commit");
}

/// A transaction left open after a claim that took from every share holds
/// them all: another claim meanwhile waits at most 100 ms for one and gets
/// no rows, instead of waiting for that transaction, and gets them once
/// it ends and the permits are a period old.
///
/// Broken on purpose: with `lease._rate_take` waiting for a share
/// without a bound, the second claim hung until its statement timeout.
#[tokio::test]
async fn an_open_transaction_holding_every_share_hangs_no_one() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 32, rate_period => '500 milliseconds');
         SELECT lease.enqueue('r', '{}') FROM generate_series(1, 40);",
    )
    .await
    .expect("a limited queue");
    pg.batch_execute("BEGIN; SELECT lease.claim_pending(32, '1 minute', 'a', 'r');")
        .await
        .expect("a claim of every permit in an open transaction");
    let other = cluster.connect().await;
    other
        .batch_execute("SET statement_timeout = '5s'")
        .await
        .expect("set");
    let claim = "lease.claim_pending(5, '1 minute', 'b', 'r')";
    let during = std::time::Instant::now();
    assert!(claim_times(&other, claim).await.is_empty());
    assert!(
        during.elapsed() < Duration::from_secs(2),
        "{:?}",
        during.elapsed()
    );
    pg.batch_execute("COMMIT").await.expect("commit");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(claim_times(&other, claim).await.len(), 5);
}

/// Bad limits are refused with their SQLSTATE, and change nothing.
#[tokio::test]
async fn bad_limits_are_refused() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('r', rate_limit => 5)")
        .await
        .expect("a limited queue");
    for (args, code) in [
        ("rate_limit => 0", "22023"),
        ("rate_limit => 100001", "22023"),
        ("rate_limit => 5, rate_period => '0'", "22023"),
        ("rate_limit => 5, rate_period => '-1 second'", "22023"),
        ("rate_limit => 5, rate_period => '1 month'", "22023"),
        ("rate_limit => 5, rate_period => '2 days'", "22023"),
        ("rate_limit => 5, rate_period => NULL", "22004"),
    ] {
        let err = pg
            .batch_execute(&format!("SELECT lease.create_queue('r', {args})"))
            .await
            .expect_err(args);
        assert_eq!(sqlstate(&err).as_deref(), Some(code), "{args}: {err}");
    }
    let kept: String = scalar(
        &pg,
        "SELECT rate_limit || ' per ' || rate_period FROM lease.queue WHERE name = 'r'",
    )
    .await;
    assert_eq!(kept, "5 per 00:00:01");
}

/// Sixteen sessions claim batches of 1 to 5 rows from a backlog for 3 s,
/// again at once after rows and 2 ms after none, against 50 rows per 250 ms: no span of 250 ms holds
/// more than 50 claims, and the first 2.5 s use at least 95% of what the
/// limit allows.
///
/// Broken on purpose: with `lease._rate_take` reading a share without
/// locking it, concurrent claims counted the same permits and the busiest
/// window held more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_never_pass_the_limit() {
    const LIMIT: usize = 50;
    const PERIOD: i64 = 250_000;
    let _alone = TIMED.lock().await;
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 50, rate_period => '250 milliseconds');
         SELECT lease.enqueue_batch('r', array_agg(jsonb_build_object('n', g)))
           FROM generate_series(1, 5000) g;",
    )
    .await
    .expect("a backlog");
    let mut starts: Vec<i64> = claim_in_loops(&cluster, "r", Duration::from_secs(3))
        .await
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let busiest = busiest_window(&mut starts, PERIOD);
    assert!(busiest <= LIMIT, "{busiest} claims in one window");
    let first = starts[0];
    let used = starts.iter().filter(|&&s| s < first + 10 * PERIOD).count();
    // Claims close together share an entry of a share's record.
    let entries: i32 = scalar(
        &pg,
        "SELECT max(cardinality(starts)) FROM lease.rate_share WHERE queue = 'r'",
    )
    .await;
    assert!(entries <= 101, "{entries} entries");
    // Said, not asserted, on a distributed install: three servers and
    // sixteen claimers in a loop share two cores there, and the turn's
    // holder got 88-94% of what the limit allows in runs beside the
    // suite's other tests (the Workers' test below holds there too).
    if skipped_on_citus("the use of the limit by sixteen claimers in a loop") {
        eprintln!("{used} of {} allowed claims used", 10 * LIMIT);
        return;
    }
    assert!(
        used * 100 >= 95 * 10 * LIMIT,
        "{used} of {} allowed claims used",
        10 * LIMIT
    );
}

/// Sixteen claimers on two Workers of 8 slots, with their defaults
/// otherwise, against 200 rows a second for 30 s with a backlog
/// throughout: never more than 200 claims in any second, and at least 95%
/// of the allowed ones used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_use_the_limit_and_never_pass_it() {
    const SECS: i64 = 30;
    let _alone = TIMED.lock().await;
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 200);
         SELECT lease.enqueue_batch('r', array_agg(jsonb_build_object('n', g)))
           FROM generate_series(1, 7000) g;",
    )
    .await
    .expect("a backlog");
    let starts = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut config = WorkerConfig::new("r");
        config.concurrency = 8;
        let ttl = config.ttl;
        let starts = Arc::clone(&starts);
        let worker = Worker::new(pg_tests::jobs::client(&cluster).await, config, move |job| {
            let claimed = job.lease().lease_until() - ttl;
            let micros = claimed
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            starts.lock().expect("starts").push(micros);
            async { Ok(Outcome::Done) }
        });
        runs.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_secs(SECS as u64)).await;
    shutdown.cancel();
    for run in runs {
        run.await.expect("join").expect("worker");
    }
    let mut starts = std::mem::take(&mut *starts.lock().expect("starts"));
    let busiest = busiest_window(&mut starts, 1_000_000);
    assert!(busiest <= 200, "{busiest} claims in one second");
    // The first SECS - 1 seconds from the first claim: the run's last
    // second may be cut short by the shutdown.
    let first = starts[0];
    let used = starts
        .iter()
        .filter(|&&s| s < first + (SECS - 1) * 1_000_000)
        .count();
    let allowed = (SECS - 1) as usize * 200;
    eprintln!("{used} of {allowed} allowed claims used, {busiest} in the busiest second");
    assert!(
        used * 100 >= 95 * allowed,
        "{used} of {allowed} allowed claims used"
    );
}

/// One Worker against 2 rows a second, with a backlog, for 3 s: after the
/// limit's rows it waits until the limit lets the next through, instead of
/// claiming every few milliseconds.
///
/// Broken on purpose: with the Worker ignoring `rate_wait` (rechecking as
/// after an empty queue, at doubling intervals) it called claim_pending 26
/// times in 3 s for 6 rows; with it, 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waits_for_the_limit_instead_of_polling() {
    if skipped_on_citus("claims counted by the coordinator's statistics, which run on the nodes") {
        return;
    }
    let _alone = TIMED.lock().await;
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec!["track_functions = 'pl'".into()],
        ..ClusterConfig::default()
    });
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('r', rate_limit => 2);
         SELECT lease.enqueue('r', '{}') FROM generate_series(1, 100);",
    )
    .await
    .expect("a slow queue with a backlog");
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        pg_tests::jobs::client(&cluster).await,
        WorkerConfig::new("r"),
        |_job| async { Ok(Outcome::Done) },
    );
    let run = tokio::spawn(worker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    shutdown.cancel();
    run.await.expect("join").expect("worker");
    // The Worker's sessions report their counts as they end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls: i64 = scalar(
        &pg,
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
          WHERE schemaname = 'lease' AND funcname = 'claim_pending'",
    )
    .await;
    let done: i64 = scalar(&pg, "SELECT count(*) FROM lease.job").await;
    assert!(calls <= 18, "{calls} claims for {} rows", 100 - done);
}
