//! Options for queues and enqueues, and the rows of the observability views.

use std::time::{Duration, SystemTime};

/// Policy of a queue, for [`Client::create_queue`](crate::Client::create_queue).
/// The defaults are the SQL function's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueOptions {
    /// Claims a row may spend before a retry or an expiry dead-letters it
    /// (1..=1000000). Default 25.
    pub max_attempts: i32,
    /// Backoff after attempt *n* is `min(backoff_max, backoff_base · 2^(n−1))`.
    /// Default 1 second.
    pub backoff_base: Duration,
    /// Upper bound of the backoff. Default 1 hour.
    pub backoff_max: Duration,
    /// How long `done` rows are kept; zero deletes them at release.
    /// Default zero.
    pub retention: Duration,
    /// How long dead and cancelled rows are kept. Default 7 days.
    pub dead_retention: Duration,
    /// Full jitter on retry delays: each is uniform in `[0, backoff)`, so
    /// rows that failed together do not come back together. Default true;
    /// false keeps delays exact.
    pub jitter: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            max_attempts: 25,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(3600),
            retention: Duration::ZERO,
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            jitter: true,
        }
    }
}

/// Options of one [`Client::enqueue_with`](crate::Client::enqueue_with).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    /// Idempotency key: a second enqueue with the same `(queue, key)`
    /// returns the first row's id and changes nothing (while that row is
    /// retained). Default: none.
    pub key: Option<String>,
    /// Claimable only after this delay, measured by the database clock.
    /// Default: at once.
    pub delay: Option<Duration>,
    /// Higher is claimed first. Default 0.
    pub priority: i32,
    /// Uniqueness while active: while a row of the queue with this
    /// `unique_key` is pending or leased, enqueue returns its id and adds
    /// nothing; once it has finished, a new row is added. Default: none.
    pub unique_key: Option<String>,
}

/// Options of one [`Client::enqueue_batch`](crate::Client::enqueue_batch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOptions {
    /// One idempotency key (or `None`) per payload; must have as many
    /// elements as there are payloads. Default: no keys.
    pub keys: Option<Vec<Option<String>>>,
    /// Claimable only after this delay (database clock). Default: at once.
    pub delay: Option<Duration>,
    /// Higher is claimed first. Default 0.
    pub priority: i32,
}

/// One row of `lease.queue_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStats {
    /// Queue name.
    pub queue: String,
    /// Rows waiting, claimable now or later.
    pub pending: i64,
    /// Pending rows claimable now.
    pub ready: i64,
    /// Rows under a lease.
    pub leased: i64,
    /// Leases past their end, not yet reaped.
    pub expired: i64,
    /// Finished rows still retained.
    pub done: i64,
    /// Dead letters.
    pub dead: i64,
    /// Cancelled rows still retained.
    pub cancelled: i64,
    /// Age of the oldest ready row, if any.
    pub oldest_ready_age: Option<Duration>,
    /// Expired leases recovered by `reap` so far.
    pub recovered_total: i64,
}

/// One row of `lease.in_flight`: a leased row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Row id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Idempotency key, if any.
    pub key: Option<String>,
    /// Lease owner.
    pub owner: String,
    /// Fencing epoch.
    pub epoch: i64,
    /// Attempt number.
    pub attempt: i32,
    /// End of the lease (database clock).
    pub lease_until: SystemTime,
    /// Time left (zero once expired).
    pub remaining: Duration,
    /// The lease ended and awaits `reap`.
    pub expired: bool,
    /// `lease.cancel` was called for the row.
    pub cancel_requested: bool,
}

/// One row of `lease.holders`: the current holder of a named lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Lease name.
    pub name: String,
    /// Holder.
    pub owner: String,
    /// Fencing epoch of the holder.
    pub epoch: i64,
    /// When the holder acquired it (database clock).
    pub acquired_at: SystemTime,
    /// End of the hold (database clock).
    pub lease_until: SystemTime,
    /// Time left.
    pub remaining: Duration,
}

/// One row of `lease.dead_letters`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// Row id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Idempotency key, if any.
    pub key: Option<String>,
    /// Payload.
    pub payload: serde_json::Value,
    /// Attempts spent.
    pub attempts: i32,
    /// Last error recorded.
    pub last_error: Option<String>,
    /// When it died (database clock).
    pub finished_at: Option<SystemTime>,
}

/// What one `lease.reap` recovered in one queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reaped {
    /// Queue name.
    pub queue: String,
    /// Back to pending (with backoff).
    pub requeued: i64,
    /// Dead-lettered (attempts reached `max_attempts`).
    pub dead: i64,
    /// Cancelled (a cancel had been requested).
    pub cancelled: i64,
}
