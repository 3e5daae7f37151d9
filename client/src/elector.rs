//! [`Elector`]: leader election over a named lease, with step-down before
//! expiry and the epoch for fencing the leader's writes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::timing::{check_lease_timing, default_owner, jitter, renew_retry};

/// Settings of an [`Elector`]. [`ElectorConfig::new`] gives the defaults
/// documented on each field; [`ElectorConfig::with_ttl`] scales them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectorConfig {
    /// Name of the named lease (1 to 128 characters).
    pub name: String,
    /// This contender's owner name. Default: `<hostname>-<pid>-<random
    /// hex>`, unique per process start.
    pub owner: String,
    /// Lease duration asked for on acquire and renewal. Default 15 s.
    pub ttl: Duration,
    /// Time between renewals while leading. Default 5 s (ttl / 3); after a
    /// failed renewal the next comes after a quarter of this.
    pub renew_every: Duration,
    /// Safety margin: leadership ends locally at the send time of the last
    /// confirmed acquire or renewal plus `ttl − margin`, before the
    /// database can give the lease to anyone else. Default 3 s (ttl / 5).
    pub margin: Duration,
    /// Time between attempts to acquire while following. Default 3 s
    /// (ttl / 5).
    pub retry_every: Duration,
    /// Time allowed for each request (never beyond the local deadline).
    /// Default 3 s (ttl / 5).
    pub request_timeout: Duration,
}

impl ElectorConfig {
    /// The defaults, for named lease `name`.
    pub fn new(name: impl Into<String>) -> ElectorConfig {
        ElectorConfig::with_ttl_for(name.into(), Duration::from_secs(15))
    }

    fn with_ttl_for(name: String, ttl: Duration) -> ElectorConfig {
        ElectorConfig {
            name,
            owner: default_owner(),
            ttl,
            renew_every: ttl / 3,
            margin: ttl / 5,
            retry_every: ttl / 5,
            request_timeout: ttl / 5,
        }
    }

    /// Sets `ttl`, and `renew_every` = ttl / 3, `margin`, `retry_every` and
    /// `request_timeout` = ttl / 5.
    pub fn with_ttl(self, ttl: Duration) -> ElectorConfig {
        ElectorConfig {
            owner: self.owner,
            ..ElectorConfig::with_ttl_for(self.name, ttl)
        }
    }

    /// Checks the settings; [`Error::InvalidInput`] names the first wrong
    /// one.
    pub fn validate(&self) -> Result<()> {
        check_lease_timing(self.ttl, self.margin, self.renew_every)?;
        if self.retry_every.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::invalid(
                "retry_every and request_timeout must be positive",
            ));
        }
        Ok(())
    }

    fn confirmed_for(&self) -> Duration {
        self.ttl.saturating_sub(self.margin)
    }
}

/// What an elector currently is, as published on its watch channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Not leading (trying to acquire, or stopped).
    Follower,
    /// Leading with this fencing epoch.
    Leader {
        /// Epoch of the named lease; pass it to
        /// [`fence_named`](crate::fence_named) in the leader's transactions.
        epoch: i64,
    },
}

/// One period of leadership: its epoch, and a token that fires when it
/// ends.
#[derive(Clone, Debug)]
pub struct Term {
    epoch: i64,
    deadline: Arc<Mutex<Instant>>,
    ended: CancellationToken,
}

impl Term {
    fn new(epoch: i64, deadline: Instant) -> Term {
        Term {
            epoch,
            deadline: Arc::new(Mutex::new(deadline)),
            ended: CancellationToken::new(),
        }
    }

    fn deadline_lock(&self) -> MutexGuard<'_, Instant> {
        self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deadline(&self) -> Instant {
        *self.deadline_lock()
    }

    fn extend(&self, until: Instant) {
        let mut d = self.deadline_lock();
        if until > *d {
            *d = until;
        }
    }

    /// Fencing epoch of this term.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Whether this term still holds: not ended, and its local deadline not
    /// passed (checked now, even if the elector's task has not run since).
    pub fn is_current(&self) -> bool {
        !self.ended.is_cancelled() && Instant::now() < self.deadline()
    }

    /// Completes when the term ends (step-down or stop).
    pub async fn ended(&self) {
        self.ended.cancelled().await
    }

    /// A token that fires when the term ends, to run leader work under.
    pub fn ended_token(&self) -> CancellationToken {
        self.ended.clone()
    }
}

/// Contends for a named lease in a background task, holds it while it can,
/// and steps down as soon as it cannot be sure it still holds it.
///
/// * While following, it tries `try_acquire` every
///   [`retry_every`](ElectorConfig::retry_every).
/// * While leading, it renews every [`renew_every`](ElectorConfig::renew_every),
///   well before expiry. Leadership has a local deadline: the time the last
///   confirmed acquire or renewal request was sent plus `ttl − margin`
///   (monotonic clock). It steps down when a renewal says the lease is lost
///   or when that deadline passes without a confirmed renewal, before the
///   database would let anyone else in.
/// * [`Elector::is_leader`] checks the deadline itself, so even a process
///   that was paused answers `false` as soon as it runs again.
/// * Changes are published on a watch channel ([`Elector::subscribe`]);
///   each term's epoch fences the leader's writes
///   ([`fence_named`](crate::fence_named)).
///
/// ```no_run
/// use pg_lease_client::{Client, Elector, ElectorConfig};
///
/// # async fn example() -> Result<(), pg_lease_client::Error> {
/// let client = Client::connect("host=127.0.0.1 user=app dbname=app").await?;
/// let mut elector = Elector::start(client, ElectorConfig::new("housekeeper"))?;
/// loop {
///     let term = elector.wait_for_term().await;
///     tokio::select! {
///         _ = term.ended() => continue, // stepped down
///         _ = housekeeping(term.epoch()) => {}
///     }
/// }
/// # }
/// # async fn housekeeping(_: i64) {}
/// ```
#[derive(Debug)]
pub struct Elector {
    state: watch::Receiver<Leadership>,
    term: Arc<Mutex<Option<Term>>>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    config: ElectorConfig,
}

impl Elector {
    /// Starts contending in a task spawned on the current tokio runtime.
    /// [`Error::InvalidInput`] for a bad config or when called outside a
    /// runtime.
    pub fn start(client: Client, config: ElectorConfig) -> Result<Elector> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::invalid("Elector::start must be called within a tokio runtime"))?;
        let (tx, state) = watch::channel(Leadership::Follower);
        let term = Arc::new(Mutex::new(None));
        let stop = CancellationToken::new();
        let task = runtime.spawn(contend(
            client,
            config.clone(),
            tx,
            Arc::clone(&term),
            stop.clone(),
        ));
        Ok(Elector {
            state,
            term,
            stop,
            task: Some(task),
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ElectorConfig {
        &self.config
    }

    /// The current term, if leading and its deadline has not passed.
    pub fn term(&self) -> Option<Term> {
        self.term
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|t| t.is_current())
            .cloned()
    }

    /// Whether this elector leads right now (local deadline included).
    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// The epoch to fence the leader's writes with, while leading.
    pub fn epoch(&self) -> Option<i64> {
        self.term().map(|t| t.epoch())
    }

    /// A receiver of leadership changes.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.clone()
    }

    /// Waits until this elector leads and returns the term. Never returns
    /// once the elector is stopped.
    pub async fn wait_for_term(&mut self) -> Term {
        loop {
            if let Some(term) = self.term() {
                return term;
            }
            if self.state.changed().await.is_err() {
                // The task ended (stopped): nothing will change any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Steps down (releasing the lease so another contender can take it at
    /// once) and stops contending.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Elector {
    /// Stops contending; the background task releases the lease if held.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn contend(
    client: Client,
    cfg: ElectorConfig,
    tx: watch::Sender<Leadership>,
    shared: Arc<Mutex<Option<Term>>>,
    stop: CancellationToken,
) {
    let requests = client.with_timeout(cfg.request_timeout);
    let publish = |term: Option<&Term>| {
        metrics::gauge!(crate::metrics::LEADER, "name" => cfg.name.clone())
            .set(if term.is_some() { 1.0 } else { 0.0 });
        *shared.lock().unwrap_or_else(|p| p.into_inner()) = term.cloned();
        tx.send_replace(match term {
            Some(t) => Leadership::Leader { epoch: t.epoch },
            None => Leadership::Follower,
        });
    };
    loop {
        let sent = Instant::now();
        let acquired = tokio::select! {
            () = stop.cancelled() => return,
            r = requests.try_acquire(&cfg.name, &cfg.owner, cfg.ttl) => r,
        };
        // After a failure, a jittered wait: electors that failed together
        // (a database restart) do not come back in lockstep.
        let mut retry_in = cfg.retry_every;
        if let Err(e) = &acquired {
            retry_in = jitter(cfg.retry_every);
            tracing::warn!(name = %cfg.name, error = %e, retry_in = ?retry_in, "could not contend for leadership");
        }
        if let Ok(Some(epoch)) = acquired {
            let term = Term::new(epoch, sent + cfg.confirmed_for());
            tracing::info!(name = %cfg.name, owner = %cfg.owner, epoch, "leading");
            publish(Some(&term));
            lead(&client, &cfg, &term, &stop).await;
            term.ended.cancel();
            tracing::info!(name = %cfg.name, owner = %cfg.owner, epoch, "stepped down");
            publish(None);
            if stop.is_cancelled() {
                if Instant::now() < term.deadline() {
                    if let Err(e) = requests
                        .release_named(&cfg.name, &cfg.owner, term.epoch)
                        .await
                    {
                        tracing::warn!(name = %cfg.name, error = %e, "release on stop failed; the lease expires");
                    }
                }
                return;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry_in) => {}
        }
    }
}

/// Renews while leading; returns on step-down (lost, or deadline passed)
/// or stop.
async fn lead(client: &Client, cfg: &ElectorConfig, term: &Term, stop: &CancellationToken) {
    let mut next_renewal = Instant::now() + cfg.renew_every;
    loop {
        let wake = next_renewal.min(term.deadline());
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(wake) => {}
        }
        let sent = Instant::now();
        let deadline = term.deadline();
        if sent >= deadline {
            return;
        }
        let bounded = client.with_timeout(cfg.request_timeout.min(deadline - sent));
        let renewal = tokio::select! {
            () = stop.cancelled() => return,
            // The request's budget does not cover reconnecting: the term
            // ends at its deadline whatever the request is doing.
            () = tokio::time::sleep_until(deadline) => return,
            r = bounded.renew_named(&cfg.name, &cfg.owner, term.epoch, cfg.ttl) => r,
        };
        match renewal {
            Ok(_) => {
                term.extend(sent + cfg.confirmed_for());
                next_renewal = sent + cfg.renew_every;
            }
            Err(e) if e.is_lease_lost() => {
                tracing::warn!(name = %cfg.name, epoch = term.epoch, "leadership lost");
                return;
            }
            Err(e) => {
                tracing::warn!(name = %cfg.name, epoch = term.epoch, error = %e, "renewal failed");
                next_renewal = Instant::now() + renew_retry(cfg.renew_every);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_terms_end_at_their_deadline() {
        assert!(ElectorConfig::new("x").validate().is_ok());
        let c = ElectorConfig::new("x").with_ttl(Duration::from_secs(3));
        assert_eq!(c.renew_every, Duration::from_secs(1));
        assert!(c.validate().is_ok());

        let t = Term::new(4, Instant::now() + Duration::from_secs(60));
        assert!(t.is_current());
        t.extend(Instant::now());
        assert!(t.is_current(), "extend never moves a deadline earlier");
        let past = Term::new(5, Instant::now());
        assert!(!past.is_current());
        t.ended.cancel();
        assert!(!t.is_current());
    }
}
