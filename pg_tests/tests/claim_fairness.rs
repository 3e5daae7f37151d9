//! Weighted fairness (sql/fairness.sql): rows enqueued with a
//! `fairness_key` are placed so that claims share themselves among the
//! keys with ready rows in proportion to their weights, whatever each
//! key's backlog, and a key that comes late starts where claims are.
//!
//! Each test failed before fairness keys: `lease.enqueue` and
//! `lease.enqueue_batch` had no `fairness_key(s)` argument (42883). The
//! first was also broken on purpose, with `lease._fair_ranks` giving every
//! row of a key the same rank: A's million rows came first.

use pg_lease_client::{Client, EnqueueOptions};
use pg_tests::{scalar, sqlstate, Cluster, SUPERUSER, TEST_DB};
use tokio_postgres::Client as Pg;

/// Enqueues `n` rows of fairness key `key` into queue `f`, 100,000 a batch.
async fn enqueue_rows(pg: &Pg, key: Option<&str>, n: i64) {
    let mut left = n;
    while left > 0 {
        let batch = left.min(100_000);
        pg.execute(
            "SELECT count(*) FROM lease.enqueue_batch('f',
                    (SELECT array_agg('{}'::jsonb) FROM generate_series(1, $1::bigint)),
                    fairness_keys => array_fill($2::text, ARRAY[$1::int]))",
            &[&batch, &key],
        )
        .await
        .expect("a batch of one key");
        left -= batch;
    }
}

/// Claims `n` rows of queue `f` (or all it has), `batch` a claim, and
/// returns their payloads' `k` in claim order ("" if none).
async fn claim_keys(pg: &Pg, n: usize, batch: i32) -> Vec<String> {
    let mut keys = Vec::new();
    while keys.len() < n {
        let rows = pg
            .query(
                "SELECT c.payload->>'k' FROM lease.claim_pending($1, '1 minute', 'w', 'f') AS c",
                &[&batch],
            )
            .await
            .expect("claim");
        if rows.is_empty() {
            break;
        }
        keys.extend(
            rows.iter()
                .map(|r| r.get::<_, Option<String>>(0).unwrap_or_default()),
        );
    }
    keys
}

/// Like [`enqueue_rows`], with each payload naming its key (`{"k": key}`)
/// so that claims can tell whose rows they took.
async fn enqueue_named(pg: &Pg, key: Option<&str>, n: i64) {
    pg.execute(
        "SELECT count(*) FROM lease.enqueue_batch('f',
                (SELECT array_agg(jsonb_build_object('k', coalesce($2::text, ''))) FROM generate_series(1, $1::bigint)),
                fairness_keys => array_fill($2::text, ARRAY[$1::int]))",
        &[&n, &key],
    )
    .await
    .expect("a batch of one key");
}

/// Tenant A has 1,000,000 ready rows, tenants B..K 100 each, all of weight
/// 1: every row of B..K is claimed before A's 2,000th.
#[tokio::test]
async fn ten_small_tenants_are_served_before_a_big_ones_two_thousandth_row() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('f')")
        .await
        .expect("queue");
    enqueue_rows(&pg, Some("A"), 1_000_000).await;
    for key in ["B", "C", "D", "E", "F", "G", "H", "I", "J", "K"] {
        enqueue_named(&pg, Some(key), 100).await;
    }
    // A's rows carry no name: claims see them as "".
    let keys = claim_keys(&pg, 3_000, 50).await;
    let small_done = keys
        .iter()
        .rposition(|k| !k.is_empty())
        .expect("small tenants' rows claimed");
    let a_before = keys[..small_done].iter().filter(|k| k.is_empty()).count();
    let small = keys.iter().filter(|k| !k.is_empty()).count();
    assert_eq!(small, 1_000, "every row of B..K within 3,000 claimed rows");
    assert!(
        a_before < 2_000,
        "{a_before} of A's rows were claimed before B..K's last"
    );
}

/// Keys of weights 3 and 1 with steady backlogs share claims 3:1 (within
/// 5%), set and enqueued through the client; a key enqueued late starts
/// where claims are rather than ahead of them, and rows without a key in
/// a fair queue are one key of their own.
#[tokio::test]
async fn weights_share_claims_and_late_keys_earn_no_credit() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let client = Client::connect(&cluster.conn_string(TEST_DB))
        .await
        .expect("client");
    client
        .create_queue("f", &Default::default())
        .await
        .expect("queue");
    client.set_weight("f", "heavy", 3).await.expect("weight");
    for (key, n) in [("light", 2_000), ("heavy", 2_000)] {
        for _ in 0..n {
            let options = EnqueueOptions {
                fairness_key: Some(key.to_owned()),
                ..Default::default()
            };
            client
                .enqueue_with("f", &serde_json::json!({ "k": key }), &options)
                .await
                .expect("enqueue");
        }
    }
    let keys = claim_keys(&pg, 2_000, 10).await;
    let heavy = keys.iter().filter(|k| *k == "heavy").count();
    assert!(
        (1_425..=1_575).contains(&heavy),
        "heavy got {heavy} of 2,000 claims (3:1 is 1,500)"
    );

    // Claims are now far into heavy's and light's rows. A new key, and
    // rows without a key, start there: they alternate with the others
    // instead of taking the next hundreds of claims.
    let _: i32 = scalar(&pg, "SELECT lease._raise_heads('f')").await;
    enqueue_named(&pg, Some("late"), 100).await;
    enqueue_named(&pg, None, 100).await;
    let keys = claim_keys(&pg, 30, 1).await;
    let late = keys.iter().filter(|k| *k == "late").count();
    let unkeyed = keys.iter().filter(|k| k.is_empty()).count();
    assert!(
        (4..=11).contains(&late) && (4..=11).contains(&unkeyed),
        "of 30 claims, {late} late and {unkeyed} without a key: {keys:?}"
    );
    // No key with ready rows waits longer than a claim per active key.
    let first_late = keys.iter().position(|k| k == "late").expect("late claimed");
    assert!(first_late < 4, "{keys:?}");
}

/// A fair queue claimed empty (its head at the end of the claim order)
/// keeps where its claims got to: a key that had fallen behind gets no
/// credit for it, and the next rows of both keys alternate.
#[tokio::test]
async fn a_queue_claimed_empty_keeps_its_place() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('f')")
        .await
        .expect("queue");
    enqueue_named(&pg, Some("a"), 1).await;
    enqueue_named(&pg, Some("b"), 50).await;
    // Half of b's rows: the head is raised past a's old place.
    assert_eq!(claim_keys(&pg, 26, 26).await.len(), 26);
    let _: i32 = scalar(&pg, "SELECT lease._raise_heads('f')").await;
    assert_eq!(claim_keys(&pg, 100, 50).await.len(), 25);
    let _: i32 = scalar(&pg, "SELECT lease._raise_heads('f')").await;
    enqueue_named(&pg, Some("a"), 10).await;
    enqueue_named(&pg, Some("b"), 10).await;
    let keys = claim_keys(&pg, 6, 1).await;
    assert_eq!(
        keys.iter().filter(|k| *k == "a").count(),
        3,
        "a and b alternate: {keys:?}"
    );
}

/// Bad input is refused with its SQLSTATE and changes nothing; a worker
/// may enqueue with a fairness key but not weigh one.
#[tokio::test]
async fn bad_fairness_input_is_refused() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "SELECT lease.create_queue('f');
         CREATE ROLE w LOGIN IN ROLE lease_worker;",
    )
    .await
    .expect("setup");
    let long = "x".repeat(257);
    for (sql, code) in [
        ("SELECT lease.set_weight('f', 'a', 0)".to_owned(), "22023"),
        ("SELECT lease.set_weight('f', 'a', 1001)".to_owned(), "22023"),
        ("SELECT lease.set_weight('f', 'a', NULL)".to_owned(), "22004"),
        ("SELECT lease.set_weight('f', NULL, 2)".to_owned(), "22004"),
        ("SELECT lease.set_weight('nope', 'a', 2)".to_owned(), "42704"),
        (format!("SELECT lease.set_weight('f', '{long}', 2)"), "22023"),
        (format!("SELECT lease.enqueue('f', '{{}}', fairness_key => '{long}')"), "22023"),
        (
            "SELECT lease.enqueue_batch('f', ARRAY['{}'::jsonb, '{}'], fairness_keys => ARRAY['a'])".to_owned(),
            "22023",
        ),
    ] {
        let err = su.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(sqlstate(&err).as_deref(), Some(code), "{sql}: {err}");
    }
    let changed: i64 = scalar(
        &su,
        "SELECT (SELECT count(*) FROM lease.fairness_key) + (SELECT count(*) FROM lease.job)
              + (SELECT count(*) FROM lease.queue WHERE fair)",
    )
    .await;
    assert_eq!(changed, 0, "a refused call changed nothing");

    let w = cluster.connect_to(TEST_DB, "w").await;
    w.batch_execute("SELECT lease.enqueue('f', '{}', fairness_key => 'a')")
        .await
        .expect("a worker enqueues with a fairness key");
    let err = w
        .batch_execute("SELECT lease.set_weight('f', 'a', 1000)")
        .await
        .expect_err("a worker weighs a key");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err}");
    let weight: i32 = scalar(
        &su,
        "SELECT weight FROM lease.fairness_key WHERE queue = 'f' AND key = 'a'",
    )
    .await;
    assert_eq!(weight, 1);
}

/// The sweep removes the rows of keys that fell idle (their place behind
/// where claims are), and keeps those with rows ahead, a weight or a rate
/// limit; a key removed and enqueued again starts where claims are, as
/// before.
///
/// Failed before: `lease.fairness_key` kept a row for every key ever
/// named (all five stayed).
#[tokio::test]
async fn the_sweep_forgets_idle_keys() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('f');
         SELECT lease.set_weight('f', 'heavy', 2);
         SELECT lease.set_key_rate('f', 'slow', 1000);",
    )
    .await
    .expect("a queue with a weighed and a limited key");
    for (key, n) in [
        ("idle", 1),
        ("other", 1),
        ("busy", 10),
        ("heavy", 1),
        ("slow", 1),
    ] {
        enqueue_named(&pg, Some(key), n).await;
    }
    let claimed = claim_keys(&pg, 6, 6).await;
    assert_eq!(claimed.len(), 6, "{claimed:?}");
    // It moves the head past the rows claimed, then forgets.
    cluster.sweep().await;
    let kept: Vec<String> = pg
        .query(
            "SELECT key FROM lease.fairness_key WHERE queue = 'f' ORDER BY key",
            &[],
        )
        .await
        .expect("keys")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, ["busy", "heavy", "slow"]);

    // Enqueued again, an idle key's row comes among the first.
    enqueue_named(&pg, Some("idle"), 1).await;
    let next = claim_keys(&pg, 2, 2).await;
    assert!(next.contains(&"idle".to_owned()), "{next:?}");
}

/// Five keys of weight 1 with backlogs of 50 to 250 rows, enqueued one
/// key after the other: no key with ready rows waits more than five
/// claims (the number of active keys) of one row each, from the first
/// claim on.
#[tokio::test]
async fn no_key_waits_more_claims_than_there_are_keys() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("SELECT lease.create_queue('f')")
        .await
        .expect("queue");
    let keys = ["k0", "k1", "k2", "k3", "k4"];
    for (i, key) in keys.iter().enumerate() {
        enqueue_named(&pg, Some(key), 50 * (i as i64 + 1)).await;
    }
    // 250 claims: every key has rows throughout (k0 runs out at its 50th).
    let claimed = claim_keys(&pg, 250, 1).await;
    for key in keys {
        let at: Vec<usize> = claimed
            .iter()
            .enumerate()
            .filter(|(_, k)| *k == key)
            .map(|(i, _)| i)
            .collect();
        assert!(at[0] < keys.len(), "{key} first claimed at {}", at[0]);
        let longest = at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        assert!(
            longest <= keys.len(),
            "{key} waited {longest} claims: {claimed:?}"
        );
    }
}
