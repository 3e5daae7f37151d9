//! Releasing held leases: one batch, one `release_batch` per
//! distinct outcome, the done ones in a `release_and_claim` that takes
//! their leases up again.

use futures_util::future::join_all;
use tokio::time::Instant;

use super::held::Held;
use super::Ctx;
use crate::client::Client;
use crate::lease::{Claimed, FencingToken, Outcome};

/// What releasing a batch came to.
pub(super) struct Released {
    /// Leases whose release failed and may be tried again.
    pub(super) retry: Vec<Held>,
    /// Rows claimed in the same statement as the done ones.
    pub(super) claimed: Vec<Claimed>,
}

/// Releases `batch` over `client`, grouped by outcome, the groups
/// concurrently. With
/// `refill > 0` the done group goes out as `lease.release_and_claim`,
/// which claims up to `refill` rows in the same statement: one commit, not
/// two, per cycle. A release that fails is retried (returned) until the
/// lease's local deadline, and for at most a ttl (renewals that succeed
/// meanwhile must not keep the slot forever: given up, the lease is no
/// longer renewed and expires on the server); one the database refuses was
/// already lost.
pub(super) async fn release_held(
    ctx: &Ctx,
    client: &Client,
    batch: Vec<Held>,
    refill: usize,
) -> Released {
    let mut groups: Vec<(Outcome, Vec<Held>)> = Vec::new();
    for h in batch {
        match groups.iter_mut().find(|(o, _)| *o == h.outcome) {
            Some((_, group)) => group.push(h),
            None => groups.push((h.outcome.clone(), vec![h])),
        }
    }
    let cfg = &ctx.config;
    let owner = cfg.owner.as_str();
    let results = join_all(groups.into_iter().map(|(outcome, group)| async move {
        let tokens: Vec<FencingToken> = group.iter().map(|h| h.lease.token()).collect();
        if outcome == Outcome::Done && refill > 0 {
            let limit = u32::try_from(refill).unwrap_or(u32::MAX);
            let sent = Instant::now();
            let result = client
                .release_and_claim(owner, &tokens, &cfg.queue, limit, cfg.ttl)
                .await;
            ctx.counters.claim_latency(sent.elapsed());
            return match result {
                Ok((released, claimed)) => (outcome, group, Ok(released), claimed),
                Err(e) => (outcome, group, Err(e), Vec::new()),
            };
        }
        let released = match tokens.as_slice() {
            [one] => client
                .release_token(owner, *one, &cfg.queue, &outcome)
                .await
                .map(|ok| vec![ok]),
            _ => {
                client
                    .release_batch(owner, &tokens, &cfg.queue, &outcome)
                    .await
            }
        };
        (outcome, group, released, Vec::new())
    }))
    .await;

    let mut released = Released {
        retry: Vec::new(),
        claimed: Vec::new(),
    };
    let now = Instant::now();
    for (outcome, group, result, claimed) in results {
        released.claimed.extend(claimed);
        match result {
            Ok(released) => {
                for (h, ok) in group.into_iter().zip(released) {
                    if ok {
                        ctx.counters.released(&outcome);
                    } else if h.tried {
                        // Retries run before the local deadline, while no
                        // one else can hold the lease: refused now, it was
                        // the earlier attempt that released it.
                        tracing::debug!(
                            id = h.lease.id,
                            epoch = h.lease.epoch,
                            outcome = outcome.as_sql(),
                            "release already carried out by the attempt that went unanswered"
                        );
                        ctx.counters.released(&outcome);
                    } else {
                        tracing::warn!(
                            id = h.lease.id,
                            epoch = h.lease.epoch,
                            outcome = outcome.as_sql(),
                            "release refused: lease already lost"
                        );
                        ctx.counters.lost();
                    }
                    h.disarm();
                }
            }
            Err(e) => {
                tracing::warn!(outcome = outcome.as_sql(), leases = group.len(), error = %e, "release failed");
                for mut h in group {
                    let failing_since = *h.failing_since.get_or_insert(now);
                    if e.is_invalid_input()
                        || h.deadline() <= now
                        || now.duration_since(failing_since) >= ctx.config.ttl
                    {
                        ctx.counters.unreleased();
                        h.disarm();
                    } else {
                        // Unanswered, it may have been carried out; a
                        // database error rolled it back.
                        h.tried |= e.is_connection();
                        released.retry.push(h);
                    }
                }
            }
        }
    }
    released
}
