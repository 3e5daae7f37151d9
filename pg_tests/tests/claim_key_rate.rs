//! Rate limits per fairness key (sql/key_rate.sql): `lease.set_key_rate`
//! lets at most N rows of one key be claimed in any span of P, by the
//! database clock, whatever the number of claimers, while the queue's other
//! keys go on; a full key's rows stay pending and come when its window has
//! room, and `lease.rate_wait` says when.
//!
//! Each row's claim time is `lease_until - ttl`: the instant the limit
//! counts it at.

use std::collections::BTreeMap;
use std::time::Duration;

use pg_lease_client::RateLimit;
use pg_tests::claims::{busiest_window, claim_in_loops};
use pg_tests::{scalar, sqlstate, Cluster, SUPERUSER, TEST_DB};
use tokio_postgres::Client as Pg;

/// The fairness keys of the rows `claim` (of ttl one minute) returned, in
/// the order it returned them, with their claim times (microseconds). Each
/// row names its key in its payload (`{"k": key}`): on a distributed
/// install a claim joined with `lease.job` would run nested in a query of
/// its shard, which Citus refuses.
async fn claim_keys(pg: &Pg, claim: &str) -> Vec<(String, i64)> {
    pg.query(
        &format!(
            "SELECT c.payload->>'k',
                    (extract(epoch FROM c.lease_until - interval '1 minute') * 1e6)::bigint
               FROM {claim} WITH ORDINALITY AS c
              ORDER BY c.ordinality"
        ),
        &[],
    )
    .await
    .expect("claim")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// How many of `got` are of `key`.
fn of(got: &[(String, i64)], key: &str) -> usize {
    got.iter().filter(|(k, _)| k == key).count()
}

/// A key's rows up to its limit, the other key's rows beside and after
/// them, the full key's rest once its window has room, and `rate_wait`
/// saying when.
///
/// Failed before: there was no `lease.set_key_rate` (42883), and the
/// claims took the limited key's rows like any other.
#[tokio::test]
async fn a_full_key_waits_while_the_others_go_on() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('k');
         SELECT lease.set_key_rate('k', 'a', 3, '600 milliseconds');
         SELECT lease.enqueue_batch('k', array_agg('{\"k\": \"a\"}'::jsonb), fairness_keys => array_agg('a'::text))
           FROM generate_series(1, 20);
         SELECT lease.enqueue_batch('k', array_agg('{\"k\": \"b\"}'::jsonb), fairness_keys => array_agg('b'::text))
           FROM generate_series(1, 20);",
    )
    .await
    .expect("a queue with a limited key");
    let claim = "lease.claim_pending(10, '1 minute', 'w', 'k')";
    let wait = "SELECT (extract(epoch FROM lease.rate_wait('k')) * 1e3)::float8";

    let first = claim_keys(&pg, claim).await;
    assert_eq!(of(&first, "a"), 3, "a's limit: {first:?}");
    assert!(of(&first, "b") >= 5, "b beside it: {first:?}");
    let second = claim_keys(&pg, claim).await;
    assert_eq!(of(&second, "a"), 0, "a is full: {second:?}");
    assert_eq!(second.len(), 10, "b's rows instead: {second:?}");
    let ms = scalar::<f64>(&pg, wait).await;
    assert!(ms > 0.0 && ms <= 600.0, "rate_wait {ms} ms");
    pg.batch_execute("SELECT lease.create_queue('free')")
        .await
        .expect("a queue without limits");
    let free: Option<String> = scalar(&pg, "SELECT lease.rate_wait('free')::text").await;
    assert_eq!(free, None, "no limits, no wait");

    tokio::time::sleep(Duration::from_secs_f64(ms / 1e3 + 0.02)).await;
    let third = claim_keys(&pg, claim).await;
    assert_eq!(of(&third, "a"), 3, "a's window has room: {third:?}");
    let a_first = first.iter().find(|(k, _)| k == "a").map(|r| r.1);
    let a_third = third.iter().find(|(k, _)| k == "a").map(|r| r.1);
    assert!(
        a_third.zip(a_first).is_some_and(|(t, f)| t - f >= 600_000),
        "{first:?} {third:?}"
    );

    pg.batch_execute("SELECT lease.set_key_rate('k', 'a', NULL)")
        .await
        .expect("limit lifted");
    let rest = claim_keys(&pg, "lease.claim_pending(100, '1 minute', 'w', 'k')").await;
    assert_eq!(of(&rest, "a"), 14, "the rest at once: {rest:?}");
}

/// Sixteen claimers in a loop against two limited keys and one free one:
/// no window of either limited key holds more than its limit, and the
/// free key's rows keep coming.
///
/// Broken on purpose: with `lease._key_rate_take` reading the limited keys
/// without locking them, 50 and 42 claims of `a` (limit 20) fell in one
/// window in two runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_never_pass_a_keys_limit() {
    const PERIOD: i64 = 250_000;
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('k');
         SELECT lease.set_key_rate('k', 'a', 20, '250 milliseconds');
         SELECT lease.set_key_rate('k', 'b', 5, '250 milliseconds');
         SELECT lease.enqueue_batch('k', array_agg(jsonb_build_object('k', u.k)), fairness_keys => array_agg(u.k))
           FROM generate_series(1, 9000) g, LATERAL (SELECT ('{a,b,c}'::text[])[1 + g % 3] AS k) u;",
    )
    .await
    .expect("a backlog of three keys");
    let mut starts = BTreeMap::<String, Vec<i64>>::new();
    for (k, t) in claim_in_loops(&cluster, "k", Duration::from_secs(3)).await {
        starts.entry(k).or_default().push(t);
    }
    for (key, limit) in [("a", 20), ("b", 5)] {
        let times = starts.entry(key.to_owned()).or_default();
        let busiest = busiest_window(times, PERIOD);
        assert!(busiest <= limit, "{busiest} claims of {key} in one window");
        // Twelve windows in 3 s; said, not asserted: the claimers share
        // two cores with the server.
        eprintln!("{key}: {} of {} allowed claims", times.len(), 12 * limit);
        assert!(
            times.len() >= 6 * limit,
            "{key}: only {} claims",
            times.len()
        );
    }
    // The free key's rows keep coming (until they run out: on a single
    // node its 3,000 went in under 3 s; on a distributed install, whose
    // claims through the coordinator take several round trips, about 180).
    let free = starts.entry("c".to_owned()).or_default();
    free.sort_unstable();
    let gap = free
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(i64::MAX);
    eprintln!("c: {} claims, at most {gap} us apart", free.len());
    // At most 67 ms on a single node, 260 ms on a distributed install.
    assert!(gap < 4 * PERIOD, "the free key waited {gap} us");
}

/// A claim left in an open transaction holds the limited key it counted:
/// another claim meanwhile takes the other key's rows at once, never
/// waiting for that transaction, and the key's rows once it ends.
#[tokio::test]
async fn an_open_transaction_holding_a_key_hangs_no_one() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('k');
         SELECT lease.set_key_rate('k', 'a', 100);
         SELECT lease.enqueue_batch('k', array_agg(jsonb_build_object('k', u.k)), fairness_keys => array_agg(u.k))
           FROM generate_series(1, 40) g, LATERAL (SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END AS k) u;",
    )
    .await
    .expect("a queue with a limited key");
    pg.batch_execute("BEGIN; SELECT lease.claim_pending(2, '1 minute', 'x', 'k');")
        .await
        .expect("a claim in an open transaction");
    let other = cluster.connect().await;
    other
        .batch_execute("SET statement_timeout = '2s'")
        .await
        .expect("timeout");
    let got = claim_keys(&other, "lease.claim_pending(10, '1 minute', 'y', 'k')").await;
    assert_eq!(of(&got, "a"), 0, "a is the open transaction's: {got:?}");
    assert!(of(&got, "b") >= 5, "b's rows at once: {got:?}");
    pg.batch_execute("COMMIT").await.expect("commit");
    let got = claim_keys(&other, "lease.claim_pending(10, '1 minute', 'y', 'k')").await;
    assert!(of(&got, "a") >= 5, "a's rows once it ended: {got:?}");
}

/// Bad input is refused with its SQLSTATE and changes nothing; a worker
/// may not limit a key. The client sets and lifts a limit.
#[tokio::test]
async fn bad_key_limits_are_refused() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "SELECT lease.create_queue('k');
         CREATE ROLE w LOGIN IN ROLE lease_worker;",
    )
    .await
    .expect("setup");
    let long = "x".repeat(257);
    for (sql, code) in [
        ("SELECT lease.set_key_rate('k', 'a', 0)".to_owned(), "22023"),
        (
            "SELECT lease.set_key_rate('k', 'a', 100001)".to_owned(),
            "22023",
        ),
        (
            "SELECT lease.set_key_rate('k', 'a', 5, '0 s')".to_owned(),
            "22023",
        ),
        (
            "SELECT lease.set_key_rate('k', 'a', 5, '2 days')".to_owned(),
            "22023",
        ),
        (
            "SELECT lease.set_key_rate('k', 'a', 5, NULL)".to_owned(),
            "22004",
        ),
        (
            "SELECT lease.set_key_rate('k', NULL, 5)".to_owned(),
            "22004",
        ),
        (
            "SELECT lease.set_key_rate('nope', 'a', 5)".to_owned(),
            "42704",
        ),
        (
            format!("SELECT lease.set_key_rate('k', '{long}', 5)"),
            "22023",
        ),
    ] {
        let err = su.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(sqlstate(&err).as_deref(), Some(code), "{sql}: {err}");
    }
    let changed: i64 = scalar(
        &su,
        "SELECT (SELECT count(*) FROM lease.fairness_key) + (SELECT count(*) FROM lease.queue WHERE key_limited)",
    )
    .await;
    assert_eq!(changed, 0, "a refused call changed nothing");

    let w = cluster.connect_to(TEST_DB, "w").await;
    let err = w
        .batch_execute("SELECT lease.set_key_rate('k', 'a', 1)")
        .await
        .expect_err("a worker limits a key");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err}");

    let client = pg_tests::jobs::client(&cluster).await;
    let limit = RateLimit {
        limit: 7,
        period: Duration::from_millis(1500),
    };
    client
        .set_key_rate("k", "a", Some(limit))
        .await
        .expect("set");
    let set: String = scalar(
        &su,
        "SELECT rate_limit || ' per ' || rate_period FROM lease.fairness_key WHERE queue = 'k' AND key = 'a'",
    )
    .await;
    assert_eq!(set, "7 per 00:00:01.5");
    client.set_key_rate("k", "a", None).await.expect("lift");
    let lifted: Option<i32> = scalar(
        &su,
        "SELECT rate_limit FROM lease.fairness_key WHERE queue = 'k' AND key = 'a'",
    )
    .await;
    assert_eq!(lifted, None);
}

/// `lease.fairness_keys` shows a full key held back, with its window, to a
/// `lease_admin` (through `lease.read_fairness_keys`, as the client and the
/// CLI read it), and to no worker.
///
/// Failed before: there was no such view (42P01).
#[tokio::test]
async fn operators_see_which_keys_are_held_back() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE ops LOGIN IN ROLE lease_admin;
         CREATE ROLE w LOGIN IN ROLE lease_worker;
         SELECT lease.create_queue('k');
         SELECT lease.set_key_rate('k', 'a', 2, '1 hour');
         SELECT lease.enqueue('k', '{}', fairness_key => k) FROM unnest('{a,a,a,b}'::text[]) k;
         SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'x', 'k');",
    )
    .await
    .expect("a full key");
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    let rows = ops
        .query(
            "SELECT concat_ws(' ', fairness_key, pending, leased, rate_limit, claimed_in_period,
                              held_until IS NOT NULL)
               FROM lease.read_fairness_keys('k')",
            &[],
        )
        .await
        .expect("an operator reads the keys");
    let seen: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    // Key, pending, leased, limit, claimed in its window, held back.
    assert_eq!(seen, ["a 1 2 2 2 t", "b 0 1 f"]);
    let w = cluster.connect_to(TEST_DB, "w").await;
    let err = w
        .query("SELECT * FROM lease.read_fairness_keys('k')", &[])
        .await
        .expect_err("a worker reads the keys");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err}");
}

/// `lease.wait_reason` says why a pending row waits, as the claim decides:
/// its fairness key's window is full, its queue's limit is, it is held
/// for a concurrency slot, its queue is paused, it is not due; or it is
/// ready. For a `lease_admin`, not a worker.
///
/// Failed before: there was no such function (42883).
#[tokio::test]
async fn a_waiting_row_says_why() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE ops LOGIN IN ROLE lease_admin;
         CREATE ROLE w LOGIN IN ROLE lease_worker;
         SELECT lease.create_queue('k');
         SELECT lease.set_key_rate('k', 'a', 1, '1 hour');
         SELECT lease.create_queue('r', rate_limit => 1, rate_period => '1 hour', concurrency => 1);",
    )
    .await
    .expect("queues with limits");
    let id = |sql: &'static str| {
        let su = &su;
        async move { scalar::<i64>(su, sql).await }
    };
    let key_full = id("SELECT lease.enqueue('k', '{}', fairness_key => 'a')").await;
    let key_next = id("SELECT lease.enqueue('k', '{}', fairness_key => 'a')").await;
    let ready = id("SELECT lease.enqueue('k', '{}', fairness_key => 'b')").await;
    let later = id("SELECT lease.enqueue('k', '{}', run_at => now() + interval '1 day')").await;
    id("SELECT lease.enqueue('r', '{}')").await;
    let queue_next = id("SELECT lease.enqueue('r', '{}')").await;
    id("SELECT lease.enqueue('r', '{}', concurrency_key => 'c')").await;
    let held = id("SELECT lease.enqueue('r', '{}', concurrency_key => 'c')").await;
    su.batch_execute(
        "SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'x', 'k');
         SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'x', 'r');",
    )
    .await
    .expect("claims that fill the windows");
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    let why = |id: i64| {
        let ops = &ops;
        async move {
            let row = ops
                .query_one("SELECT lease.wait_reason($1)", &[&id])
                .await
                .expect("wait_reason");
            row.get::<_, Option<String>>(0).unwrap_or_default()
        }
    };
    assert_eq!(why(key_full).await, "", "claimed: not waiting");
    assert!(why(key_next)
        .await
        .starts_with("rate limit: fairness key 'a' has no room until "));
    assert_eq!(why(ready).await, "ready: claimable now");
    assert!(why(later).await.starts_with("not due: claimable from "));
    assert!(why(queue_next)
        .await
        .starts_with("rate limit: queue 'r' has no room until "));
    assert_eq!(
        why(held).await,
        "held: concurrency key 'c' has 1 of its 1 slots in use"
    );
    su.batch_execute("SELECT lease.pause('k')")
        .await
        .expect("pause");
    assert_eq!(
        why(ready).await,
        "paused: queue 'k' is paused (lease.resume)"
    );

    let w = cluster.connect_to(TEST_DB, "w").await;
    let err = w
        .query("SELECT lease.wait_reason($1)", &[&ready])
        .await
        .expect_err("a worker asks");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err}");
}
