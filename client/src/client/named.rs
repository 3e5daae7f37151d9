//! Named leases: acquire, renew and release a lease on a name (leader election, locks).

use std::time::{Duration, SystemTime};

use super::rows::{col, micros};
use super::statements::Query;
use super::Client;
use crate::error::{Error, Result};

impl Client {
    /// `lease.try_acquire`: takes named lease `name` for `owner` for `ttl`
    /// if it is free, expired, or already `owner`'s, and returns the new
    /// epoch; `None` if someone else holds it.
    pub async fn try_acquire(&self, name: &str, owner: &str, ttl: Duration) -> Result<Option<i64>> {
        let ttl_us = micros(ttl, "ttl")?;
        self.call(|c| async move {
            let row = c
                .query_one(Query::TryAcquire, &[&name, &owner, &ttl_us])
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.renew_named`: extends the hold to now + `ttl` and returns its
    /// new end (database clock); [`Error::NamedLeaseLost`] when the hold is
    /// lost: step down.
    pub async fn renew_named(
        &self,
        name: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> Result<SystemTime> {
        let ttl_us = micros(ttl, "ttl")?;
        let until: Option<SystemTime> = self
            .call(|c| async move {
                let row = c
                    .query_one(Query::RenewNamed, &[&name, &owner, &epoch, &ttl_us])
                    .await?;
                col(&row, 0)
            })
            .await?;
        until.ok_or_else(|| Error::NamedLeaseLost {
            name: name.to_owned(),
            epoch,
        })
    }

    /// `lease.release_named`: gives the hold up so another contender can
    /// take it at once. [`Error::NamedLeaseLost`] if it was already lost.
    pub async fn release_named(&self, name: &str, owner: &str, epoch: i64) -> Result<()> {
        let released: bool = self
            .call(|c| async move {
                let row = c
                    .query_one(Query::ReleaseNamed, &[&name, &owner, &epoch])
                    .await?;
                col(&row, 0)
            })
            .await?;
        if released {
            Ok(())
        } else {
            Err(Error::NamedLeaseLost {
                name: name.to_owned(),
                epoch,
            })
        }
    }

    /// `lease.release_named_batch`: many `(name, epoch)` holds of `owner`
    /// released in one statement; returns `(name, released)` per hold, in
    /// order (`false`: that hold was already lost).
    pub async fn release_named_batch(
        &self,
        owner: &str,
        holds: &[(&str, i64)],
    ) -> Result<Vec<(String, bool)>> {
        let names: Vec<&str> = holds.iter().map(|(name, _)| *name).collect();
        let epochs: Vec<i64> = holds.iter().map(|(_, epoch)| *epoch).collect();
        let (names, epochs) = (&names, &epochs);
        self.call(|c| async move {
            let rows = c
                .query(Query::ReleaseNamedBatch, &[names, &owner, epochs])
                .await?;
            rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
        })
        .await
    }

    /// The former name of [`Client::release_named_batch`].
    #[deprecated(since = "0.2.0", note = "renamed to release_named_batch")]
    pub async fn release_named_many(
        &self,
        owner: &str,
        holds: &[(&str, i64)],
    ) -> Result<Vec<(String, bool)>> {
        self.release_named_batch(owner, holds).await
    }
}
