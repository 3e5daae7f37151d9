//! `lease.metrics`: per-queue gauges and totals that cost O(queues), kept
//! by counters that every state change adds to (sql/metrics.sql).
//!
//! Before it, the only per-queue numbers, `lease.queue_stats`,
//! aggregate the whole table on every poll. These tests failed before
//! `lease.metrics` existed; the workload test was also run
//! against a deliberate break (the `_count` call removed from
//! `release_batch`) and failed there on the pending gauge.

use std::time::Duration;

use pg_tests::{scalar, Cluster, Rng};
use tokio_postgres::Client;

/// Per queue: `(queue, pending, leased, dead)` as `lease.metrics` says and
/// as `count(*)` over the rows says, for every queue where they differ.
async fn disagreements(pg: &Client) -> Vec<String> {
    let rows = pg
        .query(
            "SELECT m.queue, m.ready + m.delayed, m.leased, m.dead, a.pending, a.leased, a.dead
               FROM lease.metrics m
               JOIN (SELECT q.name,
                            count(j.id) FILTER (WHERE j.state = 'pending') AS pending,
                            count(j.id) FILTER (WHERE j.state = 'leased')  AS leased,
                            count(j.id) FILTER (WHERE j.state = 'dead')    AS dead
                       FROM lease.queue q LEFT JOIN lease.job j ON j.queue = q.name
                      GROUP BY q.name) a ON a.name = m.queue
              WHERE (m.ready + m.delayed, m.leased, m.dead) IS DISTINCT FROM (a.pending, a.leased, a.dead)",
            &[],
        )
        .await
        .expect("metrics against the rows");
    rows.iter()
        .map(|r| {
            let (q, p, l, d): (String, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
            let (ap, al, ad): (i64, i64, i64) = (r.get(4), r.get(5), r.get(6));
            format!("{q}: metrics pending {p} leased {l} dead {d}, rows {ap} {al} {ad}")
        })
        .collect()
}

/// One session's share of the workload: every function that moves rows
/// between states, at random, on two queues with different policies.
async fn churn(pg: Client, seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let owner = format!("w{seed}");
    for _ in 0..steps {
        let queue = if rng.below(2) == 0 { "a" } else { "b" };
        let sql = match rng.below(12) {
            0 => format!(
                "SELECT lease.enqueue('{queue}', '{{}}', key => 'k{}', run_at => now() + interval '{} hour',
                                      priority => {})",
                rng.below(30),
                rng.below(2),
                rng.below(3)
            ),
            1 => format!(
                "SELECT lease.enqueue_batch('{queue}', array_fill('{{}}'::jsonb, ARRAY[4]),
                                            ARRAY['b{}', NULL, 'b{}', NULL])",
                rng.below(30),
                rng.below(30)
            ),
            2 | 3 => {
                let outcome = ["done", "retry", "fail", "abandon"][rng.below(4) as usize];
                format!(
                    "SELECT lease.release(c.id, '{owner}', c.epoch, '{outcome}')
                       FROM lease.claim_pending(2, '1 minute', '{owner}', '{queue}') c"
                )
            }
            4 => {
                let outcome = ["done", "retry", "fail", "abandon"][rng.below(4) as usize];
                format!(
                    "SELECT lease.release_batch(array_agg(c.id), '{owner}', array_agg(c.epoch), '{outcome}')
                       FROM lease.claim_pending(3, '1 minute', '{owner}', '{queue}') c"
                )
            }
            5 => format!(
                "WITH c AS MATERIALIZED (SELECT * FROM lease.claim_pending(2, '1 minute', '{owner}', '{queue}'))
                 SELECT count(*) FROM lease.release_and_claim(
                     (SELECT coalesce(array_agg(c.id ORDER BY c.id), '{{}}') FROM c), '{owner}',
                     (SELECT coalesce(array_agg(c.epoch ORDER BY c.id), '{{}}') FROM c), 2, '1 minute', '{queue}')"
            ),
            // Left to expire and be reaped (or to be reclaimed).
            6 => format!("SELECT count(*) FROM lease.claim_pending(1, '10 milliseconds', '{owner}', '{queue}')"),
            7 => "SELECT lease.cancel((SELECT j.id FROM lease.job j WHERE j.state IN ('pending', 'leased')
                                        ORDER BY random() LIMIT 1))"
                .to_owned(),
            8 => "SELECT count(*) FROM lease.reap()".to_owned(),
            9 => "SELECT lease.requeue((SELECT j.id FROM lease.job j WHERE j.state = 'dead'
                                         ORDER BY random() LIMIT 1))"
                .to_owned(),
            10 => "SELECT lease.purge()".to_owned(),
            _ => "SELECT count(*) FROM lease.sweep()".to_owned(),
        };
        // Collisions with other sessions (a cancelled row, a lost lease,
        // a release_and_claim over arrays of unequal lengths) are part of
        // the workload; only the accounting is checked.
        let _ = pg.batch_execute(&sql).await;
    }
}

/// Four sessions run every kind of state change at once, with sweeps (which
/// fold the counters) among them; afterwards the gauges equal the rows,
/// before and after a last fold, and folding leaves one counter row per
/// queue.
#[tokio::test]
async fn metrics_match_the_rows_after_every_kind_of_change() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('a', max_attempts => 2, backoff_base => '0', retention => '0',
                                   dead_retention => '1 millisecond');
         SELECT lease.create_queue('b', max_attempts => 3, backoff_base => '1 hour', backoff_max => '1 hour',
                                   jitter => 'none', retention => '1 millisecond', dead_retention => '1 hour');",
    )
    .await
    .expect("queues");
    let mut sessions = Vec::new();
    for seed in 1..=4 {
        sessions.push(tokio::spawn(churn(cluster.connect().await, seed, 300)));
    }
    for s in sessions {
        s.await.expect("a session");
    }
    // What expired during the run is reaped now, so that the ready count
    // below is settled.
    tokio::time::sleep(Duration::from_millis(50)).await;
    pg.batch_execute("SELECT count(*) FROM lease.reap()")
        .await
        .expect("reap");
    let off = disagreements(&pg).await;
    assert!(off.is_empty(), "before folding: {off:?}");
    let ready: i64 = scalar(
        &pg,
        "SELECT (SELECT sum(ready) FROM lease.metrics)::bigint
              - (SELECT count(*) FROM lease.job WHERE state = 'pending' AND next_at <= clock_timestamp())",
    )
    .await;
    assert_eq!(ready, 0, "ready rows by metrics minus by rows");
    let totals: bool = scalar(
        &pg,
        "SELECT sum(enqueued_total) > 0 AND sum(claimed_total) > 0 AND sum(done_total) > 0
                AND sum(retried_total) > 0 AND sum(dead_total) > 0 AND sum(cancelled_total) > 0
           FROM lease.metrics WHERE queue IN ('a', 'b')",
    )
    .await;
    assert!(totals, "every kind of change happened and was counted");

    pg.batch_execute("SELECT count(*) FROM lease.sweep()")
        .await
        .expect("sweep");
    let off = disagreements(&pg).await;
    assert!(off.is_empty(), "after folding: {off:?}");
    let rows: i64 = scalar(
        &pg,
        "SELECT count(*) FILTER (WHERE backend <> 0) FROM lease.counter",
    )
    .await;
    assert_eq!(rows, 0, "folding leaves only the folded rows");
    let fixed: i64 = scalar(&pg, "SELECT lease.recount()").await;
    assert_eq!(fixed, 0, "recount found nothing to correct");
}

/// Each total counts its kind of change once, whichever function made it;
/// an idempotent enqueue that found its row counts nothing; recount
/// repairs gauges after rows were changed behind the functions' back.
#[tokio::test]
async fn totals_count_each_change_once() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('t', max_attempts => 5, backoff_base => '0');
         SELECT lease.enqueue('t', '{}', key => 'same');
         SELECT lease.enqueue('t', '{}', key => 'same');
         SELECT lease.enqueue_batch('t', array_fill('{}'::jsonb, ARRAY[5]));
         CREATE TEMP TABLE c AS
         SELECT row_number() OVER (ORDER BY l.id) AS n, l.* FROM lease.claim_pending(5, '1 minute', 'w', 't') l;
         SELECT lease.release(id, 'w', epoch, 'done') FROM c WHERE n = 1;
         SELECT lease.release(id, 'w', epoch, 'retry') FROM c WHERE n = 2;
         SELECT lease.release_batch(ARRAY[id], 'w', ARRAY[epoch], 'fail') FROM c WHERE n = 3;
         SELECT lease.release(id, 'w', epoch, 'abandon') FROM c WHERE n = 4;
         SELECT lease.cancel(j.id) FROM lease.job j WHERE j.queue = 't' AND j.state = 'pending'
          ORDER BY j.id LIMIT 1;
         SELECT count(*) FROM lease.claim_pending(1, '1 millisecond', 'w', 't');
         SELECT pg_sleep(0.01);
         SELECT count(*) FROM lease.reap();",
    )
    .await
    .expect("a known history");
    let row = pg
        .query_one(
            "SELECT enqueued_total, claimed_total, done_total, retried_total, dead_total, cancelled_total,
                    recovered_total, ready, delayed, leased, dead
               FROM lease.metrics WHERE queue = 't'",
            &[],
        )
        .await
        .expect("metrics");
    let got: Vec<i64> = (0..11).map(|i| row.get(i)).collect();
    // 6 enqueued; 5 + 1 claimed; one done, retried, failed; one pending row
    // cancelled; the short lease reaped; left: 2 leased from the first
    // claim, the rest pending and ready.
    let ready = got[7];
    assert_eq!(got[..7], [6, 6, 1, 1, 1, 1, 1], "totals {got:?}");
    assert_eq!(got[8..], [0, 1, 1], "delayed, leased, dead {got:?}");
    assert_eq!(ready, 2, "ready {got:?}");

    pg.batch_execute("UPDATE lease.job SET state = 'dead' WHERE queue = 't' AND state = 'pending'")
        .await
        .expect("a write behind the functions' back");
    let fixed: i64 = scalar(&pg, "SELECT lease.recount()").await;
    assert_eq!(fixed, 1);
    let (ready, dead): (i64, i64) = {
        let r = pg
            .query_one(
                "SELECT ready, dead FROM lease.metrics WHERE queue = 't'",
                &[],
            )
            .await
            .expect("metrics");
        (r.get(0), r.get(1))
    };
    assert_eq!((ready, dead), (0, 3));
}

/// Shared buffers one execution of `sql` touched (hit or read), from
/// EXPLAIN (ANALYZE, BUFFERS); the second of two runs, so that the
/// session's first look at the catalog is not counted.
async fn buffers(pg: &Client, sql: &str) -> i64 {
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let mut touched = 0;
    for _ in 0..2 {
        // The simple protocol hands the plan over as text.
        let messages = pg.simple_query(&explain).await.expect("explain");
        let plan = messages
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .expect("a plan");
        let plan: serde_json::Value = serde_json::from_str(&plan).expect("EXPLAIN's JSON");
        let top = &plan[0]["Plan"];
        touched = top["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + top["Shared Read Blocks"].as_i64().unwrap_or(0);
    }
    touched
}

/// At 101,000 pending rows (1,000 of them delayed, three priorities, 500
/// leased), reading lease.metrics touches a hundred or so buffers (it reads
/// the delayed and the leased rows, not the ready ones); lease.queue_stats
/// reads the whole table. Buffers, not time: the cost that grows with rows.
#[tokio::test]
async fn metrics_cost_does_not_grow_with_rows() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('big');
         SELECT lease.create_queue('small');
         SELECT count(*) FROM generate_series(0, 9) g,
                LATERAL lease.enqueue_batch('big', array_fill('{}'::jsonb, ARRAY[10000]), priority => g % 3);
         SELECT count(*) FROM lease.enqueue_batch('big', array_fill('{}'::jsonb, ARRAY[1000]),
                                                  run_at => now() + interval '1 day');
         SELECT lease.enqueue('small', '{}');
         SELECT count(*) FROM lease.claim_pending(500, '1 hour', 'w', 'big');",
    )
    .await
    .expect("100,000 rows");
    let metrics = buffers(&pg, "SELECT * FROM lease.metrics").await;
    let stats = buffers(&pg, "SELECT * FROM lease.queue_stats").await;
    assert!(metrics < 300, "lease.metrics touched {metrics} buffers");
    assert!(stats > 1000, "lease.queue_stats touched {stats} buffers");
    let row = pg
        .query_one(
            "SELECT ready, delayed, leased FROM lease.metrics WHERE queue = 'big'",
            &[],
        )
        .await
        .expect("metrics");
    let got: (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(got, (99_500, 1_000, 500));
}

/// An attached table's rows come and go through its triggers: inserts,
/// rows that stop matching (leased, pending, dead), a dead letter written
/// by a failing release, TRUNCATE and detach all keep the gauges equal to
/// the rows.
#[tokio::test]
async fn attached_tables_keep_the_gauges_right() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let steps = [
        "CREATE TABLE items (id int PRIMARY KEY, status text NOT NULL);
         INSERT INTO items SELECT g, 'new' FROM generate_series(1, 5) g;
         SELECT lease.attach('items', pending => $$status = 'new'$$, queue => 'items');",
        "INSERT INTO items SELECT g, 'new' FROM generate_series(6, 10) g;",
        "CREATE TEMP TABLE c AS
         SELECT row_number() OVER (ORDER BY l.id) AS n, l.* FROM lease.claim_pending(3, '1 minute', 'w', 'items') l;",
        "SELECT lease.release(id, 'w', epoch, 'fail') FROM c WHERE n = 1;",
        "UPDATE items SET status = 'done' WHERE id::text IN (SELECT key FROM c WHERE n = 2) OR id = 10;",
        "UPDATE items SET status = 'gone' WHERE id::text IN (SELECT key FROM c WHERE n = 1);",
        "TRUNCATE items;",
        "INSERT INTO items SELECT g, 'new' FROM generate_series(1, 3) g;",
    ];
    for step in steps {
        pg.batch_execute(step).await.expect(step);
        let off = disagreements(&pg).await;
        assert!(off.is_empty(), "after {step}: {off:?}");
    }
    let totals: (i64, i64, i64) = {
        let r = pg
            .query_one(
                "SELECT enqueued_total, done_total, dead_total FROM lease.metrics WHERE queue = 'items'",
                &[],
            )
            .await
            .expect("metrics");
        (r.get(0), r.get(1), r.get(2))
    };
    // 10 + 3 rows started; the leased row that stopped matching is done;
    // the failed release made one dead letter.
    assert_eq!(totals, (13, 1, 1));
    pg.batch_execute("SELECT lease.detach('items')")
        .await
        .expect("detach");
    let left: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.counter WHERE queue = 'items'",
    )
    .await;
    assert_eq!(left, 0, "detach drops the queue's counters");
}
