//! How many rows the Worker claims ahead of its free slots when
//! [`WorkerConfig::prefetch`](super::WorkerConfig::prefetch) is not set.
//!
//! Rows waiting in the Worker keep its slots busy while a refill travels:
//! a slot that frees starts the next waiting row at once instead of waiting
//! for its outcome to commit and a new row to come back. How many that
//! takes is the rows the slots finish during a few database round trips:
//! `concurrency / handler time × REFILL_TRIPS × round trip`, both times
//! measured as the Worker runs (moving averages). No-op jobs need hundreds
//! (and then each commit carries hundreds of outcomes); 10 ms jobs about
//! one per slot; slow jobs none.
//!
//! Rows that wait are rows another Worker could run, and a lease that no
//! slot will start before its ttl runs out is a lease held for nothing. Two
//! things bound the waiting:
//! * the prefetch is at most what the slots start within half of the
//!   lease's confirmed time (`ttl − margin`) at the measured rate, and
//!   while every slot is busy the rate counts the youngest handler's age
//!   (so handlers that turn slow cut the prefetch before the first of them
//!   returns);
//! * a row that has waited that long all the same (handlers turned slow
//!   after it was claimed) is given back ([`Pace::overdue`]: `abandon`, its
//!   attempt returned, claimable by any Worker at once) rather than held.
//!
//! Until handler times are known, nothing is claimed ahead. A fixed
//! prefetch is the user's choice: neither bound applies to it.

use std::time::Duration;

use tokio::time::Instant;

use super::WorkerConfig;

/// Round trips a refill may take: the two release lanes, each with a batch
/// in flight and the next one waiting.
const REFILL_TRIPS: f64 = 4.0;

/// Most leases the Worker holds on its own accord, running ones included:
/// with claims and release-and-claims of this many rows one commit carries
/// hundreds of jobs, and more gained nothing measurable.
const MOST_HELD: usize = 512;

/// Weight of the newest sample in the moving averages.
const WEIGHT: f64 = 0.1;

/// The Worker's measured pace and the budget of leases it gives.
#[derive(Debug)]
pub(super) struct Pace {
    concurrency: usize,
    fixed: Option<usize>,
    /// Half of `ttl − margin`.
    horizon: Duration,
    /// Mean time a slot is taken by a handler, in seconds.
    job: Option<f64>,
    /// Mean time of a claim or release call that succeeded, in seconds.
    trip: Option<f64>,
    /// When the last handler started.
    last_start: Option<Instant>,
}

impl Pace {
    pub(super) fn new(config: &WorkerConfig) -> Pace {
        Pace {
            concurrency: config.concurrency,
            fixed: config.prefetch,
            horizon: config.confirmed_for() / 2,
            job: None,
            trip: None,
            last_start: None,
        }
    }

    /// Most leases to hold at once, running and waiting ones included;
    /// `running` handlers run now.
    pub(super) fn budget(&self, running: usize) -> usize {
        self.concurrency + self.prefetch(running)
    }

    /// Rows to hold beyond the slots.
    fn prefetch(&self, running: usize) -> usize {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let (Some(mut job), Some(trip)) = (self.job, self.trip) else {
            return 0;
        };
        // Every slot busy: none has freed since the last start, so the
        // youngest handler is at least that old.
        if running >= self.concurrency {
            if let Some(start) = self.last_start {
                job = job.max(start.elapsed().as_secs_f64());
            }
        }
        // Rows the slots finish per second.
        let rate = self.concurrency as f64 / job.max(1e-6);
        // Whole rows: enough to cover the trips, none that would start
        // past the horizon.
        let cover = (rate * REFILL_TRIPS * trip).ceil();
        let bound = (rate * self.horizon.as_secs_f64()).floor();
        let most = MOST_HELD.saturating_sub(self.concurrency) as f64;
        // A float-to-integer cast saturates (and the inputs are finite).
        cover.min(bound).min(most) as usize
    }

    /// Whether a row claimed at `claimed` has waited too long for a slot
    /// and should be given back.
    pub(super) fn overdue(&self, claimed: Instant) -> bool {
        self.fixed.is_none() && claimed.elapsed() > self.horizon
    }

    /// A handler starts now.
    pub(super) fn job_started(&mut self) {
        self.last_start = Some(Instant::now());
    }

    /// A handler held its slot for `took`.
    pub(super) fn job_took(&mut self, took: Duration) {
        average(&mut self.job, took);
    }

    /// A claim or release call succeeded after `took`.
    pub(super) fn trip_took(&mut self, took: Duration) {
        average(&mut self.trip, took);
    }
}

fn average(mean: &mut Option<f64>, sample: Duration) {
    let sample = sample.as_secs_f64();
    *mean = Some(match *mean {
        Some(mean) => mean + WEIGHT * (sample - mean),
        None => sample,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(concurrency: usize, ttl: Duration, job: Duration, trip: Duration) -> Pace {
        let mut config = WorkerConfig::new("q").with_ttl(ttl);
        config.concurrency = concurrency;
        let mut pace = Pace::new(&config);
        pace.job_took(job);
        pace.trip_took(trip);
        pace
    }

    #[test]
    fn nothing_ahead_until_handler_times_are_known() {
        let mut config = WorkerConfig::new("q");
        config.concurrency = 4;
        let mut pace = Pace::new(&config);
        pace.trip_took(Duration::from_millis(2));
        assert_eq!(pace.budget(0), 4);
    }

    #[test]
    fn short_jobs_fill_the_budget() {
        let p = pace(
            16,
            Duration::from_secs(30),
            Duration::from_micros(20),
            Duration::from_millis(2),
        );
        assert_eq!(p.budget(0), MOST_HELD);
    }

    #[test]
    fn ten_ms_jobs_keep_a_few_rows_per_slot() {
        let p = pace(
            16,
            Duration::from_secs(30),
            Duration::from_millis(10),
            Duration::from_millis(2),
        );
        // 1,600 rows/s × 4 trips × 2 ms.
        assert_eq!(p.prefetch(0), 13);
    }

    #[test]
    fn slow_jobs_under_a_short_ttl_wait_for_nothing() {
        // ttl 3 s, margin 0.5 s: the horizon is 1.25 s, and two slots start
        // a row every 2.5 s.
        let p = pace(
            2,
            Duration::from_secs(3),
            Duration::from_secs(5),
            Duration::from_millis(2),
        );
        assert_eq!(p.prefetch(0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn busy_slots_that_stay_busy_cut_the_prefetch() {
        let mut p = pace(
            4,
            Duration::from_secs(30),
            Duration::from_micros(20),
            Duration::from_millis(2),
        );
        p.job_started();
        assert_eq!(p.prefetch(4), MOST_HELD - 4);
        tokio::time::advance(Duration::from_secs(20)).await;
        // Four slots busy for 20 s: at most 4 rows per 20 s, 2 within the
        // 12.5 s horizon, and the trips need only one.
        assert_eq!(p.prefetch(4), 1);
        assert_eq!(p.prefetch(3), MOST_HELD - 4, "a free slot: the mean rules");
    }

    #[tokio::test(start_paused = true)]
    async fn rows_waiting_past_the_horizon_are_overdue() {
        let config = WorkerConfig::new("q").with_ttl(Duration::from_secs(3));
        let pace = Pace::new(&config);
        let claimed = Instant::now();
        tokio::time::advance(Duration::from_millis(1200)).await;
        assert!(!pace.overdue(claimed));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(pace.overdue(claimed), "half of 2.5 s passed");
        let mut fixed = config;
        fixed.prefetch = Some(3);
        assert!(!Pace::new(&fixed).overdue(claimed));
    }

    #[test]
    fn a_fixed_prefetch_wins() {
        let mut config = WorkerConfig::new("q");
        config.prefetch = Some(7);
        assert_eq!(Pace::new(&config).budget(8), 8 + 7);
    }
}
