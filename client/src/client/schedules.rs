//! Periodic work: `lease.schedule` and `lease.unschedule`.

use std::time::SystemTime;

use serde::Serialize;

use super::rows::{col, from_micros, micros};
use super::statements::Query;
use super::Client;
use crate::error::{Error, Result};
use crate::queue::{Every, ScheduleInfo, ScheduleOptions};

impl Client {
    /// `lease.schedule`'s rows: every schedule with its next occurrence,
    /// by name. Needs `lease_admin`.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.call(|c| async move {
            let rows = c.query(Query::Schedules, &[]).await?;
            rows.iter()
                .map(|r| {
                    let cron: Option<String> = col(r, 2)?;
                    let period: Option<i64> = col(r, 3)?;
                    let every = match (cron, period) {
                        (Some(spec), _) => Every::Cron(spec),
                        (None, Some(us)) => Every::Period(from_micros(us)),
                        (None, None) => {
                            return Err(Error::Protocol(
                                "a schedule without cron or every".to_owned(),
                            ))
                        }
                    };
                    Ok(ScheduleInfo {
                        name: col(r, 0)?,
                        queue: col(r, 1)?,
                        every,
                        next_at: col(r, 4)?,
                        enqueued: col(r, 5)?,
                        last_run_at: col(r, 6)?,
                        last_error: col(r, 7)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.schedule`: creates or replaces schedule `name`, which
    /// enqueues `payload` into `queue` at every occurrence of `every`, and
    /// returns the first occurrence (database clock). Whoever runs
    /// `lease.sweep()` (the reaper, pg_cron, an operator) enqueues each
    /// occurrence exactly once, keyed `schedule:<name>@<occurrence>`; no
    /// replica needs to lead. Needs `lease_admin`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use pg_lease_client::{Client, Every, ScheduleOptions};
    ///
    /// # async fn example(client: Client) -> Result<(), pg_lease_client::Error> {
    /// let nightly = Every::Cron("0 3 * * *".into()); // 03:00 UTC
    /// client.schedule("compact", "maintenance", &nightly, &serde_json::json!({}), &ScheduleOptions::default()).await?;
    /// let often = Every::Period(Duration::from_secs(30));
    /// client.schedule("poll-feeds", "feeds", &often, &serde_json::json!({"all": true}), &ScheduleOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn schedule<P: Serialize + ?Sized>(
        &self,
        name: &str,
        queue: &str,
        every: &Every,
        payload: &P,
        options: &ScheduleOptions,
    ) -> Result<SystemTime> {
        let payload = serde_json::to_value(payload)?;
        let (cron, period) = match every {
            Every::Cron(spec) => (Some(spec.as_str()), None),
            Every::Period(d) => (None, Some(micros(*d, "every")?)),
        };
        let missed = if options.catch_up { "catch_up" } else { "skip" };
        let priority = options.priority;
        let payload = &payload;
        self.call(|c| async move {
            let row = c
                .query_one(
                    Query::Schedule,
                    &[&name, &queue, &cron, &period, payload, &priority, &missed],
                )
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.unschedule`: deletes schedule `name`; `false` if there was
    /// none. Rows it already enqueued stay. Needs `lease_admin`.
    pub async fn unschedule(&self, name: &str) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Query::Unschedule, &[&name]).await?;
            col(&row, 0)
        })
        .await
    }
}
