//! What a worker did: the [`Summary`] that [`Worker::run`](super::Worker::run)
//! returns, and the same events as `metrics` (see [`crate::metrics`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::job::Summary;
use crate::lease::Outcome;
use crate::metrics as m;

/// Counts for the [`Summary`], each also sent to the `metrics` recorder
/// (if the application installed one) with the worker's queue as label.
pub(super) struct Counters {
    queue: String,
    slots: usize,
    running: AtomicUsize,
    claimed: AtomicU64,
    done: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    abandoned: AtomicU64,
    lost: AtomicU64,
    unreleased: AtomicU64,
    panicked: AtomicU64,
}

impl Counters {
    pub(super) fn new(queue: &str, slots: usize) -> Counters {
        Counters {
            queue: queue.to_owned(),
            slots,
            running: AtomicUsize::new(0),
            claimed: AtomicU64::new(0),
            done: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            unreleased: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
        }
    }

    fn add(&self, counter: &AtomicU64, event: &'static str, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(m::JOBS, "queue" => self.queue.clone(), "event" => event).increment(n);
    }

    pub(super) fn claimed(&self, n: usize) {
        self.add(&self.claimed, "claimed", n as u64);
    }

    pub(super) fn recorded(&self, outcome: &Outcome) {
        match outcome {
            Outcome::Done | Outcome::Finished => self.add(&self.done, "done", 1),
            Outcome::Retry { .. } => self.add(&self.retried, "retried", 1),
            Outcome::Fail { .. } => self.add(&self.failed, "failed", 1),
            Outcome::Abandon => self.add(&self.abandoned, "abandoned", 1),
        }
    }

    pub(super) fn lost(&self) {
        self.add(&self.lost, "lost", 1);
    }

    pub(super) fn unreleased(&self) {
        self.add(&self.unreleased, "unreleased", 1);
    }

    pub(super) fn panicked(&self) {
        self.add(&self.panicked, "panicked", 1);
    }

    /// A handler ran for `took` and answered `outcome`.
    pub(super) fn handled(&self, outcome: &Outcome, took: Duration) {
        metrics::histogram!(m::HANDLER_SECONDS, "queue" => self.queue.clone(), "outcome" => outcome.as_sql())
            .record(took.as_secs_f64());
    }

    /// A claim (or release-and-claim) request took `took`.
    pub(super) fn claim_latency(&self, took: Duration) {
        metrics::histogram!(m::CLAIM_SECONDS, "queue" => self.queue.clone())
            .record(took.as_secs_f64());
    }

    /// A heartbeat took `took` for `held` leases.
    pub(super) fn heartbeat(&self, took: Duration, held: usize) {
        metrics::histogram!(m::RENEW_SECONDS, "queue" => self.queue.clone())
            .record(took.as_secs_f64());
        metrics::gauge!(m::LEASES_HELD, "queue" => self.queue.clone()).set(held as f64);
    }

    /// A handler starts (`+1`) or has ended (`-1`).
    pub(super) fn running(&self, delta: isize) {
        let now = if delta >= 0 {
            self.running
                .fetch_add(delta.unsigned_abs(), Ordering::Relaxed)
                + delta.unsigned_abs()
        } else {
            self.running
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
                .saturating_sub(delta.unsigned_abs())
        };
        metrics::gauge!(m::JOBS_RUNNING, "queue" => self.queue.clone()).set(now as f64);
        metrics::gauge!(m::SLOTS_FREE, "queue" => self.queue.clone())
            .set(self.slots.saturating_sub(now) as f64);
    }

    pub(super) fn snapshot(&self) -> Summary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            claimed: get(&self.claimed),
            done: get(&self.done),
            retried: get(&self.retried),
            failed: get(&self.failed),
            abandoned: get(&self.abandoned),
            lost: get(&self.lost),
            unreleased: get(&self.unreleased),
            panicked: get(&self.panicked),
        }
    }
}
