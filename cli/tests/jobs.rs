//! `jobs list` and `jobs show` against a real cluster: filters, every
//! column of one row, and the exit codes of what is not there.

mod common;

use common::{assert_exit, line_cells, pg_lease, pg_lease_json, stderr, stdout};
use pg_tests::{scalar, Cluster, TEST_DB};
use serde_json::Value;

/// Ids of the rows in a JSON array.
fn ids(rows: &Value) -> Vec<i64> {
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|r| r["id"].as_i64().expect("an id"))
        .collect()
}

/// The rows of queue `emails`, one per state that matters here.
struct Rows {
    dead: i64,
    pending: i64,
    leased: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_listed_filtered_and_shown_whole() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let rows = setup(&pg).await;
    let url = cluster.conn_string(TEST_DB);
    list(&url, &rows);
    show(&url, &rows);
    let epoch: i64 = scalar(
        &pg,
        &format!("SELECT epoch FROM lease.job WHERE id = {}", rows.leased),
    )
    .await;
    let shown = pg_lease_json(&url, &["jobs", "show", &rows.leased.to_string()]);
    assert_eq!(shown["epoch"], epoch);
    not_there(&url);
}

/// A dead letter (two-line error), a pending row due in an hour, a leased
/// row; and a row in another queue.
async fn setup(pg: &tokio_postgres::Client) -> Rows {
    pg.batch_execute(
        "SELECT lease.create_queue('emails');
         SELECT lease.create_queue('other');
         SELECT lease.enqueue('other', '{}');",
    )
    .await
    .expect("queues");
    let dead: i64 = scalar(
        pg,
        "SELECT c.id FROM lease.enqueue('emails', '{\"to\": \"a\"}', key => 'k-dead'),
                LATERAL lease.claim_pending(1, '1 minute', 'w', 'emails') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail', error => 'mailbox full
second line') r",
    )
    .await;
    let pending: i64 = scalar(
        pg,
        "SELECT lease.enqueue('emails', '{\"to\": \"b\"}', key => 'k-pending', priority => 5,
                              run_at => now() + interval '1 hour')",
    )
    .await;
    let leased: i64 = scalar(
        pg,
        "SELECT lease.enqueue('emails', '{\"to\": \"c\"}', unique_key => 'u-1')",
    )
    .await;
    let claimed: i64 = scalar(
        pg,
        "SELECT id FROM lease.claim_pending(5, '10 minutes', 'worker-7', 'emails')",
    )
    .await;
    assert_eq!(claimed, leased);
    Rows {
        dead,
        pending,
        leased,
    }
}

/// `jobs list` with each filter, as JSON and as a table.
fn list(url: &str, rows: &Rows) {
    let Rows {
        dead,
        pending,
        leased,
    } = *rows;
    let all = pg_lease_json(url, &["jobs", "list", "--queue", "emails"]);
    assert_eq!(ids(&all), [dead, pending, leased], "lowest id first");
    let dead_rows = pg_lease_json(url, &["jobs", "list", "--state", "dead"]);
    assert_eq!(ids(&dead_rows), [dead]);
    assert_eq!(dead_rows[0]["last_error"], "mailbox full\nsecond line");
    let leased_rows = pg_lease_json(url, &["jobs", "list", "--state", "leased"]);
    assert_eq!(ids(&leased_rows), [leased]);
    assert_eq!(leased_rows[0]["owner"], "worker-7");
    let limited = pg_lease_json(url, &["jobs", "list", "--limit", "2"]);
    assert_eq!(limited.as_array().map(Vec::len), Some(2));
    let none = pg_lease_json(
        url,
        &["jobs", "list", "--queue", "other", "--state", "dead"],
    );
    assert_eq!(none, Value::Array(vec![]));

    let table = pg_lease(url, &["jobs", "list", "--queue", "emails"]);
    assert_exit(&table, 0);
    let cells = line_cells(&table, &dead.to_string());
    assert_eq!(cells[1..5], ["emails", "k-dead", "dead", "1"], "{cells:?}");
    assert!(
        stdout(&table).contains("mailbox full…"),
        "first line only, cut"
    );
    assert!(!stdout(&table).contains("second line"));
}

/// `jobs show`: every column as JSON, and as aligned fields.
fn show(url: &str, rows: &Rows) {
    let Rows {
        dead,
        pending,
        leased,
    } = *rows;
    let row = pg_lease_json(url, &["jobs", "show", &leased.to_string()]);
    let keys: Vec<&str> = row
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "attempt",
            "cancel_requested",
            "created_at",
            "epoch",
            "finished_at",
            "id",
            "key",
            "last_error",
            "lease_until",
            "next_at",
            "owner",
            "payload",
            "priority",
            "queue",
            "rank",
            "state",
            "unique_key",
            "waiting",
        ]
    );
    assert_eq!(row["state"], "leased");
    assert_eq!(row["waiting"], Value::Null, "only a pending row waits");
    assert_eq!(row["unique_key"], "u-1");
    assert_eq!(row["payload"], serde_json::json!({"to": "c"}));
    assert_eq!(row["attempt"], 1);
    assert!(row["lease_until"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert_eq!(row["finished_at"], Value::Null);

    let shown = pg_lease(url, &["jobs", "show", &dead.to_string()]);
    assert_exit(&shown, 0);
    let text = stdout(&shown);
    assert_eq!(line_cells(&shown, "state"), ["state", "dead"]);
    assert_eq!(line_cells(&shown, "owner"), ["owner", "w"]);
    assert!(
        text.contains("last error        mailbox full\n                  second line\n"),
        "{text}"
    );
    assert!(
        text.contains("payload           {\n                    \"to\": \"a\"\n"),
        "{text}"
    );
    let pending_row = pg_lease_json(url, &["jobs", "show", &pending.to_string()]);
    assert_eq!(
        (
            pending_row["priority"].as_i64(),
            pending_row["key"].as_str()
        ),
        (Some(5), Some("k-pending"))
    );
    // Due in an hour: it says so, in the table too.
    assert!(
        pending_row["waiting"]
            .as_str()
            .is_some_and(|w| w.starts_with("not due: claimable from ")),
        "{pending_row}"
    );
    let shown = pg_lease(url, &["jobs", "show", &pending.to_string()]);
    assert_eq!(
        line_cells(&shown, "waiting")[..3],
        ["waiting", "not", "due:"]
    );
}

/// What is not there exits 1 with nothing on stdout; bad arguments exit 2.
fn not_there(url: &str) {
    let missing = pg_lease(url, &["jobs", "show", "1"]);
    assert_exit(&missing, 1);
    assert!(
        stdout(&missing).is_empty() && stderr(&missing).contains("no row 1"),
        "{missing:?}"
    );
    for args in [
        &["jobs", "list", "--queue", "nope"][..],
        &["dead", "--queue", "nope"],
        &["in-flight", "--queue", "nope"],
    ] {
        let out = pg_lease(url, args);
        assert_exit(&out, 1);
        assert!(stderr(&out).contains("no queue named \"nope\""), "{out:?}");
        assert!(stderr(&out).contains("42704"), "{out:?}");
    }
    // Usage errors are clap's: exit 2.
    assert_exit(&pg_lease(url, &["jobs", "list", "--state", "lost"]), 2);
    assert_exit(&pg_lease(url, &["jobs", "show"]), 2);
}
