//! The worker's actor: one loop that owns every lease the worker holds.
//!
//! Each lease is in exactly one place: waiting for a slot, with a running
//! handler, waiting to be released (its handler returned, or it was given
//! back unstarted), or inside a database call in flight. The loop claims
//! while the worker may hold more leases (`concurrency + prefetch`, the
//! prefetch sized by [`Pace`] unless set), starts waiting rows in claim
//! order as slots free up, and releases the leases whose handlers
//! returned, taking the done ones' leases up again in the same statement
//! (`release_and_claim`). Heartbeats and `LISTEN` run beside it on their
//! own connections.
//!
//! Calls in flight: at most one claim, and up to [`RELEASE_LANES`] release
//! batches (each with its refill), each lane on a connection of its own so
//! that the server runs them side by side (on one connection they would
//! run one after the other). Throughput comes from batching as wide as the
//! leases allow: what finishes while one batch is in flight goes out in
//! the next.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handler::run_job;
use super::held::{register, Held, Ready};
use super::pace::Pace;
use super::release::{release_held, Released};
use super::{Ctx, MAX_BATCH};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease::{Claimed, Outcome};
use crate::timing::Backoff;

/// What a claim came to.
struct ClaimDone {
    rows: Result<Vec<Claimed>>,
    asked: usize,
    reclaim: bool,
    took: Duration,
    /// After a claim that found nothing: how long until the queue's rate
    /// limit lets a claim take a row again, if it has one and it is what
    /// held the rows back.
    rate_wait: Option<Duration>,
}

/// Release batches in flight at once, each on its own connection.
const RELEASE_LANES: usize = 2;

/// What releasing a batch came to.
struct RecordDone {
    lane: usize,
    released: Released,
    /// Leases counted as held while the call runs: the batch's, except
    /// the done ones a refill replaces in the same statement, and the rows
    /// the refill asked for.
    counted: usize,
    took: Duration,
}

/// A lane: its one call in flight, if any.
type Lane<'a, T> = Option<Pin<Box<dyn Future<Output = T> + Send + 'a>>>;

/// The leases, by where they are.
struct Leases {
    waiting: VecDeque<Ready>,
    /// Each with the time its handler took.
    running: JoinSet<(Held, Duration)>,
    /// Handlers returned, or rows given back unstarted.
    to_release: Vec<Held>,
    /// Leases in a release batch in flight, and rows asked for by calls in
    /// flight.
    in_flight: usize,
}

impl Leases {
    fn held(&self) -> usize {
        self.waiting.len() + self.running.len() + self.to_release.len() + self.in_flight
    }

    fn is_empty(&self) -> bool {
        self.held() == 0
    }
}

/// The claim side's state.
struct Claims {
    /// False once shutdown fired or a claim failed for good.
    open: bool,
    /// The first claim takes back this owner's rows from an earlier run,
    /// and only the first: every later reclaim would re-issue rows this
    /// process is running (they are this owner's too).
    reclaiming: bool,
    /// The last claim found fewer rows than it asked for: wait for a
    /// wake-up or for `not_before`.
    idle: bool,
    not_before: Instant,
    /// How long an idle worker waits for a wake-up before it claims again:
    /// [`RECHECK_FIRST`] after rows came, doubling after each claim that
    /// found none, up to the poll interval.
    recheck: Duration,
    backoff: Backoff,
}

/// The first recheck after work. A wake-up can be missed: an enqueue
/// announces itself only when it sees no other ready rows
/// (`lease._wake`), and a claim running meanwhile may take those rows
/// without seeing the new ones, which commit just after its snapshot (or,
/// in a longer transaction, whenever it commits). Such rows wait for the
/// next claim; rechecking soon after work finds them in milliseconds, not
/// a poll interval, at the cost of a few empty claims per idle spell.
const RECHECK_FIRST: Duration = Duration::from_millis(10);

/// Runs until `shutdown` fires (or a claim fails for good), then lets the
/// running handlers finish within the grace period and returns once every
/// lease is released: the error of that failed claim, if any.
pub(super) async fn actor(ctx: &Arc<Ctx>, shutdown: &CancellationToken) -> Result<()> {
    let cfg = &ctx.config;
    let mut pace = Pace::new(cfg);
    let mut leases = Leases {
        waiting: VecDeque::new(),
        running: JoinSet::new(),
        to_release: Vec::new(),
        in_flight: 0,
    };
    let mut claims = Claims {
        open: true,
        reclaiming: cfg.reclaim_own,
        idle: false,
        not_before: Instant::now(),
        recheck: RECHECK_FIRST,
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
    };
    let mut release_backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut release_not_before = Instant::now();
    let mut claiming: Lane<'_, ClaimDone> = None;
    let lanes: Vec<Client> = (0..RELEASE_LANES)
        .map(|lane| match lane {
            0 => ctx.client.clone(),
            _ => ctx.client.separate(None),
        })
        .collect();
    let mut idle_lanes: Vec<usize> = (0..RELEASE_LANES).rev().collect();
    let mut releasing = FuturesUnordered::new();
    let mut grace = None;
    let mut failure: Option<Error> = None;
    loop {
        // Slots first: waiting rows start in claim order; one that waited
        // too long for a slot goes back for any Worker to take.
        while let Some(next) = leases.waiting.front() {
            if pace.overdue(next.held.lease.claim_sent_at) {
                if let Some(next) = leases.waiting.pop_front() {
                    tracing::debug!(queue = %cfg.queue, id = next.held.lease.id, "waited too long for a slot; given back");
                    leases.to_release.push(next.held);
                }
                continue;
            }
            if leases.running.len() >= cfg.concurrency {
                break;
            }
            let Some(next) = leases.waiting.pop_front() else {
                break;
            };
            if next.job.is_cancelled() {
                // Lost or cancelled while it waited: nothing to run.
                leases.to_release.push(next.held);
            } else {
                let ctx = Arc::clone(ctx);
                pace.job_started();
                leases.running.spawn(async move {
                    let started = Instant::now();
                    let held = run_job(ctx, next).await;
                    (held, started.elapsed())
                });
            }
        }
        let now = Instant::now();
        if !leases.to_release.is_empty() && release_not_before <= now {
            if let Some(lane) = idle_lanes.pop() {
                let batch = std::mem::take(&mut leases.to_release);
                // The done leases and the refill change hands in one
                // commit, so only the refill counts for them; the other
                // outcomes hold their leases until they are released.
                // (Counting both made claims that returned meanwhile
                // overflow the budget and give rows back, which then
                // waited for the poll.)
                let kept = batch.iter().filter(|h| h.outcome != Outcome::Done).count();
                let refill = if claims.open {
                    pace.budget(leases.running.len())
                        .saturating_sub(leases.held() + kept)
                        .min(MAX_BATCH)
                } else {
                    0
                };
                let counted = if refill > 0 {
                    kept + refill
                } else {
                    batch.len()
                };
                leases.in_flight += counted;
                let client = &lanes[lane];
                releasing.push(async move {
                    let sent = Instant::now();
                    let released = release_held(ctx, client, batch, refill).await;
                    RecordDone {
                        lane,
                        released,
                        counted,
                        took: sent.elapsed(),
                    }
                });
            }
        }
        // An idle claim side polls again once the poll interval is over,
        // whichever event woke the loop: the timer's own branch may never
        // be taken (another branch ready at the same time wins, and the
        // timer is not armed again once its time has passed).
        if claims.idle && claims.not_before <= now {
            claims.idle = false;
        }
        if claiming.is_none() && claims.open && !claims.idle && claims.not_before <= now {
            let asked = pace
                .budget(leases.running.len())
                .saturating_sub(leases.held())
                .min(MAX_BATCH);
            if asked > 0 {
                leases.in_flight += asked;
                claiming = Some(claim(ctx, asked, claims.reclaiming));
            }
        }
        if claiming.is_none() && releasing.is_empty() && !claims.open && leases.is_empty() {
            return failure.map_or(Ok(()), Err);
        }
        // The next time something is due without an event.
        let release_due =
            (!idle_lanes.is_empty() && !leases.to_release.is_empty() && release_not_before > now)
                .then_some(release_not_before);
        let claim_due = (claiming.is_none()
            && claims.open
            && leases.held() < pace.budget(leases.running.len())
            && claims.not_before > now)
            .then_some(claims.not_before);
        let due = release_due.into_iter().chain(claim_due).min();
        tokio::select! {
            biased;
            () = shutdown.cancelled(), if claims.open => {
                stop_claiming(ctx, &mut claims, &mut leases, &mut grace);
            }
            done = in_flight(&mut claiming), if claiming.is_some() => {
                claiming = None;
                leases.in_flight -= done.asked;
                if done.rows.is_ok() {
                    pace.trip_took(done.took);
                }
                if let Err(e) = claimed(ctx, &mut claims, &mut leases, done) {
                    failure = Some(e);
                    stop_claiming(ctx, &mut claims, &mut leases, &mut grace);
                }
            }
            Some(done) = releasing.next(), if !releasing.is_empty() => {
                idle_lanes.push(done.lane);
                leases.in_flight -= done.counted;
                if take_released(ctx, &mut claims, &mut leases, done.released) {
                    release_not_before = Instant::now() + release_backoff.next();
                } else {
                    pace.trip_took(done.took);
                    release_backoff.reset();
                }
            }
            Some(done) = leases.running.join_next(), if !leases.running.is_empty() => match done {
                Ok((held, took)) => {
                    pace.job_took(took);
                    leases.to_release.push(held);
                }
                // Its lease was released when the task's state was dropped.
                Err(e) => tracing::error!(queue = %cfg.queue, error = %e, "a job task ended abnormally"),
            },
            () = ctx.wake.notified(), if claims.open && claims.idle => {
                claims.idle = false;
                claims.not_before = Instant::now();
            }
            // Only wakes the loop; what is due is decided at its top.
            () = sleep_until(due), if due.is_some() => {}
            () = sleep_until(grace), if grace.is_some() && !ctx.hard_stop.is_cancelled() => {
                ctx.hard_stop.cancel();
            }
        }
    }
}

/// The call of a lane; never ready while the lane is empty.
async fn in_flight<T>(call: &mut Lane<'_, T>) -> T {
    match call.as_mut() {
        Some(call) => call.await,
        None => std::future::pending().await,
    }
}

fn sleep_until(at: Option<Instant>) -> tokio::time::Sleep {
    tokio::time::sleep_until(at.unwrap_or_else(Instant::now))
}

/// Starts a claim of up to `asked` rows (a reclaim of this owner's rows
/// if `reclaim`).
fn claim(
    ctx: &Arc<Ctx>,
    asked: usize,
    reclaim: bool,
) -> Pin<Box<dyn Future<Output = ClaimDone> + Send + '_>> {
    Box::pin(async move {
        let cfg = &ctx.config;
        let limit = u32::try_from(asked).unwrap_or(1);
        let sent = Instant::now();
        let rows = if reclaim {
            ctx.client
                .reclaim_own(limit, cfg.ttl, &cfg.owner, &cfg.queue)
                .await
        } else {
            ctx.client
                .claim(limit, cfg.ttl, &cfg.owner, &cfg.queue)
                .await
        };
        let took = sent.elapsed();
        ctx.counters.claim_latency(took);
        let rate_wait = match &rows {
            Ok(rows) if rows.is_empty() && !reclaim => rate_wait(ctx).await,
            _ => None,
        };
        ClaimDone {
            rows,
            asked,
            reclaim,
            took,
            rate_wait,
        }
    })
}

/// How long the queue's rate limit holds rows back, if it does. Only a
/// hint for when to claim next: a failure (an extension without rate
/// limits) is the same as no limit.
async fn rate_wait(ctx: &Ctx) -> Option<Duration> {
    match ctx.client.rate_wait(&ctx.config.queue).await {
        Ok(wait) => wait.filter(|w| !w.is_zero()),
        Err(e) => {
            tracing::debug!(queue = %ctx.config.queue, error = %e, "could not ask for the rate limit's wait");
            None
        }
    }
}

/// Takes in what releasing a batch returned: the rows claimed in its
/// statement, and the leases whose release is to be tried again (true if
/// there are any).
fn take_released(
    ctx: &Arc<Ctx>,
    claims: &mut Claims,
    leases: &mut Leases,
    released: Released,
) -> bool {
    let Released { retry, claimed } = released;
    if !claimed.is_empty() {
        claims.recheck = RECHECK_FIRST;
    }
    ctx.counters.took(&claimed);
    take_up(ctx, claims, leases, claimed);
    let again = !retry.is_empty();
    leases.to_release.extend(retry);
    again
}

/// Takes in what a claim returned; an error only for a claim that cannot
/// succeed by retrying.
fn claimed(
    ctx: &Arc<Ctx>,
    claims: &mut Claims,
    leases: &mut Leases,
    done: ClaimDone,
) -> Result<()> {
    let cfg = &ctx.config;
    let ClaimDone {
        rows,
        asked,
        reclaim,
        rate_wait,
        ..
    } = done;
    match rows {
        Ok(rows) => {
            claims.backoff.reset();
            let got = rows.len();
            if reclaim {
                tracing::info!(queue = %cfg.queue, owner = %cfg.owner, reclaimed = got, "took back this owner's leases");
                // Rows beyond the free slots expire and come back through
                // the reaper.
                claims.reclaiming = false;
                // How long a reclaimed row waited says nothing of the queue.
                ctx.counters.claimed(got);
            } else {
                tracing::debug!(queue = %cfg.queue, claimed = got, asked, "claimed");
                ctx.counters.took(&rows);
                if got > 0 {
                    claims.recheck = RECHECK_FIRST;
                }
                if let Some(wait) = rate_wait {
                    // The rate limit holds back what rows there are: claim
                    // again when it lets one through, not a poll later.
                    claims.idle = true;
                    claims.not_before = Instant::now() + wait.min(cfg.poll_interval);
                    claims.recheck = RECHECK_FIRST;
                } else if got < asked {
                    claims.idle = true;
                    claims.not_before = Instant::now() + claims.recheck;
                    claims.recheck = (claims.recheck * 2).min(cfg.poll_interval);
                }
            }
            take_up(ctx, claims, leases, rows);
            Ok(())
        }
        Err(e) if e.is_invalid_input() => {
            tracing::error!(queue = %cfg.queue, error = %e, "claim refused; the worker stops");
            Err(e)
        }
        Err(e) => {
            let delay = claims.backoff.next();
            tracing::warn!(queue = %cfg.queue, error = %e, retry_in = ?delay, "claim failed");
            claims.not_before = Instant::now() + delay;
            Ok(())
        }
    }
}

/// Registers claimed rows; they wait for a slot, or, once claims have
/// stopped, go back with the next release batch. Every row was asked for
/// within the budget of its time: if the prefetch shrank since, the
/// Worker holds more for a while rather than give rows back.
fn take_up(ctx: &Arc<Ctx>, claims: &Claims, leases: &mut Leases, rows: Vec<Claimed>) {
    for row in rows {
        let ready = register(ctx, row);
        if claims.open {
            leases.waiting.push_back(ready);
        } else {
            leases.to_release.push(ready.held);
        }
    }
}

/// Stops claiming: rows that never started go back (abandoned, attempt
/// given back) with the next release batch, and the grace period of the
/// running handlers starts.
fn stop_claiming(ctx: &Ctx, claims: &mut Claims, leases: &mut Leases, grace: &mut Option<Instant>) {
    claims.open = false;
    leases
        .to_release
        .extend(leases.waiting.drain(..).map(|ready| ready.held));
    *grace = Some(Instant::now() + ctx.config.grace_period);
}
