//! Timing and naming shared by the [`Worker`](crate::Worker) and the [`Elector`](crate::Elector):
//! retry backoff, the longest ttl, and default owner names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// Retry delays with full jitter: each is drawn uniformly from up to a
/// ceiling that doubles from `min` to `max` (at least a millisecond), so
/// that replicas that failed together (a database restart) do not retry
/// in lockstep.
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    ceiling: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            ceiling: min,
        }
    }

    pub(crate) fn next(&mut self) -> Duration {
        let d = jitter(self.ceiling);
        self.ceiling = (self.ceiling * 2).min(self.max);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.ceiling = self.min;
    }
}

/// A delay drawn uniformly from 1 ms to `ceiling` (`ceiling` itself if it
/// is shorter).
pub(crate) fn jitter(ceiling: Duration) -> Duration {
    let floor = Duration::from_millis(1);
    if ceiling <= floor {
        return ceiling;
    }
    rand::random_range(floor..=ceiling)
}

/// How soon to try a renewal again after one failed (or was not
/// extended): a [`jitter`]ed quarter of `renew_every`, at least 20 ms, well
/// before `ttl − margin` runs out.
pub(crate) fn renew_retry(renew_every: Duration) -> Duration {
    let floor = Duration::from_millis(20);
    jitter((renew_every / 4).max(floor)).max(floor)
}

/// Longest ttl the SQL functions accept.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// `<hostname>-<pid>-<hex>`: readable in `lease.in_flight`, unique per
/// process start.
pub(crate) fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    let host: String = host.chars().take(64).collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{host}-{}-{nanos:08x}{n}", std::process::id())
}

/// The checks a holder's timing must pass, the same for a
/// [`WorkerConfig`](crate::WorkerConfig) and an
/// [`ElectorConfig`](crate::ElectorConfig): a ttl the SQL accepts, a margin
/// inside it, and a heartbeat that comes before `ttl − margin` runs out.
pub(crate) fn check_lease_timing(
    ttl: Duration,
    margin: Duration,
    renew_every: Duration,
) -> Result<()> {
    if ttl > MAX_TTL {
        return Err(Error::invalid("ttl must be at most one day"));
    }
    if margin >= ttl {
        return Err(Error::invalid("margin must be shorter than ttl"));
    }
    if renew_every.is_zero() || renew_every >= ttl.saturating_sub(margin) {
        return Err(Error::invalid(
            "renew_every must be positive and shorter than ttl - margin",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_differ_and_fit() {
        let (a, b) = (default_owner(), default_owner());
        assert_ne!(a, b);
        assert!(!a.is_empty() && a.len() <= 256);
    }

    #[test]
    fn backoff_ceilings_double_up_to_the_max_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
        for ceiling in [100, 200, 300, 300] {
            let d = b.next();
            assert!(
                d >= Duration::from_millis(1) && d <= Duration::from_millis(ceiling),
                "{d:?} above {ceiling} ms"
            );
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(100));
    }

    /// Failed before full jitter: two backoffs gave the same delays.
    #[test]
    fn two_backoffs_draw_different_delays() {
        let delays = || {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            (0..8).map(|_| b.next()).collect::<Vec<_>>()
        };
        assert_ne!(delays(), delays());
    }
}
