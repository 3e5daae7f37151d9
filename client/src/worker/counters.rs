//! What a worker did: the [`Summary`] that [`Worker::run`](super::Worker::run)
//! returns, and the same events as `metrics` (see [`crate::metrics`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

use super::job::Summary;
use crate::lease::{Claimed, Outcome};
use crate::metrics as m;

/// Counts for the [`Summary`], each also sent to the `metrics` recorder
/// (if the application installed one before the worker started) with the
/// worker's queue as label. The metric handles are made once, at start:
/// no label is built per job.
pub(super) struct Counters {
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
    metrics: Handles,
}

/// The worker's metric handles, labelled with its queue.
struct Handles {
    claimed: Counter,
    done: Counter,
    retried: Counter,
    failed: Counter,
    abandoned: Counter,
    lost: Counter,
    unreleased: Counter,
    panicked: Counter,
    /// By outcome: done, retry, fail, abandon.
    handler: [Histogram; 4],
    claim: Histogram,
    claim_wait: Histogram,
    renew: Histogram,
    held: Gauge,
    running: Gauge,
    free: Gauge,
}

impl Handles {
    fn new(queue: &str) -> Handles {
        let event =
            |e: &'static str| metrics::counter!(m::JOBS, "queue" => queue.to_owned(), "event" => e);
        let handler = |o: &'static str| metrics::histogram!(m::HANDLER_SECONDS, "queue" => queue.to_owned(), "outcome" => o);
        Handles {
            claimed: event("claimed"),
            done: event("done"),
            retried: event("retried"),
            failed: event("failed"),
            abandoned: event("abandoned"),
            lost: event("lost"),
            unreleased: event("unreleased"),
            panicked: event("panicked"),
            handler: [
                handler("done"),
                handler("retry"),
                handler("fail"),
                handler("abandon"),
            ],
            claim: metrics::histogram!(m::CLAIM_SECONDS, "queue" => queue.to_owned()),
            claim_wait: metrics::histogram!(m::CLAIM_WAIT_SECONDS, "queue" => queue.to_owned()),
            renew: metrics::histogram!(m::RENEW_SECONDS, "queue" => queue.to_owned()),
            held: metrics::gauge!(m::LEASES_HELD, "queue" => queue.to_owned()),
            running: metrics::gauge!(m::JOBS_RUNNING, "queue" => queue.to_owned()),
            free: metrics::gauge!(m::SLOTS_FREE, "queue" => queue.to_owned()),
        }
    }
}

fn add(count: &AtomicU64, metric: &Counter, n: u64) {
    count.fetch_add(n, Ordering::Relaxed);
    metric.increment(n);
}

impl Counters {
    pub(super) fn new(queue: &str, slots: usize) -> Counters {
        Counters {
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
            metrics: Handles::new(queue),
        }
    }

    pub(super) fn claimed(&self, n: usize) {
        add(&self.claimed, &self.metrics.claimed, n as u64);
    }

    /// Rows a claim took, each with how long it had been claimable
    /// (database clock).
    pub(super) fn took(&self, rows: &[Claimed]) {
        self.claimed(rows.len());
        for row in rows {
            self.metrics
                .claim_wait
                .record(row.lease.waited().as_secs_f64());
        }
    }

    #[allow(deprecated)]
    pub(super) fn released(&self, outcome: &Outcome) {
        let m = &self.metrics;
        match outcome {
            Outcome::Done | Outcome::Released | Outcome::Finished => add(&self.done, &m.done, 1),
            Outcome::Retry { .. } => add(&self.retried, &m.retried, 1),
            Outcome::Fail { .. } => add(&self.failed, &m.failed, 1),
            Outcome::Abandon => add(&self.abandoned, &m.abandoned, 1),
        }
    }

    pub(super) fn lost(&self) {
        add(&self.lost, &self.metrics.lost, 1);
    }

    pub(super) fn unreleased(&self) {
        add(&self.unreleased, &self.metrics.unreleased, 1);
    }

    pub(super) fn panicked(&self) {
        add(&self.panicked, &self.metrics.panicked, 1);
    }

    /// A handler ran for `took` and answered `outcome`.
    #[allow(deprecated)]
    pub(super) fn handled(&self, outcome: &Outcome, took: Duration) {
        let i = match outcome {
            Outcome::Done | Outcome::Released | Outcome::Finished => 0,
            Outcome::Retry { .. } => 1,
            Outcome::Fail { .. } => 2,
            Outcome::Abandon => 3,
        };
        self.metrics.handler[i].record(took.as_secs_f64());
    }

    /// A claim (or release-and-claim) request took `took`.
    pub(super) fn claim_latency(&self, took: Duration) {
        self.metrics.claim.record(took.as_secs_f64());
    }

    /// A heartbeat took `took` for `held` leases.
    pub(super) fn heartbeat(&self, took: Duration, held: usize) {
        self.metrics.renew.record(took.as_secs_f64());
        self.metrics.held.set(held as f64);
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
        self.metrics.running.set(now as f64);
        self.metrics.free.set(self.slots.saturating_sub(now) as f64);
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
