//! The heartbeat: one `renew_batch` per tick for every lease the worker holds.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::job::CancelReason;
use super::{Ctx, MAX_BATCH};
use crate::lease::FencingToken;
use crate::timing::renew_retry;

/// One `renew_batch` per tick for every held lease; moves local deadlines
/// on confirmation and fires tokens on loss or cancel requests.
pub(super) async fn renewer(ctx: &Ctx, stop: &CancellationToken) {
    let cfg = &ctx.config;
    let mut wait = cfg.renew_every;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            () = ctx.renew_now.notified() => {}
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
                r = ctx.heartbeat.renew_batch(&cfg.owner, chunk, &cfg.queue, cfg.ttl) => r,
            };
            ctx.counters.heartbeat(sent.elapsed(), tokens.len());
            let renewals = match renewals {
                Ok(renewals) => renewals,
                Err(e) => {
                    wait = renew_retry(cfg.renew_every);
                    tracing::warn!(queue = %cfg.queue, leases = chunk.len(), error = %e, retry_in = ?wait, "heartbeat failed");
                    continue;
                }
            };
            let confirmed_until = sent + cfg.confirmed_for();
            let slots = ctx.slots();
            for (token, renewal) in chunk.iter().zip(&renewals) {
                let Some(slot) = slots.get(&token.id).filter(|s| s.epoch == token.epoch) else {
                    continue;
                };
                if !renewal.held {
                    tracing::warn!(queue = %cfg.queue, id = token.id, epoch = token.epoch, "lease lost");
                    slot.fire(CancelReason::Lost);
                    continue;
                }
                if renewal.busy {
                    // Not extended: keep the old deadline and come back
                    // soon, before it passes.
                    wait = renew_retry(cfg.renew_every);
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
                    tracing::info!(queue = %cfg.queue, id = token.id, epoch = token.epoch, "cancel requested");
                    slot.fire(CancelReason::CancelRequested);
                }
            }
        }
    }
}
