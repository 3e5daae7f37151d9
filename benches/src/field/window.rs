//! Pickup-latency percentiles over a trailing window, in bounded memory.
//!
//! The harness asks for p50/p95/p99 over the last 30 s, at 3 significant
//! figures, without keeping every sample: one HDR histogram per second of
//! the window, merged when a tick reads them. Memory does not grow with the
//! rate (a ring of samples would hold 600,000 entries at 20,000 jobs/s).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Largest latency kept apart: 10 minutes, in microseconds. Larger ones are
/// clamped to it (a job picked up later than that is an outage, not a tail).
const MAX_MICROS: u64 = 600_000_000;

/// Latencies of the trailing `window`, bucketed by second.
pub struct LatencyWindow {
    window: Duration,
    started: Instant,
    /// (second since `started`, that second's histogram), oldest first.
    buckets: VecDeque<(u64, Histogram<u64>)>,
    merged: Histogram<u64>,
}

/// p50, p95 and p99 in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl LatencyWindow {
    /// An empty window of `window`'s length.
    pub fn new(window: Duration) -> Result<LatencyWindow, hdrhistogram::CreationError> {
        Ok(LatencyWindow {
            window,
            started: Instant::now(),
            buckets: VecDeque::new(),
            merged: Histogram::new_with_bounds(1, MAX_MICROS, 3)?,
        })
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_secs()
    }

    /// Records one latency, now.
    pub fn record(&mut self, latency: Duration) {
        let second = self.second(Instant::now());
        if self.buckets.back().map(|(s, _)| *s) != Some(second) {
            self.buckets
                .push_back((second, Histogram::new_from(&self.merged)));
            self.forget_before(second);
        }
        let micros = u64::try_from(latency.as_micros()).unwrap_or(MAX_MICROS);
        if let Some((_, h)) = self.buckets.back_mut() {
            h.saturating_record(micros.clamp(1, MAX_MICROS));
        }
    }

    fn forget_before(&mut self, now_second: u64) {
        let oldest = now_second.saturating_sub(self.window.as_secs().saturating_sub(1));
        while self.buckets.front().is_some_and(|(s, _)| *s < oldest) {
            self.buckets.pop_front();
        }
    }

    /// The percentiles of the window ending now; `None` if it holds no
    /// latency.
    pub fn percentiles(&mut self) -> Option<Percentiles> {
        self.forget_before(self.second(Instant::now()));
        self.merged.reset();
        for (_, h) in &self.buckets {
            // Same bounds on both sides: adding cannot fail.
            let _ = self.merged.add(h);
        }
        if self.merged.is_empty() {
            return None;
        }
        let ms = |q: f64| self.merged.value_at_quantile(q) as f64 / 1_000.0;
        Some(Percentiles {
            p50: ms(0.50),
            p95: ms(0.95),
            p99: ms(0.99),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_what_was_recorded() {
        let mut w = LatencyWindow::new(Duration::from_secs(30)).unwrap();
        assert_eq!(w.percentiles(), None);
        for ms in 1..=100 {
            w.record(Duration::from_millis(ms));
        }
        let p = w.percentiles().expect("samples");
        assert!((p.p50 - 50.0).abs() < 0.1, "{p:?}");
        assert!((p.p99 - 99.0).abs() < 0.1, "{p:?}");
    }

    #[test]
    fn old_seconds_leave_the_window() {
        let mut w = LatencyWindow::new(Duration::from_secs(1)).unwrap();
        w.record(Duration::from_millis(500));
        std::thread::sleep(Duration::from_millis(2_100));
        assert_eq!(w.percentiles(), None);
    }
}
