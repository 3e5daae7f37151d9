//! The `worker` section: `pg_lease_client::Worker` draining a queue, side
//! by side with the hand-written claim-50 SQL through pgbench (16 clients)
//! on the same rows, with the CPU each side of the wire used.
//!
//! Measured as users run: rows are enqueued, then drained at once (no
//! VACUUM in between; a CHECKPOINT so that every drain starts alike).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease_client::{CancellationToken, Client, Outcome, Worker, WorkerConfig};

use crate::cpu::Cpu;
use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{Bench, Drain, Res, Side};

/// The hand-tuned prefetch the Worker's default is compared with, per 16
/// slots: claims and release-and-claims of up to 16 + 496 = 512 rows, so
/// that one commit carries many jobs (measured at 200k rows: 0.95× of the
/// hand-written SQL with 240, 1.22× with 496).
pub const WORKER_PREFETCH: usize = 496;

/// One Worker drain: `workers` Workers (each with its own `Client` and
/// connections, in this process) of `slots` slots and `prefetch` each (the
/// default, sized by the Worker, if `None`), jobs that take `work`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    workers: usize,
    slots: usize,
    prefetch: Option<usize>,
    work: Duration,
}

impl Shape {
    fn label(&self) -> String {
        let work = if self.work.is_zero() {
            "no-op jobs".to_owned()
        } else {
            format!("{} ms jobs", self.work.as_millis())
        };
        let prefetch = self
            .prefetch
            .map_or("default prefetch".to_owned(), |p| format!("prefetch {p}"));
        format!(
            "Worker {} × {} slots, {prefetch}, {work}",
            self.workers, self.slots
        )
    }
}

/// A drain and the CPU it took.
struct Measured {
    drain: Drain,
    cpu: Cpu,
    /// Mean time a handler took, start to return.
    handler: Duration,
}

impl Measured {
    fn cells(&self, label: String, hand: Option<&Measured>) -> Vec<String> {
        let d = &self.drain;
        let per_k = |s: f64| format!("{:.0}", s * 1000.0 / (d.drained.max(1) as f64 / 1000.0));
        let mut secs = format!("{:.2}", d.secs);
        if d.timed_out {
            secs.push_str(" (deadline)");
        }
        vec![
            label,
            d.rows.to_string(),
            secs,
            rate(d.jobs_per_s()),
            hand.map_or("—".into(), |h| {
                ratio(d.jobs_per_s() / h.drain.jobs_per_s())
            }),
            per_k(self.cpu.server),
            per_k(self.cpu.client),
        ]
    }
}

impl Bench {
    /// The section: hand-written SQL, then Worker shapes, per row count.
    pub async fn worker(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Worker drains vs hand-written SQL",
            "Per row count, in one run: the hand-written claim-50-then-DELETE SQL through \
             pgbench (16 clients, `-M prepared`), twice (ratios are to the faster run), then \
             `Worker`s draining the same number of \
             rows with a handler that returns at once (or sleeps). Each drain is timed from \
             start until the queue is empty; rows are enqueued just before, without VACUUM. \
             CPU: milliseconds per 1,000 jobs used by the server's processes and by the client \
             side (pgbench, or this process running the Workers), from /proc.",
            &[
                "scenario",
                "rows",
                "seconds",
                "jobs/s",
                "vs hand-written",
                "server CPU ms/1k jobs",
                "client CPU ms/1k jobs",
            ],
        );
        // Library defaults first (only the slots set), then the hand-tuned
        // prefetch for comparison.
        let noop = Duration::ZERO;
        let default = Shape {
            workers: 1,
            slots: 16,
            prefetch: None,
            work: noop,
        };
        let split = Shape {
            workers: 2,
            slots: 8,
            ..default
        };
        let tuned = Shape {
            prefetch: Some(WORKER_PREFETCH),
            ..default
        };
        let large = self.size.worker_rows;
        let small = large / 10;
        for (rows, shapes) in [
            (large, vec![default, split, tuned]),
            (small, vec![default, split, tuned]),
        ] {
            // Without VACUUM between fill and drain, the hand-written drain
            // varies a lot from run to run (10.7k to 38.9k jobs/s seen in one
            // run); the Workers are compared with the faster of two.
            let first = self.measured_pgbench(rows).await?;
            let second = self.measured_pgbench(rows).await?;
            for (i, h) in [&first, &second].into_iter().enumerate() {
                let label = format!("hand-written SQL, pgbench 16 × batch 50 (run {})", i + 1);
                t.row(h.cells(label, None));
            }
            let hand = if first.drain.jobs_per_s() >= second.drain.jobs_per_s() {
                first
            } else {
                second
            };
            for shape in shapes {
                let m = self.measured_worker(rows, shape).await?;
                if shape.workers == 1 && shape.prefetch.is_none() {
                    let key = if rows == large {
                        "worker_jobs_s"
                    } else {
                        "worker_small_jobs_s"
                    };
                    out.metrics.insert(key, m.drain.jobs_per_s());
                    out.metrics.insert(
                        if rows == large {
                            "worker_hand_jobs_s"
                        } else {
                            "worker_hand_small_jobs_s"
                        },
                        hand.drain.jobs_per_s(),
                    );
                }
                if shape.workers == 2 && rows == large {
                    out.metrics
                        .insert("worker_split_jobs_s", m.drain.jobs_per_s());
                }
                t.row(m.cells(shape.label(), Some(&hand)));
            }
        }
        // Jobs that take 10 ms: throughput is bounded by slots / 10 ms. With
        // prefetch 0 a slot waits for its row's outcome to commit and the
        // next row to be claimed; the default keeps a few rows per slot
        // waiting, which hides that.
        for prefetch in [None, Some(0)] {
            let slow = Shape {
                work: Duration::from_millis(10),
                prefetch,
                ..default
            };
            let m = self.measured_worker(small, slow).await?;
            let bound = slow.slots as f64 / slow.work.as_secs_f64();
            if prefetch.is_none() {
                out.metrics
                    .insert("worker_slow_share", m.drain.jobs_per_s() / bound);
            }
            let mut cells = m.cells(slow.label(), None);
            // A 10 ms sleep takes longer (timer ticks, wake-ups on a busy
            // machine): the share of what the handlers' real time allows
            // is the Worker's own overhead.
            let allowed = slow.slots as f64 / m.handler.as_secs_f64().max(1e-9);
            cells[4] = format!(
                "{} of slots / 10 ms; {} of slots / mean handler time ({:.2} ms)",
                ratio(m.drain.jobs_per_s() / bound),
                ratio(m.drain.jobs_per_s() / allowed),
                m.handler.as_secs_f64() * 1000.0
            );
            t.row(cells);
        }
        out.tables.push(t);
        Ok(())
    }

    pub(crate) async fn postmaster(&self) -> Res<u32> {
        let pid = self.scalar_i64("SELECT pg_backend_pid()::bigint").await?;
        crate::cpu::parent_of(u32::try_from(pid).map_err(|e| e.to_string())?)
    }

    /// CPU used since `before`, read once the drain's sessions have ended
    /// and the postmaster has reaped them (their time then counts in its
    /// `cutime`; a backend that has exited but is not yet reaped counts
    /// nowhere).
    async fn cpu_since(&self, postmaster: u32, before: Cpu) -> Res<Cpu> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self
                .scalar_i64(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                .await?
                > 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(Cpu::now(postmaster) - before)
    }

    async fn measured_pgbench(&self, rows: u64) -> Res<Measured> {
        let rows = Self::whole_cycles(50, 16, rows);
        self.fill(Side::Hand, rows).await?;
        let postmaster = self.postmaster().await?;
        let before = Cpu::now(postmaster);
        let drain = self
            .drain_filled(Side::Hand, 50, 16, (rows, 0), false)
            .await?;
        Ok(Measured {
            cpu: self.cpu_since(postmaster, before).await?,
            drain,
            handler: Duration::ZERO,
        })
    }

    async fn measured_worker(&self, rows: u64, shape: Shape) -> Res<Measured> {
        self.fill(Side::Lease, rows).await?;
        let postmaster = self.postmaster().await?;
        let before = Cpu::now(postmaster);
        let (drain, handler) = self.worker_drain(rows, shape).await?;
        Ok(Measured {
            cpu: self.cpu_since(postmaster, before).await?,
            drain,
            handler,
        })
    }

    /// Runs `shape` until the queue is empty (every job handled and its
    /// outcome committed) or the deadline.
    async fn worker_drain(&self, rows: u64, shape: Shape) -> Res<(Drain, Duration)> {
        let handled = Arc::new(AtomicU64::new(0));
        let busy_ns = Arc::new(AtomicU64::new(0));
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let mut runs = Vec::new();
        for _ in 0..shape.workers {
            let client = Client::connect(&self.conn)
                .await
                .map_err(|e| e.to_string())?;
            let mut config = WorkerConfig::new("q");
            config.concurrency = shape.slots;
            config.prefetch = shape.prefetch;
            let (counter, busy, work) = (Arc::clone(&handled), Arc::clone(&busy_ns), shape.work);
            let worker = Worker::new(client, config, move |_job| {
                let (counter, busy) = (Arc::clone(&counter), Arc::clone(&busy));
                async move {
                    if !work.is_zero() {
                        let started = Instant::now();
                        tokio::time::sleep(work).await;
                        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        busy.fetch_add(ns, Ordering::Relaxed);
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok(Outcome::Done)
                }
            });
            runs.push(tokio::spawn(worker.run(shutdown.clone())));
        }
        let deadline = started + self.size.deadline;
        let mut timed_out = false;
        loop {
            if Instant::now() > deadline {
                timed_out = true;
                break;
            }
            if runs.iter().any(|r| r.is_finished()) {
                break;
            }
            // The count is read only once every job ran: it scans the table.
            if handled.load(Ordering::Relaxed) >= rows && self.remaining(Side::Lease).await? == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let secs = started.elapsed().as_secs_f64();
        let left = self.remaining(Side::Lease).await?;
        shutdown.cancel();
        for run in runs {
            run.await
                .map_err(|e| format!("worker task: {e}"))?
                .map_err(|e| e.to_string())?;
        }
        let drain = Drain {
            rows,
            drained: rows - left,
            secs,
            timed_out,
        };
        let mean = busy_ns.load(Ordering::Relaxed) / handled.load(Ordering::Relaxed).max(1);
        Ok((drain, Duration::from_nanos(mean)))
    }
}
