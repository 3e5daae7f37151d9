//! Queues and leases as the views show them: `queues`, `stats`,
//! `in-flight`, `keys`, `holders`, `schedules`, and `pause`/`resume`. The row converters are shared with `status`.

use std::time::SystemTime;

use pg_lease_client::{Client, Every, FairnessKey, Holder, InFlight, QueueSettings, QueueStats};
use serde_json::{json, Value};

use super::{check_queue, Done};
use crate::error::CliError;
use crate::output::{age, first_line, secs, span, time_json, time_text, Output, Table};

/// `pg-lease queues`: each queue's policy beside its rows by state.
pub async fn queues(client: &Client, out: Output) -> Result<Done, CliError> {
    let settings = client.queue_settings().await?;
    let stats = client.queue_stats().await?;
    let counts = |name: &str| stats.iter().find(|s| s.queue == name);
    if out.is_json() {
        let rows = settings
            .iter()
            .map(|q| queue_json(q, counts(&q.name)))
            .collect();
        out.json(&Value::Array(rows))?;
        return Ok(Done::All);
    }
    let mut t = Table::new(&[
        "queue",
        "state",
        "attempts",
        "backoff",
        "jitter",
        "retention",
        "dead kept",
        "rate",
        "access",
        "pending",
        "ready",
        "leased",
        "dead",
    ]);
    for q in &settings {
        let c = counts(&q.name);
        let n = |f: fn(&QueueStats) -> i64| c.map(f).unwrap_or_default().to_string();
        t.row(vec![
            q.name.clone(),
            c.map(state).unwrap_or_default().to_owned(),
            q.max_attempts.to_string(),
            format!("{}..{}", span(q.backoff_base), span(q.backoff_max)),
            if q.jitter { "full" } else { "none" }.to_owned(),
            span(q.retention),
            span(q.dead_retention),
            q.rate_limit
                .map(|r| format!("{} per {}", r.limit, span(r.period)))
                .unwrap_or_default(),
            access(q).to_owned(),
            n(|s| s.pending),
            n(|s| s.ready),
            n(|s| s.leased),
            n(|s| s.dead),
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// Whether claims take the queue's rows, in a word.
fn state(s: &QueueStats) -> &'static str {
    if s.paused {
        "paused"
    } else {
        "running"
    }
}

/// Who may use a queue, in a word.
fn access(q: &QueueSettings) -> &'static str {
    match (q.attached, q.restricted) {
        (true, true) => "attached, granted",
        (true, false) => "attached",
        (false, true) => "granted",
        (false, false) => "all workers",
    }
}

/// A queue's settings and counts as one JSON object.
fn queue_json(q: &QueueSettings, counts: Option<&QueueStats>) -> Value {
    let mut v = json!({
        "queue": q.name,
        "max_attempts": q.max_attempts,
        "backoff_base_secs": secs(q.backoff_base),
        "backoff_max_secs": secs(q.backoff_max),
        "jitter": if q.jitter { "full" } else { "none" },
        "retention_secs": secs(q.retention),
        "dead_retention_secs": secs(q.dead_retention),
        "rate_limit": q.rate_limit.map(|r| r.limit),
        "rate_period_secs": q.rate_limit.map(|r| secs(r.period)),
        "restricted": q.restricted,
        "attached": q.attached,
        "created_at": time_json(Some(q.created_at)),
    });
    // The counts under the same keys as `stats`, so one jq filter reads both.
    if let (Some(s), Value::Object(map)) = (counts, &mut v) {
        if let Value::Object(c) = stats_json(s) {
            map.extend(c.into_iter().filter(|(k, _)| k != "queue"));
        }
    }
    v
}

/// `pg-lease stats`: `lease.queue_stats`.
pub async fn stats(client: &Client, out: Output) -> Result<Done, CliError> {
    let stats = client.queue_stats().await?;
    if out.is_json() {
        out.json(&Value::Array(stats.iter().map(stats_json).collect()))?;
    } else {
        out.text(&stats_table(&stats).render())?;
    }
    Ok(Done::All)
}

/// One row of `queue_stats` as JSON.
pub fn stats_json(s: &QueueStats) -> Value {
    json!({
        "queue": s.queue,
        "pending": s.pending,
        "ready": s.ready,
        "leased": s.leased,
        "expired": s.expired,
        "done": s.done,
        "dead": s.dead,
        "cancelled": s.cancelled,
        "oldest_ready_age_secs": s.oldest_ready_age.map(secs),
        "recovered_total": s.recovered_total,
        "paused": s.paused,
    })
}

/// `queue_stats` as a table.
pub fn stats_table(stats: &[QueueStats]) -> Table {
    let mut t = Table::new(&[
        "queue",
        "state",
        "pending",
        "ready",
        "leased",
        "expired",
        "done",
        "dead",
        "cancelled",
        "oldest ready",
        "recovered",
    ]);
    for s in stats {
        t.row(vec![
            s.queue.clone(),
            state(s).to_owned(),
            s.pending.to_string(),
            s.ready.to_string(),
            s.leased.to_string(),
            s.expired.to_string(),
            s.done.to_string(),
            s.dead.to_string(),
            s.cancelled.to_string(),
            s.oldest_ready_age.map(age).unwrap_or_default(),
            s.recovered_total.to_string(),
        ]);
    }
    t
}

/// `pg-lease in-flight`: leased rows, of one queue or all.
pub async fn in_flight(
    client: &Client,
    out: Output,
    queue: Option<&str>,
) -> Result<Done, CliError> {
    check_queue(client, queue).await?;
    let leases = client.in_flight(queue).await?;
    if out.is_json() {
        out.json(&Value::Array(leases.iter().map(in_flight_json).collect()))?;
        return Ok(Done::All);
    }
    let mut t = Table::new(&[
        "id",
        "queue",
        "key",
        "owner",
        "epoch",
        "attempt",
        "remaining",
        "cancel",
    ]);
    for l in leases {
        t.row(vec![
            l.id.to_string(),
            l.queue,
            l.key.unwrap_or_default(),
            l.owner,
            l.epoch.to_string(),
            l.attempt.to_string(),
            if l.expired {
                "expired".into()
            } else {
                age(l.remaining)
            },
            if l.cancel_requested {
                "requested".into()
            } else {
                String::new()
            },
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// One row of `in_flight` as JSON.
fn in_flight_json(l: &InFlight) -> Value {
    json!({
        "id": l.id,
        "queue": l.queue,
        "key": l.key,
        "owner": l.owner,
        "epoch": l.epoch,
        "attempt": l.attempt,
        "lease_until": time_json(Some(l.lease_until)),
        "remaining_secs": secs(l.remaining),
        "expired": l.expired,
        "cancel_requested": l.cancel_requested,
    })
}

/// `pg-lease keys`: the fairness keys of one queue or all, with their rows
/// and rate limits.
pub async fn keys(client: &Client, out: Output, queue: Option<&str>) -> Result<Done, CliError> {
    check_queue(client, queue).await?;
    let keys = client.fairness_keys(queue).await?;
    if out.is_json() {
        out.json(&Value::Array(keys.iter().map(key_json).collect()))?;
        return Ok(Done::All);
    }
    let now = SystemTime::now();
    let mut t = Table::new(&[
        "queue",
        "key",
        "weight",
        "pending",
        "ready",
        "leased",
        "rate limit",
        "in window",
        "held back until",
    ]);
    for k in keys {
        t.row(vec![
            k.queue,
            k.fairness_key,
            k.weight.to_string(),
            k.pending.to_string(),
            k.ready.to_string(),
            k.leased.to_string(),
            k.rate_limit
                .map(|r| format!("{} per {}", r.limit, span(r.period)))
                .unwrap_or_default(),
            k.claimed_in_period
                .map(|n| n.to_string())
                .unwrap_or_default(),
            time_text(k.held_until, now),
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// One row of `fairness_keys` as JSON.
fn key_json(k: &FairnessKey) -> Value {
    json!({
        "queue": k.queue,
        "fairness_key": k.fairness_key,
        "weight": k.weight,
        "pending": k.pending,
        "ready": k.ready,
        "leased": k.leased,
        "rate_limit": k.rate_limit.map(|r| r.limit),
        "rate_period_secs": k.rate_limit.map(|r| secs(r.period)),
        "claimed_in_period": k.claimed_in_period,
        "held_until": time_json(k.held_until),
    })
}

/// `pg-lease holders`: named leases held now.
pub async fn holders(client: &Client, out: Output) -> Result<Done, CliError> {
    let holders = client.holders().await?;
    if out.is_json() {
        out.json(&Value::Array(holders.iter().map(holder_json).collect()))?;
    } else {
        out.text(&holders_table(&holders).render())?;
    }
    Ok(Done::All)
}

/// One row of `holders` as JSON.
pub fn holder_json(h: &Holder) -> Value {
    json!({
        "name": h.name,
        "owner": h.owner,
        "epoch": h.epoch,
        "acquired_at": time_json(Some(h.acquired_at)),
        "lease_until": time_json(Some(h.lease_until)),
        "remaining_secs": secs(h.remaining),
    })
}

/// `holders` as a table.
pub fn holders_table(holders: &[Holder]) -> Table {
    let mut t = Table::new(&["name", "owner", "epoch", "remaining"]);
    for h in holders {
        t.row(vec![
            h.name.clone(),
            h.owner.clone(),
            h.epoch.to_string(),
            age(h.remaining),
        ]);
    }
    t
}

/// `pg-lease schedules`: every schedule, when it fires next, what it did.
pub async fn schedules(client: &Client, out: Output) -> Result<Done, CliError> {
    let schedules = client.schedules().await?;
    if out.is_json() {
        let rows = schedules
            .iter()
            .map(|s| {
                let (cron, every) = match &s.every {
                    Every::Cron(spec) => (Some(spec.as_str()), None),
                    Every::Period(d) => (None, Some(secs(*d))),
                };
                json!({
                    "name": s.name,
                    "queue": s.queue,
                    "cron": cron,
                    "every_secs": every,
                    "next_at": time_json(s.next_at),
                    "enqueued": s.enqueued,
                    "last_run_at": time_json(s.last_run_at),
                    "last_error": s.last_error,
                })
            })
            .collect();
        out.json(&Value::Array(rows))?;
        return Ok(Done::All);
    }
    let now = SystemTime::now();
    let mut t = Table::new(&["name", "queue", "when", "next", "enqueued", "last error"]);
    for s in schedules {
        let when = match &s.every {
            Every::Cron(spec) => format!("cron {spec}"),
            Every::Period(d) => format!("every {}", span(*d)),
        };
        t.row(vec![
            s.name,
            s.queue,
            when,
            time_text(s.next_at, now),
            s.enqueued.to_string(),
            s.last_error.map(|e| first_line(&e, 60)).unwrap_or_default(),
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// `pg-lease pause Q` (`pause`) or `resume Q`; exit 1 if it already was.
pub async fn pause(
    client: &Client,
    out: Output,
    queue: &str,
    pause: bool,
) -> Result<Done, CliError> {
    check_queue(client, Some(queue)).await?;
    let changed = if pause {
        client.pause(queue).await?
    } else {
        client.resume(queue).await?
    };
    let state = if pause { "paused" } else { "running" };
    if out.is_json() {
        out.json(&json!({ "queue": queue, "state": state, "changed": changed }))?;
    } else if changed {
        out.text(&format!("{queue}: {state}\n"))?;
    } else {
        out.text(&format!("{queue}: {state} already, unchanged\n"))?;
    }
    Ok(Done::from_ok(changed))
}
