//! The templates (cli/templates) and the data each one shows, formatted
//! here so that the templates only place text.

use askama::Template;

/// What the frame around every page shows.
pub struct Layout {
    /// The navigation entry to mark as current ("" for none).
    pub page: &'static str,
    /// `database at host:port` ("" on error pages).
    pub database: String,
    /// Whether to show action forms.
    pub actions: bool,
    /// The token those forms carry.
    pub csrf: String,
}

impl Layout {
    /// The frame of an error page, which knows nothing of the request.
    pub fn bare() -> Layout {
        Layout {
            page: "",
            database: String::new(),
            actions: false,
            csrf: String::new(),
        }
    }
}

/// One queue on the queues page.
pub struct QueueRow {
    pub name: String,
    /// `/queues/<name>`, percent-encoded.
    pub href: String,
    /// `/dead?queue=<name>`, percent-encoded.
    pub dead_href: String,
    /// Paused (`lease.pause`): claims take none of its rows.
    pub paused: bool,
    pub ready: i64,
    pub delayed: i64,
    pub leased: i64,
    pub expired: i64,
    pub dead: i64,
    pub oldest_ready: String,
    pub reap_lag: String,
    /// Rows finished per second over the last sample interval ("" before
    /// the second sample).
    pub rate: String,
    /// The sparkline's SVG points (`x,y x,y ...`), "" when there are none.
    pub chart: String,
}

/// `/`.
#[derive(Template)]
#[template(path = "queues.html")]
pub struct QueuesPage {
    pub layout: Layout,
    pub queues: Vec<QueueRow>,
    pub reaper: String,
}

/// `/fragments/queues`: the table the queues page refreshes in place.
#[derive(Template)]
#[template(path = "queues_table.html")]
pub struct QueuesTable {
    pub queues: Vec<QueueRow>,
}

/// One row in a table of jobs.
pub struct JobRow {
    pub id: i64,
    pub key: String,
    pub state: &'static str,
    pub attempt: i32,
    pub epoch: i64,
    pub owner: String,
    pub when: String,
    pub last_error: String,
}

/// `/queues/<name>`.
#[derive(Template)]
#[template(path = "queue.html")]
pub struct QueuePage {
    pub layout: Layout,
    pub name: String,
    /// Whether the page's address carries the name in the query (see
    /// `pages::queue_href`), so the filter form must send it again.
    pub name_in_query: bool,
    /// Paused (`lease.pause`): claims take none of its rows.
    pub paused: bool,
    /// Its rate limit and what claims used of it, in words, if it has one.
    pub rate: Option<String>,
    pub counts: Vec<(&'static str, i64)>,
    /// The state filter ("" for all) and the key filter.
    pub state: String,
    pub key: String,
    pub states: &'static [&'static str],
    /// The rows, or why the role may not list them.
    pub jobs: Result<Vec<JobRow>, String>,
    /// The next page's link, if there may be one.
    pub next: Option<String>,
}

/// `/jobs/<id>`.
#[derive(Template)]
#[template(path = "job.html")]
pub struct JobPage {
    pub layout: Layout,
    pub id: i64,
    pub queue: String,
    pub queue_href: String,
    pub fields: Vec<(&'static str, String)>,
    /// The payload's JSON text: whole and indented, or its start.
    pub payload: String,
    /// What part of the payload is shown, when not all of it.
    pub truncated: Option<String>,
    /// Whether `/jobs/<id>/payload` serves the whole payload.
    pub raw: bool,
    pub last_error: String,
    pub can_cancel: bool,
    pub can_requeue: bool,
}

/// One dead letter.
pub struct DeadRow {
    pub id: i64,
    pub queue: String,
    pub key: String,
    pub attempts: i32,
    pub finished: String,
    pub last_error: String,
}

/// `/dead`.
#[derive(Template)]
#[template(path = "dead.html")]
pub struct DeadPage {
    pub layout: Layout,
    /// The queue filter ("" for all).
    pub queue: String,
    pub limit: u32,
    pub rows: Vec<DeadRow>,
}

/// `/schedules`: name, queue, every, next, enqueued, last run, last error.
#[derive(Template)]
#[template(path = "schedules.html")]
pub struct SchedulesPage {
    pub layout: Layout,
    pub rows: Vec<[String; 7]>,
}

/// `/leases`: name, owner, epoch, acquired, lease ends.
#[derive(Template)]
#[template(path = "leases.html")]
pub struct LeasesPage {
    pub layout: Layout,
    pub rows: Vec<[String; 5]>,
}

/// `/reaper`: label and value pairs.
#[derive(Template)]
#[template(path = "reaper.html")]
pub struct ReaperPage {
    pub layout: Layout,
    pub fields: Vec<(&'static str, String)>,
}

/// What an action did.
#[derive(Template)]
#[template(path = "done.html")]
pub struct DonePage {
    pub layout: Layout,
    pub message: String,
    /// Where to go on: a path this server made, never one from the form.
    pub back: String,
}

/// An error page.
#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub layout: Layout,
    pub status: u16,
    pub title: &'static str,
    pub message: String,
    pub sqlstate: Option<String>,
    /// Whether to say that reloading may help (the database was away).
    pub retry: bool,
}
