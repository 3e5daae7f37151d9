//! `jobs list` and `jobs show`: rows in any state, read from `lease.job`
//! itself (no view shows every state, so this needs the superuser).

use std::time::SystemTime;

use pg_lease_client::{Client, JobFilter, JobRecord, JobState};
use serde_json::{json, Value};

use super::{check_queue, Done};
use crate::error::CliError;
use crate::output::{fields, first_line, relative, time_json, time_text, Output, Table};

/// `pg-lease jobs list`.
pub async fn list(
    client: &Client,
    out: Output,
    queue: Option<String>,
    state: Option<JobState>,
    limit: u32,
) -> Result<Done, CliError> {
    check_queue(client, queue.as_deref()).await?;
    let filter = JobFilter {
        queue,
        state,
        limit,
        ..JobFilter::default()
    };
    let jobs = client.jobs(&filter).await.map_err(denied)?;
    if out.is_json() {
        out.json(&Value::Array(jobs.iter().map(job_json).collect()))?;
        return Ok(Done::All);
    }
    let now = SystemTime::now();
    let mut t = Table::new(&[
        "id",
        "queue",
        "key",
        "state",
        "attempt",
        "epoch",
        "owner",
        "when",
        "last error",
    ]);
    for j in &jobs {
        t.row(vec![
            j.id.to_string(),
            j.queue.clone(),
            j.key.clone().unwrap_or_default(),
            state_name(j.state).to_owned(),
            j.attempt.to_string(),
            j.epoch.to_string(),
            j.owner.clone().unwrap_or_default(),
            when(j.state, j.next_at, j.lease_until, j.finished_at, now),
            j.last_error
                .as_deref()
                .map(|e| first_line(e, 60))
                .unwrap_or_default(),
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// `pg-lease jobs show ID`: every column; exit 1 if there is no such row.
pub async fn show(client: &Client, out: Output, id: i64) -> Result<Done, CliError> {
    let Some(j) = client.job(id).await.map_err(denied)? else {
        return Err(CliError::NotFound(format!(
            "no row {id} (never enqueued, or purged)"
        )));
    };
    let waiting = if j.state == JobState::Pending {
        client.wait_reason(id).await?
    } else {
        None
    };
    if out.is_json() {
        let mut json = job_json(&j);
        json["waiting"] = waiting.clone().into();
        out.json(&json)?;
        return Ok(Done::All);
    }
    let now = SystemTime::now();
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let payload = serde_json::to_string_pretty(&j.payload)?;
    out.text(&fields(&[
        ("id", j.id.to_string()),
        ("queue", j.queue.clone()),
        ("key", opt(&j.key)),
        ("unique key", opt(&j.unique_key)),
        ("state", state_name(j.state).to_owned()),
        ("waiting", opt(&waiting)),
        ("priority", j.priority.to_string()),
        ("rank", j.rank.to_string()),
        ("attempts", j.attempt.to_string()),
        ("epoch", j.epoch.to_string()),
        ("owner", opt(&j.owner)),
        ("lease until", time_text(j.lease_until, now)),
        ("cancel requested", j.cancel_requested.to_string()),
        ("next at", time_text(Some(j.next_at), now)),
        ("created at", time_text(Some(j.created_at), now)),
        ("finished at", time_text(j.finished_at, now)),
        ("last error", opt(&j.last_error)),
        ("payload", payload),
    ]))?;
    Ok(Done::All)
}

/// Says why a `lease_admin` gets `42501` here.
fn denied(e: pg_lease_client::Error) -> CliError {
    if matches!(e, pg_lease_client::Error::PermissionDenied(_)) {
        CliError::explain_client(
            "jobs reads lease.job, which only the superuser may (no view shows rows in \
             every state; dead and in-flight need only lease_admin)",
            &e,
        )
    } else {
        e.into()
    }
}

/// One row of `lease.job` as JSON, every column.
fn job_json(j: &JobRecord) -> Value {
    json!({
        "id": j.id,
        "queue": j.queue,
        "key": j.key,
        "unique_key": j.unique_key,
        "state": state_name(j.state),
        "priority": j.priority,
        "rank": j.rank,
        "attempt": j.attempt,
        "epoch": j.epoch,
        "owner": j.owner,
        "lease_until": time_json(j.lease_until),
        "cancel_requested": j.cancel_requested,
        "next_at": time_json(Some(j.next_at)),
        "created_at": time_json(Some(j.created_at)),
        "finished_at": time_json(j.finished_at),
        "last_error": j.last_error,
        "payload": j.payload,
    })
}

/// The time that matters in a row's state, for a table: when a pending row
/// becomes claimable, when a lease ends, when a finished row finished. By
/// this machine's clock against the database's times, so roughly.
/// Takes the row's times rather than the row, for rows read with or
/// without their payloads.
pub fn when(
    state: JobState,
    next_at: SystemTime,
    lease_until: Option<SystemTime>,
    finished_at: Option<SystemTime>,
    now: SystemTime,
) -> String {
    match state {
        JobState::Pending if next_at <= now => "ready".to_owned(),
        JobState::Pending => format!("ready {}", relative(next_at, now)),
        JobState::Leased => lease_until
            .map(|t| format!("lease ends {}", relative(t, now)))
            .unwrap_or_default(),
        _ => finished_at
            .map(|t| format!("finished {}", relative(t, now)))
            .unwrap_or_default(),
    }
}

/// The SQL name of a state, which is also its JSON value.
pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "pending",
        JobState::Leased => "leased",
        JobState::Done => "done",
        JobState::Dead => "dead",
        JobState::Cancelled => "cancelled",
    }
}
