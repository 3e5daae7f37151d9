//! Uniqueness while active: `enqueue(..., unique_key => k)` adds a row only
//! when no row of the queue with that key is pending or leased, atomically
//! under concurrent producers; unlike `key`, a finished row does not block
//! a new one.
//!
//! Failed before `unique_key` existed.

use std::collections::HashSet;

use pg_lease_client::{Client, EnqueueOptions, QueueOptions};
use pg_tests::{scalar, Cluster, TEST_DB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_active_row_per_unique_key_under_concurrent_producers() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let client = pg_tests::jobs::client(&cluster).await;
    client
        .create_queue(
            "reports",
            &QueueOptions {
                retention: std::time::Duration::from_secs(3600),
                ..QueueOptions::default()
            },
        )
        .await
        .expect("queue");

    // 16 producers, each on its own connection, at once.
    let mut producers = Vec::new();
    for _ in 0..16 {
        let conn = cluster.conn_string(TEST_DB);
        producers.push(tokio::spawn(async move {
            let c = Client::connect(&conn).await.expect("client");
            let options = EnqueueOptions {
                unique_key: Some("report-42".into()),
                ..EnqueueOptions::default()
            };
            c.enqueue_with("reports", &serde_json::json!({}), &options)
                .await
                .expect("enqueue")
        }));
    }
    let mut ids = HashSet::new();
    for p in producers {
        ids.insert(p.await.expect("producer"));
    }
    assert_eq!(ids.len(), 1, "one row, one id for all: {ids:?}");
    let first = *ids.iter().next().expect("id");
    let rows: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE queue = 'reports'",
    )
    .await;
    assert_eq!(rows, 1);

    // Still one while it is leased.
    let (id, epoch): (i64, i64) = {
        let r = pg
            .query_one(
                "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'w', 'reports')",
                &[],
            )
            .await
            .expect("claim");
        (r.get(0), r.get(1))
    };
    assert_eq!(id, first);
    let again: i64 = scalar(
        &pg,
        "SELECT lease.enqueue('reports', '{}', unique_key => 'report-42')",
    )
    .await;
    assert_eq!(again, first);

    // Finished (and retained): the same unique_key is new work again;
    // `key`, by contrast, keeps answering with the retained row.
    pg.execute(
        "SELECT lease.release($1, 'w', $2, 'done', queue => 'reports')",
        &[&id, &epoch],
    )
    .await
    .expect("done");
    let next: i64 = scalar(
        &pg,
        "SELECT lease.enqueue('reports', '{}', unique_key => 'report-42')",
    )
    .await;
    assert_ne!(next, first, "a new row once the first finished");
    let keyed: i64 = scalar(&pg, "SELECT lease.enqueue('reports', '{}', key => 'k1')").await;
    let claimed: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w', 'reports') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'done', queue => 'reports') r",
    )
    .await;
    assert_eq!(claimed, 2);
    let keyed_again: i64 = scalar(&pg, "SELECT lease.enqueue('reports', '{}', key => 'k1')").await;
    assert_eq!(
        keyed_again, keyed,
        "key: idempotent while retained, finished or not"
    );
    let states: String = scalar(
        &pg,
        "SELECT string_agg(state::text, ',' ORDER BY id) FROM lease.job WHERE queue = 'reports'",
    )
    .await;
    assert_eq!(states, "done,done,done");
}
