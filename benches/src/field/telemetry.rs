//! The harness's JSONL protocol on stdout: one descriptor line at start,
//! then one record per metric every tick, ticks aligned to the wall clock.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The `system` key of every record (and the harness's adapter name).
pub const SYSTEM: &str = "pg_lease";

/// Now, as the harness writes times: RFC 3339, milliseconds, UTC.
pub fn now_iso() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// Milliseconds since the Unix epoch: what a payload carries as the time
/// it was produced, so that any replica can measure its pickup latency.
pub fn now_epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Time until the next multiple of `every` on the wall clock, so that the
/// samples of every adapter line up whatever second each started in.
pub fn until_next_boundary(every: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let every_ms = every.as_millis().max(1);
    let into = now.as_millis() % every_ms;
    Duration::from_millis(u64::try_from(every_ms - into).unwrap_or(0))
}

fn emit(record: &Value) {
    // One write per line, flushed: the harness tails stdout line by line.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{record}");
    let _ = out.flush();
}

/// What the descriptor line says about this run.
pub struct Descriptor<'a> {
    pub db_name: &'a str,
    pub event_tables: &'a [&'a str],
    pub extension_version: &'a str,
}

/// The startup descriptor (checked by the harness against `adapter.json`).
pub fn descriptor(d: &Descriptor<'_>) {
    emit(&json!({
        "kind": "descriptor",
        "system": SYSTEM,
        "event_tables": d.event_tables,
        "extensions": ["pg_lease"],
        "version": env!("CARGO_PKG_VERSION"),
        "schema_version": d.extension_version,
        "db_name": d.db_name,
        "started_at": now_iso(),
    }));
}

/// One sample of one metric, at time `t`, over `window_s` seconds (0 for a
/// gauge).
pub fn sample(t: &str, instance: u32, metric: &str, value: f64, window_s: f64) {
    emit(&json!({
        "t": t,
        "system": SYSTEM,
        "instance_id": instance,
        "kind": "adapter",
        "subject_kind": "adapter",
        "subject": "",
        "metric": metric,
        "value": value,
        "window_s": window_s,
    }));
}
