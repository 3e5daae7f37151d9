//! Workers killed (SIGKILL) and restarted under the same owner name, over
//! and over, with `reclaim_own`: each restart takes back what its earlier
//! incarnation held, at once and under new epochs.
//!
//! Before the fix a restarted Worker kept reclaiming while its calls
//! came back full, re-issuing rows it was already running (tests/
//! worker_reclaim.rs has the two-row repro); here the same property holds
//! under churn: no row is started twice by one process, and every row
//! finishes. `PG_LEASE_CHURN_SECS` sets the churn (default 60 s).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use pg_tests::{eventually, scalar, Cluster, ClusterConfig, TEST_DB};
use tokio::process::{Child, Command};

const ROWS: i64 = 5000;
const REPLICAS: usize = 3;

fn start(conn: &str, owner: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_reclaim_worker"))
        .args([conn, owner])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start reclaim_worker")
}

/// Three replicas drain 5,000 rows while, every 1.5 s, one of them is
/// killed and restarted under its name. No row is started twice by one
/// process, every row is done, and rows held by killed processes were
/// taken back (some rows started more than once, in different processes).
///
/// Broken on purpose: with the Worker reclaiming on every claim that came
/// back full (the loop before the fix), rows were started twice by one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_workers_run_each_row_once_per_process() {
    let churn_secs: u64 = std::env::var("PG_LEASE_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    // The reaper is the backstop, as in production: a claim a killed
    // process sent may still commit on the server after its successor's
    // reclaim_own ran, leaving rows leased to the name that no later
    // incarnation takes back. Without it, one run (SQL mode, PostgreSQL
    // 18) did not finish its last rows within the 120 s below.
    let cluster = Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(200)));
    let pg = cluster.connect().await;
    pg.batch_execute(&format!(
        "CREATE SCHEMA churn;
         CREATE TABLE churn.starts (row_id bigint, epoch bigint, pid int, at timestamptz DEFAULT clock_timestamp());
         SELECT lease.create_queue('churn', retention => '1 hour', backoff_base => '10 milliseconds');
         SELECT lease.enqueue_batch('churn', array_agg('{{}}'::jsonb)) FROM generate_series(1, {ROWS});"
    ))
    .await
    .expect("queue");
    let conn = cluster.conn_string(TEST_DB);
    let names: Vec<String> = (0..REPLICAS).map(|n| format!("replica-{n}")).collect();
    let mut children: Vec<Child> = names.iter().map(|n| start(&conn, n)).collect();

    let mut kills: HashMap<usize, u32> = HashMap::new();
    let started = tokio::time::Instant::now();
    let mut n: usize = 0;
    while started.elapsed() < Duration::from_secs(churn_secs) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        n = (n * 7 + 3) % REPLICAS;
        children[n].start_kill().expect("kill -9");
        let _ = children[n].wait().await;
        *kills.entry(n).or_default() += 1;
        children[n] = start(&conn, &names[n]);
    }
    eventually(
        &pg,
        &format!(
            "SELECT count(*) = {ROWS} FROM lease.job WHERE queue = 'churn' AND state = 'done'"
        ),
        Duration::from_secs(120),
    )
    .await;
    for mut child in children {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }

    let twice: i64 = scalar(
        &pg,
        "SELECT count(*) FROM (SELECT row_id, pid FROM churn.starts GROUP BY 1, 2 HAVING count(*) > 1) t",
    )
    .await;
    assert_eq!(twice, 0, "a row was started twice by one process");
    let restarted: i64 = scalar(
        &pg,
        "SELECT count(*) FROM (SELECT row_id FROM churn.starts GROUP BY 1 HAVING count(DISTINCT pid) > 1) t",
    )
    .await;
    let kills: u32 = kills.values().sum();
    assert!(kills >= 3, "{kills} kills");
    assert!(
        restarted > 0,
        "killed processes' rows were run again: {restarted}"
    );
}
