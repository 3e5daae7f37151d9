//! Rows read without their payloads, or with only the start of one: what
//! a listing or a page shows, at a cost that does not grow with payloads
//! (a queue's `max_payload_bytes` allows up to 256 MiB each).

use tokio_postgres::Row;

use super::admin::{in_filter, lookup, Lookup};
use super::rows::{col, count_arg};
use super::statements::Query;
use super::Client;
use crate::error::Result;
use crate::queue::{DeadLetterSummary, JobFilter, JobPreview, JobSummary};

impl Client {
    /// [`Client::dead_letters`] without the payloads: up to `limit` dead
    /// rows (oldest id first), of one queue or all, each `last_error` cut
    /// after 2,000 characters. Needs `lease_admin`.
    pub async fn dead_letter_summaries(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeadLetterSummary>> {
        let limit = i64::from(limit);
        self.call(|c| async move {
            let rows = c
                .query(Query::DeadLetterSummaries, &[&queue, &limit])
                .await?;
            rows.iter()
                .map(|r| {
                    Ok(DeadLetterSummary {
                        id: col(r, 0)?,
                        queue: col(r, 1)?,
                        key: col(r, 2)?,
                        attempts: col(r, 3)?,
                        last_error: col(r, 4)?,
                        finished_at: col(r, 5)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// [`Client::jobs`] without the payloads: the same rows, read the same
    /// way and with the same rights (the superuser), each `last_error` cut
    /// after 2,000 characters.
    pub async fn job_summaries(&self, filter: &JobFilter) -> Result<Vec<JobSummary>> {
        let (queue, state, limit, after) = match lookup(filter)? {
            Lookup::Key { queue, key } => {
                let row = self
                    .call(|c| async move {
                        let rows = c.query(Query::JobSummaryByKey, &[&queue, &key]).await?;
                        rows.first().map(job_summary).transpose()
                    })
                    .await?;
                return Ok(row
                    .into_iter()
                    .filter(|j| in_filter(filter, j.state, j.id))
                    .collect());
            }
            Lookup::Page(page) => page,
        };
        self.call(|c| async move {
            let rows = c
                .query(Query::JobSummaries, &[&queue, &state, &limit, &after])
                .await?;
            rows.iter().map(job_summary).collect()
        })
        .await
    }

    /// Row `id` of `lease.job` with the first `payload_chars` characters of
    /// its payload's JSON text and that text's whole length: the rest of
    /// the payload stays in the database (0 reads only the length).
    /// `None` if there is no such row. Superuser only, like
    /// [`Client::job`].
    pub async fn job_preview(&self, id: i64, payload_chars: u32) -> Result<Option<JobPreview>> {
        let chars = count_arg(payload_chars, "payload_chars")?;
        self.call(|c| async move {
            let rows = c.query(Query::JobPreview, &[&id, &chars]).await?;
            rows.first()
                .map(|r| {
                    Ok(JobPreview {
                        job: job_summary(r)?,
                        payload_head: col(r, 16)?,
                        payload_bytes: col(r, 17)?,
                    })
                })
                .transpose()
        })
        .await
    }
}

/// A row from the columns of `job_summary_select!`.
fn job_summary(r: &Row) -> Result<JobSummary> {
    Ok(JobSummary {
        id: col(r, 0)?,
        queue: col(r, 1)?,
        key: col(r, 2)?,
        state: col::<String>(r, 3)?.parse()?,
        priority: col(r, 4)?,
        rank: col(r, 5)?,
        next_at: col(r, 6)?,
        attempt: col(r, 7)?,
        epoch: col(r, 8)?,
        owner: col(r, 9)?,
        lease_until: col(r, 10)?,
        cancel_requested: col(r, 11)?,
        last_error: col(r, 12)?,
        created_at: col(r, 13)?,
        finished_at: col(r, 14)?,
        unique_key: col(r, 15)?,
    })
}
