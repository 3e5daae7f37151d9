//! `pg-lease`: look at pg_lease in one database and act on it, without
//! writing SQL against its tables. Every command but `install` and
//! `upgrade` is a few calls of [`pg_lease_client::Client`]; the roles it
//! needs are the SQL functions' (docs/security.md).
//!
//! ```sh
//! pg-lease --url "host=db user=ops dbname=app" status
//! pg-lease dead --queue emails            # PG_LEASE_URL or DATABASE_URL also work
//! pg-lease requeue 4711 4712
//! pg-lease --json jobs show 4711 | jq .payload
//! ```
//!
//! `args` is the command line, `ui` the web dashboard, `commands` one module per group of
//! commands, `output` the tables and JSON they print, `error` what can go
//! wrong and the exit code it gives.

mod args;
mod commands;
mod error;
mod output;
mod target;
mod ui;

use std::process::ExitCode;

use clap::Parser;
use pg_lease_client::{Client, Connector};

use args::{Cli, Command};
use commands::Done;
use error::CliError;
use output::Output;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // clap prints usage errors itself and exits 2.
    let cli = Cli::parse();
    match run(cli).await {
        Ok(Done::All) => ExitCode::SUCCESS,
        Ok(Done::NotAll) => ExitCode::FAILURE,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            let mut message = e.to_string();
            // Every variant that has one prints it; this keeps it so.
            if let Some(code) = e.sqlstate().filter(|c| !message.contains(c.as_str())) {
                message.push_str(&format!(" (SQLSTATE {code})"));
            }
            eprintln!("pg-lease: {message}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Finds the database, connects, and runs the command.
async fn run(cli: Cli) -> Result<Done, CliError> {
    let out = Output::new(cli.json);
    let url = cli.url.or_else(|| std::env::var("DATABASE_URL").ok());
    let target = target::resolve(url)?;
    match cli.command {
        Command::Install => commands::install(&target, out).await,
        Command::Upgrade => commands::upgrade(&target, out).await,
        command => {
            let role = target.config.get_user().map(str::to_owned);
            // Unprepared: a command sends a few statements once, and through
            // a transaction-mode pooler a prepared one outlives the
            // transaction on a connection other clients get next (42P05).
            let connector = Connector::new(target.config, tokio_postgres::NoTls)
                .with_prepared_statements(false);
            let client = Client::with_connector(connector);
            // Opens the connection now, without a statement: a failure here
            // is the connection's, and a statement's failure is its own.
            client.open().await.map_err(|source| CliError::Connect {
                target: target.shown.clone(),
                source,
            })?;
            if let Command::Ui {
                listen,
                allow_actions,
                allow_hosts,
                login,
            } = command
            {
                let options = ui::Options {
                    listen,
                    allow_actions,
                    allow_hosts,
                    login,
                };
                return ui::serve(client, target.shown, options).await;
            }
            let needs = needs(&command, role.as_deref());
            commands::run(&client, command, out)
                .await
                .map_err(|e| e.of_command(needs))
        }
    }
}

/// The grant a command needs, for the message of a refusal (42501), to
/// `role`, the role that connected.
fn needs(command: &Command, role: Option<&str>) -> String {
    let role = role.map_or_else(|| "your_role".to_owned(), identifier);
    match command {
        Command::Cancel { .. } => format!(
            "lease_worker, and on a restricted queue a grant of it: \
             GRANT lease_worker TO {role}; SELECT lease.grant('the queue', '{role}')"
        ),
        _ => format!("the role lease_admin: GRANT lease_admin TO {role}"),
    }
}

/// `name` as an SQL identifier: bare when it would read back the same,
/// else double-quoted.
fn identifier(name: &str) -> String {
    let bare = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::identifier;

    #[test]
    fn a_role_is_named_as_sql_reads_it_back() {
        assert_eq!(identifier("nobody"), "nobody");
        assert_eq!(identifier("_ops2"), "_ops2");
        assert_eq!(identifier("Ops"), "\"Ops\"");
        assert_eq!(identifier("app-1"), "\"app-1\"");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(identifier("2x"), "\"2x\"");
    }
}
