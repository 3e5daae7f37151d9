//! Leases on queue rows, their fencing tokens and the outcomes that end them.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// The fencing token of one attempt: row `id` at `epoch`.
///
/// Every claim gives a row a new, greater epoch, so `(id, epoch)` names one
/// attempt and no other. Its text form, `pgl-<id>-<epoch>` (for example
/// `pgl-42-7`), is the attempt id: stable for the whole attempt (renewals do
/// not change it), different for every other attempt, and made of ASCII
/// letters, digits and `-` only, so it fits as an idempotency key or message
/// de-duplication id of most brokers. It parses back with [`str::parse`].
///
/// ```
/// use pg_lease_client::FencingToken;
///
/// let token = FencingToken { id: 42, epoch: 7 };
/// assert_eq!(token.to_string(), "pgl-42-7");
/// assert_eq!("pgl-42-7".parse::<FencingToken>().unwrap(), token);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken {
    /// Row id in `lease.job`.
    pub id: i64,
    /// Epoch of the attempt.
    pub epoch: i64,
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pgl-{}-{}", self.id, self.epoch)
    }
}

impl FromStr for FencingToken {
    type Err = Error;

    /// Parses `pgl-<id>-<epoch>`; anything else is [`Error::InvalidInput`].
    fn from_str(s: &str) -> Result<FencingToken> {
        let bad = || Error::invalid(format!("not an attempt id (pgl-<id>-<epoch>): {s:?}"));
        let rest = s.strip_prefix("pgl-").ok_or_else(bad)?;
        let (id, epoch) = rest.split_once('-').ok_or_else(bad)?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(id) || !digits(epoch) {
            return Err(bad());
        }
        Ok(FencingToken {
            id: id.parse().map_err(|_| bad())?,
            epoch: epoch.parse().map_err(|_| bad())?,
        })
    }
}

/// A lease on one queue row, as handed out by a claim.
///
/// It carries what every later call needs: the fencing token `(id, epoch)`,
/// the owner that claimed it, and the attempt number. A `Lease` is a plain
/// value: whether it is still held is decided by the database on every call.
#[derive(Clone, Debug)]
pub struct Lease {
    pub(crate) id: i64,
    pub(crate) epoch: i64,
    pub(crate) attempt: i32,
    pub(crate) queue: String,
    pub(crate) key: Option<String>,
    pub(crate) owner: String,
    pub(crate) lease_until: SystemTime,
    pub(crate) eligible_at: SystemTime,
    pub(crate) claim_sent_at: Instant,
    pub(crate) ttl: Duration,
}

impl Lease {
    /// Row id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Fencing epoch of this attempt.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// How many times the row has been claimed, this claim included
    /// (an `abandon` gives its attempt back).
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// Queue the row belongs to.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The row's idempotency key given at enqueue, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Owner name the lease was claimed under.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing token `(id, epoch)`.
    pub fn token(&self) -> FencingToken {
        FencingToken {
            id: self.id,
            epoch: self.epoch,
        }
    }

    /// The attempt id, `pgl-<id>-<epoch>`: a stable identity of this attempt
    /// to pass downstream as an idempotency key (see [`FencingToken`]).
    pub fn attempt_id(&self) -> String {
        self.token().to_string()
    }

    /// End of the lease by the database clock, as the claim reported it.
    /// Informational only: compare it with nothing on this machine's clock;
    /// use [`Lease::local_expiry`] for local decisions.
    pub fn lease_until(&self) -> SystemTime {
        self.lease_until
    }

    /// When the row became claimable (its `next_at`), by the database
    /// clock. For a row taken back with `reclaim_own`: when it first did.
    pub fn eligible_at(&self) -> SystemTime {
        self.eligible_at
    }

    /// How long the row waited between becoming claimable and this claim,
    /// both read from the database clock (the claim's time is
    /// `lease_until − ttl`); zero if the clock stepped back.
    pub fn waited(&self) -> Duration {
        self.lease_until
            .checked_sub(self.ttl)
            .and_then(|claimed| claimed.duration_since(self.eligible_at).ok())
            .unwrap_or(Duration::ZERO)
    }

    /// When the claim request was sent (local monotonic clock).
    pub fn claimed_at(&self) -> Instant {
        self.claim_sent_at
    }

    /// The latest local instant at which the claim alone can still be held:
    /// the time the claim request was *sent* plus the ttl. Renewals move the
    /// real end later; this value does not follow them.
    pub fn local_expiry(&self) -> Instant {
        self.claim_sent_at + self.ttl
    }
}

/// A claimed row: its lease and its payload.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The lease, with the fencing token.
    pub lease: Lease,
    /// The row's payload as JSON.
    pub payload: serde_json::Value,
}

impl Claimed {
    /// Deserializes the payload into `T`.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(T::deserialize(&self.payload)?)
    }
}

/// How an attempt ends; recorded by `release` with the fencing epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Finished (deleted at once when the queue's retention is 0).
    Done,
    /// Pending again after `delay` (measured by the database clock), or
    /// after the queue's backoff when `None`; dead once the row reached the
    /// queue's `max_attempts`. `error` is kept in `last_error`.
    Retry {
        /// Delay before the row is claimable again; `None`: queue backoff.
        delay: Option<Duration>,
        /// Message kept in the row's `last_error`.
        error: Option<String>,
    },
    /// Dead letter now; `error` is kept in `last_error`.
    Fail {
        /// Message kept in the row's `last_error`.
        error: Option<String>,
    },
    /// Pending again at once; the attempt is given back (it does not count
    /// towards `max_attempts`).
    Abandon,
    /// The handler released the lease itself, in its own fenced
    /// transaction: a `lease.release` there, or, on an attached table
    /// (`lease.attach`), a write that made the row stop matching the
    /// pending predicate (e.g. `status = 'DELETED'`), which ends the lease
    /// in the same transaction. Nothing is sent to the database; counted as
    /// done.
    Released,
    /// The name [`Outcome::Released`] had until 0.2.0; the same outcome.
    #[deprecated(since = "0.2.0", note = "renamed `Outcome::Released`")]
    Finished,
}

impl Outcome {
    /// [`Outcome::Retry`] after the queue's backoff, with an error message.
    pub fn retry(error: impl Into<String>) -> Outcome {
        Outcome::Retry {
            delay: None,
            error: Some(error.into()),
        }
    }

    /// [`Outcome::Retry`] after `delay`, with an error message.
    pub fn retry_after(delay: Duration, error: impl Into<String>) -> Outcome {
        Outcome::Retry {
            delay: Some(delay),
            error: Some(error.into()),
        }
    }

    /// [`Outcome::Fail`] with an error message.
    pub fn fail(error: impl Into<String>) -> Outcome {
        Outcome::Fail {
            error: Some(error.into()),
        }
    }

    /// The outcome's name in SQL: `done`, `retry`, `fail` or `abandon`
    /// (`done` for [`Outcome::Released`], which is never sent).
    #[allow(deprecated)]
    pub fn as_sql(&self) -> &'static str {
        match self {
            Outcome::Done | Outcome::Released | Outcome::Finished => "done",
            Outcome::Retry { .. } => "retry",
            Outcome::Fail { .. } => "fail",
            Outcome::Abandon => "abandon",
        }
    }

    /// Whether the handler released the lease itself (nothing to send).
    #[allow(deprecated)]
    pub(crate) fn is_released(&self) -> bool {
        matches!(self, Outcome::Released | Outcome::Finished)
    }

    pub(crate) fn delay(&self) -> Option<Duration> {
        match self {
            Outcome::Retry { delay, .. } => *delay,
            _ => None,
        }
    }

    pub(crate) fn error(&self) -> Option<&str> {
        match self {
            Outcome::Retry { error, .. } | Outcome::Fail { error } => error.as_deref(),
            _ => None,
        }
    }
}

/// The answer to one renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// Row id.
    pub id: i64,
    /// `false`: the lease is lost (expired, reaped, taken over, released);
    /// stop working.
    pub held: bool,
    /// Held, but not extended this time: another transaction had the row
    /// locked (your own open [`fence`](crate::fence), or a writer of an
    /// attached table that may be removing the row). Only from
    /// [`Client::renew_batch`](crate::Client::renew_batch), which never
    /// waits for such a row. Try again soon; `lease_until` is unchanged.
    pub busy: bool,
    /// End of the lease by the database clock, when held (extended unless
    /// `busy`).
    pub lease_until: Option<SystemTime>,
    /// `lease.cancel` was called for this row: stop and release.
    pub cancel_requested: bool,
}

/// States of a row in `lease.job`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Claimable from its next-eligible time on.
    Pending,
    /// Leased to an owner.
    Leased,
    /// Finished.
    Done,
    /// Dead letter.
    Dead,
    /// Cancelled.
    Cancelled,
}

impl FromStr for JobState {
    type Err = Error;

    fn from_str(s: &str) -> Result<JobState> {
        Ok(match s {
            "pending" => JobState::Pending,
            "leased" => JobState::Leased,
            "done" => JobState::Done,
            "dead" => JobState::Dead,
            "cancelled" => JobState::Cancelled,
            other => return Err(Error::Protocol(format!("unknown job state {other:?}"))),
        })
    }
}

/// What `cancel` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelResult {
    /// The row was pending and is now cancelled.
    Cancelled,
    /// The row is leased: its owner sees the request on its next renewal,
    /// and a retry, abandon or expiry ends it as cancelled.
    CancelRequested,
    /// The row had already finished in this state; nothing changed.
    AlreadyFinished(JobState),
    /// No such row (never existed, or deleted after finishing).
    NotFound,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_ids_round_trip_and_reject_garbage() {
        let t = FencingToken {
            id: 9_000_000_000,
            epoch: 3,
        };
        assert_eq!(t.to_string().parse::<FencingToken>().ok(), Some(t));
        for bad in [
            "",
            "pgl-",
            "pgl-1",
            "pgl-1-",
            "pgl--1-2",
            "x-1-2",
            "pgl-1-2-3",
            "pgl-+1-2",
        ] {
            assert!(bad.parse::<FencingToken>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn outcomes_name_their_sql() {
        assert_eq!(Outcome::Done.as_sql(), "done");
        assert_eq!(Outcome::retry("x").as_sql(), "retry");
        assert_eq!(Outcome::retry("x").error(), Some("x"));
        assert_eq!(Outcome::fail("y").as_sql(), "fail");
        assert_eq!(Outcome::Abandon.as_sql(), "abandon");
        assert_eq!(Outcome::Released.as_sql(), "done");
        #[allow(deprecated)]
        let old = Outcome::Finished;
        assert!(old.is_released() && Outcome::Released.is_released());
        assert!(!Outcome::Done.is_released());
        assert_eq!(
            Outcome::retry_after(Duration::from_secs(2), "z").delay(),
            Some(Duration::from_secs(2))
        );
    }
}
