//! The typed wrappers of the Rust client (`pg_lease_client::Client`)
//! against the real SQL: results, lost leases as `Error::LeaseLost`, bad
//! input as `Error::InvalidInput` with the SQLSTATE, missing grants, and an
//! unreachable server as a connection error. One test per part of the SQL
//! reference, each on a cluster of its own.

use std::collections::HashMap;
use std::time::Duration;

use pg_lease_client::{
    fence, fence_named, BatchOptions, CancelResult, Claimed, Client, EnqueueOptions, Error,
    FencingToken, JobState, Outcome,
};
use pg_tests::jobs::{client, job_row, queue};
use pg_tests::{Cluster, TEST_DB};
use serde_json::json;
use tokio::time::{sleep, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Rows enqueued into `api` and claimed by `owner-1`, as
/// [`enqueue_and_claim`] left them.
struct Claims {
    /// The keyed row (`k1`).
    a: i64,
    /// The two rows of the batch, in input order.
    batch: Vec<i64>,
    /// The delayed row, never claimed.
    later: i64,
    claimed: Vec<Claimed>,
}

/// Enqueue: keys are idempotent, batches keep input order, delays hold;
/// claim: at most the limit, payloads and lease fields, the delayed row not
/// claimable.
async fn enqueue_and_claim(c: &Client) -> Claims {
    let keyed = EnqueueOptions {
        key: Some("k1".into()),
        ..Default::default()
    };
    let a = c
        .enqueue_with("api", &json!({"n": 1}), &keyed)
        .await
        .expect("enqueue");
    let again = c
        .enqueue_with("api", &json!({"n": 99}), &keyed)
        .await
        .expect("enqueue again");
    assert_eq!(a, again, "same key, same row");
    let batch = c
        .enqueue_batch(
            "api",
            &[json!({"n": 2}), json!({"n": 3})],
            &BatchOptions {
                keys: Some(vec![None, Some("k3".into())]),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue_batch");
    assert_eq!(batch.len(), 2);
    assert!(a < batch[0] && batch[0] < batch[1], "ids in input order");
    let later = c
        .enqueue_with(
            "api",
            &json!({"n": 4}),
            &EnqueueOptions {
                delay: Some(secs(3600)),
                ..Default::default()
            },
        )
        .await
        .expect("delayed enqueue");

    let claimed = c
        .claim(10, secs(30), "owner-1", "api")
        .await
        .expect("claim");
    let ids: Vec<i64> = claimed.iter().map(|x| x.lease.id()).collect();
    assert_eq!(
        ids.len(),
        3,
        "three ready rows, the delayed one stays: {ids:?}"
    );
    assert!(!ids.contains(&later));
    let first = claimed
        .iter()
        .find(|x| x.lease.id() == a)
        .expect("row a claimed");
    assert_eq!(
        first.payload_as::<serde_json::Value>().expect("payload")["n"],
        1
    );
    assert_eq!(first.lease.attempt(), 1);
    assert_eq!(first.lease.owner(), "owner-1");
    assert_eq!(first.lease.queue(), "api");
    assert_eq!(first.lease.key(), Some("k1"));
    let token = first.lease.token();
    assert_eq!(
        first
            .lease
            .attempt_id()
            .parse::<FencingToken>()
            .expect("attempt id parses"),
        token
    );
    assert!(first.lease.local_expiry() <= Instant::now() + secs(30));
    Claims {
        a,
        batch,
        later,
        claimed,
    }
}

#[tokio::test]
async fn enqueue_and_claim_follow_the_sql_reference() {
    let cluster = Cluster::start();
    let c = client(&cluster).await;
    queue(&c, "api").await;
    enqueue_and_claim(&c).await;
}

#[tokio::test]
async fn renew_fence_release_and_cancel_follow_the_sql_reference() {
    let cluster = Cluster::start();
    let admin = cluster.connect().await;
    let c = client(&cluster).await;
    queue(&c, "api").await;
    let Claims {
        a,
        batch,
        later,
        claimed,
    } = enqueue_and_claim(&c).await;
    let first = &claimed
        .iter()
        .find(|x| x.lease.id() == a)
        .expect("row a claimed")
        .lease;
    let token = first.token();

    // Renew, fenced update, fence inside a transaction.
    let renewal = c.renew(first, secs(60)).await.expect("renew");
    assert!(renewal.held && !renewal.cancel_requested);
    assert!(renewal.lease_until.expect("lease_until") > first.lease_until());
    c.fenced_update(token, &json!({"note": "fenced"}))
        .await
        .expect("fenced_update");
    let note: Option<String> = admin
        .query_one(
            "SELECT payload->>'note' FROM lease.job WHERE id = $1",
            &[&a],
        )
        .await
        .expect("payload")
        .get(0);
    assert_eq!(note.as_deref(), Some("fenced"));
    {
        let mut pg = cluster.connect().await;
        let tx = pg.transaction().await.expect("begin");
        fence(&tx, token).await.expect("fence while held");
        tx.commit().await.expect("commit");
    }
    let other = claimed
        .iter()
        .find(|x| x.lease.id() != a)
        .expect("another row")
        .lease
        .token();
    let stale = FencingToken {
        id: other.id,
        epoch: other.epoch - 1,
    };
    // Named with a queue it is not of, a lease is lost and nothing changes.
    let elsewhere = c
        .renew_batch("owner-1", &[token], "elsewhere", secs(30))
        .await
        .expect("renew_batch of another queue");
    assert_eq!(
        elsewhere.iter().map(|r| r.held).collect::<Vec<_>>(),
        [false]
    );
    let released = c
        .release_batch("owner-1", &[token], "elsewhere", &Outcome::fail("x"))
        .await
        .expect("release_batch of another queue");
    assert_eq!(released, [false]);
    let renewals = c
        .renew_batch("owner-1", &[token, stale], "api", secs(30))
        .await
        .expect("renew_batch");
    assert_eq!(
        renewals.iter().map(|r| r.held).collect::<Vec<_>>(),
        [true, false]
    );

    // Release with each outcome; a second release is a lost lease.
    let by_id: HashMap<i64, _> = claimed.iter().map(|x| (x.lease.id(), &x.lease)).collect();
    c.release(by_id[&a], &Outcome::retry_after(secs(3600), "later"))
        .await
        .expect("release retry");
    let row = job_row(&admin, a).await;
    assert_eq!(
        (row.state.as_str(), row.last_error.as_deref()),
        ("pending", Some("later"))
    );
    match c.release(by_id[&a], &Outcome::Done).await {
        Err(Error::LeaseLost { id, epoch }) => assert_eq!((id, epoch), (a, token.epoch)),
        other => panic!("second release: {other:?}"),
    }
    {
        let mut pg = cluster.connect().await;
        let tx = pg.transaction().await.expect("begin");
        let err = fence(&tx, token).await.expect_err("fence after release");
        assert!(err.is_lease_lost(), "{err:?}");
    }
    assert!(c
        .fenced_update(token, &json!({"x": 1}))
        .await
        .expect_err("fenced_update after release")
        .is_lease_lost());
    c.release(by_id[&batch[0]], &Outcome::fail("broken"))
        .await
        .expect("release fail");
    let dead = c.dead_letters(Some("api"), 10).await.expect("dead_letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("broken"));

    // Cancel: leased, pending, finished, unknown.
    assert_eq!(
        c.cancel(batch[1]).await.expect("cancel"),
        CancelResult::CancelRequested
    );
    let renewal = c
        .renew(by_id[&batch[1]], secs(30))
        .await
        .expect("renew after cancel");
    assert!(renewal.cancel_requested);
    assert_eq!(
        c.cancel(later).await.expect("cancel"),
        CancelResult::Cancelled
    );
    assert_eq!(
        c.cancel(batch[0]).await.expect("cancel"),
        CancelResult::AlreadyFinished(JobState::Dead)
    );
    assert_eq!(
        c.cancel(i64::MAX).await.expect("cancel"),
        CancelResult::NotFound
    );
    let released = c
        .release_batch(
            "owner-1",
            &[by_id[&batch[1]].token()],
            "api",
            &Outcome::Abandon,
        )
        .await
        .expect("release_batch");
    assert_eq!(released, [true]);
    assert_eq!(job_row(&admin, batch[1]).await.state, "cancelled");

    // Views.
    let stats = c.queue_stats().await.expect("queue_stats");
    let api = stats.iter().find(|s| s.queue == "api").expect("api stats");
    assert_eq!((api.pending, api.dead, api.cancelled), (1, 1, 2));
    assert!(c
        .in_flight(Some("api"))
        .await
        .expect("in_flight")
        .is_empty());
}

#[tokio::test]
async fn named_lease_wrappers_follow_the_sql_reference() {
    let cluster = Cluster::start();
    let c = client(&cluster).await;

    let e1 = c
        .try_acquire("leader", "n1", secs(30))
        .await
        .expect("try_acquire")
        .expect("free");
    assert_eq!(
        c.try_acquire("leader", "n2", secs(30))
            .await
            .expect("try_acquire"),
        None
    );
    c.renew_named("leader", "n1", e1, secs(30))
        .await
        .expect("renew_named");
    let holders = c.holders().await.expect("holders");
    assert_eq!(
        holders
            .iter()
            .map(|h| (h.name.as_str(), h.owner.as_str(), h.epoch))
            .collect::<Vec<_>>(),
        [("leader", "n1", e1)]
    );
    {
        let mut pg = cluster.connect().await;
        let tx = pg.transaction().await.expect("begin");
        fence_named(&tx, "leader", e1).await.expect("fence_named");
        tx.commit().await.expect("commit");
    }
    c.release_named("leader", "n1", e1)
        .await
        .expect("release_named");
    assert!(matches!(
        c.release_named("leader", "n1", e1).await,
        Err(Error::NamedLeaseLost { .. })
    ));
    let e2 = c
        .try_acquire("leader", "n2", secs(30))
        .await
        .expect("try_acquire")
        .expect("free again");
    assert!(e2 > e1);
    assert!(matches!(
        c.renew_named("leader", "n1", e1, secs(30)).await,
        Err(Error::NamedLeaseLost { .. })
    ));
}

/// A zombie: its lease expired and was reaped; every write is refused.
#[tokio::test]
async fn a_reaped_owner_is_refused_every_write() {
    let cluster = Cluster::start();
    let c = client(&cluster).await;
    queue(&c, "api").await;

    c.enqueue("api", &json!({"n": 5})).await.expect("enqueue");
    let z = c
        .claim(1, ms(300), "zombie", "api")
        .await
        .expect("claim")
        .pop()
        .expect("one row");
    sleep(ms(400)).await;
    assert!(!c.reap(100).await.expect("reap").is_empty());
    let y = c
        .claim(1, secs(30), "heir", "api")
        .await
        .expect("claim")
        .pop()
        .expect("the zombie's row");
    assert_eq!(y.lease.id(), z.lease.id());
    assert!(y.lease.epoch() > z.lease.epoch());
    assert!(c
        .fenced_update(z.lease.token(), &json!({"z": 1}))
        .await
        .expect_err("zombie write")
        .is_lease_lost());
    assert!(c
        .release(&z.lease, &Outcome::Done)
        .await
        .expect_err("zombie release")
        .is_lease_lost());
    assert!(c
        .renew(&z.lease, secs(5))
        .await
        .expect_err("zombie renew")
        .is_lease_lost());
    c.release(&y.lease, &Outcome::Done)
        .await
        .expect("heir release");
}

#[tokio::test]
async fn bad_input_no_grant_and_no_server_are_told_apart() {
    let cluster = Cluster::start();
    let c = client(&cluster).await;
    queue(&c, "api").await;
    c.enqueue("api", &json!({})).await.expect("enqueue");
    let y = c
        .claim(1, secs(30), "o", "api")
        .await
        .expect("claim")
        .pop()
        .expect("one row");

    // Bad input, with its SQLSTATE.
    let bad = |r: Result<_, Error>, code: &str| match r {
        Err(Error::InvalidInput { code: got, .. }) => assert_eq!(got, code),
        other => panic!("expected invalid input {code}, got {other:?}"),
    };
    bad(c.claim(0, secs(1), "o", "api").await.map(drop), "22023");
    bad(c.claim(1, secs(1), "o", "nope").await.map(drop), "42704");
    bad(
        c.claim(1, Duration::ZERO, "o", "api").await.map(drop),
        "22023",
    );
    bad(c.claim(1, secs(1), "", "api").await.map(drop), "22023");
    bad(c.enqueue("nope", &json!({})).await.map(drop), "42704");
    bad(c.fenced_update(y.lease.token(), &json!([1])).await, "22023");
    let err = c
        .claim(1, Duration::MAX, "o", "api")
        .await
        .expect_err("huge ttl");
    assert!(
        err.is_invalid_input() && err.sqlstate().is_none(),
        "{err:?}"
    );

    // No grant: permission denied, not a connection problem.
    // An operator's step (the test role may not be a superuser).
    cluster.psql(TEST_DB, "CREATE ROLE outsider LOGIN");
    let outsider = Client::connect(&format!(
        "host=127.0.0.1 port={} user=outsider dbname={TEST_DB}",
        cluster.port()
    ))
    .await
    .expect("connect as outsider");
    let err = outsider
        .claim(1, secs(1), "o", "api")
        .await
        .expect_err("no grant");
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");

    // Nobody listening: a connection error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let err = Client::connect(&format!("host=127.0.0.1 port={port} user=x dbname=x"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_connection(), "{err:?}");
}

/// Each claim reports how long its row had been claimable, by the database
/// clock alone (`Lease::waited`, the Worker's `pg_lease_claim_wait_seconds`):
/// from its `run_at` for a delayed row, from its enqueue otherwise. New with
/// `eligible_at` (claims did not say when a row became claimable).
#[tokio::test]
async fn claims_report_how_long_rows_waited() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    client
        .enqueue("default", &json!({"n": 1}))
        .await
        .expect("now");
    let delayed = EnqueueOptions {
        delay: Some(Duration::from_millis(300)),
        ..EnqueueOptions::default()
    };
    client
        .enqueue_with("default", &json!({"n": 2}), &delayed)
        .await
        .expect("delayed");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let claimed = client
        .claim(2, Duration::from_secs(60), "w", "default")
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let waited = |n: i64| {
        let c = claimed
            .iter()
            .find(|c| c.payload["n"] == n)
            .expect("the row");
        assert!(c.lease.eligible_at() <= c.lease.lease_until());
        c.lease.waited()
    };
    let (now, later) = (waited(1), waited(2));
    assert!(now >= Duration::from_millis(600), "{now:?}");
    assert!(now < Duration::from_secs(10), "{now:?}");
    assert!(later >= Duration::from_millis(250), "{later:?}");
    assert!(
        later + Duration::from_millis(250) <= now,
        "{later:?} vs {now:?}"
    );
}
