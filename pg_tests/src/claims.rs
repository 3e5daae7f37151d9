//! What the claim-path tests share: draining a queue as a worker would,
//! counting what one claim reads, and finding a rate limit's busiest window.

use tokio_postgres::Client;

/// Claims up to `limit` rows of `default` as owner `w` and releases them as
/// done, `times` times over, each cycle a transaction of its own.
pub async fn claim_and_release(pg: &Client, limit: i32, times: usize) {
    for _ in 0..times {
        pg.execute(
            "SELECT lease.release_batch(array_agg(id), 'w', array_agg(epoch), queue => 'default')
               FROM lease.claim_pending($1, '1 minute', 'w', 'default')",
            &[&limit],
        )
        .await
        .expect("claim and release");
    }
}

/// What one claim read, from the backend's own statistics.
#[derive(Debug)]
pub struct Reads {
    /// Blocks of `job_ready` fetched.
    pub index_blocks: i64,
    /// Entries of `job_ready` returned by its scans.
    pub index_entries: i64,
    /// Blocks of `lease.job` fetched.
    pub heap_blocks: i64,
}

/// Claims `n` rows of `queue` as owner `reader`, counts what that read and
/// rolls the claim back. Panics unless the claim found `n` rows.
pub async fn claim_reads(pg: &Client, queue: &str, n: i32) -> Reads {
    let reads = "SELECT pg_stat_get_xact_blocks_fetched('lease.job_ready'::regclass),
                        pg_stat_get_xact_tuples_returned('lease.job_ready'::regclass),
                        pg_stat_get_xact_blocks_fetched('lease.job'::regclass)";
    pg.batch_execute("BEGIN").await.expect("begin");
    let before = pg.query_one(reads, &[]).await.expect("reads before");
    let claimed: i64 = pg
        .query_one(
            "SELECT count(*) FROM lease.claim_pending($1, '1 minute', 'reader', $2)",
            &[&n, &queue],
        )
        .await
        .expect("claim")
        .get(0);
    let after = pg.query_one(reads, &[]).await.expect("reads after");
    pg.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(claimed, i64::from(n), "the claim found rows");
    let delta = |i: usize| after.get::<_, i64>(i) - before.get::<_, i64>(i);
    Reads {
        index_blocks: delta(0),
        index_entries: delta(1),
        heap_blocks: delta(2),
    }
}

/// The most of `starts` (claim times in microseconds, any order; sorted on
/// return) that fall in one span of `period` microseconds.
pub fn busiest_window(starts: &mut [i64], period: i64) -> usize {
    starts.sort_unstable();
    let mut most = 0;
    let mut first = 0;
    for last in 0..starts.len() {
        while starts[last] - starts[first] >= period {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}
