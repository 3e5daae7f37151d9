//! Leases bound to their holder's session (`lease.bind_session`,
//! `WorkerConfig::bind_session`): a holder that dies gives its work back
//! within about a second, not after its ttl; one that is only slow, or
//! partitioned for less than its ttl, keeps it.
//!
//! Failed before binding existed: the tests did not compile, and a killed
//! Worker's leases waited out their 60 s ttl. Checked by hand against a
//! deliberate break, the sweep without its `lease._end_lost_sessions()`
//! step: the kill test then waits out the ttl and fails its 3 s bound.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{
    CancelReason, Client, Error, FencingToken, HandlerResult, Job, Outcome, Worker, WorkerConfig,
};
use pg_tests::proxy::Proxy;
use pg_tests::{eventually, scalar, Cluster, ClusterConfig, TEST_DB};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;

/// Queue `bound` and the table the holders record their starts in.
async fn setup(pg: &tokio_postgres::Client, rows: usize) {
    pg.batch_execute(&format!(
        "CREATE SCHEMA bound;
         CREATE TABLE bound.starts (row_id bigint, epoch bigint, pid int,
                                    at timestamptz DEFAULT clock_timestamp());
         SELECT lease.create_queue('bound', retention => '1 hour', backoff_base => '0 seconds');
         SELECT lease.enqueue_batch('bound', array_agg('{{}}'::jsonb)) FROM generate_series(1, {rows})
          HAVING count(*) > 0;"
    ))
    .await
    .expect("queue bound");
}

/// Starts recorded per (row, epoch); panics if any was started twice.
async fn starts_once_per_epoch(pg: &tokio_postgres::Client) -> usize {
    let twice: i64 = scalar(
        pg,
        "SELECT count(*) FROM (SELECT FROM bound.starts GROUP BY row_id, epoch HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(twice, 0, "a row started twice under one epoch");
    let n: i64 = scalar(pg, "SELECT count(*) FROM bound.starts").await;
    usize::try_from(n).expect("count")
}

/// A handler that records its start with a fenced insert; on a row's first
/// attempt it then holds the lease until its token fires (counting that in
/// `fired` when the reason is a lost lease), later attempts are done at once.
fn holder(fired: Arc<AtomicUsize>) -> impl Fn(Job) -> HandlerFuture + Send + Sync + 'static {
    move |job: Job| -> HandlerFuture {
        let fired = Arc::clone(&fired);
        Box::pin(async move {
            let tx = job.transaction().await?;
            tx.execute(
                "INSERT INTO bound.starts (row_id, epoch, pid) VALUES ($1, $2, pg_backend_pid())",
                &[&job.lease().id(), &job.lease().epoch()],
            )
            .await?;
            tx.commit().await?;
            if job.lease().attempt() > 1 {
                return Ok(Outcome::Done);
            }
            job.cancelled().await;
            if job.cancel_reason() == Some(CancelReason::Lost) {
                fired.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Outcome::retry("token fired"))
        })
    }
}

fn config(owner: &str, concurrency: usize, ttl: Duration, bind: bool) -> WorkerConfig {
    let mut config = WorkerConfig::new("bound").with_ttl(ttl);
    config.owner = owner.to_owned();
    config.concurrency = concurrency;
    config.prefetch = Some(0);
    config.bind_session = bind;
    config
}

/// The median and the worst of `times`.
fn median_and_worst(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[times.len() - 1])
}

/// A Worker process holding 50 leases (ttl 60 s, bound to its session) is
/// killed with SIGKILL; a Worker of another process finishes all 50 within
/// 3 s of the kill, each row once per epoch, and the dead holder's tokens
/// are fenced. The reaper sweeps at its default interval (1 s). Repeated
/// `PG_LEASE_SESSION_KILLS` times (default 2); prints the median and worst
/// recovery times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_bound_leases_are_retried_within_seconds() {
    let kills: usize = std::env::var("PG_LEASE_SESSION_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_secs(1)));
    let pg = cluster.connect().await;
    setup(&pg, 0).await;
    let conn = cluster.conn_string(TEST_DB);
    let mut times = Vec::new();
    for round in 0..kills {
        pg.batch_execute(
            "TRUNCATE bound.starts;
             SELECT lease.enqueue_batch('bound', array_agg('{}'::jsonb)) FROM generate_series(1, 50);",
        )
        .await
        .expect("50 rows");
        let owner = format!("doomed-{round}");
        let mut child: Child = Command::new(env!("CARGO_BIN_EXE_bound_worker"))
            .args([conn.as_str(), owner.as_str(), "50"])
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start bound_worker");
        eventually(
            &pg,
            &format!(
                "SELECT count(*) = 50 FROM bound.starts
                  WHERE EXISTS (SELECT FROM lease.session WHERE owner = '{owner}')"
            ),
            Duration::from_secs(20),
        )
        .await;
        let old: Vec<(i64, i64)> = pg
            .query("SELECT row_id, epoch FROM bound.starts", &[])
            .await
            .expect("starts")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();

        let fired = Arc::new(AtomicUsize::new(0));
        let client = Client::connect(&conn).await.expect("connect");
        let rescuer = Worker::new(
            client.clone(),
            config(
                &format!("rescuer-{round}"),
                50,
                Duration::from_secs(60),
                false,
            ),
            holder(Arc::clone(&fired)),
        );
        let (shutdown, handle) = pg_tests::workers::spawn(rescuer);
        // Let the rescuer listen before the kill.
        tokio::time::sleep(Duration::from_millis(300)).await;

        let killed = Instant::now();
        child.start_kill().expect("kill -9");
        let _ = child.wait().await;
        eventually(
            &pg,
            "SELECT count(*) = 50 FROM lease.job WHERE queue = 'bound' AND state = 'done'",
            Duration::from_secs(65),
        )
        .await;
        let took = killed.elapsed();
        pg_tests::workers::stop(shutdown, handle).await;
        assert!(
            took < Duration::from_secs(3),
            "round {round}: the rescuer finished the 50 rows {took:?} after the kill"
        );
        assert_eq!(starts_once_per_epoch(&pg).await, 100, "50 starts by each");
        // The dead holder's tokens are refused: a zombie write changes nothing.
        for (id, epoch) in old.iter().take(5) {
            let token = FencingToken {
                id: *id,
                epoch: *epoch,
            };
            let err = client
                .fenced_update(token, &serde_json::json!({ "zombie": true }))
                .await
                .expect_err("a zombie's fenced write");
            assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
        }
        pg.batch_execute("DELETE FROM lease.job WHERE queue = 'bound'")
            .await
            .expect("clean up");
        times.push(took);
    }
    let (median, worst) = median_and_worst(&mut times);
    eprintln!(
        "recovery after SIGKILL over {kills} kills: median {median:?}, worst {worst:?} \
         (ttl 60 s, sweep interval 1 s)"
    );
}

/// The session the leases are bound to is terminated while the Worker
/// process lives on: its handlers' tokens fire (lease lost), another
/// Worker finishes the rows within 3 s, and no row starts twice under one
/// epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_ends_its_leases_while_the_process_lives() {
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_secs(1)));
    let pg = cluster.connect().await;
    setup(&pg, 10).await;
    let fired = Arc::new(AtomicUsize::new(0));
    let holder_worker = Worker::new(
        pg_tests::jobs::client(&cluster).await,
        config("holder", 10, Duration::from_secs(60), true),
        holder(Arc::clone(&fired)),
    );
    let (stop_holder, holder_handle) = pg_tests::workers::spawn(holder_worker);
    eventually(
        &pg,
        "SELECT count(*) = 10 FROM bound.starts
          WHERE EXISTS (SELECT FROM lease.session WHERE owner = 'holder')",
        Duration::from_secs(20),
    )
    .await;
    let rescuer = Worker::new(
        pg_tests::jobs::client(&cluster).await,
        config("rescuer", 10, Duration::from_secs(60), false),
        holder(Arc::new(AtomicUsize::new(0))),
    );
    let (stop_rescuer, rescuer_handle) = pg_tests::workers::spawn(rescuer);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let terminated = Instant::now();
    let ended: bool = scalar(
        &pg,
        "SELECT pg_terminate_backend(pid) FROM lease.session WHERE owner = 'holder'",
    )
    .await;
    assert!(ended, "the bound session was there to terminate");
    eventually(
        &pg,
        "SELECT count(*) = 10 FROM lease.job WHERE queue = 'bound' AND state = 'done'",
        Duration::from_secs(65),
    )
    .await;
    let took = terminated.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "finished {took:?} after the termination"
    );
    let start = Instant::now();
    while fired.load(Ordering::SeqCst) < 10 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        fired.load(Ordering::SeqCst),
        10,
        "every holder's token fired"
    );
    assert_eq!(starts_once_per_epoch(&pg).await, 20);
    pg_tests::workers::stop(stop_rescuer, rescuer_handle).await;
    pg_tests::workers::stop(stop_holder, holder_handle).await;
}

/// A partition shorter than the ttl (the proxy forwards nothing for 2 s,
/// nothing is closed, the heartbeat's request times out and reconnects):
/// the session lives on in the server, so the bound leases stay held under
/// their epochs and no token fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_partition_keeps_bound_leases() {
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(200)));
    let pg = cluster.connect().await;
    setup(&pg, 5).await;
    let proxy = Proxy::start(cluster.port()).await;
    let client = Client::connect(&proxy.conn_string(TEST_DB))
        .await
        .expect("connect through the proxy");
    let fired = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (fired, release) = (Arc::clone(&fired), Arc::clone(&release));
        move |job: Job| {
            let (fired, release) = (Arc::clone(&fired), Arc::clone(&release));
            async move {
                let tx = job.transaction().await?;
                tx.execute(
                    "INSERT INTO bound.starts (row_id, epoch) VALUES ($1, $2)",
                    &[&job.lease().id(), &job.lease().epoch()],
                )
                .await?;
                tx.commit().await?;
                tokio::select! {
                    () = release.notified() => Ok(Outcome::Done),
                    () = job.cancelled() => {
                        fired.fetch_add(1, Ordering::SeqCst);
                        Ok(Outcome::retry("token fired"))
                    }
                }
            }
        }
    };
    let worker = Worker::new(
        client,
        config("partitioned", 5, Duration::from_secs(9), true),
        handler,
    );
    let (shutdown, handle) = pg_tests::workers::spawn(worker);
    eventually(
        &pg,
        "SELECT count(*) = 5 FROM bound.starts
          WHERE EXISTS (SELECT FROM lease.session WHERE owner = 'partitioned')",
        Duration::from_secs(20),
    )
    .await;
    let before: HashMap<i64, i64> = epochs(&pg).await;

    proxy.pause();
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.resume();
    // Past a heartbeat (every 3 s) and many sweeps.
    tokio::time::sleep(Duration::from_secs(4)).await;

    assert_eq!(fired.load(Ordering::SeqCst), 0, "a token fired");
    assert_eq!(epochs(&pg).await, before, "the leases changed hands");
    let held: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job
          WHERE queue = 'bound' AND state = 'leased' AND owner = 'partitioned'
            AND lease_until > clock_timestamp()",
    )
    .await;
    assert_eq!(held, 5, "the leases are still held");
    for _ in 0..5 {
        release.notify_one();
    }
    eventually(
        &pg,
        "SELECT count(*) = 5 FROM lease.job WHERE queue = 'bound' AND state = 'done'",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(starts_once_per_epoch(&pg).await, 5, "one start per row");
    pg_tests::workers::stop(shutdown, handle).await;
}

/// Each leased row's epoch.
async fn epochs(pg: &tokio_postgres::Client) -> HashMap<i64, i64> {
    pg.query(
        "SELECT id, epoch FROM lease.job WHERE queue = 'bound' AND state = 'leased'",
        &[],
    )
    .await
    .expect("epochs")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The SQL semantics, swept by hand: a new session of the holder that binds
/// while the old one still runs takes the leases over, so ending the old
/// one ends nothing; ending the session they are bound to expires them at
/// the next sweep, under a new epoch, and the binding is forgotten.
#[tokio::test]
async fn a_live_rebind_takes_the_leases_over_and_the_last_session_ends_them() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    setup(&pg, 3).await;
    let first = cluster.connect().await;
    let first_pid: i32 = scalar(&first, "SELECT pg_backend_pid()").await;
    let bound: bool = scalar(&first, "SELECT lease.bind_session('bound', 'o')").await;
    assert!(bound);
    let claimed: HashMap<i64, i64> = pg
        .query(
            "SELECT id, epoch FROM lease.claim_pending(3, '1 hour', 'o', 'bound')",
            &[],
        )
        .await
        .expect("claim")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(claimed.len(), 3);
    let leased = "SELECT count(*) FROM lease.job
                   WHERE queue = 'bound' AND state = 'leased' AND lease_until > clock_timestamp()";

    let second = cluster.connect().await;
    let kept: bool = scalar(&second, "SELECT lease.bind_session('bound', 'o')").await;
    assert!(kept, "a live session hands over");
    pg.batch_execute(&format!("SELECT pg_terminate_backend({first_pid})"))
        .await
        .expect("terminate the first");
    sweep_once_gone(&pg, first_pid).await;
    assert_eq!(
        scalar::<i64>(&pg, leased).await,
        3,
        "the ended old session ended leases the new one holds"
    );

    let second_pid: i32 = scalar(&second, "SELECT pg_backend_pid()").await;
    drop(second);
    sweep_once_gone(&pg, second_pid).await;
    assert_eq!(
        scalar::<i64>(&pg, leased).await,
        0,
        "ended with their session"
    );
    let retried = pg
        .query(
            "SELECT id, epoch FROM lease.job
              WHERE queue = 'bound' AND state = 'pending' AND attempt = 1
                AND last_error LIKE 'lease expired%'",
            &[],
        )
        .await
        .expect("rows");
    assert_eq!(retried.len(), 3, "back to pending as after an expiry");
    for row in retried {
        let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
        assert!(epoch > claimed[&id], "row {id}: a new epoch");
    }
    let sessions: i64 = scalar(&pg, "SELECT count(*) FROM lease.session").await;
    assert_eq!(sessions, 0, "the ended session is forgotten");
}

/// Waits until backend `pid` has exited, then sweeps.
async fn sweep_once_gone(pg: &tokio_postgres::Client, pid: i32) {
    eventually(
        pg,
        &format!("SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = {pid})"),
        Duration::from_secs(5),
    )
    .await;
    pg.batch_execute("SELECT lease.sweep()")
        .await
        .expect("sweep");
}

/// Binding checks its input as the claims do, and a refused bind binds
/// nothing. (A worker of another queue is refused in `security.rs`.)
#[tokio::test]
async fn bind_session_checks_its_input() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    setup(&pg, 0).await;
    for (sql, code) in [
        (
            "SELECT lease.bind_session('nope', 'a')",
            SqlState::UNDEFINED_OBJECT,
        ),
        (
            "SELECT lease.bind_session(NULL, 'a')",
            SqlState::NULL_VALUE_NOT_ALLOWED,
        ),
        (
            "SELECT lease.bind_session('bound', NULL)",
            SqlState::NULL_VALUE_NOT_ALLOWED,
        ),
        (
            "SELECT lease.bind_session('bound', '')",
            SqlState::INVALID_PARAMETER_VALUE,
        ),
    ] {
        let err = pg.batch_execute(sql).await.expect_err(sql);
        assert_eq!(err.code(), Some(&code), "{sql}: {err}");
    }
    let none: i64 = scalar(&pg, "SELECT count(*) FROM lease.session").await;
    assert_eq!(none, 0, "a refused bind binds nothing");
}
