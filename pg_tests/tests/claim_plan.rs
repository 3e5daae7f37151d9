//! The claim's plan does not depend on what the statistics of `lease.job`
//! said when a session first claimed.
//!
//! `lease.claim_pending` keeps one generic plan per session until
//! `lease.job`'s statistics change. Found while profiling the batch-1
//! drain: a plan made while the table was small, or while its statistics
//! counted no live rows (a drained queue after a vacuum), read the whole
//! backlog on every claim once a burst arrived — a sequential scan of the
//! table for the primary-key lookup, or a bitmap scan of every pending row
//! of `job_ready` and a sort. It lasted until the next ANALYZE or VACUUM of
//! the table replanned it. A pgbench batch-1 drain of 40,000 rows ran at 45
//! cycles/s (22 ms of CPU each) in such a session, 1,510 with the claim
//! planned without those scans. Both tests failed before the fix
//! (391 heap blocks; 20,000 index entries). Autovacuum is off for the table
//! in both, so that no ANALYZE replans the claim in between, as none does
//! in the minute before autovacuum comes round.

use pg_tests::claims::{claim_and_release, claim_reads};
use pg_tests::{scalar, Cluster};
use tokio_postgres::Client;

/// Asserts that one claim of a row of `default` reads at most 10 heap blocks
/// of `lease.job` and 10 entries of `job_ready`.
async fn a_claim_reads_little(pg: &Client) {
    let reads = claim_reads(pg, "default", 1).await;
    assert!(
        reads.heap_blocks <= 10 && reads.index_entries <= 10,
        "a claim of one row read {reads:?}"
    );
}

/// A cluster whose `lease.job` is left alone by autovacuum.
async fn cluster_without_autovacuum() -> (Cluster, Client) {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute("ALTER TABLE lease.job SET (autovacuum_enabled = off)")
        .await
        .expect("autovacuum off for lease.job");
    (cluster, pg)
}

/// Enqueues `n` rows into `default`.
async fn enqueue(pg: &Client, n: i32) {
    pg.execute(
        "SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[$1::int]))",
        &[&n],
    )
    .await
    .expect("enqueue");
}

/// Failed before the fix: the claim read all 391 heap blocks. A worker
/// that started on a small queue, then met a burst.
#[tokio::test]
async fn a_claim_planned_on_a_small_table_reads_little_of_a_large_one() {
    let (_cluster, pg) = cluster_without_autovacuum().await;
    enqueue(&pg, 10).await;
    claim_and_release(&pg, 1, 7).await;
    enqueue(&pg, 20_000).await;

    a_claim_reads_little(&pg).await;
}

/// Failed before the fix: the claim read all 20,000 pending entries of
/// `job_ready` and sorted them. A queue analysed while full, drained and
/// vacuumed (its statistics: no live rows), planned by a worker's empty
/// claim, then a burst.
#[tokio::test]
async fn a_claim_planned_on_a_drained_queue_reads_little_of_a_burst() {
    let (_cluster, pg) = cluster_without_autovacuum().await;
    enqueue(&pg, 1_000).await;
    for step in [
        "ANALYZE lease.job",
        "DELETE FROM lease.job",
        "VACUUM lease.job",
    ] {
        pg.batch_execute(step).await.expect(step);
    }
    let found: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'w')",
    )
    .await;
    assert_eq!(found, 0, "the drained queue is empty");
    enqueue(&pg, 20_000).await;

    a_claim_reads_little(&pg).await;
}

/// The claim is never compiled by JIT. `claim_pending` turns sorts off for
/// its plan, and returning its rows in claim order takes a sort all the
/// same: costed at the planner's penalty for a disabled node, it crossed
/// every JIT threshold, and each claim spent 2.4 s compiling (a 200k-row
/// pgbench drain that should take seconds ran for minutes). Failed before
/// the function turned JIT off: the server log showed "JIT:" under the
/// claim's plan.
#[tokio::test]
async fn a_claim_is_not_compiled_by_jit() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(pg_tests::TEST_DB, "postgres").await;
    enqueue(&su, 100).await;
    su.batch_execute(
        "LOAD 'auto_explain';
         SET auto_explain.log_min_duration = 0;
         SET auto_explain.log_nested_statements = on;
         SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w');",
    )
    .await
    .expect("a claim, explained");
    let log = cluster.server_log();
    assert!(
        log.contains("lease.job_ready") || log.contains("job_ready"),
        "auto_explain logged the claim's plan"
    );
    assert!(!log.contains("JIT:"), "the claim was compiled by JIT");
}
