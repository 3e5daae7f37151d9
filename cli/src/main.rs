//! `pg-lease`: look at pg_lease in one database and act on it, without
//! writing SQL against its tables. Every command is one call of
//! [`pg_lease_client::Client`]; the roles it needs are the SQL functions'
//! (README, "Security").
//!
//! ```sh
//! pg-lease --url "host=db user=ops dbname=app" stats
//! pg-lease dead --queue emails            # PG_LEASE_URL or DATABASE_URL also work
//! pg-lease requeue 4711 4712
//! pg-lease cancel --queue items --key b1
//! ```

mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pg_lease_client::{CancelResult, Client};

use table::{age, Table};

/// Inspect and operate pg_lease queues in one database.
#[derive(Parser, Debug)]
#[command(name = "pg-lease", version, about)]
struct Cli {
    /// Connection string (libpq style or postgresql:// URL).
    #[arg(long, env = "PG_LEASE_URL")]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Rows per queue and state, oldest ready age, leases recovered.
    Stats,
    /// Leases held now (queue rows).
    InFlight {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Named leases and their holders.
    Holders,
    /// Dead letters, oldest first.
    Dead {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Puts dead letters back to pending, attempts reset.
    Requeue {
        /// Row ids.
        #[arg(required = true)]
        ids: Vec<i64>,
    },
    /// Cancels a row by id, or by queue and key.
    Cancel {
        /// Row id.
        #[arg(conflicts_with_all = ["queue", "key"], required_unless_present = "key")]
        id: Option<i64>,
        /// Queue of the row to cancel by key.
        #[arg(long, requires = "key")]
        queue: Option<String>,
        /// Key of the row (an attached table's primary key as text).
        #[arg(long, requires = "queue")]
        key: Option<String>,
    },
    /// Recovers expired leases now (what the reaper does).
    Reap {
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        max_rows: u32,
    },
    /// Deletes finished rows past their queue's retention now.
    Purge {
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        max_rows: u32,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.url.or_else(|| std::env::var("DATABASE_URL").ok()) else {
        eprintln!("pg-lease: no database: pass --url, or set PG_LEASE_URL or DATABASE_URL");
        return ExitCode::from(2);
    };
    let result = match Client::connect(&url).await {
        Ok(client) => run(&client, cli.command).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pg-lease: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command and prints its answer; the exit code says whether
/// everything asked for happened.
async fn run(client: &Client, command: Command) -> pg_lease_client::Result<ExitCode> {
    match command {
        Command::Stats => {
            let mut t = Table::new(&[
                "queue",
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
            for s in client.queue_stats().await? {
                t.row(vec![
                    s.queue,
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
            t.print();
        }
        Command::InFlight { queue } => {
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
            for l in client.in_flight(queue.as_deref()).await? {
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
            t.print();
        }
        Command::Holders => {
            let mut t = Table::new(&["name", "owner", "epoch", "remaining"]);
            for h in client.holders().await? {
                t.row(vec![h.name, h.owner, h.epoch.to_string(), age(h.remaining)]);
            }
            t.print();
        }
        Command::Dead { queue, limit } => {
            let mut t = Table::new(&["id", "queue", "key", "attempts", "last error"]);
            for d in client.dead_letters(queue.as_deref(), limit).await? {
                t.row(vec![
                    d.id.to_string(),
                    d.queue,
                    d.key.unwrap_or_default(),
                    d.attempts.to_string(),
                    d.last_error.unwrap_or_default(),
                ]);
            }
            t.print();
        }
        Command::Requeue { ids } => {
            let mut all = true;
            for id in ids {
                if client.requeue(id).await? {
                    println!("{id}: requeued");
                } else {
                    println!("{id}: not a dead letter, unchanged");
                    all = false;
                }
            }
            return Ok(if all {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Cancel { id, queue, key } => {
            let result = match (id, queue, key) {
                (Some(id), _, _) => client.cancel(id).await?,
                (None, Some(queue), Some(key)) => client.cancel_key(&queue, &key).await?,
                _ => unreachable_args(),
            };
            let (text, ok) = match result {
                CancelResult::Cancelled => ("cancelled".to_owned(), true),
                CancelResult::CancelRequested => (
                    "cancel requested: its holder stops at its next renewal".to_owned(),
                    true,
                ),
                CancelResult::AlreadyFinished(state) => {
                    (format!("already finished ({state:?}), unchanged"), false)
                }
                CancelResult::NotFound => ("no such row".to_owned(), false),
            };
            println!("{text}");
            return Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Reap { max_rows } => {
            let mut t = Table::new(&["queue", "requeued", "dead", "cancelled"]);
            for r in client.reap(max_rows).await? {
                t.row(vec![
                    r.queue,
                    r.requeued.to_string(),
                    r.dead.to_string(),
                    r.cancelled.to_string(),
                ]);
            }
            t.print();
        }
        Command::Purge { max_rows } => {
            println!("{} rows purged", client.purge(max_rows).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// clap's `required_unless_present` and `requires` rule this out.
fn unreachable_args() -> ! {
    eprintln!("pg-lease: cancel needs an id, or --queue and --key");
    std::process::exit(2)
}
