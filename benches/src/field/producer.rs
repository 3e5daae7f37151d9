//! The producer: `Client::enqueue_batch`, as a service would enqueue, paced
//! the three ways the harness asks for.
//!
//! * `fixed`, harness-paced (the default): the harness writes
//!   `ENQUEUE <n>` lines on stdin; each becomes rows of one batch call
//!   (tokens that queued up while a call was out go together, at most
//!   `PRODUCER_BATCH_MAX` rows per call).
//! * `fixed`, adapter-paced (`PRODUCER_PACING=adapter`): credit accrues on
//!   real elapsed wall-clock time, never per loop turn, at the rate in
//!   `PRODUCER_RATE_CONTROL_FILE` when the harness keeps one.
//! * `depth-target`: enqueue while the ready depth is under the target.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease_client::{BatchOptions, CancellationToken, Client};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::telemetry::now_epoch_ms;
use crate::{Shared, QUEUE};

/// How the producer decides how much to enqueue.
#[derive(Clone, Debug)]
pub enum Pacing {
    /// `ENQUEUE <n>` tokens from the harness on stdin.
    Harness,
    /// Its own wall-clock credit at `rate` jobs/s (or the control file's).
    Adapter {
        rate: f64,
        period: Duration,
        control_file: Option<PathBuf>,
    },
    /// Keep the ready depth at `depth`.
    DepthTarget { depth: u64 },
}

/// One job's payload: when it was produced (for the pickup latency), which
/// process produced it and its number there (so that a check of the table
/// after the run finds lost or doubled rows), and padding up to
/// `JOB_PAYLOAD_BYTES`.
#[derive(Serialize)]
struct Payload<'a> {
    produced_at_ms: i64,
    producer: &'a str,
    seq: u64,
    padding: &'a str,
}

/// Enqueues rows until `stop` fires.
pub struct Producer {
    pub client: Client,
    pub pacing: Pacing,
    pub batch_max: usize,
    pub padding: String,
    /// This process, as `<instance>-<pid>`.
    pub name: String,
    pub shared: Arc<Shared>,
    /// Number of the next row; it advances only when a call succeeds, so
    /// the numbers the table holds are gapless unless rows were lost.
    pub next_seq: u64,
}

impl Producer {
    /// Runs the producer until `stop` fires.
    pub async fn run(mut self, stop: CancellationToken) {
        match self.pacing.clone() {
            Pacing::Harness => self.harness_paced(stop).await,
            Pacing::Adapter {
                rate,
                period,
                control_file,
            } => self.adapter_paced(rate, period, control_file, stop).await,
            Pacing::DepthTarget { depth } => self.depth_target(depth, stop).await,
        }
    }

    async fn harness_paced(&mut self, stop: CancellationToken) {
        let mut tokens = read_tokens();
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                n = tokens.recv() => match n {
                    Some(n) => n,
                    None => return stop.cancelled().await,
                },
            };
            let mut n = first;
            while n < self.batch_max {
                match tokens.try_recv() {
                    Ok(more) => n += more,
                    Err(_) => break,
                }
            }
            // Rows beyond one call's maximum go out in further calls.
            while n > 0 {
                let rows = n.min(self.batch_max);
                self.enqueue(rows).await;
                n -= rows;
            }
        }
    }

    async fn adapter_paced(
        &mut self,
        rate: f64,
        period: Duration,
        control_file: Option<PathBuf>,
        stop: CancellationToken,
    ) {
        let mut credit = 0.0_f64;
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.is_cancelled() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let rate = control_file.as_ref().and_then(read_rate).unwrap_or(rate);
            credit += rate * now.saturating_duration_since(last).as_secs_f64();
            last = now;
            let whole = credit.floor();
            credit -= whole;
            let mut n = whole as usize;
            while n > 0 && !stop.is_cancelled() {
                let rows = n.min(self.batch_max);
                self.enqueue(rows).await;
                n -= rows;
            }
        }
    }

    async fn depth_target(&mut self, target: u64, stop: CancellationToken) {
        while !stop.is_cancelled() {
            let depth = self.shared.depth.load(Ordering::Relaxed);
            if depth >= target {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                }
            }
            let missing = usize::try_from(target - depth).unwrap_or(self.batch_max);
            self.enqueue(missing.clamp(1, self.batch_max)).await;
        }
    }

    /// One `enqueue_batch` call of `rows` rows; a failure (the database
    /// restarting, say) is logged and the rows are not counted.
    async fn enqueue(&mut self, rows: usize) {
        let produced_at_ms = now_epoch_ms();
        let first = self.next_seq;
        let payloads: Vec<Payload<'_>> = (0..rows as u64)
            .map(|i| Payload {
                produced_at_ms,
                producer: &self.name,
                seq: first + i,
                padding: &self.padding,
            })
            .collect();
        match self
            .client
            .enqueue_batch(QUEUE, &payloads, &BatchOptions::default())
            .await
        {
            Ok(ids) => {
                self.next_seq += ids.len() as u64;
                self.shared
                    .enqueued
                    .fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                eprintln!("[pg_lease] enqueue_batch of {rows} rows failed: {e}");
                // Not a hot loop while the database is away.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// `ENQUEUE <n>` lines from stdin, read on a thread of their own (stdin
/// is blocking); the channel closes at end of input.
fn read_tokens() -> mpsc::UnboundedReceiver<usize> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let n = line
                .strip_prefix("ENQUEUE ")
                .and_then(|n| n.trim().parse::<usize>().ok());
            if let Some(n) = n.filter(|n| *n > 0) {
                if tx.send(n).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// The harness's current offered rate, from its control file.
fn read_rate(path: &PathBuf) -> Option<f64> {
    let raw = std::fs::read_to_string(path).ok()?;
    raw.trim().parse::<f64>().ok().map(|r| r.max(0.0))
}
