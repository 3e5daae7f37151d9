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
    /// Per-key concurrency limit: at most this many rows of one
    /// [`EnqueueOptions::concurrency_key`] are admitted (claimable or
    /// leased) at once; the rest wait, held, until one ends. 1 runs each
    /// key's rows one at a time, in order. Default `None`: no limit, and
    /// enqueues may not name a concurrency key.
    pub concurrency: Option<i32>,
    /// The largest payload an enqueue may write, in bytes of stored `jsonb`
    /// (1..=268435455); a larger one is refused with `22023`. Default 1 MiB.
    pub max_payload_bytes: i32,
    /// At most so many rows claimed per period, by every worker together.
    /// Default `None`: no limit.
    pub rate_limit: Option<RateLimit>,
}

/// A queue's rate limit: claims take at most `limit` rows in any span of
/// `period` (a sliding window on the database clock: each row counts from
/// its claim until `period` later), whatever the number of workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Rows per period, 1..=100000.
    pub limit: i32,
    /// The window, more than zero and at most one day.
    pub period: Duration,
}

impl RateLimit {
    /// At most `limit` rows per second.
    pub fn per_second(limit: i32) -> RateLimit {
        RateLimit {
            limit,
            period: Duration::from_secs(1),
        }
    }
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
            concurrency: None,
            max_payload_bytes: 1 << 20,
            rate_limit: None,
        }
    }
}

/// When a schedule fires, for [`Client::schedule`](crate::Client::schedule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Every {
    /// A cron expression, in UTC: five fields (minute hour day-of-month
    /// month day-of-week), or six with seconds first; `L`, `W` and `#`
    /// work as in Vixie cron.
    Cron(String),
    /// A fixed period, counted from the time the schedule is (re)created.
    Period(Duration),
}

/// One schedule as `lease.schedule` holds it, for
/// [`Client::schedules`](crate::Client::schedules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The queue it enqueues into.
    pub queue: String,
    /// When it fires: a cron expression or a fixed period.
    pub every: Every,
    /// Its next occurrence; `None` for a cron expression that never fires
    /// again.
    pub next_at: Option<SystemTime>,
    /// Rows it has enqueued so far.
    pub enqueued: i64,
    /// When a sweep last enqueued for it.
    pub last_run_at: Option<SystemTime>,
    /// Why its last enqueue failed, if it did.
    pub last_error: Option<String>,
}

/// Options of a schedule, for [`Client::schedule`](crate::Client::schedule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleOptions {
    /// Priority of the rows it enqueues. Default 0.
    pub priority: i32,
    /// After an outage, enqueue every missed occurrence (oldest first),
    /// not only the latest. Default false.
    pub catch_up: bool,
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
    /// Shares the queue's [`QueueOptions::concurrency`] slots with the
    /// other rows of this key: the row is claimable only while fewer than
    /// that many rows of the key are admitted, and keeps its slot through
    /// retries and expiries until it ends. Default: none.
    pub concurrency_key: Option<String>,
    /// Shares claims fairly with the queue's other fairness keys (a
    /// tenant, say): while several keys have ready rows of one priority,
    /// claims take rows of each in proportion to their weights
    /// ([`Client::set_weight`](crate::Client::set_weight); round-robin
    /// while all weigh 1), whatever each key's backlog. Once a queue has a
    /// row with a fairness key, its rows without one are of the key `""`.
    /// Default: none.
    pub fairness_key: Option<String>,
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
    /// One concurrency key (or `None`) per payload, as
    /// [`EnqueueOptions::concurrency_key`]; as many elements as payloads.
    /// Default: none.
    pub concurrency_keys: Option<Vec<Option<String>>>,
    /// One fairness key (or `None`) per payload, as
    /// [`EnqueueOptions::fairness_key`]; as many elements as payloads.
    /// Default: none.
    pub fairness_keys: Option<Vec<Option<String>>>,
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
    /// Paused by [`Client::pause`](crate::Client::pause): claims take
    /// none of its rows until it is resumed.
    pub paused: bool,
}

/// One row of `lease.metrics`: a queue's gauges and totals, read at
/// O(queues) cost (counters kept by every state change) rather than by
/// counting rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMetrics {
    /// Queue name.
    pub queue: String,
    /// Pending rows claimable now.
    pub ready: i64,
    /// Pending rows waiting for a later next-eligible time (`run_at`,
    /// backoff).
    pub delayed: i64,
    /// Pending rows held back until a slot of their concurrency key frees.
    pub held: i64,
    /// Rows under a lease.
    pub leased: i64,
    /// Leases past their end, not yet reaped.
    pub expired: i64,
    /// Dead letters.
    pub dead: i64,
    /// Age of the oldest ready row, if any.
    pub oldest_ready_age: Option<Duration>,
    /// How long the oldest expired lease has waited for the reaper, if any.
    pub reap_lag: Option<Duration>,
    /// Rows enqueued since install (idempotent repeats not counted).
    pub enqueued_total: i64,
    /// Claims, `reclaim_own` included.
    pub claimed_total: i64,
    /// Rows finished as done.
    pub done_total: i64,
    /// Releases with outcome `retry` that made the row pending again.
    pub retried_total: i64,
    /// Rows that became dead letters.
    pub dead_total: i64,
    /// Rows that became cancelled.
    pub cancelled_total: i64,
    /// Expired leases recovered by `reap`.
    pub recovered_total: i64,
    /// Paused by [`Client::pause`](crate::Client::pause): claims take
    /// none of its rows until it is resumed.
    pub paused: bool,
    /// Its rate limit, if it has one.
    pub rate_limit: Option<RateLimit>,
    /// Rows claimed within the last rate period (0 without a limit): the
    /// limit minus this is what claims may take now.
    pub rate_used: i64,
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

/// One row of `lease.fairness_keys`: a fairness key of a queue, its rows
/// and its rate limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairnessKey {
    /// Queue name.
    pub queue: String,
    /// The key (`""`: the rows enqueued without one).
    pub fairness_key: String,
    /// Its weight ([`Client::set_weight`](crate::Client::set_weight)).
    pub weight: i32,
    /// Rows pending, claimable now or later.
    pub pending: i64,
    /// Rows claimable now.
    pub ready: i64,
    /// Rows leased.
    pub leased: i64,
    /// Its rate limit ([`Client::set_key_rate`](crate::Client::set_key_rate)), if any.
    pub rate_limit: Option<RateLimit>,
    /// Rows claimed in its limit's window now (with a limit only).
    pub claimed_in_period: Option<i64>,
    /// While its window is full: until when claims hold its rows back.
    pub held_until: Option<SystemTime>,
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

/// One dead letter without its payload, as
/// [`Client::dead_letter_summaries`](crate::Client::dead_letter_summaries)
/// lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterSummary {
    /// Row id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Idempotency key, if any.
    pub key: Option<String>,
    /// Attempts spent.
    pub attempts: i32,
    /// Last error recorded, cut after its first 2,000 characters (a cut
    /// one ends in `…`).
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

/// One row of `lease.queue`: a queue's policy, as
/// [`Client::queue_settings`](crate::Client::queue_settings) reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    /// Queue name.
    pub name: String,
    /// Claims a row may spend before it is dead-lettered.
    pub max_attempts: i32,
    /// First backoff step.
    pub backoff_base: Duration,
    /// Upper bound of the backoff.
    pub backoff_max: Duration,
    /// How long `done` rows are kept.
    pub retention: Duration,
    /// How long dead and cancelled rows are kept.
    pub dead_retention: Duration,
    /// Retry delays are spread over `[0, backoff)` (`jitter = 'full'`).
    pub jitter: bool,
    /// Only grantees and `lease_admin` may use it (`lease.grant` was called).
    pub restricted: bool,
    /// Fed by an attached table.
    pub attached: bool,
    /// When it was created (database clock).
    pub created_at: SystemTime,
    /// Its rate limit, if it has one.
    pub rate_limit: Option<RateLimit>,
}

/// One row of `lease.reaper_stats`: housekeeping in the connected database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaperStats {
    /// The database these counters belong to.
    pub database: String,
    /// `lease.sweep` passes run here so far.
    pub sweeps: i64,
    /// Expired leases those passes recovered.
    pub recovered: i64,
    /// Finished rows they purged.
    pub purged: i64,
    /// When the last pass started (database clock); `None` if never.
    pub last_sweep_at: Option<SystemTime>,
    /// How long the last pass took.
    pub last_duration: Option<Duration>,
    /// What failed in the last pass that failed (kept until the next failure).
    pub last_error: Option<String>,
    /// When that failure happened.
    pub last_error_at: Option<SystemTime>,
    /// Server-wide: how often a sweeper could not start for want of a
    /// background worker slot. `None` when the library is not preloaded,
    /// i.e. no background reaper runs in this server.
    pub slot_shortages: Option<i64>,
    /// When that last happened, if ever.
    pub last_slot_shortage_at: Option<SystemTime>,
}

impl ReaperStats {
    /// True when pg_lease is in `shared_preload_libraries`, so the server
    /// runs the background reaper (it may still be turned off with
    /// `lease.reaper_enabled`).
    pub fn preloaded(&self) -> bool {
        self.slot_shortages.is_some()
    }
}

/// Which rows [`Client::jobs`](crate::Client::jobs) returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this queue. Default: all.
    pub queue: Option<String>,
    /// Only rows in this state. Default: all.
    pub state: Option<crate::JobState>,
    /// Only the row of this key (needs `queue`: a key is unique within
    /// its queue). Default: any.
    pub key: Option<String>,
    /// Only rows with an id greater than this: the last id of the page
    /// before, so that each page costs its own rows, however deep.
    /// Default: from the start.
    pub after: Option<i64>,
    /// At most this many rows, lowest id first. Default 100.
    pub limit: u32,
}

impl Default for JobFilter {
    fn default() -> Self {
        JobFilter {
            queue: None,
            state: None,
            key: None,
            after: None,
            limit: 100,
        }
    }
}

/// Every column of one `lease.job` row, as
/// [`Client::jobs`](crate::Client::jobs) and [`Client::job`](crate::Client::job)
/// read it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// Row id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Idempotency key (an attached table's primary key as text), if any.
    pub key: Option<String>,
    /// Payload.
    pub payload: serde_json::Value,
    /// State.
    pub state: crate::JobState,
    /// Higher is claimed first.
    pub priority: i32,
    /// Claim order after priority (an attached table's `order_by` value).
    pub rank: i64,
    /// A pending row is claimable from this time on (database clock).
    pub next_at: SystemTime,
    /// Claims that spent an attempt.
    pub attempt: i32,
    /// Fencing epoch of the current or last lease.
    pub epoch: i64,
    /// Owner of the current or last lease.
    pub owner: Option<String>,
    /// End of the current or last lease.
    pub lease_until: Option<SystemTime>,
    /// `lease.cancel` was called while it was leased.
    pub cancel_requested: bool,
    /// Last error recorded by a release.
    pub last_error: Option<String>,
    /// When it was enqueued (database clock).
    pub created_at: SystemTime,
    /// When it finished, if it has.
    pub finished_at: Option<SystemTime>,
    /// `enqueue`'s `unique_key`, if any.
    pub unique_key: Option<String>,
}

/// Every column of one `lease.job` row but its payload, as
/// [`Client::job_summaries`](crate::Client::job_summaries) lists them and
/// [`Client::job_preview`](crate::Client::job_preview) reads one: what a
/// listing shows, without payloads whose size only the queue's
/// `max_payload_bytes` bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSummary {
    /// Row id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Idempotency key (an attached table's primary key as text), if any.
    pub key: Option<String>,
    /// State.
    pub state: crate::JobState,
    /// Higher is claimed first.
    pub priority: i32,
    /// Claim order after priority (an attached table's `order_by` value).
    pub rank: i64,
    /// A pending row is claimable from this time on (database clock).
    pub next_at: SystemTime,
    /// Claims that spent an attempt.
    pub attempt: i32,
    /// Fencing epoch of the current or last lease.
    pub epoch: i64,
    /// Owner of the current or last lease.
    pub owner: Option<String>,
    /// End of the current or last lease.
    pub lease_until: Option<SystemTime>,
    /// `lease.cancel` was called while it was leased.
    pub cancel_requested: bool,
    /// Last error recorded by a release, cut after its first 2,000
    /// characters (a cut one ends in `…`).
    pub last_error: Option<String>,
    /// When it was enqueued (database clock).
    pub created_at: SystemTime,
    /// When it finished, if it has.
    pub finished_at: Option<SystemTime>,
    /// `enqueue`'s `unique_key`, if any.
    pub unique_key: Option<String>,
}

/// One row and the start of its payload, as
/// [`Client::job_preview`](crate::Client::job_preview) reads it: the rest
/// of the payload stays in the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobPreview {
    /// The row's other columns.
    pub job: JobSummary,
    /// The payload's JSON text (as PostgreSQL prints `jsonb`), cut after
    /// the number of characters asked for.
    pub payload_head: String,
    /// The length in bytes of the payload's whole JSON text.
    pub payload_bytes: i64,
}

impl JobPreview {
    /// Whether `payload_head` is the whole payload.
    pub fn payload_is_whole(&self) -> bool {
        i64::try_from(self.payload_head.len()).is_ok_and(|n| n == self.payload_bytes)
    }
}

/// The pg_lease versions of the connected database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtensionVersions {
    /// The connected database's name.
    pub database: String,
    /// `pg_extension.extversion`; `None` if not created in this database.
    pub installed: Option<String>,
    /// The default version the server's installed files offer
    /// (`pg_available_extensions`); `None` if the server has no pg_lease.
    pub available: Option<String>,
}
