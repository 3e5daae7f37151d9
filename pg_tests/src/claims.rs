//! What the claim-path tests share: draining a queue as a worker would,
//! counting what one claim reads, and finding a rate limit's busiest window.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::Cluster;

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

/// Sixteen claimers of `queue`, each on a connection of its own claiming
/// 1 to 5 rows at a time in a loop for `run` (a claim that comes back empty
/// sleeps 2 ms, as any claimer would, rather than spin), with a ttl of one
/// minute. Returns, for every row claimed, the key its payload names
/// (`{"k": key}`, "" if none) and its claim time (`lease_until - ttl`, the
/// instant a rate limit counts it at) in microseconds.
pub async fn claim_in_loops(cluster: &Cluster, queue: &str, run: Duration) -> Vec<(String, i64)> {
    let claimed = Arc::new(Mutex::new(Vec::new()));
    let mut claimers = Vec::new();
    for i in 0..16 {
        let pg = cluster.connect().await;
        let claimed = Arc::clone(&claimed);
        let queue = queue.to_owned();
        claimers.push(tokio::spawn(async move {
            let until = Instant::now() + run;
            let mut n = 0;
            while Instant::now() < until {
                let limit = 1 + (i + n) % 5;
                let rows = pg
                    .query(
                        "SELECT coalesce(c.payload->>'k', ''),
                                (extract(epoch FROM c.lease_until - interval '1 minute') * 1e6)::bigint
                           FROM lease.claim_pending($1, '1 minute', 'w' || $2::int, $3) AS c",
                        &[&limit, &i, &queue],
                    )
                    .await
                    .expect("claim");
                if rows.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                claimed
                    .lock()
                    .expect("claimed")
                    .extend(rows.iter().map(|r| (r.get(0), r.get(1))));
                n += 1;
            }
        }));
    }
    for c in claimers {
        c.await.expect("claimer");
    }
    let all = std::mem::take(&mut *claimed.lock().expect("claimed"));
    all
}
