//! [`Worker`]: a runtime that claims rows of one queue, runs a handler on
//! each under a heartbeat, and records every outcome with its fencing epoch.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease::{Claimed, FencingToken, Lease, Outcome};

/// The channel `lease.enqueue`, `lease.enqueue_batch` and `lease.reap`
/// notify, with the queue name as payload, when rows become claimable.
pub const READY_CHANNEL: &str = "pg_lease_ready";

/// Most rows one claim or one batched call handles (the SQL functions'
/// limit).
const MAX_BATCH: usize = 10_000;

/// Release batches the releaser keeps in flight at once. Measured with
/// `bin/bench --only client` (16 slots): 4 in flight drained 3.15k jobs/s
/// at prefetch 0 and 17.7k at 112, 1 in flight 4.97k and 22.1k: concurrent
/// `release_and_claim`s of one queue skip each other's rows at its head.
const RELEASES_IN_FLIGHT: usize = 1;

/// Longest ttl the SQL functions accept.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Error type a handler may return; any error converts into it with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a handler returns: the outcome to record, or an error, recorded as
/// [`Outcome::Retry`] with the error's text (so the row backs off and
/// dead-letters after the queue's `max_attempts`). An [`Error::Payload`]
/// (from [`Job::payload_as`] and `?`) is recorded as [`Outcome::Fail`]: a
/// payload that does not deserialize never will.
pub type HandlerResult = Result<Outcome, BoxError>;

type BoxFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
type HandlerFn = dyn Fn(Job) -> BoxFuture + Send + Sync;

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
    /// leases (finished jobs included until their outcome is recorded).
    /// Default 0 (a claim asks only for free slots); raise it for short
    /// jobs, where claims in batches of `concurrency + prefetch` carry the
    /// throughput (see benches/README.md).
    pub prefetch: usize,
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
    /// Time allowed for each claim, renewal or release request (connecting
    /// included) before its connection is given up. Default 5 s (ttl / 6).
    pub request_timeout: Duration,
    /// Claim at least this often when idle, whether or not a notification
    /// came (the fallback when `LISTEN` is off or unavailable, and the
    /// pick-up delay of retries, which are not notified). Default 2 s.
    pub poll_interval: Duration,
    /// Open a second connection that `LISTEN`s on [`READY_CHANNEL`] and
    /// claim as soon as this queue is notified. Turn off behind a
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
}

impl WorkerConfig {
    /// The defaults, for `queue`.
    pub fn new(queue: impl Into<String>) -> WorkerConfig {
        WorkerConfig {
            queue: queue.into(),
            owner: default_owner(),
            concurrency: 8,
            prefetch: 0,
            ttl: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            margin: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_secs(2),
            listen: true,
            grace_period: Duration::from_secs(30),
            reclaim_own: false,
        }
    }

    /// Sets `ttl`, and `renew_every` = ttl / 3, `margin` and
    /// `request_timeout` = ttl / 6, `grace_period` = ttl: the proportions of
    /// the defaults. Set `grace_period` after this call to choose another.
    pub fn with_ttl(mut self, ttl: Duration) -> WorkerConfig {
        self.ttl = ttl;
        self.renew_every = ttl / 3;
        self.margin = ttl / 6;
        self.request_timeout = ttl / 6;
        self.grace_period = ttl;
        self
    }

    /// Checks the settings; [`Error::InvalidInput`] names the first wrong
    /// one.
    pub fn validate(&self) -> Result<()> {
        if self.prefetch > MAX_BATCH {
            return Err(Error::invalid(format!(
                "prefetch must be at most {MAX_BATCH} (got {})",
                self.prefetch
            )));
        }
        if self.concurrency == 0 || self.concurrency > MAX_BATCH {
            return Err(Error::invalid(format!(
                "concurrency must be 1..={MAX_BATCH} (got {})",
                self.concurrency
            )));
        }
        if self.ttl > MAX_TTL {
            return Err(Error::invalid("ttl must be at most one day"));
        }
        if self.margin >= self.ttl {
            return Err(Error::invalid("margin must be shorter than ttl"));
        }
        if self.renew_every.is_zero() || self.renew_every >= self.confirmed_for() {
            return Err(Error::invalid(
                "renew_every must be positive and shorter than ttl - margin",
            ));
        }
        if self.request_timeout.is_zero() || self.poll_interval.is_zero() {
            return Err(Error::invalid(
                "request_timeout and poll_interval must be positive",
            ));
        }
        Ok(())
    }
}

impl WorkerConfig {
    /// How long a confirmed claim or renewal lets a job run: `ttl − margin`.
    fn confirmed_for(&self) -> Duration {
        self.ttl.saturating_sub(self.margin)
    }
}

impl Default for WorkerConfig {
    /// [`WorkerConfig::new`] for queue `default`.
    fn default() -> Self {
        WorkerConfig::new("default")
    }
}

/// Why a job's cancellation token fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// No renewal confirmed the lease before the job's local deadline: the
    /// lease may be gone (or soon will be). Stop; writes are no longer
    /// safe unless fenced.
    Unconfirmed,
    /// The database said the lease is lost (expired, reaped, taken over).
    Lost,
    /// `lease.cancel` was called for the row.
    CancelRequested,
    /// The worker's grace period after shutdown ended; the handler is
    /// dropped and the row abandoned.
    Shutdown,
}

/// One claimed row handed to the handler: payload, lease, and a
/// cancellation token that fires when the handler should stop (see
/// [`CancelReason`]).
#[derive(Debug)]
pub struct Job {
    lease: Lease,
    payload: serde_json::Value,
    cancel: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
    client: Client,
}

impl Job {
    /// The lease, with the fencing token and attempt number.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token `(id, epoch)` for fenced writes.
    pub fn token(&self) -> FencingToken {
        self.lease.token()
    }

    /// The attempt id (`pgl-<id>-<epoch>`), an idempotency key for
    /// downstream systems.
    pub fn attempt_id(&self) -> String {
        self.lease.attempt_id()
    }

    /// The payload as JSON.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }

    /// The payload deserialized into `T` ([`Error::Payload`] if it does not
    /// fit).
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(T::deserialize(&self.payload)?)
    }

    /// The token that fires when the handler should stop: the lease could
    /// not be confirmed before its local deadline, was lost, its
    /// cancellation was requested, or shutdown's grace period ended.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Completes when [`Job::cancellation`] fires.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Whether [`Job::cancellation`] has fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Why the token fired, once it has.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }

    /// The worker's client (shared connection), for fenced writes and
    /// short queries. Run heavy queries on a connection of your own.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// [`Client::fenced_update`] with this job's token.
    pub async fn fenced_update<P: Serialize + ?Sized>(&self, patch: &P) -> Result<()> {
        self.client.fenced_update(self.token(), patch).await
    }
}

/// Counts of what a worker did, returned by [`Worker::run`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Rows claimed.
    pub claimed: u64,
    /// Outcomes `done` recorded.
    pub done: u64,
    /// Outcomes `retry` recorded (handler errors and panics included).
    pub retried: u64,
    /// Outcomes `fail` recorded.
    pub failed: u64,
    /// Outcomes `abandon` recorded.
    pub abandoned: u64,
    /// Releases the database refused because the lease was already lost.
    pub lost: u64,
    /// Releases given up after errors (the lease expires and is reaped).
    pub unreleased: u64,
    /// Handlers that panicked.
    pub panicked: u64,
}

#[derive(Default)]
struct Counters {
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
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Summary {
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

    fn recorded(&self, outcome: &Outcome) {
        Counters::add(match outcome {
            Outcome::Done | Outcome::Finished => &self.done,
            Outcome::Retry { .. } => &self.retried,
            Outcome::Fail { .. } => &self.failed,
            Outcome::Abandon => &self.abandoned,
        });
    }
}

/// Runs a handler on the rows of one queue.
///
/// * **Bounded concurrency.** At most [`WorkerConfig::concurrency`]
///   handlers run, and the worker holds at most `concurrency +`
///   [`prefetch`](WorkerConfig::prefetch) leases (a finished job's counts
///   until its outcome is recorded). With the default prefetch 0 a claim
///   asks only for free slots; with more, rows claimed ahead wait in claim
///   order, renewed like running ones, and go back at once on shutdown.
/// * **Wake-ups.** A second connection `LISTEN`s on [`READY_CHANNEL`]; a
///   notification for this queue triggers a claim at once. Without it (or
///   when it fails) the worker claims every
///   [`poll_interval`](WorkerConfig::poll_interval).
/// * **Heartbeat.** Every [`renew_every`](WorkerConfig::renew_every), one
///   `renew_batch` call (on its own connection) renews every lease the
///   worker holds.
/// * **Local deadline.** Each job has a deadline on the local monotonic
///   clock: the time its claim or last confirmed renewal request was sent,
///   plus `ttl − margin`. The job's cancellation token fires when that
///   deadline passes without a confirming renewal (the database may be
///   unreachable), when the database says the lease is lost, or when a
///   cancel was requested. The server's timestamps are never compared with
///   the local clock.
/// * **Outcomes.** The handler's outcome is recorded with the fencing epoch;
///   completions that arrive together go out in one `release_batch` (done
///   ones in one `release_and_claim`, which takes their leases up again). A
///   handler error or panic is recorded as `retry` with its message; a
///   handler dropped at shutdown, or a worker whose `run` future is dropped,
///   abandons its rows (`abandon`: claimable again at once, attempt given
///   back). No exit path leaves a lease to expire, short of the process
///   dying or the database being unreachable.
/// * **Graceful shutdown.** When the token passed to [`Worker::run`] fires,
///   the worker stops claiming, lets running handlers finish within
///   [`grace_period`](WorkerConfig::grace_period), then fires their tokens,
///   drops them and abandons their rows, and returns once every lease is
///   released (or, if the database stays unreachable, its local deadline
///   has passed).
///
/// ```no_run
/// use pg_lease_client::{Client, Outcome, Worker, WorkerConfig};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example() -> Result<(), pg_lease_client::Error> {
/// let client = Client::connect("host=127.0.0.1 user=app dbname=app").await?;
/// let worker = Worker::new(client, WorkerConfig::new("emails"), |job| async move {
///     let to: String = job.payload_as::<serde_json::Value>()?["to"].to_string();
///     let attempt_id = job.attempt_id(); // idempotency key for the mail service
///     tokio::select! {
///         _ = job.cancelled() => Ok(Outcome::Abandon),
///         _ = send_email(&to, &attempt_id) => Ok(Outcome::Done),
///     }
/// });
/// let shutdown = CancellationToken::new();
/// let summary = worker.run(shutdown.clone()).await?;
/// # Ok(()) }
/// # async fn send_email(_: &str, _: &str) {}
/// ```
pub struct Worker {
    client: Client,
    config: WorkerConfig,
    handler: Arc<HandlerFn>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("client", &self.client)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker that runs `handler` on each claimed row. The handler gets a
    /// [`Job`] and returns the [`Outcome`] to record (or an error: retry).
    ///
    /// `client` should come from [`Client::connect`] or
    /// [`Client::with_connector`]: the worker then opens a separate
    /// connection for heartbeats and one for `LISTEN`, and reconnects after
    /// connection loss.
    pub fn new<F, Fut>(client: Client, config: WorkerConfig, handler: F) -> Worker
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler: Arc<HandlerFn> = Arc::new(move |job| Box::pin(handler(job)) as BoxFuture);
        Worker {
            client,
            config,
            handler,
        }
    }

    /// The settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Runs until `shutdown` fires, then drains (see [`Worker`]) and
    /// returns what was done.
    ///
    /// Errors: [`Error::InvalidInput`] for a bad [`WorkerConfig`], and, after
    /// draining, the error of a claim that cannot succeed by retrying (no
    /// such queue, no grant, invalid owner). Connection errors are retried
    /// with backoff and never end the run.
    pub async fn run(self, shutdown: CancellationToken) -> Result<Summary> {
        self.config.validate()?;
        let timeout = self.config.request_timeout;
        let ctx = Arc::new(Ctx {
            // Tagged with the owner where session settings are safe (no
            // transaction-mode pooler, which is what `listen` says).
            heartbeat: self
                .client
                .separate(self.config.listen.then_some(self.config.owner.as_str()))
                .with_timeout(timeout),
            client: self.client.with_timeout(timeout),
            config: self.config,
            handler: self.handler,
            slots: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            hard_stop: CancellationToken::new(),
            counters: Counters::default(),
        });
        let free = Arc::new(Semaphore::new(ctx.config.concurrency + ctx.config.prefetch));
        let (releases, released) = mpsc::unbounded_channel();
        let background = CancellationToken::new();

        let (ready, waiting) = mpsc::unbounded_channel();
        // Ends with the claims (shutdown, or a claim that fails for good):
        // the dispatcher then gives back the rows that wait, and the
        // releaser stops taking leases up again.
        let dispatching = shutdown.child_token();
        let releaser = {
            let ctx = Arc::clone(&ctx);
            let background = background.clone();
            let refill = Refill {
                ready: ready.clone(),
                stopping: dispatching.clone(),
            };
            async move {
                releaser(&ctx, released, &refill).await;
                background.cancel();
            }
        };
        let main = {
            let ctx = Arc::clone(&ctx);
            async move {
                let mut jobs = JoinSet::new();
                let claims = async {
                    let result = claim_loop(&ctx, &shutdown, ready, &releases, &free).await;
                    dispatching.cancel();
                    result
                };
                let (result, ()) = tokio::join!(
                    claims,
                    dispatcher(&ctx, &dispatching, waiting, &mut jobs, &releases)
                );
                let grace = tokio::time::sleep(ctx.config.grace_period);
                tokio::pin!(grace);
                loop {
                    tokio::select! {
                        next = jobs.join_next() => if next.is_none() { break },
                        () = &mut grace, if !ctx.hard_stop.is_cancelled() => ctx.hard_stop.cancel(),
                    }
                }
                // Every job task has handed its lease to the releaser (or
                // released it on drop); the releaser ends once it is done.
                drop(releases);
                result
            }
        };
        let (result, (), (), ()) = tokio::join!(
            main,
            releaser,
            renewer(&ctx, &background),
            listener(&ctx, &background)
        );
        result.map(|()| ctx.counters.snapshot())
    }
}

/// State shared by the worker's loops and its job tasks.
struct Ctx {
    client: Client,
    heartbeat: Client,
    config: WorkerConfig,
    handler: Arc<HandlerFn>,
    /// Leases held, by row id: what the heartbeat renews.
    slots: Mutex<HashMap<i64, Slot>>,
    /// Claim now (a notification came, or the listener reconnected).
    wake: Notify,
    /// The grace period is over: drop handlers, abandon their rows.
    hard_stop: CancellationToken,
    counters: Counters,
}

impl Ctx {
    fn slots(&self) -> MutexGuard<'_, HashMap<i64, Slot>> {
        // Nothing panics while holding the lock; a poisoned map is intact.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A held lease as the heartbeat sees it.
struct Slot {
    epoch: i64,
    deadline: watch::Sender<Instant>,
    cancel: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl Slot {
    fn fire(&self, reason: CancelReason) {
        fire(&self.reason, &self.cancel, reason);
    }
}

fn fire(slot: &OnceLock<CancelReason>, cancel: &CancellationToken, reason: CancelReason) {
    let _ = slot.set(reason);
    cancel.cancel();
}

/// Ownership of one lease until its outcome is recorded. Dropped while
/// still armed (its task aborted, the worker's future dropped, the releaser
/// gone), it releases the lease with its current outcome (`abandon` until
/// the handler has answered) from a spawned task.
struct Held {
    ctx: Arc<Ctx>,
    lease: Lease,
    outcome: Outcome,
    deadline: watch::Receiver<Instant>,
    /// One of the `concurrency + prefetch` leases the worker may hold.
    _permit: Option<OwnedSemaphorePermit>,
    armed: bool,
}

impl Held {
    fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// The release is settled (recorded, refused, or given up).
    fn settle(mut self) {
        self.armed = false;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        {
            let mut slots = self.ctx.slots();
            if slots
                .get(&self.lease.id)
                .is_some_and(|s| s.epoch == self.lease.epoch)
            {
                slots.remove(&self.lease.id);
            }
        }
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.ctx.client.clone();
        let lease = self.lease.clone();
        let outcome = std::mem::replace(&mut self.outcome, Outcome::Abandon);
        runtime.spawn(async move {
            let _ = client
                .release_token(&lease.owner, lease.token(), &outcome)
                .await;
        });
    }
}

/// Doubling delays between `min` and `max`.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Claims while the worker may hold more leases (`concurrency +
/// prefetch`), until `shutdown` fires, and queues the rows for the
/// dispatcher; returns an error only for claims that cannot succeed by
/// retrying.
async fn claim_loop(
    ctx: &Arc<Ctx>,
    shutdown: &CancellationToken,
    ready: mpsc::UnboundedSender<Ready>,
    releases: &mpsc::UnboundedSender<Held>,
    free: &Arc<Semaphore>,
) -> Result<()> {
    let cfg = &ctx.config;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    // The first claim takes back this owner's rows from an earlier run, and
    // only the first: every later reclaim would re-issue rows this process
    // is running (they are this owner's too). Rows beyond the free slots
    // expire and come back through the reaper.
    let mut reclaiming = cfg.reclaim_own;
    loop {
        let first = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            permit = Arc::clone(free).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return Ok(()),
            },
        };
        let mut permits = vec![first];
        while permits.len() < MAX_BATCH {
            match Arc::clone(free).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let asked = permits.len();
        let limit = u32::try_from(asked).unwrap_or(1);
        let claimed = if reclaiming {
            ctx.client
                .reclaim_own(&cfg.queue, limit, cfg.ttl, &cfg.owner)
                .await
        } else {
            ctx.client
                .claim(&cfg.queue, limit, cfg.ttl, &cfg.owner)
                .await
        };
        match claimed {
            Ok(rows) => {
                backoff.reset();
                let got = rows.len();
                for claimed in rows {
                    Counters::add(&ctx.counters.claimed);
                    let permit = match permits.pop() {
                        Some(permit) if !shutdown.is_cancelled() => permit,
                        // Over the limit (the SQL never does this) or too
                        // late: give the row back at once.
                        _ => {
                            let _ = releases.send(abandon_now(ctx, claimed.lease));
                            continue;
                        }
                    };
                    if let Err(mpsc::error::SendError(ready)) =
                        ready.send(register(ctx, claimed, permit))
                    {
                        // The dispatcher has stopped: give the row back.
                        let _ = releases.send(ready.held);
                    }
                }
                drop(permits);
                if reclaiming {
                    reclaiming = false;
                } else if got < asked {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return Ok(()),
                        () = ctx.wake.notified() => {}
                        () = tokio::time::sleep(cfg.poll_interval) => {}
                    }
                }
            }
            Err(e) if e.is_invalid_input() => return Err(e),
            Err(_) => {
                drop(permits);
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(backoff.next()) => {}
                }
            }
        }
    }
}

/// Starts the ready rows, in claim order, as slots free up, until `stop`
/// fires; then gives back the rows that never started.
async fn dispatcher(
    ctx: &Arc<Ctx>,
    stop: &CancellationToken,
    mut ready: mpsc::UnboundedReceiver<Ready>,
    jobs: &mut JoinSet<()>,
    releases: &mpsc::UnboundedSender<Held>,
) {
    let slots = Arc::new(Semaphore::new(ctx.config.concurrency));
    loop {
        while jobs.try_join_next().is_some() {}
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = ready.recv() => next,
        };
        let Some(next) = next else { break };
        let slot = tokio::select! {
            biased;
            () = stop.cancelled() => {
                let _ = releases.send(next.held);
                break;
            }
            slot = Arc::clone(&slots).acquire_owned() => slot,
        };
        match slot {
            // Lost or cancelled while it waited: nothing to run.
            Ok(_) if next.job.is_cancelled() => {
                let _ = releases.send(next.held);
            }
            Ok(slot) => {
                jobs.spawn(run_job(Arc::clone(ctx), next, slot, releases.clone()));
            }
            Err(_) => break,
        }
    }
    ready.close();
    while let Ok(left) = ready.try_recv() {
        let _ = releases.send(left.held);
    }
}

fn abandon_now(ctx: &Arc<Ctx>, lease: Lease) -> Held {
    let (_, deadline) = watch::channel(lease.claim_sent_at + ctx.config.confirmed_for());
    Held {
        ctx: Arc::clone(ctx),
        lease,
        outcome: Outcome::Abandon,
        deadline,
        _permit: None,
        armed: true,
    }
}

/// A claimed row registered for heartbeats, waiting for a slot.
struct Ready {
    held: Held,
    job: Job,
}

/// Registers a claimed row for heartbeats from the moment it is claimed
/// (also while it waits for a slot): the lease is renewed, and released
/// with its outcome (`abandon` until a handler answers) when `Held` goes.
fn register(ctx: &Arc<Ctx>, claimed: Claimed, lease_permit: OwnedSemaphorePermit) -> Ready {
    let Claimed { lease, payload } = claimed;
    let (deadline_tx, deadline) = watch::channel(lease.claim_sent_at + ctx.config.confirmed_for());
    let cancel = CancellationToken::new();
    let reason = Arc::new(OnceLock::new());
    let replaced = ctx.slots().insert(
        lease.id,
        Slot {
            epoch: lease.epoch,
            deadline: deadline_tx,
            cancel: cancel.clone(),
            reason: Arc::clone(&reason),
        },
    );
    // The same row under a new epoch: the job running under the old one is
    // fenced, and must hear it rather than run on beside this one.
    if let Some(old) = replaced {
        old.fire(CancelReason::Lost);
    }
    Ready {
        held: Held {
            ctx: Arc::clone(ctx),
            lease: lease.clone(),
            outcome: Outcome::Abandon,
            deadline,
            _permit: Some(lease_permit),
            armed: true,
        },
        job: Job {
            lease,
            payload,
            cancel,
            reason,
            client: ctx.client.clone(),
        },
    }
}

/// Runs the handler of one ready row in a slot and hands the lease with
/// its outcome to the releaser.
async fn run_job(
    ctx: Arc<Ctx>,
    ready: Ready,
    slot: OwnedSemaphorePermit,
    releases: mpsc::UnboundedSender<Held>,
) {
    let Ready { mut held, job } = ready;
    held.outcome = supervise(&ctx, job, held.deadline.clone()).await;
    // The slot is free once the handler is done: the lease stays held (and
    // renewed) until the releaser has recorded the outcome, which it does
    // for many jobs at once, several batches in flight.
    drop(slot);
    // If the releaser is gone, dropping the returned value releases it.
    let _ = releases.send(held);
}

/// Runs the handler; fires its token at the local deadline; turns errors
/// and panics into `retry` and the end of the grace period into `abandon`.
async fn supervise(ctx: &Ctx, job: Job, mut deadline: watch::Receiver<Instant>) -> Outcome {
    let cancel = job.cancel.clone();
    let reason = Arc::clone(&job.reason);
    let handler = Arc::clone(&ctx.handler);
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(job))) {
        Ok(fut) => fut,
        Err(panic) => {
            Counters::add(&ctx.counters.panicked);
            return Outcome::retry(panic_text(panic.as_ref()));
        }
    };
    let mut fut = std::pin::pin!(AssertUnwindSafe(fut).catch_unwind());
    let mut watching = true;
    loop {
        let at = *deadline.borrow_and_update();
        tokio::select! {
            result = &mut fut => {
                return match result {
                    Ok(Ok(outcome)) => outcome,
                    // A payload that does not deserialize never will.
                    Ok(Err(error)) if matches!(error.downcast_ref::<Error>(), Some(Error::Payload(_))) => {
                        Outcome::fail(format!("handler failed: {error}"))
                    }
                    Ok(Err(error)) => Outcome::retry(format!("handler failed: {error}")),
                    Err(panic) => {
                        Counters::add(&ctx.counters.panicked);
                        Outcome::retry(panic_text(panic.as_ref()))
                    }
                };
            }
            () = tokio::time::sleep_until(at), if !cancel.is_cancelled() => {
                if *deadline.borrow() <= Instant::now() {
                    fire(&reason, &cancel, CancelReason::Unconfirmed);
                }
            }
            changed = deadline.changed(), if watching => {
                watching = changed.is_ok();
            }
            () = ctx.hard_stop.cancelled() => {
                fire(&reason, &cancel, CancelReason::Shutdown);
                return Outcome::Abandon;
            }
        }
    }
}

fn panic_text(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned());
    format!("handler panicked: {text}")
}

/// One `renew_batch` per tick for every held lease; moves local deadlines
/// on confirmation and fires tokens on loss or cancel requests.
async fn renewer(ctx: &Ctx, stop: &CancellationToken) {
    let cfg = &ctx.config;
    let mut wait = cfg.renew_every;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let tokens: Vec<FencingToken> = ctx
            .slots()
            .iter()
            .filter(|(_, s)| s.reason.get() != Some(&CancelReason::Lost))
            .map(|(id, s)| FencingToken {
                id: *id,
                epoch: s.epoch,
            })
            .collect();
        wait = cfg.renew_every;
        let sent = Instant::now();
        for chunk in tokens.chunks(MAX_BATCH) {
            let renewals = tokio::select! {
                () = stop.cancelled() => return,
                r = ctx.heartbeat.renew_batch(&cfg.owner, chunk, cfg.ttl) => r,
            };
            let Ok(renewals) = renewals else {
                wait = (cfg.renew_every / 4).max(Duration::from_millis(20));
                continue;
            };
            let confirmed_until = sent + cfg.confirmed_for();
            let slots = ctx.slots();
            for (token, renewal) in chunk.iter().zip(&renewals) {
                let Some(slot) = slots.get(&token.id).filter(|s| s.epoch == token.epoch) else {
                    continue;
                };
                if !renewal.held {
                    slot.fire(CancelReason::Lost);
                    continue;
                }
                if renewal.busy {
                    // Not extended: keep the old deadline and come back
                    // soon, before it passes.
                    wait = (cfg.renew_every / 4).max(Duration::from_millis(20));
                    continue;
                }
                slot.deadline.send_if_modified(|d| {
                    let later = confirmed_until > *d;
                    if later {
                        *d = confirmed_until;
                    }
                    later
                });
                if renewal.cancel_requested {
                    slot.fire(CancelReason::CancelRequested);
                }
            }
        }
    }
}

/// Records outcomes: whatever is waiting goes out together, one
/// `release_batch` per distinct outcome, with up to [`RELEASES_IN_FLIGHT`]
/// such batches in flight on the connection (their commits share WAL
/// flushes); failed releases are retried with backoff until their local
/// deadline.
async fn releaser(ctx: &Ctx, mut incoming: mpsc::UnboundedReceiver<Held>, refill: &Refill) {
    let mut pending: Vec<Held> = Vec::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut not_before = Instant::now();
    loop {
        while let Ok(held) = incoming.try_recv() {
            pending.push(held);
        }
        if !pending.is_empty()
            && in_flight.len() < RELEASES_IN_FLIGHT
            && not_before <= Instant::now()
        {
            in_flight.push(release_all(ctx, std::mem::take(&mut pending), refill));
            continue;
        }
        if !open && pending.is_empty() && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            next = incoming.recv(), if open => match next {
                Some(held) => pending.push(held),
                None => open = false,
            },
            Some(retry) = in_flight.next(), if !in_flight.is_empty() => {
                if retry.is_empty() {
                    backoff.reset();
                } else {
                    pending.extend(retry);
                    not_before = Instant::now() + backoff.next();
                }
            }
            () = tokio::time::sleep_until(not_before), if !pending.is_empty() && not_before > Instant::now() => {}
        }
    }
}

/// Where the releaser puts the rows it claims for the leases that done
/// jobs give up, and whether it still may.
struct Refill {
    ready: mpsc::UnboundedSender<Ready>,
    stopping: CancellationToken,
}

/// Releases `held`, grouped by outcome; returns those to try again. Done
/// jobs' leases are taken up again in the same statement
/// (`lease.release_and_claim`) unless the worker is stopping: one commit,
/// not two, per cycle.
async fn release_all(ctx: &Ctx, held: Vec<Held>, refill: &Refill) -> Vec<Held> {
    let mut groups: Vec<(Outcome, Vec<Held>)> = Vec::new();
    for h in held {
        match groups.iter_mut().find(|(o, _)| *o == h.outcome) {
            Some((_, group)) => group.push(h),
            None => groups.push((h.outcome.clone(), vec![h])),
        }
    }
    let cfg = &ctx.config;
    let owner = cfg.owner.as_str();
    let refilling = !refill.stopping.is_cancelled();
    let results = join_all(groups.into_iter().map(|(outcome, group)| async move {
        let tokens: Vec<FencingToken> = group.iter().map(|h| h.lease.token()).collect();
        if outcome == Outcome::Done && refilling {
            let limit = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
            let result = ctx
                .client
                .release_and_claim(owner, &tokens, &cfg.queue, limit, cfg.ttl)
                .await;
            return match result {
                Ok((released, claimed)) => (outcome, group, Ok(released), claimed),
                Err(e) => (outcome, group, Err(e), Vec::new()),
            };
        }
        let released = match tokens.as_slice() {
            [one] => ctx
                .client
                .release_token(owner, *one, &outcome)
                .await
                .map(|ok| vec![ok]),
            _ => ctx.client.release_batch(owner, &tokens, &outcome).await,
        };
        (outcome, group, released, Vec::new())
    }))
    .await;

    let mut retry = Vec::new();
    let now = Instant::now();
    for (outcome, mut group, result, claimed) in results {
        match result {
            Ok(released) => {
                let mut permits: Vec<OwnedSemaphorePermit> =
                    group.iter_mut().filter_map(|h| h._permit.take()).collect();
                if let Some(shared) = group.first().map(|h| Arc::clone(&h.ctx)) {
                    for row in claimed {
                        Counters::add(&ctx.counters.claimed);
                        let Some(permit) = permits.pop() else {
                            // More rows than leases given up: the SQL
                            // never does this.
                            retry.push(abandon_now(&shared, row.lease));
                            continue;
                        };
                        if let Err(mpsc::error::SendError(ready)) =
                            refill.ready.send(register(&shared, row, permit))
                        {
                            // The dispatcher has stopped: give it back.
                            retry.push(ready.held);
                        }
                    }
                }
                for (h, ok) in group.into_iter().zip(released) {
                    if ok {
                        ctx.counters.recorded(&outcome);
                    } else {
                        Counters::add(&ctx.counters.lost);
                    }
                    h.settle();
                }
            }
            Err(e) => {
                for h in group {
                    if e.is_invalid_input() || h.deadline() <= now {
                        Counters::add(&ctx.counters.unreleased);
                        h.settle();
                    } else {
                        retry.push(h);
                    }
                }
            }
        }
    }
    retry
}

/// Wakes the claim loop when this queue is notified; reconnects with
/// backoff; ends when `stop` fires. Without a connector or with `listen`
/// off it does nothing (the claim loop polls).
async fn listener(ctx: &Ctx, stop: &CancellationToken) {
    if !ctx.config.listen {
        return;
    }
    let Some(connector) = ctx.client.connector() else {
        return;
    };
    let connector = connector.with_application_name(&ctx.config.owner);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let started = Instant::now();
        let session = async {
            let mut connected = connector.open().await?;
            let listen = format!("LISTEN {READY_CHANNEL}");
            match tokio::time::timeout(
                ctx.config.request_timeout,
                connected.client.batch_execute(&listen),
            )
            .await
            {
                Ok(result) => result.map_err(Error::from_pg)?,
                Err(_) => return Err(Error::Timeout(ctx.config.request_timeout)),
            }
            // Rows may have become ready while nobody listened.
            ctx.wake.notify_one();
            while let Some(n) = connected.notifications.recv().await {
                if n.channel() == READY_CHANNEL && n.payload() == ctx.config.queue {
                    ctx.wake.notify_one();
                }
            }
            Ok(())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = session => {}
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff.reset();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

/// `<hostname>-<pid>-<hex>`: readable in `lease.in_flight`, unique per
/// process start.
pub(crate) fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    let host: String = host.chars().take(64).collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{host}-{}-{nanos:08x}{n}", std::process::id())
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
        // Failed on 3729e87: the grace period stayed 30 s whatever the ttl.
        assert_eq!(c.grace_period, Duration::from_secs(3));
        assert!(c.validate().is_ok());
        let mut bad = c.clone();
        bad.margin = bad.ttl;
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.concurrency = 0;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn owners_differ_and_fit() {
        let (a, b) = (default_owner(), default_owner());
        assert_ne!(a, b);
        assert!(!a.is_empty() && a.len() <= 256);
    }

    #[test]
    fn backoff_doubles_up_to_its_max_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
        let seen: Vec<_> = (0..4).map(|_| b.next().as_millis()).collect();
        assert_eq!(seen, [100, 200, 300, 300]);
        b.reset();
        assert_eq!(b.next().as_millis(), 100);
    }
}
