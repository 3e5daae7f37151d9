//! `keys` against a real cluster, as a `lease_admin` who is no superuser:
//! the fairness keys of a queue with their weights, rows and rate limits,
//! and which of them a full window holds back.

mod common;

use common::{assert_exit, pg_lease, pg_lease_json, stdout, url_as};
use pg_tests::{Cluster, TEST_DB};

/// Three keys: one weighed, one limited and full after a claim, and the
/// rows enqueued without a key (`""`); JSON and the table agree.
///
/// Failed before: there was no `keys` command (exit 2, clap's usage error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_shows_weights_rows_and_held_keys() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "CREATE ROLE ops LOGIN IN ROLE lease_admin;
         SELECT lease.create_queue('mail');
         SELECT lease.set_weight('mail', 'big', 3);
         SELECT lease.set_key_rate('mail', 'slow', 2, '1 hour');
         SELECT lease.enqueue('mail', '{}', fairness_key => k) FROM unnest('{big,big,slow,slow,slow}'::text[]) k;
         SELECT lease.enqueue('mail', '{}');
         SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w', 'mail');",
    )
    .await
    .expect("a fair queue with a full key");
    let url = url_as(&cluster, TEST_DB, "ops");

    let keys = pg_lease_json(&url, &["keys", "--queue", "mail"]);
    let keys = keys.as_array().expect("an array");
    let names: Vec<&str> = keys
        .iter()
        .map(|k| k["fairness_key"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(names, ["", "big", "slow"]);
    let slow = &keys[2];
    assert_eq!(slow["rate_limit"], 2);
    assert_eq!(slow["rate_period_secs"], 3600.0);
    assert_eq!(slow["claimed_in_period"], 2);
    assert_eq!(
        (slow["pending"].as_i64(), slow["leased"].as_i64()),
        (Some(1), Some(2))
    );
    assert!(slow["held_until"].is_string(), "{slow}");
    let big = &keys[1];
    assert_eq!(
        (big["weight"].as_i64(), big["leased"].as_i64()),
        (Some(3), Some(2))
    );
    assert!(big["held_until"].is_null(), "{big}");

    let table = pg_lease(&url, &["keys"]);
    assert_exit(&table, 0);
    let text = stdout(&table);
    let row: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.get(1) == Some(&"slow"))
        .unwrap_or_else(|| panic!("no line for slow in\n{text}"));
    assert_eq!(
        row[..11],
        ["mail", "slow", "1", "1", "1", "2", "2", "per", "1", "h", "2"],
        "{text}"
    );
}
