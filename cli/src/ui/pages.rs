//! The pages: what each GET reads and how it is shown. Each is a handful
//! of the client's calls, whose cost does not grow with the queues' rows
//! (`lease.metrics`, the views), but for the rows of a queue, read one
//! page at a time from where the last one ended. Listings read no
//! payloads (`job` shows the start of one), so no page holds more than
//! its rows' other columns.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::Uri;
use pg_lease_client::{Every, JobFilter, JobState, QueueMetrics};
use serde::Deserialize;

use super::reply::{page, Reply, UiError};
use super::views::*;
use super::Ui;
use crate::commands::{state_name, when};
use crate::output::{age, first_line, relative, rfc3339, span, time_text};

/// Rows on a page of a queue's jobs.
const PAGE_ROWS: u32 = 50;

/// The states a queue page filters by, in the order it offers them.
const STATES: &[&str] = &["pending", "leased", "done", "dead", "cancelled"];

/// Dead letters on the dead-letter page when the URL does not say.
const DEAD_ROWS: u32 = 100;

/// The most dead letters a page may ask for: each row holds up to 2,000
/// characters of its last error until the page is sent.
const MAX_DEAD_ROWS: u32 = 1000;

/// The handlers' shared state.
type Shared = State<Arc<Ui>>;

/// `/`: every queue, refreshed in place through `/fragments/queues`.
pub async fn queues(State(ui): Shared) -> Reply {
    let queues = queue_rows(&ui, &ui.client.metrics().await?);
    let reaper = match ui.client.reaper_stats().await {
        Ok(r) => match (r.preloaded(), r.last_sweep_at) {
            (false, _) => "reaper not running: pg_lease is not preloaded".to_owned(),
            (true, Some(at)) => format!("last sweep {}", relative(at, SystemTime::now())),
            (true, None) => "no sweep yet in this database".to_owned(),
        },
        Err(e) => format!("reaper unknown: {}", crate::error::client_reason(&e)),
    };
    page(&QueuesPage {
        layout: ui.layout("queues"),
        queues,
        reaper,
    })
}

/// `/fragments/queues`: the queues table alone.
pub async fn queues_fragment(State(ui): Shared) -> Reply {
    let queues = queue_rows(&ui, &ui.client.metrics().await?);
    page(&QueuesTable { queues })
}

/// The rows of the queues table.
fn queue_rows(ui: &Ui, metrics: &[QueueMetrics]) -> Vec<QueueRow> {
    let dur = |d: Option<std::time::Duration>| d.map(age).unwrap_or_default();
    metrics
        .iter()
        .map(|m| {
            let (rate, chart) = ui.throughput.chart(&m.queue);
            QueueRow {
                href: queue_href(&m.queue, ""),
                dead_href: format!("/dead?queue={}", encode(&m.queue)),
                name: m.queue.clone(),
                paused: m.paused,
                ready: m.ready,
                delayed: m.delayed,
                leased: m.leased,
                expired: m.expired,
                dead: m.dead,
                oldest_ready: dur(m.oldest_ready_age),
                reap_lag: dur(m.reap_lag),
                rate,
                chart,
            }
        })
        .collect()
}

/// The metrics of queue `name`: a 404 if there is no such queue (a view
/// would just show nothing, and a typo must not read as "all clear").
async fn queue_metrics(ui: &Ui, name: &str) -> Result<QueueMetrics, UiError> {
    let metrics = ui.client.metrics().await?;
    metrics
        .into_iter()
        .find(|m| m.queue == name)
        .ok_or_else(|| UiError::NotFound(format!("no queue named {name:?}")))
}

/// The filters of a queue page.
#[derive(Debug, Deserialize)]
pub struct JobsParams {
    #[serde(default)]
    state: String,
    #[serde(default)]
    key: String,
    after: Option<i64>,
}

/// `/queues/<name>?state=&key=&after=`: the queue's counts and a page of
/// its rows, lowest id first.
pub async fn queue(
    State(ui): Shared,
    name: Result<Path<String>, PathRejection>,
    params: Result<Query<JobsParams>, QueryRejection>,
) -> Reply {
    let Path(name) = name.map_err(|e| UiError::BadRequest(e.body_text()))?;
    let Query(params) = params.map_err(|e| UiError::BadRequest(e.body_text()))?;
    queue_page(&ui, name, params).await
}

/// The name of a queue in the query, for the names [`queue_href`] cannot
/// put in the path.
#[derive(Debug, Deserialize)]
pub struct QueueName {
    name: String,
}

/// `/queue?name=&state=&key=&after=`: the page of `/queues/<name>`.
pub async fn queue_by_query(
    State(ui): Shared,
    name: Result<Query<QueueName>, QueryRejection>,
    params: Result<Query<JobsParams>, QueryRejection>,
) -> Reply {
    let Query(QueueName { name }) = name.map_err(|e| UiError::BadRequest(e.body_text()))?;
    let Query(params) = params.map_err(|e| UiError::BadRequest(e.body_text()))?;
    queue_page(&ui, name, params).await
}

/// The link to the page of queue `name`, with `query` (`state=…&…`, or
/// empty) after it. Browsers read a path segment `.` or `..` as "here" and
/// "the folder above", percent-encoded or not, so those two names go in
/// the query instead.
pub fn queue_href(name: &str, query: &str) -> String {
    let (path, glue) = if name_in_query(name) {
        (format!("/queue?name={}", encode(name)), '&')
    } else {
        (format!("/queues/{}", encode(name)), '?')
    };
    if query.is_empty() {
        path
    } else {
        format!("{path}{glue}{query}")
    }
}

/// Whether the link to queue `name` carries it in the query.
fn name_in_query(name: &str) -> bool {
    name == "." || name == ".."
}

/// A queue's counts and the page of its rows `params` asks for.
async fn queue_page(ui: &Ui, name: String, params: JobsParams) -> Reply {
    let state = match params.state.as_str() {
        "" => None,
        s => Some(s.parse::<JobState>().map_err(|_| {
            UiError::BadRequest(format!("no state {s:?}: one of {}", STATES.join(", ")))
        })?),
    };
    let m = queue_metrics(ui, &name).await?;
    let filter = JobFilter {
        queue: Some(name.clone()),
        state,
        key: Some(params.key.clone()).filter(|k| !k.is_empty()),
        after: params.after,
        limit: PAGE_ROWS,
    };
    let jobs = match ui.client.job_summaries(&filter).await {
        Ok(jobs) => Ok(jobs),
        Err(e) if e.sqlstate() == Some("42501") => Err(format!(
            "Listing rows reads lease.job, which only the superuser may; this role sees the \
             counts, dead letters and single rows it may read ({})",
            crate::error::client_reason(&e)
        )),
        Err(e) => return Err(e.into()),
    };
    let now = SystemTime::now();
    let next = match &jobs {
        Ok(rows) if rows.len() == PAGE_ROWS as usize => rows.last().map(|last| {
            let query = format!(
                "state={}&key={}&after={}",
                encode(&params.state),
                encode(&params.key),
                last.id
            );
            queue_href(&name, &query)
        }),
        _ => None,
    };
    let jobs = jobs.map(|rows| {
        rows.iter()
            .map(|j| JobRow {
                id: j.id,
                key: j.key.clone().unwrap_or_default(),
                state: state_name(j.state),
                attempt: j.attempt,
                epoch: j.epoch,
                owner: j.owner.clone().unwrap_or_default(),
                when: when(j.state, j.next_at, j.lease_until, j.finished_at, now),
                last_error: j
                    .last_error
                    .as_deref()
                    .map(|e| first_line(e, 80))
                    .unwrap_or_default(),
            })
            .collect()
    });
    page(&QueuePage {
        layout: ui.layout("queues"),
        counts: vec![
            ("ready", m.ready),
            ("delayed", m.delayed),
            ("leased", m.leased),
            ("expired", m.expired),
            ("dead", m.dead),
            ("enqueued in all", m.enqueued_total),
            ("done in all", m.done_total),
        ],
        name_in_query: name_in_query(&name),
        paused: m.paused,
        rate: m.rate_limit.map(|r| {
            let period = span(r.period);
            format!(
                "Rate limit: {} rows per {period}; {} claimed in the last {period}.",
                r.limit, m.rate_used
            )
        }),
        name,
        state: params.state,
        key: params.key,
        states: STATES,
        jobs,
        next,
    })
}

/// The filter of the dead-letter page.
#[derive(Debug, Deserialize)]
pub struct DeadParams {
    #[serde(default)]
    queue: String,
    limit: Option<u32>,
}

/// `/dead?queue=&limit=`: dead letters, oldest first.
pub async fn dead(State(ui): Shared, params: Result<Query<DeadParams>, QueryRejection>) -> Reply {
    let Query(params) = params.map_err(|e| UiError::BadRequest(e.body_text()))?;
    let limit = params.limit.unwrap_or(DEAD_ROWS);
    if !(1..=MAX_DEAD_ROWS).contains(&limit) {
        return Err(UiError::BadRequest(format!(
            "limit {limit} is not between 1 and {MAX_DEAD_ROWS}"
        )));
    }
    let queue = Some(params.queue.as_str()).filter(|q| !q.is_empty());
    if let Some(q) = queue {
        queue_metrics(&ui, q).await?;
    }
    let now = SystemTime::now();
    let rows = ui
        .client
        .dead_letter_summaries(queue, limit)
        .await?
        .into_iter()
        .map(|d| DeadRow {
            id: d.id,
            key: d.key.unwrap_or_default(),
            attempts: d.attempts,
            finished: d.finished_at.map(|t| relative(t, now)).unwrap_or_default(),
            last_error: d.last_error.map(|e| first_line(&e, 80)).unwrap_or_default(),
            queue: d.queue,
        })
        .collect();
    page(&DeadPage {
        layout: ui.layout("dead"),
        queue: params.queue,
        limit,
        rows,
    })
}

/// `/schedules`.
pub async fn schedules(State(ui): Shared) -> Reply {
    let now = SystemTime::now();
    let rows = ui
        .client
        .schedules()
        .await?
        .into_iter()
        .map(|s| {
            [
                s.name,
                s.queue,
                match s.every {
                    Every::Cron(spec) => format!("cron {spec}"),
                    Every::Period(d) => format!("every {}", span(d)),
                },
                time_text(s.next_at, now),
                s.enqueued.to_string(),
                time_text(s.last_run_at, now),
                s.last_error.unwrap_or_default(),
            ]
        })
        .collect();
    page(&SchedulesPage {
        layout: ui.layout("schedules"),
        rows,
    })
}

/// `/leases`: named leases and their holders.
pub async fn leases(State(ui): Shared) -> Reply {
    let now = SystemTime::now();
    let rows = ui
        .client
        .holders()
        .await?
        .into_iter()
        .map(|h| {
            [
                h.name,
                h.owner,
                h.epoch.to_string(),
                relative(h.acquired_at, now),
                format!("{} (in {})", rfc3339(h.lease_until), age(h.remaining)),
            ]
        })
        .collect();
    page(&LeasesPage {
        layout: ui.layout("leases"),
        rows,
    })
}

/// `/reaper`: the housekeeping counters of this database.
pub async fn reaper(State(ui): Shared) -> Reply {
    let r = ui.client.reaper_stats().await?;
    let now = SystemTime::now();
    let mut fields = vec![
        (
            "running",
            if r.preloaded() {
                "yes: pg_lease is preloaded and sweeps this database".to_owned()
            } else {
                "no: pg_lease is not in shared_preload_libraries".to_owned()
            },
        ),
        ("last sweep", time_text(r.last_sweep_at, now)),
        (
            "last sweep took",
            r.last_duration.map(age).unwrap_or_default(),
        ),
        ("sweeps", r.sweeps.to_string()),
        ("leases recovered", r.recovered.to_string()),
        ("rows purged", r.purged.to_string()),
        ("last error", r.last_error.clone().unwrap_or_default()),
        ("last error at", time_text(r.last_error_at, now)),
    ];
    if let Some(n) = r.slot_shortages {
        fields.push(("worker slot shortages", n.to_string()));
        fields.push(("last shortage", time_text(r.last_slot_shortage_at, now)));
    }
    page(&ReaperPage {
        layout: ui.layout("reaper"),
        fields,
    })
}

/// Any other path.
pub async fn not_found(uri: Uri) -> Reply {
    Err(UiError::NotFound(format!("no page at {}", uri.path())))
}

/// A row id from a URL or form.
pub fn parse_id(text: &str) -> Result<i64, UiError> {
    text.trim()
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| UiError::BadRequest(format!("{text:?} is not a row id")))
}

/// `text` with everything but unreserved characters percent-encoded, for a
/// path segment or a query value.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
