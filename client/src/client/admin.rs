//! Housekeeping, the observability views, and read-only looks at the
//! tables behind them (queue policies, rows, the installed version).

use tokio_postgres::Row;

use super::rows::{col, count_arg, from_micros};
use super::statements::Query;
use super::Client;
use crate::error::{Error, Result, LEASE_LOST_SQLSTATE};
use crate::lease::JobState;
use crate::queue::{
    DeadLetter, ExtensionVersions, FairnessKey, Holder, InFlight, JobFilter, JobRecord,
    QueueMetrics, QueueSettings, QueueStats, RateLimit, Reaped, ReaperStats,
};

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

    /// `lease.sweep`, fenced by named lease `name` at `epoch`: one
    /// housekeeping pass (reap, schedules, purge, counters) that commits
    /// only while `epoch` holds `name`; returns (recovered, purged).
    /// [`Error::NamedLeaseLost`] (nothing changed) when it no longer does.
    /// [`Sweeper`](crate::Sweeper) runs it. Needs `lease_admin`.
    pub async fn sweep_fenced(&self, name: &str, epoch: i64, max_rows: u32) -> Result<(i64, i64)> {
        let n = count_arg(max_rows, "max_rows")?;
        self.call(|c| async move {
            let row = c
                .query_one(Query::SweepFenced, &[&name, &epoch, &n])
                .await
                .map_err(|e| match e.sqlstate() {
                    Some(LEASE_LOST_SQLSTATE) => Error::NamedLeaseLost {
                        name: name.to_owned(),
                        epoch,
                    },
                    _ => e,
                })?;
            Ok((col(&row, 0)?, col(&row, 1)?))
        })
        .await
    }

    /// `lease.apply_write_backs`: applies up to `max_rows` due
    /// `on_dead`/`on_cancel` write-backs of the attached tables that this
    /// connection's login role owns (none if it owns none); returns how many
    /// it handled. The [`Sweeper`](crate::Sweeper) calls it after each sweep,
    /// for installs without the library, where no background worker does.
    /// The connection must log in as the tables' owner (no `SET ROLE`).
    pub async fn apply_write_backs(&self, max_rows: u32) -> Result<i32> {
        let n = count_arg(max_rows, "max_rows")?;
        self.call(|c| async move {
            let row = c.query_one(Query::ApplyWriteBacks, &[&n]).await?;
            col(&row, 0)
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

    /// `lease.queue_stats` (read through `lease.read_queue_stats()`), one
    /// entry per queue. Needs `lease_admin`.
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
                        paused: col(r, 10)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.metrics` (read through `lease.read_metrics()`), one entry per
    /// queue: gauges and monotonic totals at a cost that does not grow with
    /// the number of rows (cheap enough to poll from a metrics exporter).
    /// Needs `lease_admin`.
    pub async fn metrics(&self) -> Result<Vec<QueueMetrics>> {
        self.call(|c| async move {
            let rows = c.query(Query::Metrics, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(QueueMetrics {
                        queue: col(r, 0)?,
                        ready: col(r, 1)?,
                        delayed: col(r, 2)?,
                        leased: col(r, 3)?,
                        expired: col(r, 4)?,
                        dead: col(r, 5)?,
                        oldest_ready_age: col::<Option<i64>>(r, 6)?.map(from_micros),
                        reap_lag: col::<Option<i64>>(r, 7)?.map(from_micros),
                        enqueued_total: col(r, 8)?,
                        claimed_total: col(r, 9)?,
                        done_total: col(r, 10)?,
                        retried_total: col(r, 11)?,
                        dead_total: col(r, 12)?,
                        cancelled_total: col(r, 13)?,
                        recovered_total: col(r, 14)?,
                        held: col(r, 15)?,
                        paused: col(r, 16)?,
                        rate_limit: rate_limit(r, 17)?,
                        rate_used: col(r, 19)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.in_flight` (read through `lease.read_in_flight`): leased rows,
    /// of one queue or all. Needs `lease_admin`.
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

    /// `lease.fairness_keys` (read through `lease.read_fairness_keys`): the
    /// fairness keys of `queue` (or of every queue) with their weights,
    /// rows and rate limits, and which of them a full window holds back.
    /// Needs `lease_admin` (or `SELECT` on the view).
    pub async fn fairness_keys(&self, queue: Option<&str>) -> Result<Vec<FairnessKey>> {
        self.call(|c| async move {
            let rows = c.query(Query::FairnessKeys, &[&queue]).await?;
            rows.iter()
                .map(|r| {
                    Ok(FairnessKey {
                        queue: col(r, 0)?,
                        fairness_key: col(r, 1)?,
                        weight: col(r, 2)?,
                        pending: col(r, 3)?,
                        ready: col(r, 4)?,
                        leased: col(r, 5)?,
                        rate_limit: rate_limit(r, 6)?,
                        claimed_in_period: col(r, 8)?,
                        held_until: col(r, 9)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.wait_reason`: why pending row `id` has not been claimed, as
    /// the claim would decide now (held for a concurrency slot, its queue
    /// paused, not due yet, a rate limit of its queue or fairness key with
    /// the time it has room again, or ready); `None` if it is not pending.
    /// Needs `lease_admin`.
    pub async fn wait_reason(&self, id: i64) -> Result<Option<String>> {
        self.call(|c| async move {
            let row = c.query_one(Query::WaitReason, &[&id]).await?;
            col(&row, 0)
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

    /// `lease.dead_letters` (read through `lease.read_dead_letters`): up to
    /// `limit` dead rows (oldest id first), of
    /// one queue or all, payloads included
    /// ([`Client::dead_letter_summaries`] leaves them out). Needs
    /// `lease_admin`.
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

    /// `lease.reaper_stats`: the housekeeping counters of this database
    /// and, server-wide, whether the background reaper runs at all. Needs
    /// `lease_admin`.
    pub async fn reaper_stats(&self) -> Result<ReaperStats> {
        self.call(|c| async move {
            let r = c.query_one(Query::ReaperStats, &[]).await?;
            Ok(ReaperStats {
                database: col(&r, 0)?,
                sweeps: col(&r, 1)?,
                recovered: col(&r, 2)?,
                purged: col(&r, 3)?,
                last_sweep_at: col(&r, 4)?,
                last_duration: col::<Option<i64>>(&r, 5)?.map(from_micros),
                last_error: col(&r, 6)?,
                last_error_at: col(&r, 7)?,
                slot_shortages: col(&r, 8)?,
                last_slot_shortage_at: col(&r, 9)?,
            })
        })
        .await
    }

    /// `lease.queue`: every queue's policy, by name. Needs `lease_admin`.
    pub async fn queue_settings(&self) -> Result<Vec<QueueSettings>> {
        self.call(|c| async move {
            let rows = c.query(Query::QueueSettings, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(QueueSettings {
                        name: col(r, 0)?,
                        max_attempts: col(r, 1)?,
                        backoff_base: from_micros(col(r, 2)?),
                        backoff_max: from_micros(col(r, 3)?),
                        retention: from_micros(col(r, 4)?),
                        dead_retention: from_micros(col(r, 5)?),
                        jitter: col(r, 6)?,
                        restricted: col(r, 7)?,
                        attached: col(r, 8)?,
                        created_at: col(r, 9)?,
                        rate_limit: rate_limit(r, 10)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// Rows of `lease.job` in every state, lowest id first, as `filter`
    /// says. It reads the table itself, which only the superuser may (no
    /// view shows rows in every state); others get
    /// [`Error::PermissionDenied`](crate::Error::PermissionDenied).
    ///
    /// A `key` needs a `queue` ([`Error::InvalidInput`](crate::Error::InvalidInput)
    /// otherwise) and is found through the queue's key index. Otherwise a
    /// page starts after `after` and reads about a page of rows: it walks
    /// the primary key, or with a `state` that state's partial index when
    /// the planner finds it cheaper (the few leased, dead or cancelled rows
    /// of a big queue). Done rows have no index by id: a page of them walks
    /// the primary key or the queue's finished rows.
    ///
    /// Payloads included: [`Client::job_summaries`] leaves them out.
    pub async fn jobs(&self, filter: &JobFilter) -> Result<Vec<JobRecord>> {
        let (queue, state, limit, after) = match lookup(filter)? {
            Lookup::Key { queue, key } => {
                let row = self.job_by_key(queue, key).await?;
                return Ok(row
                    .into_iter()
                    .filter(|j| in_filter(filter, j.state, j.id))
                    .collect());
            }
            Lookup::Page(page) => page,
        };
        self.call(|c| async move {
            let rows = c
                .query(Query::Jobs, &[&queue, &state, &limit, &after])
                .await?;
            rows.iter().map(job_record).collect()
        })
        .await
    }

    /// The row of `key` in `queue`, if any.
    async fn job_by_key(&self, queue: &str, key: &str) -> Result<Option<JobRecord>> {
        self.call(|c| async move {
            let rows = c.query(Query::JobByKey, &[&queue, &key]).await?;
            rows.first().map(job_record).transpose()
        })
        .await
    }

    /// Row `id` of `lease.job`, every column; `None` if there is no such
    /// row (never enqueued, or purged). Superuser only, like
    /// [`Client::jobs`]. [`Client::job_preview`] reads only the start of
    /// the payload.
    pub async fn job(&self, id: i64) -> Result<Option<JobRecord>> {
        self.call(|c| async move {
            let rows = c.query(Query::Job, &[&id]).await?;
            rows.first().map(job_record).transpose()
        })
        .await
    }

    /// The connected database's name, the pg_lease version created in it
    /// and the one the server's files offer; any role may ask.
    pub async fn extension_versions(&self) -> Result<ExtensionVersions> {
        self.call(|c| async move {
            let r = c.query_one(Query::ExtensionVersions, &[]).await?;
            Ok(ExtensionVersions {
                database: col(&r, 0)?,
                installed: col(&r, 1)?,
                available: col(&r, 2)?,
            })
        })
        .await
    }
}

/// Whether the row of a key, in `state` with `id`, is on the page `filter`
/// asks for (the key itself found it).
/// What a [`JobFilter`] reads: the row of one key in one queue, or a page
/// (queue, state name, limit, the id it starts after).
pub(super) enum Lookup<'a> {
    Key { queue: &'a str, key: &'a str },
    Page((Option<&'a str>, Option<&'static str>, i64, i64)),
}

/// The lookup `filter` asks for; a key without a queue is refused.
pub(super) fn lookup(filter: &JobFilter) -> Result<Lookup<'_>> {
    match (&filter.key, &filter.queue) {
        (Some(_), None) => Err(Error::invalid("a key filter needs a queue")),
        (Some(key), Some(queue)) => Ok(Lookup::Key { queue, key }),
        (None, queue) => Ok(Lookup::Page((
            queue.as_deref(),
            filter.state.map(state_name),
            i64::from(filter.limit),
            filter.after.unwrap_or(i64::MIN),
        ))),
    }
}

pub(super) fn in_filter(filter: &JobFilter, state: JobState, id: i64) -> bool {
    filter.state.is_none_or(|s| s == state)
        && filter.after.is_none_or(|after| id > after)
        && filter.limit > 0
}

/// The SQL name of a state (`lease.job_state`).
pub(super) fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "pending",
        JobState::Leased => "leased",
        JobState::Done => "done",
        JobState::Dead => "dead",
        JobState::Cancelled => "cancelled",
    }
}

/// A `lease.job` row from the columns of `job_columns!`.
fn job_record(r: &Row) -> Result<JobRecord> {
    Ok(JobRecord {
        id: col(r, 0)?,
        queue: col(r, 1)?,
        key: col(r, 2)?,
        payload: col(r, 3)?,
        state: col::<String>(r, 4)?.parse()?,
        priority: col(r, 5)?,
        rank: col(r, 6)?,
        next_at: col(r, 7)?,
        attempt: col(r, 8)?,
        epoch: col(r, 9)?,
        owner: col(r, 10)?,
        lease_until: col(r, 11)?,
        cancel_requested: col(r, 12)?,
        last_error: col(r, 13)?,
        created_at: col(r, 14)?,
        finished_at: col(r, 15)?,
        unique_key: col(r, 16)?,
    })
}

/// A rate limit from columns `i` (the limit, NULL for none) and `i + 1`
/// (the period in microseconds).
fn rate_limit(r: &Row, i: usize) -> Result<Option<RateLimit>> {
    Ok(match col::<Option<i32>>(r, i)? {
        Some(limit) => Some(RateLimit {
            limit,
            period: from_micros(col(r, i + 1)?),
        }),
        None => None,
    })
}
