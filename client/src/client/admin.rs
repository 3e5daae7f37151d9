//! Housekeeping and the observability views.

use super::rows::{col, count_arg, from_micros};
use super::statements::Query;
use super::Client;
use crate::error::Result;
use crate::queue::{DeadLetter, Holder, InFlight, QueueStats, Reaped};

impl Client {
    /// `lease.reap`: recovers up to `max_rows` expired leases (new epoch,
    /// backoff, dead letter or cancelled). The extension's background worker
    /// runs it when preloaded. Needs `lease_admin`.
    pub async fn reap(&self, max_rows: u32) -> Result<Vec<Reaped>> {
        let n = count_arg(max_rows, "max_rows")?;
        self.call(|c| async move {
            let rows = c.query(Query::Reap, &[&n]).await?;
            rows.iter()
                .map(|r| {
                    Ok(Reaped {
                        queue: col(r, 0)?,
                        requeued: col(r, 1)?,
                        dead: col(r, 2)?,
                        cancelled: col(r, 3)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.purge`: deletes up to `max_rows` finished rows past their
    /// queue's retention; returns how many. Needs `lease_admin`.
    pub async fn purge(&self, max_rows: u32) -> Result<i64> {
        let n = count_arg(max_rows, "max_rows")?;
        self.call(|c| async move {
            let row = c.query_one(Query::Purge, &[&n]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.queue_stats`, one entry per queue. Needs `lease_admin`.
    pub async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.call(|c| async move {
            let rows = c.query(Query::QueueStats, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(QueueStats {
                        queue: col(r, 0)?,
                        pending: col(r, 1)?,
                        ready: col(r, 2)?,
                        leased: col(r, 3)?,
                        expired: col(r, 4)?,
                        done: col(r, 5)?,
                        dead: col(r, 6)?,
                        cancelled: col(r, 7)?,
                        oldest_ready_age: col::<Option<i64>>(r, 8)?.map(from_micros),
                        recovered_total: col(r, 9)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.in_flight`: leased rows, of one queue or all. Needs
    /// `lease_admin`.
    pub async fn in_flight(&self, queue: Option<&str>) -> Result<Vec<InFlight>> {
        self.call(|c| async move {
            let rows = c.query(Query::InFlight, &[&queue]).await?;
            rows.iter()
                .map(|r| {
                    let remaining: i64 = col(r, 7)?;
                    Ok(InFlight {
                        id: col(r, 0)?,
                        queue: col(r, 1)?,
                        key: col(r, 2)?,
                        owner: col(r, 3)?,
                        epoch: col(r, 4)?,
                        attempt: col(r, 5)?,
                        lease_until: col(r, 6)?,
                        remaining: from_micros(remaining),
                        expired: remaining <= 0,
                        cancel_requested: col(r, 8)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.holders`: current holders of named leases. Needs
    /// `lease_admin`.
    pub async fn holders(&self) -> Result<Vec<Holder>> {
        self.call(|c| async move {
            let rows = c.query(Query::Holders, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(Holder {
                        name: col(r, 0)?,
                        owner: col(r, 1)?,
                        epoch: col(r, 2)?,
                        acquired_at: col(r, 3)?,
                        lease_until: col(r, 4)?,
                        remaining: from_micros(col(r, 5)?),
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.dead_letters`: up to `limit` dead rows (oldest id first), of
    /// one queue or all. Needs `lease_admin`.
    pub async fn dead_letters(&self, queue: Option<&str>, limit: u32) -> Result<Vec<DeadLetter>> {
        let limit = i64::from(limit);
        self.call(|c| async move {
            let rows = c.query(Query::DeadLetters, &[&queue, &limit]).await?;
            rows.iter()
                .map(|r| {
                    Ok(DeadLetter {
                        id: col(r, 0)?,
                        queue: col(r, 1)?,
                        key: col(r, 2)?,
                        payload: col(r, 3)?,
                        attempts: col(r, 4)?,
                        last_error: col(r, 5)?,
                        finished_at: col(r, 6)?,
                    })
                })
                .collect()
        })
        .await
    }
}
