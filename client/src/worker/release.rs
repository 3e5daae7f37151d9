//! Recording outcomes: [`Held`] owns a lease until its outcome is recorded, and the releaser
//! records them in batches.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::claim::{abandon_now, register, Ready};
use super::Ctx;
use crate::lease::{FencingToken, Lease, Outcome};
use crate::timing::Backoff;

/// Release batches the releaser keeps in flight at once. Measured with
/// `bin/bench --only client` (16 slots): 4 in flight drained 3.15k jobs/s
/// at prefetch 0 and 17.7k at 112, 1 in flight 4.97k and 22.1k: concurrent
/// `release_and_claim`s of one queue skip each other's rows at its head.
pub(super) const RELEASES_IN_FLIGHT: usize = 1;

/// Ownership of one lease until its outcome is recorded. Dropped while
/// still armed (its task aborted, the worker's future dropped, the releaser
/// gone), it releases the lease with its current outcome (`abandon` until
/// the handler has answered) from a spawned task.
pub(super) struct Held {
    pub(super) ctx: Arc<Ctx>,
    pub(super) lease: Lease,
    pub(super) outcome: Outcome,
    pub(super) deadline: watch::Receiver<Instant>,
    /// One of the `concurrency + prefetch` leases the worker may hold.
    pub(super) _permit: Option<OwnedSemaphorePermit>,
    pub(super) armed: bool,
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
            if let Err(e) = client.release_token(&lease.owner, lease.token(), &outcome).await {
                tracing::warn!(id = lease.id, epoch = lease.epoch, error = %e, "release of a dropped lease failed; it expires");
            }
        });
    }
}

/// Records outcomes: whatever is waiting goes out together, one
/// `release_batch` per distinct outcome, with up to [`RELEASES_IN_FLIGHT`]
/// such calls in flight while more outcomes arrive; failed releases are
/// retried with backoff until their local deadline.
pub(super) async fn releaser(
    ctx: &Ctx,
    mut incoming: mpsc::UnboundedReceiver<Held>,
    refill: &Refill,
) {
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
pub(super) struct Refill {
    pub(super) ready: mpsc::UnboundedSender<Ready>,
    pub(super) stopping: CancellationToken,
}

/// Releases `held`, grouped by outcome; returns those to try again. Done
/// jobs' leases are taken up again in the same statement
/// (`lease.release_and_claim`) unless the worker is stopping: one commit,
/// not two, per cycle.
pub(super) async fn release_all(ctx: &Ctx, held: Vec<Held>, refill: &Refill) -> Vec<Held> {
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
            let sent = Instant::now();
            let result = ctx
                .client
                .release_and_claim(owner, &tokens, &cfg.queue, limit, cfg.ttl)
                .await;
            ctx.counters.claim_latency(sent.elapsed());
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
                ctx.counters.claimed(claimed.len());
                if let Some(shared) = group.first().map(|h| Arc::clone(&h.ctx)) {
                    for row in claimed {
                        ctx.counters.claim_wait(row.lease.waited());
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
                        tracing::warn!(
                            id = h.lease.id,
                            epoch = h.lease.epoch,
                            outcome = outcome.as_sql(),
                            "release refused: lease already lost"
                        );
                        ctx.counters.lost();
                    }
                    h.settle();
                }
            }
            Err(e) => {
                tracing::warn!(outcome = outcome.as_sql(), leases = group.len(), error = %e, "release failed");
                for h in group {
                    if e.is_invalid_input() || h.deadline() <= now {
                        ctx.counters.unreleased();
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
