//! One row: its page, with the start of its payload, and the payload
//! whole at its own address up to a cap. A payload may be as large as its
//! queue's `max_payload_bytes` (up to 256 MiB), so neither reads more of
//! it from PostgreSQL than it sends on.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use pg_lease_client::{FencingToken, JobPreview, JobState};

use super::pages::{parse_id, queue_href};
use super::reply::{page, Reply, UiError};
use super::views::JobPage;
use super::Ui;
use crate::commands::state_name;
use crate::output::time_text;

/// Characters of the payload a row page shows.
const PAGE_PAYLOAD_CHARS: u32 = 16_384;

/// The largest payload `/jobs/<id>/payload` serves, in bytes of its JSON
/// text: four times the 1 MiB a queue allows by default, and little
/// memory next to the 256 MiB a queue may allow.
const RAW_PAYLOAD_BYTES: u32 = 4 * 1024 * 1024;

/// `/jobs/<id>`: every column of one row and the start of its payload.
pub async fn job(State(ui): State<Arc<Ui>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let id = path_id(id)?;
    let preview = ui
        .client
        .job_preview(id, PAGE_PAYLOAD_CHARS)
        .await?
        .ok_or_else(|| no_row(id))?;
    let whole = preview.payload_is_whole();
    let served = preview.payload_bytes <= i64::from(RAW_PAYLOAD_BYTES);
    let truncated = (!whole).then(|| {
        let shown = format!(
            "Showing the first {PAGE_PAYLOAD_CHARS} characters of {} bytes",
            preview.payload_bytes
        );
        if served {
            format!("{shown}:")
        } else {
            format!(
                "{shown}; the dashboard serves payloads of up to {RAW_PAYLOAD_BYTES} bytes, \
                 so read this one with pg-lease jobs show {id}."
            )
        }
    });
    let JobPreview {
        job: j,
        payload_head,
        ..
    } = preview;
    let payload = if whole {
        pretty(payload_head)
    } else {
        format!("{payload_head}…")
    };
    let now = SystemTime::now();
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let attempt_id = match j.state {
        JobState::Leased => FencingToken {
            id: j.id,
            epoch: j.epoch,
        }
        .to_string(),
        _ => String::new(),
    };
    let fields = vec![
        ("state", state_name(j.state).to_owned()),
        ("key", opt(&j.key)),
        ("unique key", opt(&j.unique_key)),
        ("attempts", j.attempt.to_string()),
        ("owner", opt(&j.owner)),
        ("epoch", j.epoch.to_string()),
        ("attempt id", attempt_id),
        ("lease until", time_text(j.lease_until, now)),
        ("cancel requested", yes_no(j.cancel_requested)),
        ("priority", j.priority.to_string()),
        ("next at", time_text(Some(j.next_at), now)),
        ("created at", time_text(Some(j.created_at), now)),
        ("finished at", time_text(j.finished_at, now)),
    ];
    page(&JobPage {
        layout: ui.layout(""),
        id: j.id,
        queue_href: queue_href(&j.queue, ""),
        queue: j.queue,
        fields,
        payload,
        truncated,
        raw: served,
        last_error: opt(&j.last_error),
        can_cancel: matches!(j.state, JobState::Pending | JobState::Leased),
        can_requeue: j.state == JobState::Dead,
    })
}

/// `/jobs/<id>/payload`: the payload's JSON text, whole, if it is at most
/// [`RAW_PAYLOAD_BYTES`]; a 413 page otherwise. Its size is read first, so
/// a payload over the cap is not read at all.
pub async fn payload(State(ui): State<Arc<Ui>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let id = path_id(id)?;
    let size = ui
        .client
        .job_preview(id, 0)
        .await?
        .ok_or_else(|| no_row(id))?
        .payload_bytes;
    if size > i64::from(RAW_PAYLOAD_BYTES) {
        return Err(too_large(id, size));
    }
    let preview = ui
        .client
        .job_preview(id, RAW_PAYLOAD_BYTES)
        .await?
        .ok_or_else(|| no_row(id))?;
    // A fenced_update may have grown it in between.
    if !preview.payload_is_whole() {
        return Err(too_large(id, preview.payload_bytes));
    }
    Ok((
        [(CONTENT_TYPE, "application/json; charset=utf-8")],
        preview.payload_head,
    )
        .into_response())
}

/// A row id from the path.
fn path_id(id: Result<Path<String>, PathRejection>) -> Result<i64, UiError> {
    let Path(id) = id.map_err(|e| UiError::BadRequest(e.body_text()))?;
    parse_id(&id)
}

fn no_row(id: i64) -> UiError {
    UiError::NotFound(format!("no row {id} (never enqueued, or purged)"))
}

fn too_large(id: i64, size: i64) -> UiError {
    UiError::TooLarge(format!(
        "the payload of row {id} is {size} bytes of JSON; the dashboard serves payloads of up \
         to {RAW_PAYLOAD_BYTES} bytes: pg-lease jobs show {id} --json prints it"
    ))
}

/// A whole payload's text, indented; as it came if it does not parse.
fn pretty(text: String) -> String {
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text)
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}
