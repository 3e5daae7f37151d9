//! The actions, each a POST from a form of the dashboard and one call of
//! an existing SQL function as the connecting role: the role's grants
//! decide, and a refusal shows the server's SQLSTATE and message.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use pg_lease_client::CancelResult;
use serde::Deserialize;

use super::guard;
use super::pages::{parse_id, queue_href};
use super::reply::{page, Reply, UiError};
use super::views::DonePage;
use super::Ui;
use crate::commands::state_name;

/// A form naming one row.
#[derive(Debug, Deserialize)]
pub struct RowForm {
    csrf: String,
    id: String,
}

/// A form naming a queue and, for cancel by key, a key.
#[derive(Debug, Deserialize)]
pub struct QueueForm {
    csrf: String,
    queue: String,
    #[serde(default)]
    key: String,
    /// The purge's confirmation box ("yes" when ticked).
    #[serde(default)]
    yes: String,
}

/// `POST /actions/requeue`: `lease.requeue(id)`.
pub async fn requeue(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<RowForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    let id = parse_id(&form.id)?;
    if !ui.client.requeue(id).await? {
        return Err(UiError::Conflict(format!(
            "row {id} is not a dead letter; nothing changed"
        )));
    }
    done(
        &ui,
        format!("Row {id} requeued: pending again, attempts reset."),
        format!("/jobs/{id}"),
    )
}

/// `POST /actions/cancel`: `lease.cancel(id)`.
pub async fn cancel(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<RowForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    let id = parse_id(&form.id)?;
    let result = ui.client.cancel(id).await?;
    let message = cancelled(&format!("row {id}"), result, || {
        format!("there is no row {id}")
    })?;
    done(&ui, message, format!("/jobs/{id}"))
}

/// `POST /actions/cancel-key`: `lease.cancel_key(queue, key)`.
pub async fn cancel_key(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<QueueForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    let result = ui.client.cancel_key(&form.queue, &form.key).await?;
    let message = cancelled(&format!("the row of key {:?}", form.key), result, || {
        format!("{} has no row of key {:?}", form.queue, form.key)
    })?;
    done(&ui, message, queue_href(&form.queue, ""))
}

/// `POST /actions/purge-dead`: `lease.purge_dead(queue)`, only with the
/// confirmation box ticked.
pub async fn purge_dead(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<QueueForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    if form.yes != "yes" {
        return Err(UiError::BadRequest(
            "a purge deletes every dead letter of the queue: tick the box to confirm".to_owned(),
        ));
    }
    let n = ui.client.purge_dead(&form.queue).await?;
    done(
        &ui,
        format!("Deleted {n} dead letters of {}.", form.queue),
        queue_href(&form.queue, ""),
    )
}

/// `POST /actions/pause`: `lease.pause(queue)`.
pub async fn pause(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<QueueForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    let message = if ui.client.pause(&form.queue).await? {
        format!(
            "Paused {}: claims take none of its rows until it is resumed.",
            form.queue
        )
    } else {
        format!("{} was paused already; nothing changed.", form.queue)
    };
    done(&ui, message, queue_href(&form.queue, ""))
}

/// `POST /actions/resume`: `lease.resume(queue)`.
pub async fn resume(
    State(ui): State<Arc<Ui>>,
    form: Result<Form<QueueForm>, FormRejection>,
) -> Reply {
    let form = accept(&ui, form)?;
    let message = if ui.client.resume(&form.queue).await? {
        format!("Resumed {}: claims take its rows again.", form.queue)
    } else {
        format!("{} was not paused; nothing changed.", form.queue)
    };
    done(&ui, message, queue_href(&form.queue, ""))
}

/// The form, if actions are on and it carries this server's token.
fn accept<T: CsrfForm>(ui: &Ui, form: Result<Form<T>, FormRejection>) -> Result<T, UiError> {
    if !ui.allow_actions {
        return Err(UiError::Forbidden(
            "actions are off: start pg-lease ui with --allow-actions".to_owned(),
        ));
    }
    let Form(form) = form.map_err(|e| UiError::BadRequest(e.body_text()))?;
    if !guard::same_token(form.csrf(), &ui.csrf) {
        return Err(UiError::Forbidden(
            "the form's token is not this server's (a page of another server, or of \
             another site): reload the page and try again"
                .to_owned(),
        ));
    }
    Ok(form)
}

/// A form that carries the CSRF token.
trait CsrfForm {
    fn csrf(&self) -> &str;
}

impl CsrfForm for RowForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl CsrfForm for QueueForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// What a cancel of `what` did, in words; a row that had finished is an
/// error page, and so is one that does not exist (`missing` says so).
fn cancelled(
    what: &str,
    result: CancelResult,
    missing: impl FnOnce() -> String,
) -> Result<String, UiError> {
    match result {
        CancelResult::Cancelled => Ok(format!("Cancelled {what}.")),
        CancelResult::CancelRequested => Ok(format!(
            "Cancel requested for {what}: its holder sees it at its next renewal, and the \
             lease ends as cancelled."
        )),
        CancelResult::AlreadyFinished(state) => Err(UiError::Conflict(format!(
            "{what} had already finished ({}); nothing changed",
            state_name(state)
        ))),
        CancelResult::NotFound => Err(UiError::NotFound(missing())),
    }
}

/// The page that says what an action did.
fn done(ui: &Ui, message: String, back: String) -> Reply {
    page(&DonePage {
        layout: ui.layout(""),
        message,
        back,
    })
}
