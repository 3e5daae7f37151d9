//! Dead letters and what an operator does about rows: `dead`, `requeue`
//! (also `--all` of a queue), `purge --dead` of a queue, `cancel`.

use pg_lease_client::{CancelResult, Client, DeadLetter};
use serde_json::{json, Value};

use super::jobs::state_name;
use super::{check_queue, Done};
use crate::error::CliError;
use crate::output::{time_json, Output, Table};

/// `pg-lease dead`: dead letters, oldest id first.
pub async fn dead(
    client: &Client,
    out: Output,
    queue: Option<&str>,
    limit: u32,
) -> Result<Done, CliError> {
    check_queue(client, queue).await?;
    let letters = client.dead_letters(queue, limit).await?;
    if out.is_json() {
        out.json(&Value::Array(letters.iter().map(dead_json).collect()))?;
        return Ok(Done::All);
    }
    let mut t = Table::new(&["id", "queue", "key", "attempts", "last error"]);
    for d in letters {
        t.row(vec![
            d.id.to_string(),
            d.queue,
            d.key.unwrap_or_default(),
            d.attempts.to_string(),
            d.last_error.unwrap_or_default(),
        ]);
    }
    out.text(&t.render())?;
    Ok(Done::All)
}

/// One dead letter as JSON.
fn dead_json(d: &DeadLetter) -> Value {
    json!({
        "id": d.id,
        "queue": d.queue,
        "key": d.key,
        "attempts": d.attempts,
        "last_error": d.last_error,
        "finished_at": time_json(d.finished_at),
        "payload": d.payload,
    })
}

/// `pg-lease requeue ID...`: each id on its own (one may fail to be a dead
/// letter without stopping the others); exit 1 unless all were requeued.
pub async fn requeue(client: &Client, out: Output, ids: &[i64]) -> Result<Done, CliError> {
    let mut results = Vec::with_capacity(ids.len());
    for &id in ids {
        results.push((id, client.requeue(id).await?));
    }
    if out.is_json() {
        let rows = results
            .iter()
            .map(|(id, requeued)| json!({ "id": id, "requeued": requeued }))
            .collect();
        out.json(&Value::Array(rows))?;
    } else {
        let mut text = String::new();
        for (id, requeued) in &results {
            let what = if *requeued {
                "requeued"
            } else {
                "not a dead letter, unchanged"
            };
            text.push_str(&format!("{id}: {what}\n"));
        }
        out.text(&text)?;
    }
    Ok(Done::from_ok(results.iter().all(|(_, r)| *r)))
}

/// Dead letters read per round of `requeue --all`.
const PAGE: u32 = 1000;

/// `pg-lease requeue --all --queue Q [--yes]`: every dead letter of `queue`
/// back to pending, a page at a time until none is left; without `yes`
/// only how many there are (exit 1: nothing done).
pub async fn requeue_all(
    client: &Client,
    out: Output,
    queue: &str,
    yes: bool,
) -> Result<Done, CliError> {
    check_queue(client, Some(queue)).await?;
    if !yes {
        return unconfirmed(client, out, queue, "requeue").await;
    }
    let mut requeued = 0u64;
    loop {
        let page = client.dead_letters(Some(queue), PAGE).await?;
        let mut moved = 0u64;
        for letter in &page {
            if client.requeue(letter.id).await? {
                moved += 1;
            }
        }
        requeued += moved;
        // A page that moved nothing was taken by someone else meanwhile.
        if page.len() < PAGE as usize || moved == 0 {
            break;
        }
    }
    if out.is_json() {
        out.json(&json!({ "queue": queue, "requeued": requeued }))?;
    } else {
        out.text(&format!("{requeued} dead letters of {queue:?} requeued\n"))?;
    }
    Ok(Done::All)
}

/// `pg-lease purge --dead --queue Q [--yes]`: every dead letter of `queue`
/// deleted; without `yes` only how many there are (exit 1: nothing done).
pub async fn purge_dead(
    client: &Client,
    out: Output,
    queue: &str,
    yes: bool,
) -> Result<Done, CliError> {
    check_queue(client, Some(queue)).await?;
    if !yes {
        return unconfirmed(client, out, queue, "delete").await;
    }
    let purged = client.purge_dead(queue).await?;
    if out.is_json() {
        out.json(&json!({ "queue": queue, "purged": purged }))?;
    } else {
        out.text(&format!("{purged} dead letters of {queue:?} deleted\n"))?;
    }
    Ok(Done::All)
}

/// What `--all`/`--dead` without `--yes` says: how many dead letters
/// `queue` has and that nothing was done (exit 1).
async fn unconfirmed(
    client: &Client,
    out: Output,
    queue: &str,
    verb: &str,
) -> Result<Done, CliError> {
    let waiting = client.dead_letters(Some(queue), PAGE).await?.len();
    let many = if waiting >= PAGE as usize {
        format!("at least {PAGE}")
    } else {
        waiting.to_string()
    };
    if out.is_json() {
        out.json(&json!({ "queue": queue, "dead": waiting, "done": false }))?;
    } else {
        out.text(&format!(
            "{many} dead letters in queue {queue:?}; nothing done: add --yes to {verb} them\n"
        ))?;
    }
    Ok(Done::NotAll)
}

/// `pg-lease cancel ID` or `cancel --queue Q --key K`; exit 1 unless the
/// row is cancelled or its cancel requested.
pub async fn cancel(
    client: &Client,
    out: Output,
    id: Option<i64>,
    queue: Option<String>,
    key: Option<String>,
) -> Result<Done, CliError> {
    let result = match (id, &queue, &key) {
        (Some(id), _, _) => client.cancel(id).await?,
        (None, Some(queue), Some(key)) => client.cancel_key(queue, key).await?,
        // clap's `required_unless_present` and `requires` rule this out.
        _ => {
            return Err(CliError::NotFound(
                "cancel needs an id, or --queue and --key".to_owned(),
            ))
        }
    };
    let (word, state, text, ok) = match result {
        CancelResult::Cancelled => ("cancelled", None, "cancelled".to_owned(), true),
        CancelResult::CancelRequested => (
            "cancel_requested",
            None,
            "cancel requested: its holder stops at its next renewal".to_owned(),
            true,
        ),
        CancelResult::AlreadyFinished(s) => (
            "already_finished",
            Some(state_name(s)),
            format!("already finished ({}), unchanged", state_name(s)),
            false,
        ),
        CancelResult::NotFound => ("not_found", None, "no such row".to_owned(), false),
    };
    if out.is_json() {
        out.json(&json!({
            "id": id, "queue": queue, "key": key, "result": word, "state": state,
        }))?;
    } else {
        out.text(&format!("{text}\n"))?;
    }
    Ok(Done::from_ok(ok))
}
