//! Async Rust client for pg_lease, the PostgreSQL extension that does
//! every ownership change of background work server-side, fenced by
//! `(id, epoch)` and decided by the database clock.
//!
//! * [`Client`]: typed wrappers over every SQL function of schema `lease`
//!   (enqueue, claim, renew, release with each [`Outcome`], fenced writes,
//!   cancel, named leases, views), over prepared statements, with
//!   [`Duration`](std::time::Duration)s and serde payloads.
//! * [`tx`]: enqueue, cancel and [`fence`] inside *your* transaction, on
//!   any tokio-postgres client: the job commits or rolls back with your
//!   own writes. With the cargo feature `sqlx`, module `sqlx` has the
//!   same for a sqlx transaction.
//! * [`Worker`]: claims rows of a queue into a bounded number of handlers,
//!   wakes on `NOTIFY` (polling as fallback), renews every lease it holds in
//!   one batched call per tick, cancels a job's token when its lease cannot
//!   be confirmed before a local deadline, and records every outcome with
//!   the fencing epoch, on every exit path.
//! * [`Elector`]: leader election on a named lease, stepping down before
//!   the lease can expire, with the epoch for fencing the leader's writes.
//! * [`Sweeper`]: the reaper's work (`lease.sweep()`) from the application,
//!   for servers where the background reaper does not run; one replica
//!   sweeps at a time, fenced by its named lease.
//! * [`Error`]: one error type that tells a lost lease from a connection
//!   problem from bad input.
//!
//! Every attempt has a stable identity, its [`FencingToken`], whose text
//! form ([`Lease::attempt_id`], e.g. `pgl-42-7`) is meant as an idempotency
//! key for downstream systems.
//!
//! ```no_run
//! use std::time::Duration;
//! use pg_lease_client::{Client, Outcome, Worker, WorkerConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Resize { photo: i64 }
//!
//! # async fn example() -> Result<(), pg_lease_client::Error> {
//! let client = Client::connect("host=127.0.0.1 user=app dbname=app").await?;
//! client.enqueue("default", &Resize { photo: 7 }).await?;
//!
//! let config = WorkerConfig::new("default").with_ttl(Duration::from_secs(30));
//! let worker = Worker::new(client, config, |job| async move {
//!     let task: Resize = job.payload_as()?;
//!     // ... resize task.photo; the lease is renewed meanwhile ...
//!     job.fenced_update(&serde_json::json!({ "resized": task.photo })).await?;
//!     Ok(Outcome::Done)
//! });
//! let shutdown = CancellationToken::new();
//! // Call shutdown.cancel() (e.g. on SIGTERM) to drain and stop.
//! let summary = worker.run(shutdown).await?;
//! println!("{} done", summary.done);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod client;
mod connect;
mod elector;
mod error;
mod lease;
pub mod metrics;
mod queue;
mod sweeper;
mod timing;
mod transaction;
mod worker;

#[cfg(feature = "sqlx")]
pub use client::sqlx;
pub use client::{fence, fence_in, fence_named, tx, Client, DEFAULT_REQUEST_TIMEOUT};
pub use connect::{Connector, DEFAULT_CONNECT_TIMEOUT};
pub use elector::{Elector, ElectorConfig, Leadership, Term};
pub use error::{Error, Result, LEASE_LOST_SQLSTATE};
pub use lease::{CancelResult, Claimed, FencingToken, JobState, Lease, Outcome, Renewal};
pub use queue::{
    BatchOptions, DeadLetter, DeadLetterSummary, EnqueueOptions, Every, ExtensionVersions,
    FairnessKey, Holder, InFlight, JobFilter, JobPreview, JobRecord, JobSummary, QueueMetrics,
    QueueOptions, QueueSettings, QueueStats, RateLimit, Reaped, ReaperStats, ScheduleInfo,
    ScheduleOptions,
};
pub use sweeper::{Sweeper, SweeperConfig};
pub use transaction::FencedTransaction;
pub use worker::{BoxError, CancelReason, HandlerResult, Job, Summary, Worker, WorkerConfig};

/// Re-exported so callers need no direct dependency for the worker's
/// shutdown token and the job's cancellation token.
pub use tokio_util::sync::CancellationToken;
