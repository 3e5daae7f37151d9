//! What the client tests share: a connected client, a queue whose retries
//! are claimable at once, a row of `lease.job` read back as it is, and the
//! check of a schedule's rows.

use std::time::Duration;

use pg_lease_client::{Client, QueueOptions};

use crate::{Cluster, TEST_DB};

/// The typed client, connected to [`TEST_DB`] as the test role.
pub async fn client(cluster: &Cluster) -> Client {
    Client::connect(&cluster.conn_string(TEST_DB))
        .await
        .expect("connect the client")
}

/// A queue whose retries are claimable at once (no backoff) and whose
/// finished rows are kept for an hour, so tests can read them.
pub async fn queue(client: &Client, name: &str) {
    client
        .create_queue(
            name,
            &QueueOptions {
                backoff_base: Duration::ZERO,
                backoff_max: Duration::ZERO,
                retention: Duration::from_secs(3600),
                ..QueueOptions::default()
            },
        )
        .await
        .expect("create_queue");
}

/// A row of `lease.job` as read back by the test.
#[derive(Debug)]
pub struct JobRow {
    /// Its state.
    pub state: String,
    /// Its epoch.
    pub epoch: i64,
    /// Attempts spent.
    pub attempt: i32,
    /// The lease's owner, if leased.
    pub owner: Option<String>,
    /// The last error recorded.
    pub last_error: Option<String>,
    /// `lease_until > clock_timestamp()`, NULL when not leased.
    pub lease_valid: Option<bool>,
}

/// Reads row `id` of `lease.job`.
pub async fn job_row(pg: &tokio_postgres::Client, id: i64) -> JobRow {
    let r = pg
        .query_one(
            "SELECT state::text, epoch, attempt, owner, last_error, lease_until > clock_timestamp()
               FROM lease.job WHERE id = $1",
            &[&id],
        )
        .await
        .expect("read lease.job");
    JobRow {
        state: r.get(0),
        epoch: r.get(1),
        attempt: r.get(2),
        owner: r.get(3),
        last_error: r.get(4),
        lease_valid: r.get(5),
    }
}

/// Asserts that the rows a schedule enqueued into `queue` are its
/// occurrences, each once, none missing between the first and the last,
/// each enqueued less than `late` after its time; returns how many.
pub async fn assert_occurrences(pg: &tokio_postgres::Client, queue: &str, late: f64) -> i64 {
    let row = pg
        .query_one(
            "SELECT count(*), count(DISTINCT next_at),
                    extract(epoch FROM max(next_at) - min(next_at))::int,
                    max(extract(epoch FROM created_at - next_at))::float8
               FROM lease.job WHERE queue = $1",
            &[&queue],
        )
        .await
        .expect("the schedule's rows");
    let (rows, times, span, worst): (i64, i64, i32, f64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(rows, times, "an occurrence enqueued twice");
    assert_eq!(i64::from(span) + 1, rows, "an occurrence missing");
    assert!(worst < late, "an occurrence enqueued {worst:.3} s late");
    rows
}
