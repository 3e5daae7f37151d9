//! The commands, one module per group: `status` (status, watch), `queues`
//! (queues, stats, in-flight, holders), `jobs`, `dead` (dead letters,
//! requeue, cancel), `admin` (sweep, purge) and `extension` (install,
//! upgrade). Each prints its answer through [`Output`] and says whether
//! everything asked for happened.

mod admin;
mod dead;
mod extension;
mod jobs;
mod queues;
mod status;

use pg_lease_client::Client;

use crate::args::{Command, JobsCommand};
use crate::error::CliError;
use crate::output::Output;

pub use extension::{install, upgrade};
pub use jobs::{state_name, when};

/// How a command that ran ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// Everything asked for happened (exit 0).
    All,
    /// Something asked for did not happen; the output says what (exit 1).
    NotAll,
}

impl Done {
    /// `All` if `ok`.
    fn from_ok(ok: bool) -> Done {
        if ok {
            Done::All
        } else {
            Done::NotAll
        }
    }
}

/// Runs a command that works through the client (all but `install` and
/// `upgrade`, which [`crate::main`] runs on a plain connection).
pub async fn run(client: &Client, command: Command, out: Output) -> Result<Done, CliError> {
    match command {
        Command::Status => status::status(client, out).await,
        Command::Watch { interval, count } => status::watch(client, out, interval, count).await,
        Command::Queues => queues::queues(client, out).await,
        Command::Stats => queues::stats(client, out).await,
        Command::InFlight { queue } => queues::in_flight(client, out, queue.as_deref()).await,
        Command::Keys { queue } => queues::keys(client, out, queue.as_deref()).await,
        Command::Holders => queues::holders(client, out).await,
        Command::Jobs(JobsCommand::List {
            queue,
            state,
            limit,
        }) => jobs::list(client, out, queue, state.map(Into::into), limit).await,
        Command::Jobs(JobsCommand::Show { id }) => jobs::show(client, out, id).await,
        Command::Dead { queue, limit } => dead::dead(client, out, queue.as_deref(), limit).await,
        Command::Requeue {
            ids, all: false, ..
        } => dead::requeue(client, out, &ids).await,
        Command::Requeue { queue, yes, .. } => {
            dead::requeue_all(client, out, queue.as_deref().unwrap_or_default(), yes).await
        }
        Command::Schedules => queues::schedules(client, out).await,
        Command::Pause { queue } => queues::pause(client, out, &queue, true).await,
        Command::Resume { queue } => queues::pause(client, out, &queue, false).await,
        Command::Cancel { id, queue, key } => dead::cancel(client, out, id, queue, key).await,
        Command::Sweep { max_rows } => admin::sweep(client, out, max_rows).await,
        Command::Purge {
            max_rows,
            dead: false,
            ..
        } => admin::purge(client, out, max_rows).await,
        Command::Purge { queue, yes, .. } => {
            dead::purge_dead(client, out, queue.as_deref().unwrap_or_default(), yes).await
        }
        Command::Install | Command::Upgrade | Command::Ui { .. } => Err(CliError::NotFound(
            "install, upgrade and ui do not run as one command through the client".to_owned(),
        )),
    }
}

/// Fails with [`CliError::UnknownQueue`] if `queue` names no queue: the
/// views would just show nothing, and a typo must not read as "all clear".
async fn check_queue(client: &Client, queue: Option<&str>) -> Result<(), CliError> {
    let Some(queue) = queue else {
        return Ok(());
    };
    let known = client.queue_settings().await?;
    if known.iter().any(|q| q.name == queue) {
        Ok(())
    } else {
        Err(CliError::UnknownQueue(queue.to_owned()))
    }
}
