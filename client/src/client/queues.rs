//! Queues and their rows: create and drop queues, enqueue, cancel, requeue, grants.

use std::time::Duration;

use serde::Serialize;

use super::args;
use super::rows::{cancel_result, col, micros};
use super::statements::Query;
use super::Client;
use crate::error::Result;
use crate::lease::CancelResult;
use crate::queue::{BatchOptions, EnqueueOptions, QueueOptions, RateLimit};

impl Client {
    /// `lease.pause`: claims take none of `queue`'s rows until
    /// [`resume`](Client::resume); leases held run on. `false` if it was
    /// paused already. Needs `lease_admin`.
    pub async fn pause(&self, queue: &str) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Query::Pause, &[&queue]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.purge_dead`: deletes every dead letter of `queue` now;
    /// returns how many. Needs `lease_admin`.
    pub async fn purge_dead(&self, queue: &str) -> Result<i64> {
        self.call(|c| async move {
            let row = c.query_one(Query::PurgeDead, &[&queue]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.resume`: claims take `queue`'s rows again (idle workers are
    /// woken). `false` if it was not paused. Needs `lease_admin`.
    pub async fn resume(&self, queue: &str) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Query::Resume, &[&queue]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.set_weight`: gives `fairness_key` of `queue` the weight
    /// `weight` (1..=1000; a key never weighed weighs 1), for the rows
    /// enqueued from now on: while several keys have ready rows, claims
    /// take rows of each in proportion to their weights (see
    /// [`EnqueueOptions::fairness_key`](crate::EnqueueOptions::fairness_key)).
    /// Needs `lease_admin`.
    pub async fn set_weight(&self, queue: &str, fairness_key: &str, weight: i32) -> Result<()> {
        self.call(|c| async move {
            c.query_one(Query::SetWeight, &[&queue, &fairness_key, &weight])
                .await?;
            Ok(())
        })
        .await
    }

    /// `lease.set_key_rate`: limits the rows of `fairness_key` of `queue`
    /// to `rate_limit` claimed in any span of its period (a sliding window
    /// on the database clock), whatever the other keys do; `None` lifts the
    /// key's limit. Rows held back stay pending, and a claim that meets a
    /// full key takes other keys' rows instead (see
    /// [`EnqueueOptions::fairness_key`](crate::EnqueueOptions::fairness_key)).
    /// Needs `lease_admin`.
    pub async fn set_key_rate(
        &self,
        queue: &str,
        fairness_key: &str,
        rate_limit: Option<RateLimit>,
    ) -> Result<()> {
        let limit = rate_limit.map(|r| r.limit);
        // The SQL function's default period when there is no limit.
        let period = rate_limit.map_or(Duration::from_secs(1), |r| r.period);
        let period = micros(period, "rate_period")?;
        self.call(|c| async move {
            c.query_one(Query::SetKeyRate, &[&queue, &fairness_key, &limit, &period])
                .await?;
            Ok(())
        })
        .await
    }

    /// `lease.create_queue`: creates queue `name` or updates its policy (so
    /// every replica may call it at start). Needs `lease_admin`.
    pub async fn create_queue(&self, name: &str, options: &QueueOptions) -> Result<()> {
        let base = micros(options.backoff_base, "backoff_base")?;
        let max = micros(options.backoff_max, "backoff_max")?;
        let retention = micros(options.retention, "retention")?;
        let dead = micros(options.dead_retention, "dead_retention")?;
        let attempts = options.max_attempts;
        let jitter = if options.jitter { "full" } else { "none" };
        let concurrency = options.concurrency;
        let max_payload = options.max_payload_bytes;
        let rate_limit = options.rate_limit.map(|r| r.limit);
        // The SQL function's default period when there is no limit.
        let rate_period = options
            .rate_limit
            .map_or(Duration::from_secs(1), |r| r.period);
        let rate_period = micros(rate_period, "rate_period")?;
        self.call(|c| async move {
            c.query(
                Query::CreateQueue,
                &[
                    &name,
                    &attempts,
                    &base,
                    &max,
                    &retention,
                    &dead,
                    &jitter,
                    &concurrency,
                    &max_payload,
                    &rate_limit,
                    &rate_period,
                ],
            )
            .await
            .map(drop)
        })
        .await
    }

    /// `lease.drop_queue`: deletes queue `name` and its rows, returning how
    /// many rows went. Refused (SQLSTATE `55006`, [`Error::Database`]) while
    /// rows are pending or leased unless `force`. Needs `lease_admin`.
    pub async fn drop_queue(&self, name: &str, force: bool) -> Result<i64> {
        self.call(|c| async move {
            let row = c.query_one(Query::DropQueue, &[&name, &force]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.enqueue` with default options: adds `payload` to `queue`,
    /// claimable at once, and returns the row id.
    pub async fn enqueue<P: Serialize + ?Sized>(&self, queue: &str, payload: &P) -> Result<i64> {
        self.enqueue_with(queue, payload, &EnqueueOptions::default())
            .await
    }

    /// `lease.enqueue` with a key (idempotent on `(queue, key)`), a delay
    /// and a priority.
    pub async fn enqueue_with<P: Serialize + ?Sized>(
        &self,
        queue: &str,
        payload: &P,
        options: &EnqueueOptions,
    ) -> Result<i64> {
        let args = args::Enqueue::new(queue, payload, options)?;
        let params = &args.params();
        self.call(|c| async move {
            let row = c.query_one(Query::Enqueue, params).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.enqueue_batch`: adds many rows in one statement and returns
    /// their ids in input order.
    pub async fn enqueue_batch<P: Serialize>(
        &self,
        queue: &str,
        payloads: &[P],
        options: &BatchOptions,
    ) -> Result<Vec<i64>> {
        let args = args::EnqueueBatch::new(queue, payloads, options)?;
        let params = &args.params();
        self.call(|c| async move {
            let rows = c.query(Query::EnqueueBatch, params).await?;
            rows.iter().map(|r| col(r, 0)).collect()
        })
        .await
    }

    /// `lease.cancel`: a pending row is cancelled at once; a leased row is
    /// marked and its owner told on its next renewal.
    pub async fn cancel(&self, id: i64) -> Result<CancelResult> {
        let state: Option<String> = self
            .call(|c| async move {
                let row = c.query_one(Query::Cancel, &[&id]).await?;
                col(&row, 0)
            })
            .await?;
        cancel_result(state)
    }

    /// `lease.cancel_key`: [`cancel`](Client::cancel) for the row of
    /// `queue` with `key` (an attached table's row: its primary key as
    /// text), when the id is not known.
    pub async fn cancel_key(&self, queue: &str, key: &str) -> Result<CancelResult> {
        let state: Option<String> = self
            .call(|c| async move {
                let row = c.query_one(Query::CancelKey, &[&queue, &key]).await?;
                col(&row, 0)
            })
            .await?;
        cancel_result(state)
    }

    /// `lease.requeue`: a dead letter back to pending, claimable now, its
    /// attempts reset. `false` if the row is not dead. Needs `lease_admin`.
    pub async fn requeue(&self, id: i64) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Query::Requeue, &[&id]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.grant`: gives `role` the right to work `queue` and/or to
    /// produce into it; the first grant restricts the queue to its grantees
    /// and `lease_admin`. Needs `lease_admin`.
    pub async fn grant(&self, queue: &str, role: &str, work: bool, produce: bool) -> Result<()> {
        self.call(|c| async move {
            c.query(Query::Grant, &[&queue, &role, &work, &produce])
                .await?;
            Ok(())
        })
        .await
    }

    /// `lease.revoke`: removes `role`'s grant on `queue` (which stays
    /// restricted); whether there was one. Needs `lease_admin`.
    pub async fn revoke(&self, queue: &str, role: &str) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Query::Revoke, &[&queue, &role]).await?;
            col(&row, 0)
        })
        .await
    }
}
