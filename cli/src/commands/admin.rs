//! Housekeeping by hand: `sweep` (alias `reap`) and `purge`.

use pg_lease_client::{Client, Reaped};
use serde_json::{json, Value};

use super::Done;
use crate::error::CliError;
use crate::output::{Output, Table};

/// `pg-lease sweep`: what one pass of the reaper does, `lease.reap` then
/// `lease.purge`, through the client's calls of the two. Unlike
/// `lease.sweep` it reports a failure instead of recording it, and leaves
/// `reaper_stats` alone: its counters stay the background reaper's.
pub async fn sweep(client: &Client, out: Output, max_rows: u32) -> Result<Done, CliError> {
    let reaped = client.reap(max_rows).await?;
    let purged = client.purge(max_rows).await?;
    if out.is_json() {
        out.json(&json!({
            "reaped": reaped.iter().map(reaped_json).collect::<Vec<_>>(),
            "purged": purged,
        }))?;
        return Ok(Done::All);
    }
    let mut t = Table::new(&["queue", "requeued", "dead", "cancelled"]);
    for r in reaped {
        t.row(vec![
            r.queue,
            r.requeued.to_string(),
            r.dead.to_string(),
            r.cancelled.to_string(),
        ]);
    }
    out.text(&format!("{}{purged} rows purged\n", t.render()))?;
    Ok(Done::All)
}

/// What `reap` recovered in one queue, as JSON.
fn reaped_json(r: &Reaped) -> Value {
    json!({
        "queue": r.queue,
        "requeued": r.requeued,
        "dead": r.dead,
        "cancelled": r.cancelled,
    })
}

/// `pg-lease purge`.
pub async fn purge(client: &Client, out: Output, max_rows: u32) -> Result<Done, CliError> {
    let purged = client.purge(max_rows).await?;
    if out.is_json() {
        out.json(&json!({ "purged": purged }))?;
    } else {
        out.text(&format!("{purged} rows purged\n"))?;
    }
    Ok(Done::All)
}
