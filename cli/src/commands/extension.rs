//! `install` and `upgrade`: `CREATE EXTENSION` and `ALTER EXTENSION ...
//! UPDATE`. They run on a plain connection rather than through the client,
//! which wraps the extension's functions and has nothing to call before
//! the extension exists.

use pg_lease_client::DEFAULT_CONNECT_TIMEOUT;
use serde_json::json;
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};

use super::Done;
use crate::error::CliError;
use crate::output::Output;
use crate::target::Target;

/// What the database says about pg_lease.
struct Versions {
    database: String,
    /// `pg_extension.extversion`: what this database has.
    installed: Option<String>,
    /// `pg_available_extensions.default_version`: what the server's files
    /// would install or update to.
    available: Option<String>,
}

/// `pg-lease install`: creates the extension unless it exists (then exit 0
/// with nothing done: the state asked for is there).
pub async fn install(target: &Target, out: Output) -> Result<Done, CliError> {
    let pg = connect(target).await?;
    let before = versions(&pg).await?;
    if before.installed.is_none() {
        pg.batch_execute("CREATE EXTENSION pg_lease")
            .await
            .map_err(|e| refused(e, "create pg_lease", "CREATE EXTENSION"))?;
    }
    let after = versions(&pg).await?;
    let to = after.installed.as_deref().unwrap_or("?");
    let db = &after.database;
    let text = match &before.installed {
        Some(v) => format!("pg_lease {v} is already installed in database {db:?}; nothing done\n"),
        None => format!(
            "pg_lease {to} installed in database {db:?}\n{}",
            reaper_note(&pg).await
        ),
    };
    report(out, &before, &after, &text)
}

/// `pg-lease upgrade`: updates to the default version of the server's
/// files and prints from → to. Nothing is run when the database is at
/// that version already, so a role without rights gets its answer too.
pub async fn upgrade(target: &Target, out: Output) -> Result<Done, CliError> {
    let pg = connect(target).await?;
    let before = versions(&pg).await?;
    let Some(from) = before.installed.as_deref() else {
        return Err(CliError::NotFound(format!(
            "pg_lease is not installed in database {:?}: pg-lease install",
            before.database
        )));
    };
    if before.available.as_deref() != Some(from) {
        pg.batch_execute("ALTER EXTENSION pg_lease UPDATE")
            .await
            .map_err(|e| refused(e, "update pg_lease", "ALTER EXTENSION"))?;
    }
    let after = versions(&pg).await?;
    let to = after.installed.as_deref().unwrap_or("?");
    let db = &after.database;
    let text = if from == to {
        format!(
            "pg_lease {from} in database {db:?} is the newest the server offers; nothing done\n"
        )
    } else {
        format!("pg_lease {from} → {to} in database {db:?}\n")
    };
    report(out, &before, &after, &text)
}

/// Prints the outcome as text or as `{"database", "from", "to", ...}`.
fn report(out: Output, before: &Versions, after: &Versions, text: &str) -> Result<Done, CliError> {
    if out.is_json() {
        out.json(&json!({
            "database": after.database,
            "from": before.installed,
            "to": after.installed,
            "available": after.available,
            "changed": before.installed != after.installed,
        }))?;
    } else {
        out.text(text)?;
    }
    Ok(Done::All)
}

/// A connection with the client's default connect timeout unless the
/// string sets one; every failure here exits 2.
async fn connect(target: &Target) -> Result<tokio_postgres::Client, CliError> {
    let mut config = target.config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    let (client, connection) =
        config
            .connect(NoTls)
            .await
            .map_err(|source| CliError::ConnectPg {
                target: target.shown.clone(),
                source,
            })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("pg-lease: connection ended: {e}");
        }
    });
    Ok(client)
}

/// The unnamed statement, never a prepared one: through a transaction-mode
/// pooler the connection serves other clients' transactions, where a named
/// statement left behind collides with theirs (42P05).
async fn rows(pg: &tokio_postgres::Client, sql: &str) -> Result<Vec<Row>, tokio_postgres::Error> {
    pg.query_typed(sql, &[]).await
}

async fn versions(pg: &tokio_postgres::Client) -> Result<Versions, CliError> {
    let found = rows(
        pg,
        "SELECT current_database()::text,
                (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_lease'),
                (SELECT default_version FROM pg_catalog.pg_available_extensions
                  WHERE name = 'pg_lease')",
    )
    .await
    .map_err(CliError::Pg)?;
    let row = found.first().ok_or_else(|| {
        CliError::NotFound("no answer to the question of pg_lease's versions".into())
    })?;
    Ok(Versions {
        database: row.try_get(0).map_err(CliError::Pg)?,
        installed: row.try_get(1).map_err(CliError::Pg)?,
        available: row.try_get(2).map_err(CliError::Pg)?,
    })
}

/// Explains the two refusals an operator meets: the server lacks the
/// extension's files, or the role lacks the right (42501).
fn refused(e: tokio_postgres::Error, action: &str, statement: &str) -> CliError {
    let Some(db) = e.as_db_error() else {
        return CliError::Pg(e);
    };
    let explanation = if files_missing(db.code().code(), db.message(), db.detail()) {
        format!(
            "cannot {action}: the server lacks pg_lease's files; install its package \
             (or `cargo pgrx install`) on the database host first"
        )
    } else if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE {
        format!(
            "cannot {action}: {statement} pg_lease needs the superuser (or, to update, \
             the extension's owner)"
        )
    } else {
        format!("cannot {action}")
    };
    CliError::explain_pg(explanation, &e)
}

/// Whether the server said it has no pg_lease: `58P01` (no control file in
/// older minor releases, or no shared library), or, in newer ones (15.20
/// here), `0A000` 'extension "pg_lease" is not available' with the detail
/// "Could not open extension control file".
fn files_missing(code: &str, message: &str, detail: Option<&str>) -> bool {
    code == SqlState::UNDEFINED_FILE.code()
        || (code == SqlState::FEATURE_NOT_SUPPORTED.code()
            && (message.contains("is not available")
                || detail.is_some_and(|d| d.contains("extension control file"))))
}

/// After an install: a line saying the reaper will not run, if so.
async fn reaper_note(pg: &tokio_postgres::Client) -> &'static str {
    let preloaded = rows(
        pg,
        "SELECT slot_shortages IS NOT NULL FROM lease.reaper_stats",
    )
    .await
    .ok()
    .and_then(|found| found.first().and_then(|r| r.try_get::<_, bool>(0).ok()));
    match preloaded {
        Some(false) => {
            "no reaper runs in this server (pg_lease is not in shared_preload_libraries): \
             expired leases wait for `pg-lease sweep` or lease.sweep() from a scheduler\n"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::files_missing;

    #[test]
    fn missing_files_are_recognised_in_old_and_new_wording() {
        // PostgreSQL 15.20, as printed there.
        assert!(files_missing(
            "0A000",
            "extension \"pg_lease\" is not available",
            Some("Could not open extension control file \"/usr/share/postgresql/15/extension/pg_lease.control\": No such file or directory."),
        ));
        // Earlier minors, and a control file without its library.
        assert!(files_missing(
            "58P01",
            "could not open extension control file \"/usr/share/postgresql/15/extension/pg_lease.control\": No such file or directory",
            None,
        ));
        assert!(files_missing(
            "58P01",
            "could not access file \"$libdir/pg_lease\": No such file or directory",
            None,
        ));
        assert!(!files_missing("0A000", "cannot do that", None));
        assert!(!files_missing(
            "42501",
            "permission denied to create extension \"pg_lease\"",
            None
        ));
    }
}
