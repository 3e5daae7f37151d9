//! `status` (queues, reaper health and named-lease holders at a glance)
//! and `watch` (the same, refreshed).

use std::time::{Duration, SystemTime};

use pg_lease_client::{Client, ExtensionVersions, Holder, QueueStats, ReaperStats};
use serde_json::{json, Value};

use super::queues::{holder_json, holders_table, stats_json, stats_table};
use super::Done;
use crate::error::CliError;
use crate::output::{age, fields, rfc3339, secs, time_json, time_text, Output};

/// Everything `status` shows, read one view after the other.
struct Snapshot {
    versions: ExtensionVersions,
    queues: Vec<QueueStats>,
    /// Why not, if this role may not read `lease.reaper_stats`.
    reaper: Result<ReaperStats, String>,
    holders: Vec<Holder>,
}

impl Snapshot {
    async fn read(client: &Client) -> Result<Snapshot, CliError> {
        // First, because without the extension every other read fails
        // with a message about a missing relation.
        let versions = client.extension_versions().await?;
        if versions.installed.is_none() {
            return Err(CliError::NotFound(not_installed(&versions)));
        }
        let queues = client.queue_stats().await?;
        let reaper = match client.reaper_stats().await {
            Ok(r) => Ok(r),
            // A role that may read the view but not execute the functions
            // it calls (pg_read_all_data alone): the rest is still worth
            // showing.
            Err(e @ pg_lease_client::Error::PermissionDenied(_)) => {
                Err(CliError::Client(e).to_string())
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Snapshot {
            queues,
            reaper,
            holders: client.holders().await?,
            versions,
        })
    }

    /// Everything could be read.
    fn complete(&self) -> bool {
        self.reaper.is_ok()
    }

    fn to_json(&self) -> Value {
        json!({
            "database": self.versions.database,
            "extension": {
                "installed": self.versions.installed,
                "available": self.versions.available,
            },
            "queues": self.queues.iter().map(stats_json).collect::<Vec<_>>(),
            "reaper": self.reaper.as_ref().ok().map(|r| self.reaper_json(r)),
            "reaper_error": self.reaper.as_ref().err(),
            "holders": self.holders.iter().map(holder_json).collect::<Vec<_>>(),
        })
    }

    fn reaper_json(&self, r: &ReaperStats) -> Value {
        json!({
            "preloaded": r.preloaded(),
            "sweeps": r.sweeps,
            "recovered": r.recovered,
            "purged": r.purged,
            "last_sweep_at": time_json(r.last_sweep_at),
            "last_duration_secs": r.last_duration.map(secs),
            "last_error": r.last_error,
            "last_error_at": time_json(r.last_error_at),
            "slot_shortages": r.slot_shortages,
            "last_slot_shortage_at": time_json(r.last_slot_shortage_at),
            "expired_waiting": self.expired(),
        })
    }

    fn to_text(&self, now: SystemTime) -> String {
        let installed = self.versions.installed.as_deref().unwrap_or("?");
        let mut text = format!(
            "pg_lease {installed} in database {:?}",
            self.versions.database
        );
        if let Some(available) = &self.versions.available {
            if available != installed {
                text.push_str(&format!(" ({available} available: pg-lease upgrade)"));
            }
        }
        text.push_str("\n\n");
        text.push_str(&stats_table(&self.queues).render());
        text.push('\n');
        text.push_str(&self.reaper_text(now));
        text.push_str("\nnamed leases\n");
        text.push_str(&holders_table(&self.holders).render());
        text
    }

    /// Leases past their end that no sweep has recovered yet: the number
    /// that says whether housekeeping keeps up.
    fn expired(&self) -> i64 {
        self.queues.iter().map(|q| q.expired).sum()
    }

    fn reaper_text(&self, now: SystemTime) -> String {
        let expired = (
            "expired",
            format!(
                "{} (leases past their end, not yet recovered)",
                self.expired()
            ),
        );
        let r = match &self.reaper {
            Ok(r) => r,
            Err(why) => return fields(&[("reaper", format!("unknown: {why}")), expired]),
        };
        let mut lines = vec![(
            "reaper",
            if r.preloaded() {
                "preloaded: the server sweeps this database by itself".to_owned()
            } else {
                "not running: pg_lease is not in shared_preload_libraries; \
                 run `pg-lease sweep` from a scheduler"
                    .to_owned()
            },
        )];
        let last = match (r.last_sweep_at, r.last_duration) {
            (Some(at), Some(took)) => format!("{}, took {}", time_text(Some(at), now), age(took)),
            _ => "none yet in this database".to_owned(),
        };
        lines.push(("last sweep", last));
        lines.push((
            "sweeps",
            format!(
                "{} (recovered {} leases, purged {} rows)",
                r.sweeps, r.recovered, r.purged
            ),
        ));
        lines.push(expired);
        if let Some(error) = &r.last_error {
            let when = time_text(r.last_error_at, now);
            lines.push(("last error", format!("{when} {error}")));
        }
        if let Some(n) = r.slot_shortages.filter(|n| *n > 0) {
            let when = time_text(r.last_slot_shortage_at, now);
            lines.push(("slot shortages", format!("{n}, last {when}")));
        }
        fields(&lines)
    }
}

/// What to say when the database has no pg_lease.
fn not_installed(versions: &ExtensionVersions) -> String {
    match &versions.available {
        Some(v) => format!(
            "pg_lease is not installed in this database (the server offers {v}: pg-lease install)"
        ),
        None => "pg_lease is not installed in this database, nor on the server".to_owned(),
    }
}

/// `pg-lease status`.
pub async fn status(client: &Client, out: Output) -> Result<Done, CliError> {
    let snapshot = Snapshot::read(client).await?;
    if out.is_json() {
        out.json(&snapshot.to_json())?;
    } else {
        out.text(&snapshot.to_text(SystemTime::now()))?;
    }
    if let Err(why) = &snapshot.reaper {
        eprintln!("pg-lease: reaper health unknown: {why}");
    }
    Ok(Done::from_ok(snapshot.complete()))
}

/// `pg-lease watch`: `status` every `interval` until Ctrl-C or `count`
/// refreshes. A refresh that loses the connection is reported and the next
/// one reconnects (a server restart should not end the watch); any other
/// error ends it. Exit 1 if the last refresh failed.
pub async fn watch(
    client: &Client,
    out: Output,
    interval: Duration,
    count: Option<u64>,
) -> Result<Done, CliError> {
    let stop = ctrl_c();
    tokio::pin!(stop);
    let mut refreshes = 0u64;
    let mut last = Done::All;
    loop {
        refreshes += 1;
        let snapshot = tokio::select! {
            s = Snapshot::read(client) => s,
            () = &mut stop => return Ok(last),
        };
        last = match snapshot {
            Ok(s) => {
                show(out, &s, interval)?;
                Done::from_ok(s.complete())
            }
            Err(CliError::Client(e)) if e.is_connection() => {
                eprintln!("pg-lease: {}", CliError::Client(e));
                Done::NotAll
            }
            Err(e) => return Err(e),
        };
        if count.is_some_and(|c| refreshes >= c) {
            return Ok(last);
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = &mut stop => return Ok(last),
        }
    }
}

/// One refresh of `watch`: JSON Lines, a redrawn screen on a terminal, or
/// refreshes one under the other with a header line.
fn show(out: Output, s: &Snapshot, interval: Duration) -> Result<(), CliError> {
    if out.is_json() {
        return out.json_line(&s.to_json());
    }
    let now = SystemTime::now();
    let clear = if out.is_terminal() {
        "\x1b[H\x1b[2J"
    } else {
        ""
    };
    out.text(&format!(
        "{clear}--- {} (every {}; Ctrl-C to stop)\n{}",
        rfc3339(now),
        age(interval),
        s.to_text(now)
    ))
}

/// Resolves on Ctrl-C; never, if the handler cannot be installed (then the
/// default action, ending the process, still applies).
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
