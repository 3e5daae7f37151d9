//! A lease the worker holds, from its claim until it is released:
//! [`Held`], which releases the lease if it is dropped before, and
//! [`register`], which makes the handler's [`Job`] beside it.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::job::{CancelReason, Job};
use super::{Ctx, Slot};
use crate::lease::{Claimed, Lease, Outcome};

/// Ownership of one lease until it is released. The actor keeps
/// it (waiting, then with the handler, then in a release batch); dropped
/// while still armed (the worker's future dropped, a task aborted), it
/// releases the lease with its current outcome (`abandon` until the
/// handler has answered) from a spawned task.
pub(super) struct Held {
    pub(super) ctx: Arc<Ctx>,
    pub(super) lease: Lease,
    pub(super) outcome: Outcome,
    /// The job's local deadline, moved by the heartbeat.
    pub(super) deadline: watch::Receiver<Instant>,
    /// A release of it failed without an answer (a timeout, a cut
    /// connection): the server may have carried it out.
    pub(super) tried: bool,
    /// When its release first failed: one that keeps failing while the
    /// heartbeat keeps the lease must still give its slot back.
    pub(super) failing_since: Option<Instant>,
    armed: bool,
}

impl Held {
    pub(super) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// The release is over (released, refused, or given up): dropping
    /// this no longer releases the lease.
    pub(super) fn disarm(mut self) {
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
            tracing::warn!(
                id = self.lease.id,
                epoch = self.lease.epoch,
                "no runtime to release a dropped lease; it expires"
            );
            return;
        };
        let client = self.ctx.client.clone();
        let lease = self.lease.clone();
        let outcome = std::mem::replace(&mut self.outcome, Outcome::Abandon);
        runtime.spawn(async move {
            if let Err(e) = client.release_token(&lease.owner, lease.token(), &lease.queue, &outcome).await {
                tracing::warn!(id = lease.id, epoch = lease.epoch, error = %e, "release of a dropped lease failed; it expires");
            }
        });
    }
}

/// A claimed row: its lease, and the job its handler will get.
pub(super) struct Ready {
    pub(super) held: Held,
    pub(super) job: Job,
}

/// Registers a claimed row for heartbeats from the moment it is claimed
/// (also while it waits for a slot): the lease is renewed until it is
/// released (`abandon` until a handler answers).
pub(super) fn register(ctx: &Arc<Ctx>, claimed: Claimed) -> Ready {
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
            tried: false,
            failing_since: None,
            armed: true,
        },
        job: Job {
            lease,
            payload,
            cancel,
            reason,
            client: ctx.client.clone(),
            pool: Arc::clone(&ctx.pool),
        },
    }
}
