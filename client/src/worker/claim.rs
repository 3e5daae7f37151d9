//! Claiming rows and starting them: the claim loop, the dispatcher that starts claimed rows
//! as slots free up, and the supervision of each handler.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::job::{CancelReason, Job};
use super::release::Held;
use super::{fire, Ctx, Slot, MAX_BATCH};
use crate::error::{Error, Result};
use crate::lease::{Claimed, Lease, Outcome};
use crate::timing::Backoff;

/// Claims while the worker may hold more leases (`concurrency +
/// prefetch`), until `shutdown` fires, and queues the rows for the
/// dispatcher; returns an error only for claims that cannot succeed by
/// retrying.
pub(super) async fn claim_loop(
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
        let sent = Instant::now();
        let claimed = if reclaiming {
            ctx.client
                .reclaim_own(limit, cfg.ttl, &cfg.owner, &cfg.queue)
                .await
        } else {
            ctx.client
                .claim(limit, cfg.ttl, &cfg.owner, &cfg.queue)
                .await
        };
        ctx.counters.claim_latency(sent.elapsed());
        match claimed {
            Ok(rows) => {
                backoff.reset();
                let got = rows.len();
                if reclaiming {
                    tracing::info!(queue = %cfg.queue, owner = %cfg.owner, reclaimed = got, "took back this owner's leases");
                } else if got > 0 {
                    tracing::debug!(queue = %cfg.queue, claimed = got, asked, "claimed");
                }
                ctx.counters.claimed(got);
                for claimed in rows {
                    if !reclaiming {
                        ctx.counters.claim_wait(claimed.lease.waited());
                    }
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
            Err(e) if e.is_invalid_input() => {
                tracing::error!(queue = %cfg.queue, error = %e, "claim refused; the worker stops");
                return Err(e);
            }
            Err(e) => {
                let delay = backoff.next();
                tracing::warn!(queue = %cfg.queue, error = %e, retry_in = ?delay, "claim failed");
                drop(permits);
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Starts the ready rows, in claim order, as slots free up, until `stop`
/// fires; then gives back the rows that never started.
pub(super) async fn dispatcher(
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

pub(super) fn abandon_now(ctx: &Arc<Ctx>, lease: Lease) -> Held {
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
pub(super) struct Ready {
    pub(super) held: Held,
    pub(super) job: Job,
}

/// Registers a claimed row for heartbeats from the moment it is claimed
/// (also while it waits for a slot): the lease is renewed, and released
/// with its outcome (`abandon` until a handler answers) when `Held` goes.
pub(super) fn register(
    ctx: &Arc<Ctx>,
    claimed: Claimed,
    lease_permit: OwnedSemaphorePermit,
) -> Ready {
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
            pool: Arc::clone(&ctx.pool),
        },
    }
}

/// Runs the handler of one ready row in a slot and hands the lease with
/// its outcome to the releaser.
pub(super) async fn run_job(
    ctx: Arc<Ctx>,
    ready: Ready,
    slot: OwnedSemaphorePermit,
    releases: mpsc::UnboundedSender<Held>,
) {
    let Ready { mut held, job } = ready;
    let lease = &held.lease;
    let span = tracing::info_span!(
        "job",
        queue = %lease.queue,
        id = lease.id,
        epoch = lease.epoch,
        attempt = lease.attempt,
        owner = %lease.owner,
        attempt_id = %job.attempt_id(),
    );
    let started = Instant::now();
    ctx.counters.running(1);
    held.outcome = supervise(&ctx, job, held.deadline.clone())
        .instrument(span.clone())
        .await;
    ctx.counters.running(-1);
    ctx.counters.handled(&held.outcome, started.elapsed());
    span.in_scope(|| {
        tracing::debug!(outcome = held.outcome.as_sql(), took = ?started.elapsed(), "handler returned");
    });
    // The slot is free once the handler is done: the lease stays held (and
    // renewed) until the releaser has recorded the outcome, which it does
    // for many jobs at once, several batches in flight.
    drop(slot);
    // If the releaser is gone, dropping the returned value releases it.
    let _ = releases.send(held);
}

/// Runs the handler; fires its token at the local deadline; turns errors
/// and panics into `retry` and the end of the grace period into `abandon`.
pub(super) async fn supervise(
    ctx: &Ctx,
    job: Job,
    mut deadline: watch::Receiver<Instant>,
) -> Outcome {
    let cancel = job.cancel.clone();
    let reason = Arc::clone(&job.reason);
    let handler = Arc::clone(&ctx.handler);
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(job))) {
        Ok(fut) => fut,
        Err(panic) => {
            ctx.counters.panicked();
            let text = panic_text(panic.as_ref());
            tracing::error!(panic = %text, "handler panicked");
            return Outcome::retry(text);
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
                        tracing::warn!(error = %error, "payload does not deserialize: dead letter");
                        Outcome::fail(format!("handler failed: {error}"))
                    }
                    Ok(Err(error)) => {
                        tracing::info!(error = %error, "handler failed: retry");
                        Outcome::retry(format!("handler failed: {error}"))
                    }
                    Err(panic) => {
                        ctx.counters.panicked();
                        let text = panic_text(panic.as_ref());
                        tracing::error!(panic = %text, "handler panicked");
                        Outcome::retry(text)
                    }
                };
            }
            () = tokio::time::sleep_until(at), if !cancel.is_cancelled() => {
                if *deadline.borrow() <= Instant::now() {
                    tracing::warn!("no renewal confirmed the lease in time: cancelling the handler");
                    fire(&reason, &cancel, CancelReason::Unconfirmed);
                }
            }
            changed = deadline.changed(), if watching => {
                watching = changed.is_ok();
            }
            () = ctx.hard_stop.cancelled() => {
                tracing::info!("grace period over: dropping the handler, abandoning its row");
                fire(&reason, &cancel, CancelReason::Shutdown);
                return Outcome::Abandon;
            }
        }
    }
}

pub(super) fn panic_text(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned());
    format!("handler panicked: {text}")
}
