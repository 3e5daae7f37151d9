//! Reading the answers: columns, durations, and the typed rows built from them.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;

use crate::error::{Error, Result};
use crate::lease::{CancelResult, Claimed, FencingToken, JobState, Lease, Renewal};

/// A column, with a conversion failure as [`Error::Protocol`].
pub(super) fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| Error::Protocol(format!("column {i}: {e}")))
}

/// An `interval` column as a duration (months as 30 days, as PostgreSQL's
/// `extract(epoch ...)` counts them; negative as zero). The statements read
/// intervals as microseconds in SQL, but a call that a distributed install
/// must forward has to be the whole select list.
pub(super) struct Interval(pub(super) Duration);

impl<'a> FromSql<'a> for Interval {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        // Binary form: microseconds (i64), days (i32), months (i32).
        let field = |at: usize, len: usize| raw.get(at..at + len).ok_or("interval too short");
        let micros = i64::from_be_bytes(field(0, 8)?.try_into()?);
        let days = i32::from_be_bytes(field(8, 4)?.try_into()?);
        let months = i32::from_be_bytes(field(12, 4)?.try_into()?);
        const DAY: i64 = 86_400_000_000;
        let total = (i64::from(months) * 30 + i64::from(days))
            .checked_mul(DAY)
            .and_then(|d| d.checked_add(micros))
            .ok_or("interval out of range")?;
        Ok(Interval(Duration::from_micros(
            u64::try_from(total).unwrap_or_default(),
        )))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }
}

/// What `lease.cancel` and `lease.cancel_key` answered.
pub(super) fn cancel_result(state: Option<String>) -> Result<CancelResult> {
    Ok(match state.as_deref() {
        None => CancelResult::NotFound,
        Some("cancelled") => CancelResult::Cancelled,
        Some("cancel_requested") => CancelResult::CancelRequested,
        Some(other) => CancelResult::AlreadyFinished(other.parse::<JobState>()?),
    })
}

pub(super) fn renewal_from_row(row: &Row) -> Result<Renewal> {
    // NULL: held but locked by another transaction, not extended (busy).
    let held: Option<bool> = col(row, 1)?;
    Ok(Renewal {
        id: col(row, 0)?,
        held: held.unwrap_or(true),
        busy: held.is_none(),
        lease_until: col(row, 2)?,
        cancel_requested: col::<Option<bool>>(row, 3)?.unwrap_or(false),
    })
}

/// A duration as whole microseconds for the server.
pub(crate) fn micros(d: Duration, what: &str) -> Result<i64> {
    i64::try_from(d.as_micros()).map_err(|_| Error::invalid(format!("{what} {d:?} is too long")))
}

/// A row count for an `integer` argument (`limit`, `max_rows`).
pub(super) fn count_arg(n: u32, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::invalid(format!("{what} {n} is out of range")))
}

/// Microseconds from the server as a duration; negative becomes zero.
pub(super) fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

pub(super) fn split(tokens: &[FencingToken]) -> (Vec<i64>, Vec<i64>) {
    tokens.iter().map(|t| (t.id, t.epoch)).unzip()
}

/// Batch answers must come back one per input, in input order.
pub(super) fn check_order(tokens: &[FencingToken], ids: impl Iterator<Item = i64>) -> Result<()> {
    let ids: Vec<i64> = ids.collect();
    if ids.len() != tokens.len() || tokens.iter().zip(&ids).any(|(t, id)| t.id != *id) {
        return Err(Error::Protocol(format!(
            "batch answer does not match its input ({} ids for {} tokens)",
            ids.len(),
            tokens.len()
        )));
    }
    Ok(())
}

/// A claimed row from the claim columns `(id, queue, key, payload, epoch,
/// attempt, lease_until, eligible_at)` of `row`, starting at column `first`.
pub(super) fn claimed_from(
    row: &tokio_postgres::Row,
    first: usize,
    owner: &str,
    sent: Instant,
    ttl: Duration,
) -> Result<Claimed> {
    Ok(Claimed {
        lease: Lease {
            id: col(row, first)?,
            queue: col(row, first + 1)?,
            key: col(row, first + 2)?,
            epoch: col(row, first + 4)?,
            attempt: col(row, first + 5)?,
            lease_until: col(row, first + 6)?,
            eligible_at: col(row, first + 7)?,
            owner: owner.to_owned(),
            claim_sent_at: sent,
            ttl,
        },
        payload: col(row, first + 3)?,
    })
}
