//! What a handler gets ([`Job`]) and why its token fires ([`CancelReason`]), and what a run
//! returns ([`Summary`]).

use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::Result;
use crate::lease::{FencingToken, Lease};
use crate::transaction::{FencedTransaction, Pool};

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
/// [`CancelReason`]). Clones share the token and the reason (e.g. a task
/// that logs why the job was cancelled).
#[derive(Clone, Debug)]
pub struct Job {
    pub(super) lease: Lease,
    pub(super) payload: serde_json::Value,
    pub(super) cancel: CancellationToken,
    pub(super) reason: Arc<OnceLock<CancelReason>>,
    pub(super) client: Client,
    pub(super) pool: Arc<Pool>,
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

    /// [`Client::fenced_update_in`] with this job's queue and token.
    pub async fn fenced_update<P: Serialize + ?Sized>(&self, patch: &P) -> Result<()> {
        self.client
            .fenced_update_in(self.lease().queue(), self.token(), patch)
            .await
    }

    /// A transaction on a connection of the worker's own (a small pool, at
    /// most `concurrency` idle), already fenced with this job's token: its
    /// writes to your tables commit only while this lease is held
    /// ([`FencedTransaction`]). [`Error::LeaseLost`](crate::Error::LeaseLost)
    /// if it no longer is; [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// if the worker's client has no [`Connector`](crate::Connector).
    pub async fn transaction(&self) -> Result<FencedTransaction> {
        FencedTransaction::begin(&self.pool, self.lease().queue(), self.token()).await
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
