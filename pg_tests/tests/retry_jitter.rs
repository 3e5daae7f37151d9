//! Retry jitter: rows that fail together come back spread out, not in
//! lockstep (`create_queue(..., jitter => 'full')`, the default).
//!
//! Failed before the fix, when every retry waited exactly the
//! backoff: 200 rows failed in one batch all became claimable again in the
//! same instant.

use pg_tests::{scalar, sqlstate, Cluster};

/// 200 rows fail in one batch. With the default jitter their next claims
/// spread over the whole 10 s backoff; with `jitter => 'none'` they stay
/// within a few milliseconds of it. A bad value is 22023.
#[tokio::test]
async fn a_burst_of_failures_comes_back_spread_out() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    for (queue, jitter) in [("spread", "full"), ("exact", "none")] {
        pg.batch_execute(&format!(
            "SELECT lease.create_queue('{queue}', backoff_base => '10 seconds', backoff_max => '10 seconds',
                                       jitter => '{jitter}');
             SELECT lease.enqueue_batch('{queue}', array_fill('{{}}'::jsonb, ARRAY[200]));"
        ))
        .await
        .expect("a queue with 200 rows");
        // One batch release: its retries start from one instant, on a
        // distributed install too (a release per row, each a round trip
        // to the queue's node, took over a second there under load).
        let claimed = pg
            .query(
                "SELECT id, epoch FROM lease.claim_pending(200, '1 minute', 'w', $1)",
                &[&queue],
            )
            .await
            .expect("claim");
        let ids: Vec<i64> = claimed.iter().map(|r| r.get(0)).collect();
        let epochs: Vec<i64> = claimed.iter().map(|r| r.get(1)).collect();
        pg.execute(
            "SELECT count(*) FROM lease.release_batch($1, 'w', $2, 'retry', queue => $3)",
            &[&ids, &epochs, &queue],
        )
        .await
        .expect("a burst of failures");
    }
    let spread = |queue: &str| {
        format!(
            "SELECT extract(epoch FROM max(next_at) - min(next_at))::float8
               FROM lease.job WHERE queue = '{queue}' AND state = 'pending'"
        )
    };
    let full: f64 = scalar(&pg, &spread("spread")).await;
    let none: f64 = scalar(&pg, &spread("exact")).await;
    assert!(full > 5.0, "full jitter spreads 200 retries over {full} s");
    assert!(none < 1.0, "no jitter keeps them together ({none} s)");
    let buckets: i64 = scalar(
        &pg,
        "SELECT count(DISTINCT floor(extract(epoch FROM next_at - now())))
           FROM lease.job WHERE queue = 'spread'",
    )
    .await;
    assert!(buckets >= 8, "{buckets} one-second buckets of 10");
    let err = pg
        .batch_execute("SELECT lease.create_queue('bad', jitter => 'some')")
        .await
        .expect_err("unknown jitter");
    assert_eq!(sqlstate(&err).as_deref(), Some("22023"));
}
