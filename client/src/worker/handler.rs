//! Running one handler in a slot: its span, its local deadline, and turning
//! errors, panics and the end of the grace period into outcomes.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::held::{Held, Ready};
use super::job::{CancelReason, Job};
use super::{fire, Ctx};
use crate::error::Error;
use crate::lease::Outcome;

/// Runs the handler of one ready row and returns its lease with the
/// outcome to record. The slot is free once this returns: the lease stays
/// held (and renewed) until the actor has released it with the outcome.
pub(super) async fn run_job(ctx: Arc<Ctx>, ready: Ready) -> Held {
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
    held
}

/// Runs the handler; fires its token at the local deadline; turns errors
/// and panics into `retry` and the end of the grace period into `abandon`.
async fn supervise(ctx: &Ctx, job: Job, mut deadline: watch::Receiver<Instant>) -> Outcome {
    let cancel = job.cancel.clone();
    let reason = Arc::clone(&job.reason);
    let handler = Arc::clone(&ctx.handler);
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(job))) {
        Ok(fut) => fut,
        Err(panic) => return panicked(ctx, panic.as_ref()),
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
                    Err(panic) => panicked(ctx, panic.as_ref()),
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

/// A panic in the handler (or in making its future) is a retry with the
/// panic's text.
fn panicked(ctx: &Ctx, panic: &(dyn Any + Send)) -> Outcome {
    ctx.counters.panicked();
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned());
    tracing::error!(panic = %text, "handler panicked");
    Outcome::retry(format!("handler panicked: {text}"))
}
