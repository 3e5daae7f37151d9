//! Periodic work: `lease.schedule` and `lease.unschedule`.

use std::time::SystemTime;

use serde::Serialize;

use super::rows::{col, micros};
use super::statements::Query;
use super::Client;
use crate::error::Result;
use crate::queue::{Every, ScheduleOptions};

impl Client {
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
