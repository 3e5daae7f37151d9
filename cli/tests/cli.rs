//! `pg-lease` against a real cluster, as an operator runs it: inspect a
//! queue, find a dead letter, requeue it, cancel by key, purge.
//!
//! New with the CLI: before it, these needed psql and the README.

mod common;

use std::process::Command;

use common::{assert_exit, pg_lease, pg_lease_json, stderr, stdout};
use pg_tests::{scalar, Cluster, TEST_DB};

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
    assert_eq!(
        &cells[..4],
        ["emails", "running", "1", "1"],
        "state, pending, ready: {line}"
    );

    let dead = pg_lease(&url, &["dead", "--queue", "emails"]);
    assert!(stdout(&dead).contains(&dead_id.to_string()), "{dead:?}");
    assert!(stdout(&dead).contains("mailbox full"));
    let letters = pg_lease_json(&url, &["dead", "--queue", "emails"]);
    assert_eq!(letters[0]["id"], dead_id);
    assert_eq!(letters[0]["key"], "mail-1");
    assert_eq!(letters[0]["attempts"], 1);
    assert_eq!(letters[0]["last_error"], "mailbox full");
    assert_eq!(letters[0]["payload"]["to"], "a");
    assert!(letters[0]["finished_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    let requeued = pg_lease(&url, &["requeue", &dead_id.to_string()]);
    assert!(requeued.status.success(), "{requeued:?}");
    let state: String = scalar(
        &pg,
        &format!("SELECT state::text FROM lease.job WHERE id = {dead_id}"),
    )
    .await;
    assert_eq!(state, "pending");
    let again = pg_lease(&url, &["--json", "requeue", &dead_id.to_string()]);
    assert_exit(&again, 1);
    let answer: serde_json::Value = serde_json::from_slice(&again.stdout).expect("json");
    assert_eq!(
        answer,
        serde_json::json!([{"id": dead_id, "requeued": false}])
    );

    let cancelled = pg_lease(&url, &["cancel", "--queue", "emails", "--key", "mail-2"]);
    assert!(cancelled.status.success(), "{cancelled:?}");
    assert_eq!(stdout(&cancelled).trim(), "cancelled");
    let missing = pg_lease(&url, &["cancel", "--queue", "emails", "--key", "nope"]);
    assert_exit(&missing, 1);
    let gone = pg_lease_json_status(&url, &["cancel", "1"]);
    assert_eq!(gone["id"], 1);
    assert_eq!(gone["result"], "not_found");

    let purged = pg_lease(&url, &["purge"]);
    assert!(purged.status.success(), "{purged:?}");
    assert!(stdout(&purged).contains("rows purged"));

    // Errors: a queue that does not exist, and no database at all.
    let bad = pg_lease(&url, &["cancel", "--queue", "nope", "--key", "x"]);
    assert_exit(&bad, 1);
    assert!(stderr(&bad).contains("SQLSTATE 42704"), "{bad:?}");
    let nowhere = Command::new(env!("CARGO_BIN_EXE_pg-lease"))
        .env_remove("PG_LEASE_URL")
        .env_remove("DATABASE_URL")
        .arg("stats")
        .output()
        .expect("run");
    assert_exit(&nowhere, 2);
}

/// `--json` of a command that exits 1: the document is printed all the same.
fn pg_lease_json_status(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = pg_lease(url, &all);
    assert_exit(&out, 1);
    serde_json::from_slice(&out.stdout).expect("json")
}
