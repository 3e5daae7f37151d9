//! Claims and the leases on queue rows: claim, renew, release, fenced writes.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::rows::{
    check_order, claimed_from, col, count_arg, micros, renewal_from_row, split, Interval,
};
use super::statements::Query;
use super::Client;
use crate::error::{Error, Result};
use crate::lease::{Claimed, FencingToken, Lease, Outcome, Renewal};

impl Client {
    /// `lease.claim_pending`: leases up to `limit` claimable rows of `queue`
    /// to `owner` for `ttl` (the arguments in the SQL function's order).
    ///
    /// Each [`Lease`] records the instant this request was sent, before any
    /// connecting: the lease cannot be held past that instant plus `ttl`
    /// ([`Lease::local_expiry`]), whatever the network did.
    pub async fn claim(
        &self,
        limit: u32,
        ttl: Duration,
        owner: &str,
        queue: &str,
    ) -> Result<Vec<Claimed>> {
        self.lease_rows(Query::Claim, limit, ttl, owner, queue)
            .await
    }

    /// `lease.rate_wait`: how long until `queue`'s rate limit lets a claim
    /// take a row again (zero if it would now), or `None` if the queue has
    /// no rate limit. The [`Worker`](crate::Worker) asks after a claim
    /// that came back empty, and sleeps that long rather than polling.
    pub async fn rate_wait(&self, queue: &str) -> Result<Option<Duration>> {
        self.call(|c| async move {
            let row = c.query_one(Query::RateWait, &[&queue]).await?;
            Ok(col::<Option<Interval>>(&row, 0)?.map(|w| w.0))
        })
        .await
    }

    /// `lease.reclaim_own`: for a process restarted under a stable `owner`
    /// name, leases again (under new epochs, for `ttl`) up to `limit` rows
    /// of `queue` that its earlier incarnation still holds, so that work
    /// resumes at once instead of after the old leases expire. Call it at
    /// start-up, before claiming: it would re-issue this incarnation's own
    /// leases too.
    pub async fn reclaim_own(
        &self,
        limit: u32,
        ttl: Duration,
        owner: &str,
        queue: &str,
    ) -> Result<Vec<Claimed>> {
        self.lease_rows(Query::Reclaim, limit, ttl, owner, queue)
            .await
    }

    /// Runs a claim-shaped query (`claim_pending`, `reclaim_own`).
    async fn lease_rows(
        &self,
        query: Query,
        limit: u32,
        ttl: Duration,
        owner: &str,
        queue: &str,
    ) -> Result<Vec<Claimed>> {
        let limit_sql = count_arg(limit, "limit")?;
        let ttl_us = micros(ttl, "ttl")?;
        let sent = Instant::now();
        let rows = self
            .call(|c| async move { c.query(query, &[&limit_sql, &ttl_us, &owner, &queue]).await })
            .await?;
        rows.iter()
            .map(|row| claimed_from(row, 0, owner, sent, ttl))
            .collect()
    }

    /// `lease.renew`: extends `lease` to now + `ttl` (database clock).
    /// [`Error::LeaseLost`] if it is no longer held. Check
    /// [`Renewal::cancel_requested`]: if set, stop and release.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renewal> {
        let ttl_us = micros(ttl, "ttl")?;
        let (id, epoch, owner, queue) = (
            lease.id,
            lease.epoch,
            lease.owner.as_str(),
            lease.queue.as_str(),
        );
        let row = self
            .call(|c| async move {
                c.query_one(Query::Renew, &[&id, &owner, &epoch, &ttl_us, &queue])
                    .await
            })
            .await?;
        let renewal = renewal_from_row(&row)?;
        if !renewal.held {
            return Err(Error::LeaseLost { id, epoch });
        }
        Ok(renewal)
    }

    /// `lease.renew_batch`: one heartbeat for many leases of `owner` on
    /// rows of `queue`; one [`Renewal`] per token, in input order. A lost
    /// lease (also one of another queue) is reported as `held: false`, not
    /// as an error.
    pub async fn renew_batch(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        queue: &str,
        ttl: Duration,
    ) -> Result<Vec<Renewal>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let ttl_us = micros(ttl, "ttl")?;
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let rows = self
            .call(|c| async move {
                c.query(Query::RenewBatch, &[ids, &owner, epochs, &ttl_us, &queue])
                    .await
            })
            .await?;
        let renewals = rows
            .iter()
            .map(renewal_from_row)
            .collect::<Result<Vec<_>>>()?;
        check_order(tokens, renewals.iter().map(|r| r.id))?;
        Ok(renewals)
    }

    /// `lease.release`: ends `lease` with `outcome`.
    /// [`Error::LeaseLost`] (and nothing changed) if it was no longer held.
    pub async fn release(&self, lease: &Lease, outcome: &Outcome) -> Result<()> {
        let token = lease.token();
        if self
            .release_token(&lease.owner, token, &lease.queue, outcome)
            .await?
        {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                id: token.id,
                epoch: token.epoch,
            })
        }
    }

    /// `lease.release` by token of a row of `queue`: `Ok(false)` if the
    /// lease was lost.
    pub(crate) async fn release_token(
        &self,
        owner: &str,
        token: FencingToken,
        queue: &str,
        outcome: &Outcome,
    ) -> Result<bool> {
        if outcome.is_released() {
            return Ok(true);
        }
        let delay = outcome.delay().map(|d| micros(d, "delay")).transpose()?;
        let name = outcome.as_sql();
        let error = outcome.error();
        let (id, epoch) = (token.id, token.epoch);
        self.call(|c| async move {
            let row = c
                .query_one(
                    Query::Release,
                    &[&id, &owner, &epoch, &name, &delay, &error, &queue],
                )
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.release_batch`: ends many leases of `owner` on rows of
    /// `queue` with one outcome in one statement (batched completions). One
    /// `bool` per token, in input order: `false` means that lease was lost
    /// (also one of another queue).
    pub async fn release_batch(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        queue: &str,
        outcome: &Outcome,
    ) -> Result<Vec<bool>> {
        if outcome.is_released() {
            return Ok(vec![true; tokens.len()]);
        }
        let delay = outcome.delay().map(|d| micros(d, "delay")).transpose()?;
        let name = outcome.as_sql();
        let error = outcome.error();
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let rows = self
            .call(|c| async move {
                c.query(
                    Query::ReleaseBatch,
                    &[ids, &owner, epochs, &name, &delay, &error, &queue],
                )
                .await
            })
            .await?;
        let mut released = Vec::with_capacity(rows.len());
        let mut seen = Vec::with_capacity(rows.len());
        for row in &rows {
            seen.push(col::<i64>(row, 0)?);
            released.push(col::<bool>(row, 1)?);
        }
        check_order(tokens, seen.into_iter())?;
        Ok(released)
    }

    /// `lease.release_and_claim`: records the leases of `owner` in
    /// `tokens` (rows of `queue`) as done and claims up to `limit` rows of `queue` for `ttl`,
    /// in one statement and one commit (a worker refilling the slots its
    /// finished jobs freed). Returns one `bool` per token, in order
    /// (`false`: that lease was lost), and the claimed rows.
    pub async fn release_and_claim(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        queue: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<(Vec<bool>, Vec<Claimed>)> {
        let limit_sql = count_arg(limit, "limit")?;
        let ttl_us = micros(ttl, "ttl")?;
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let sent = Instant::now();
        let rows = self
            .call(|c| async move {
                c.query(
                    Query::ReleaseAndClaim,
                    &[ids, &owner, epochs, &limit_sql, &ttl_us, &queue],
                )
                .await
            })
            .await?;
        let mut released = Vec::with_capacity(tokens.len());
        let mut claimed = Vec::new();
        for row in &rows {
            match col::<Option<bool>>(row, 0)? {
                Some(ok) => released.push(ok),
                None => claimed.push(claimed_from(row, 1, owner, sent, ttl)?),
            }
        }
        if released.len() != tokens.len() {
            return Err(Error::Protocol(format!(
                "release_and_claim answered {} of {} releases",
                released.len(),
                tokens.len()
            )));
        }
        Ok((released, claimed))
    }

    /// `lease.fenced_update`: merges `patch` (must serialize to a JSON
    /// object) into the row's payload, only while `token` is the current
    /// lease. [`Error::LeaseLost`] otherwise. On a distributed install
    /// (Citus) the call needs the row's queue: [`fenced_update_in`](Client::fenced_update_in).
    pub async fn fenced_update<P: Serialize + ?Sized>(
        &self,
        token: FencingToken,
        patch: &P,
    ) -> Result<()> {
        self.fenced_update_on(None, token, patch).await
    }

    /// [`fenced_update`](Client::fenced_update) of a row of `queue` (a
    /// lease of another queue is lost); on a distributed install the call
    /// goes to the node holding `queue`. A [`Job`](crate::Job)'s
    /// `fenced_update` passes its queue.
    pub async fn fenced_update_in<P: Serialize + ?Sized>(
        &self,
        queue: &str,
        token: FencingToken,
        patch: &P,
    ) -> Result<()> {
        self.fenced_update_on(Some(queue), token, patch).await
    }

    async fn fenced_update_on<P: Serialize + ?Sized>(
        &self,
        queue: Option<&str>,
        token: FencingToken,
        patch: &P,
    ) -> Result<()> {
        let patch = serde_json::to_value(patch)?;
        let patch = &patch;
        let (id, epoch) = (token.id, token.epoch);
        let applied: bool = self
            .call(|c| async move {
                let row = c
                    .query_one(Query::FencedUpdate, &[&id, &epoch, patch, &queue])
                    .await?;
                col(&row, 0)
            })
            .await?;
        if applied {
            Ok(())
        } else {
            Err(Error::LeaseLost { id, epoch })
        }
    }
}
