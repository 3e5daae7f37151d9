//! The throughput charts: every few seconds the dashboard reads each
//! queue's monotonic totals (`lease.metrics`, O(queues)) and keeps the last
//! minutes of them in memory; a chart is the rate between neighbouring
//! samples. Nothing is stored in the database.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Ui;

/// Time between samples.
const EVERY: Duration = Duration::from_secs(5);

/// Samples kept: five minutes.
const KEEP: usize = 61;

/// The sparkline's size, in SVG units (matches queues_table.html).
const WIDTH: f64 = 120.0;
const HEIGHT: f64 = 24.0;

/// Rows finished (done, dead or cancelled) so far, per queue, at a time.
struct Sample {
    at: Instant,
    finished: HashMap<String, i64>,
}

/// The kept samples, oldest first.
#[derive(Default)]
pub struct Samples(Mutex<VecDeque<Sample>>);

impl Samples {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Sample>> {
        // A panic elsewhere cannot leave a VecDeque half-written.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.lock();
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// `queue`'s rows finished per second: the newest rate as text, and
    /// the SVG points of all of them ("" and "" before two samples).
    pub fn chart(&self, queue: &str) -> (String, String) {
        let samples = self.lock();
        let rates: Vec<f64> = samples
            .iter()
            .zip(samples.iter().skip(1))
            .filter_map(|(a, b)| {
                let (x, y) = (a.finished.get(queue)?, b.finished.get(queue)?);
                let secs = b.at.duration_since(a.at).as_secs_f64().max(0.001);
                Some((y - x).max(0) as f64 / secs)
            })
            .collect();
        let Some(last) = rates.last() else {
            return (String::new(), String::new());
        };
        let top = rates.iter().copied().fold(1.0, f64::max);
        let step = WIDTH / (KEEP - 2) as f64;
        let start = WIDTH - step * (rates.len() - 1) as f64;
        let points = rates
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let x = start + step * i as f64;
                let y = HEIGHT - 2.0 - (HEIGHT - 4.0) * r / top;
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ");
        (format!("{last:.1}/s"), points)
    }
}

/// Samples until the server stops; a failed read (the database away) is
/// skipped, and the chart shows the gap as a longer interval.
pub async fn sample(ui: Arc<Ui>) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        if let Ok(metrics) = ui.client.metrics().await {
            let finished = metrics
                .into_iter()
                .map(|m| (m.queue, m.done_total + m.dead_total + m.cancelled_total))
                .collect();
            ui.throughput.push(Sample {
                at: Instant::now(),
                finished,
            });
        }
    }
}
