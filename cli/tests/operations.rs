//! Commands an operator expects beside the views: `schedules`, `requeue
//! --all` and `purge --dead` of one queue's dead letters behind a
//! confirmation, `pause` and `resume`.

mod common;

use common::{assert_exit, pg_lease, pg_lease_json, stdout};
use pg_tests::{scalar, Cluster, TEST_DB};

/// `schedules` lists a schedule with its next run. `requeue --all --queue
/// Q` without `--yes` says how many dead letters there are and changes
/// nothing (exit 1); with it, every dead letter of Q is pending again and
/// no other queue's. `purge --dead` the same, deleting.
///
/// Failed before: neither command existed (clap exited 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_requeue_all() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('mail', max_attempts => 1);
         SELECT lease.create_queue('other', max_attempts => 1);
         SELECT lease.schedule('nightly', 'mail', cron => '0 3 * * *');
         SELECT lease.enqueue('mail', '{}') FROM generate_series(1, 3);
         SELECT lease.enqueue('other', '{}');
         SELECT r FROM lease.claim_pending(10, '1 minute', 'w', 'mail') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail') r;
         SELECT r FROM lease.claim_pending(10, '1 minute', 'w', 'other') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail') r;",
    )
    .await
    .expect("a schedule and dead letters");
    let url = cluster.conn_string(TEST_DB);

    let listed = pg_lease_json(&url, &["schedules"]);
    assert_eq!(listed[0]["name"], "nightly", "{listed}");
    assert_eq!(listed[0]["cron"], "0 3 * * *", "{listed}");
    assert!(listed[0]["next_at"].is_string(), "{listed}");
    let table = pg_lease(&url, &["schedules"]);
    assert_exit(&table, 0);
    assert!(stdout(&table).contains("cron 0 3 * * *"), "{table:?}");

    let unconfirmed = pg_lease(&url, &["requeue", "--all", "--queue", "mail"]);
    assert_exit(&unconfirmed, 1);
    assert!(
        stdout(&unconfirmed).contains("3 dead letters"),
        "{unconfirmed:?}"
    );
    let dead: i64 = scalar(&pg, "SELECT count(*) FROM lease.dead_letters").await;
    assert_eq!(dead, 4, "nothing changed without --yes");

    let confirmed = pg_lease(&url, &["requeue", "--all", "--queue", "mail", "--yes"]);
    assert_exit(&confirmed, 0);
    assert!(
        stdout(&confirmed).contains("3 dead letters"),
        "{confirmed:?}"
    );
    let left: Vec<String> = pg
        .query("SELECT queue FROM lease.dead_letters", &[])
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["other"]);

    let unconfirmed = pg_lease(&url, &["purge", "--dead", "--queue", "other"]);
    assert_exit(&unconfirmed, 1);
    let purged = pg_lease(&url, &["purge", "--dead", "--queue", "other", "--yes"]);
    assert_exit(&purged, 0);
    assert!(stdout(&purged).contains("1 dead letters"), "{purged:?}");
    let dead: i64 = scalar(&pg, "SELECT count(*) FROM lease.dead_letters").await;
    assert_eq!(dead, 0);
}

/// `pause` stops claims of a queue and `resume` restarts them; doing
/// either twice exits 1 and changes nothing. `queues`, `stats` and
/// `status`, as text and JSON, say which queue is paused.
///
/// Failed before: the commands and `lease.pause` did not exist; then no
/// listing showed a paused queue (a paused backlog looked healthy).
#[tokio::test]
async fn pause_and_resume_a_queue() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('mail'); SELECT lease.enqueue('mail', '{}');")
        .await
        .expect("a queue with a row");
    let url = cluster.conn_string(TEST_DB);
    let claimable = || async {
        scalar::<i64>(
            &pg,
            "SELECT count(*) FROM (SELECT lease.claim_pending(1, '1 minute', 'w', 'mail')) c",
        )
        .await
    };
    assert_exit(&pg_lease(&url, &["pause", "mail"]), 0);
    assert_exit(&pg_lease(&url, &["pause", "mail"]), 1);
    assert_eq!(claimable().await, 0, "a paused queue gives no rows");
    pg.batch_execute(
        "SELECT lease.create_queue('news', rate_limit => 20, rate_period => '1 minute')",
    )
    .await
    .expect("a running queue beside it, rate-limited");
    let paused = |rows: &serde_json::Value, queue: &str| {
        rows.as_array()
            .and_then(|a| a.iter().find(|q| q["queue"] == queue))
            .and_then(|q| q["paused"].as_bool())
    };
    for command in ["queues", "stats"] {
        let rows = pg_lease_json(&url, &[command]);
        assert_eq!(paused(&rows, "mail"), Some(true), "{command}: {rows}");
        assert_eq!(paused(&rows, "news"), Some(false), "{command}: {rows}");
        let text = stdout(&pg_lease(&url, &[command]));
        let line = |q: &str| {
            text.lines()
                .find(|l| l.starts_with(q))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(line("mail").contains("paused"), "{command}: {text}");
        assert!(line("news").contains("running"), "{command}: {text}");
    }
    // The rate limit, in the queue's policy.
    let queues = pg_lease_json(&url, &["queues"]);
    let news = queues
        .as_array()
        .and_then(|a| a.iter().find(|q| q["queue"] == "news"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(news["rate_limit"], 20, "{queues}");
    assert_eq!(news["rate_period_secs"], 60.0, "{queues}");
    let text = stdout(&pg_lease(&url, &["queues"]));
    assert!(text.contains("20 per 1 min"), "{text}");
    let status = pg_lease_json(&url, &["status"]);
    assert_eq!(paused(&status["queues"], "mail"), Some(true), "{status}");
    assert_exit(&pg_lease(&url, &["resume", "mail"]), 0);
    assert_exit(&pg_lease(&url, &["resume", "mail"]), 1);
    assert_eq!(claimable().await, 1);
    assert_exit(&pg_lease(&url, &["pause", "nope"]), 1);
}
