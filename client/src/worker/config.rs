//! [`WorkerConfig`]: the settings of a [`Worker`](super::Worker) and their defaults.

use std::time::Duration;

use super::MAX_BATCH;
use crate::error::{Error, Result};
use crate::timing::{check_lease_timing, default_owner};

/// Settings of a [`Worker`]. [`WorkerConfig::new`] gives the defaults
/// documented on each field; [`WorkerConfig::with_ttl`] scales the timing
/// settings to another ttl.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Queue to work on. Default `"default"`.
    pub queue: String,
    /// Owner name for claims and renewals (1 to 256 characters). Default:
    /// `<hostname>-<pid>-<random hex>`, unique per process start.
    pub owner: String,
    /// Most handlers running at once. Default 8.
    pub concurrency: usize,
    /// Rows claimed ahead of free slots: they wait in claim order, their
    /// leases held and renewed like running ones, and are given back at
    /// once on shutdown. The worker holds at most `concurrency + prefetch`
    /// leases (those whose handlers returned included until they are released).
    ///
    /// Default `None`: the Worker sizes it as it runs, from how long its
    /// handlers take and how long its database calls take: enough waiting
    /// rows to keep every slot busy while a refill is on its way (hundreds
    /// for jobs of microseconds, so that each commit records hundreds of
    /// outcomes; about one per slot for 10 ms jobs), never more than the
    /// slots start within half of `ttl − margin`, and at most 512 leases
    /// in all; none until its first handlers have returned. `Some(n)`
    /// fixes it at `n` (at most 10,000).
    pub prefetch: Option<usize>,
    /// Lease duration asked for on claim and on each renewal. Default 30 s.
    pub ttl: Duration,
    /// Time between heartbeats (one `renew_batch` for all in-flight
    /// leases). Default 10 s (ttl / 3). After a failed heartbeat the next
    /// comes after a quarter of this.
    pub renew_every: Duration,
    /// Safety margin: a job's local deadline is the time its last confirmed
    /// claim or renewal request was *sent* plus `ttl − margin`; when it
    /// passes, the job's cancellation token fires. Covers clock rate drift
    /// and the time the handler needs to notice. Default 5 s (ttl / 6).
    pub margin: Duration,
    /// Time allowed for each claim or release request, once connected
    /// (connecting has the connector's own budget,
    /// [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT)), before
    /// its connection is given up. A request given up on may still commit
    /// (a claim then holds rows nobody runs until they expire), so it is
    /// generous: default 5 s, and [`with_ttl`](WorkerConfig::with_ttl)
    /// keeps it within 5–30 s. Heartbeats are given at most `renew_every`,
    /// so that a hung one is replaced by the next tick.
    pub request_timeout: Duration,
    /// Claim at least this often when idle, whether or not a notification
    /// came (the fallback when `LISTEN` is off or unavailable, and the
    /// pick-up delay of retries, which are not notified). After work the
    /// wait starts shorter: 10 ms after the last claimed rows came, doubling
    /// with each claim that finds none, up to this; so a row whose
    /// notification was never sent (it was enqueued while a claim took the
    /// rows before it) waits milliseconds, not this long. Default 2 s.
    pub poll_interval: Duration,
    /// Open a second connection that `LISTEN`s on the queue's channel
    /// (`lease.ready_channel`) and claim as soon as it is notified. Turn off behind a
    /// transaction-mode pooler (notifications would not arrive; polling
    /// still works). While on, the worker's own connections (heartbeat,
    /// listener) carry `application_name` = `owner`. Default true. Needs a client with a
    /// [`Connector`](crate::Connector).
    pub listen: bool,
    /// After shutdown is requested, how long in-flight handlers may run
    /// before they are dropped and their rows abandoned. Default 30 s, and
    /// the ttl after [`with_ttl`](WorkerConfig::with_ttl).
    pub grace_period: Duration,
    /// On start, take back (under new epochs) the rows this `owner` still
    /// holds from an earlier run, before claiming anything else
    /// ([`Client::reclaim_own`](crate::Client::reclaim_own)), once: as many
    /// as there are slots; any others expire and are reaped. Useful only
    /// with a stable owner name per process (e.g. a StatefulSet
    /// hostname); never run two workers with one owner name. Default
    /// false.
    pub reclaim_own: bool,
    /// Bind this worker's leases to its listening session
    /// (`lease.bind_session`): when that session ends (the process is
    /// killed, its host vanishes and TCP keepalive gives up, the connection
    /// closes) the reaper expires them within about a sweep interval and
    /// another worker retries them, instead of after the ttl. A slow
    /// session keeps them, and so does one whose connection the worker
    /// replaced while the old backend still ran (a network blip); after a
    /// connection that closed, the leases end, and their handlers' tokens
    /// fire. Needs `listen` and a direct connection: a pooler keeps its
    /// server session open after the worker is gone. Default false.
    pub bind_session: bool,
}

impl WorkerConfig {
    /// The defaults, for `queue`.
    pub fn new(queue: impl Into<String>) -> WorkerConfig {
        WorkerConfig {
            queue: queue.into(),
            owner: default_owner(),
            concurrency: 8,
            prefetch: None,
            ttl: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            margin: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_secs(2),
            listen: true,
            grace_period: Duration::from_secs(30),
            reclaim_own: false,
            bind_session: false,
        }
    }

    /// Sets `ttl`, and `renew_every` = ttl / 3, `margin` and
    /// `request_timeout` = ttl / 6 within 5–30 s, `grace_period` = ttl: the proportions of
    /// the defaults. Set `grace_period` after this call to choose another.
    pub fn with_ttl(mut self, ttl: Duration) -> WorkerConfig {
        self.ttl = ttl;
        self.renew_every = ttl / 3;
        self.margin = ttl / 6;
        self.request_timeout = (ttl / 6).clamp(Duration::from_secs(5), Duration::from_secs(30));
        self.grace_period = ttl;
        self
    }

    /// Checks the settings; [`Error::InvalidInput`] names the first wrong
    /// one.
    pub fn validate(&self) -> Result<()> {
        if let Some(prefetch) = self.prefetch.filter(|p| *p > MAX_BATCH) {
            return Err(Error::invalid(format!(
                "prefetch must be at most {MAX_BATCH} (got {prefetch})"
            )));
        }
        if self.concurrency == 0 || self.concurrency > MAX_BATCH {
            return Err(Error::invalid(format!(
                "concurrency must be 1..={MAX_BATCH} (got {})",
                self.concurrency
            )));
        }
        check_lease_timing(self.ttl, self.margin, self.renew_every)?;
        if self.request_timeout.is_zero() || self.poll_interval.is_zero() {
            return Err(Error::invalid(
                "request_timeout and poll_interval must be positive",
            ));
        }
        if self.bind_session && !self.listen {
            return Err(Error::invalid(
                "bind_session binds the leases to the listening session: it needs listen",
            ));
        }
        Ok(())
    }
}

impl WorkerConfig {
    /// How long a confirmed claim or renewal lets a job run: `ttl − margin`.
    pub(super) fn confirmed_for(&self) -> Duration {
        self.ttl.saturating_sub(self.margin)
    }
}

impl Default for WorkerConfig {
    /// [`WorkerConfig::new`] for queue `default`.
    fn default() -> Self {
        WorkerConfig::new("default")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_scaled_ttls_too() {
        assert!(WorkerConfig::default().validate().is_ok());
        let c = WorkerConfig::new("q").with_ttl(Duration::from_secs(3));
        assert_eq!(c.renew_every, Duration::from_secs(1));
        assert_eq!(c.margin, Duration::from_millis(500));
        // Failed before the fix: the grace period stayed 30 s whatever the ttl.
        assert_eq!(c.grace_period, Duration::from_secs(3));
        // Failed before the fix: ttl / 6 = 500 ms, connecting included, gave up
        // on claims that then committed on a loaded machine.
        assert_eq!(c.request_timeout, Duration::from_secs(5));
        assert!(c.validate().is_ok());
        let mut bad = c.clone();
        bad.margin = bad.ttl;
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.concurrency = 0;
        assert!(bad.validate().is_err());
    }

    /// The leases are bound to the listening session: none without it.
    #[test]
    fn binding_the_session_needs_listen() {
        let mut c = WorkerConfig::new("q");
        c.bind_session = true;
        assert!(c.validate().is_ok());
        c.listen = false;
        assert!(matches!(c.validate(), Err(Error::InvalidInput { .. })));
    }
}
