//! `pg-lease` against a real cluster, as an operator runs it: inspect a
//! queue, find a dead letter, requeue it, cancel by key, purge.
//!
//! New with the CLI: before it, these needed psql and the README.

use std::process::{Command, Output};

use pg_tests::{scalar, Cluster, TEST_DB};

fn pg_lease(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pg-lease"))
        .env_remove("PG_LEASE_URL")
        .env_remove("DATABASE_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run pg-lease")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_and_requeues_a_dead_letter() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('emails');
         SELECT lease.enqueue('emails', '{\"to\": \"a\"}', key => 'mail-1');
         SELECT lease.enqueue('emails', '{\"to\": \"b\"}', key => 'mail-2');",
    )
    .await
    .expect("queue");
    let dead_id: i64 = scalar(
        &pg,
        "SELECT c.id FROM lease.claim_pending(1, '1 minute', 'w', 'emails') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail', error => 'mailbox full') r",
    )
    .await;
    let url = cluster.conn_string(TEST_DB);

    let stats = pg_lease(&url, &["stats"]);
    assert!(stats.status.success(), "{stats:?}");
    let line = stdout(&stats)
        .lines()
        .find(|l| l.starts_with("emails"))
        .map(str::to_owned)
        .expect("a line for the queue");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..3], ["emails", "1", "1"], "pending, ready: {line}");

    let dead = pg_lease(&url, &["dead", "--queue", "emails"]);
    assert!(stdout(&dead).contains(&dead_id.to_string()), "{dead:?}");
    assert!(stdout(&dead).contains("mailbox full"));

    let requeued = pg_lease(&url, &["requeue", &dead_id.to_string()]);
    assert!(requeued.status.success(), "{requeued:?}");
    let state: String = scalar(
        &pg,
        &format!("SELECT state::text FROM lease.job WHERE id = {dead_id}"),
    )
    .await;
    assert_eq!(state, "pending");
    let again = pg_lease(&url, &["requeue", &dead_id.to_string()]);
    assert!(!again.status.success(), "not a dead letter any more");

    let cancelled = pg_lease(&url, &["cancel", "--queue", "emails", "--key", "mail-2"]);
    assert!(cancelled.status.success(), "{cancelled:?}");
    assert_eq!(stdout(&cancelled).trim(), "cancelled");
    let missing = pg_lease(&url, &["cancel", "--queue", "emails", "--key", "nope"]);
    assert!(!missing.status.success());

    let purged = pg_lease(&url, &["purge"]);
    assert!(purged.status.success(), "{purged:?}");
    assert!(stdout(&purged).contains("rows purged"));

    // Errors: a queue that does not exist, and no database at all.
    let bad = pg_lease(&url, &["cancel", "--queue", "nope", "--key", "x"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("42704"),
        "{bad:?}"
    );
    let nowhere = Command::new(env!("CARGO_BIN_EXE_pg-lease"))
        .env_remove("PG_LEASE_URL")
        .env_remove("DATABASE_URL")
        .arg("stats")
        .output()
        .expect("run");
    assert_eq!(nowhere.status.code(), Some(2));
}
