//! [`Worker`]: a runtime that claims rows of one queue, runs a handler on
//! each under a heartbeat, and releases every lease with its outcome and
//! fencing epoch.
//!
//! One file per part: `config` (settings), `job` (what a handler gets), `actor` (the loop
//! that owns the leases: claims, slots, releases), `held` (one lease until it is
//! released), `handler` (one handler's run), `release` (releasing a batch of held
//! leases), `heartbeat`, `listen` (wake-ups), `counters` (summary and metrics).

mod actor;
mod config;
mod counters;
mod handler;
mod heartbeat;
mod held;
mod job;
mod listen;
mod pace;
mod release;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::WorkerConfig;
pub use job::{CancelReason, Job, Summary};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease::Outcome;
use crate::transaction::Pool;
use actor::actor;
use counters::Counters;
use heartbeat::renewer;
use listen::listener;

/// Most rows one claim or one batched call handles (the SQL functions'
/// limit).
const MAX_BATCH: usize = 10_000;

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

/// Runs a handler on the rows of one queue.
///
/// * **Bounded concurrency.** At most [`WorkerConfig::concurrency`]
///   handlers run, and the worker holds at most `concurrency +`
///   [`prefetch`](WorkerConfig::prefetch) leases (a job whose handler returned
///   counts until its outcome is recorded). With the default prefetch 0 a claim
///   asks only for free slots; with more, rows claimed ahead wait in claim
///   order, renewed like running ones, and go back at once on shutdown.
/// * **Wake-ups.** A second connection `LISTEN`s on the queue's channel
///   (`lease.ready_channel`); a notification triggers a claim at once. Without it (or
///   when it fails) the worker claims every
///   [`poll_interval`](WorkerConfig::poll_interval), and sooner after work
///   (from 10 ms, doubling), which finds the rows whose notification was
///   never sent because they came while a claim took the rows before them.
///   On a queue with a rate limit ([`QueueOptions::rate_limit`](crate::QueueOptions::rate_limit)),
///   a claim that came back empty asks `lease.rate_wait` and claims again
///   when the limit lets a row through.
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
    /// connection for heartbeats, one for `LISTEN` and one for its second
    /// release batch in flight (claims and the first go over `client`'s
    /// own), plus the handlers' [`Job::transaction`] pool, and reconnects after
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
        if self.config.bind_session && self.client.connector().is_none() {
            return Err(Error::invalid(
                "bind_session needs a Client made with a Connector (a session of the worker's own)",
            ));
        }
        tracing::info!(
            queue = %self.config.queue,
            owner = %self.config.owner,
            concurrency = self.config.concurrency,
            prefetch = self.config.prefetch,
            "worker started"
        );
        let timeout = self.config.request_timeout;
        let ctx = Arc::new(Ctx {
            // Tagged with the owner where session settings are safe (no
            // transaction-mode pooler, which is what `listen` says).
            heartbeat: self
                .client
                .separate(self.config.listen.then_some(self.config.owner.as_str()))
                .with_timeout(timeout.min(self.config.renew_every)),
            client: self.client.with_timeout(timeout),
            pool: Arc::new(Pool::new(
                self.client.connector().cloned(),
                self.config.concurrency,
            )),
            counters: Counters::new(&self.config.queue, self.config.concurrency),
            config: self.config,
            handler: self.handler,
            slots: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            renew_now: Notify::new(),
            hard_stop: CancellationToken::new(),
        });
        // Heartbeats and wake-ups run until every lease is released.
        let background = CancellationToken::new();
        let main = async {
            let result = actor(&ctx, &shutdown).await;
            background.cancel();
            result
        };
        let (result, (), ()) = tokio::join!(
            main,
            renewer(&ctx, &background),
            listener(&ctx, &background)
        );
        let summary = ctx.counters.snapshot();
        tracing::info!(queue = %ctx.config.queue, owner = %ctx.config.owner, ?summary, "worker stopped");
        result.map(|()| summary)
    }
}

/// State shared by the actor, the heartbeat, the listener and the job
/// tasks.
struct Ctx {
    client: Client,
    /// Connections for the handlers' [`Job::transaction`]s.
    pool: Arc<Pool>,
    heartbeat: Client,
    config: WorkerConfig,
    handler: Arc<HandlerFn>,
    /// Leases held, by row id: what the heartbeat renews.
    slots: Mutex<HashMap<i64, Slot>>,
    /// Claim now (a notification came, or the listener reconnected).
    wake: Notify,
    /// Heartbeat now (leases may have ended with a session).
    renew_now: Notify,
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
