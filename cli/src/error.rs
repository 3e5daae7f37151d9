//! What can go wrong, how it is printed, and the exit code it gives (the
//! contract is `args::EXIT_CODES`).

use std::fmt::Write as _;

/// A command that did not end in success.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither `--url` nor an environment variable names a database.
    #[error("no database: pass --url, or set PG_LEASE_URL, DATABASE_URL or PGHOST/PGDATABASE")]
    NoDatabase,
    /// The connection string (or a libpq variable) does not parse.
    #[error("bad connection string: {0}")]
    BadConnectionString(String),
    /// The connection could not be opened.
    #[error("could not connect to {target}: {}", client_reason(.source))]
    Connect {
        /// `host:port`.
        target: String,
        /// Why.
        #[source]
        source: pg_lease_client::Error,
    },
    /// The same, for `install` and `upgrade`, which connect without the client.
    #[error("could not connect to {target}: {}", pg_reason(.source))]
    ConnectPg {
        /// `host:port`.
        target: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The database has no pg_lease (no schema `lease`, or a table of it
    /// missing).
    #[error("pg_lease is not installed in this database (pg-lease install): {}", client_reason(.0))]
    NotInstalled(#[source] pg_lease_client::Error),
    /// The role may not do this; `needs` names the grant.
    #[error("{}; this needs {needs}", client_reason(.source))]
    NotAllowed {
        /// The grant that is missing.
        needs: String,
        /// What the server said.
        #[source]
        source: pg_lease_client::Error,
    },
    /// A call of the client failed: the database refused, or the
    /// connection broke during the command.
    #[error("{}", client_reason(.0))]
    Client(#[from] pg_lease_client::Error),
    /// A statement of `install` or `upgrade` failed.
    #[error("{}", pg_reason(.0))]
    Pg(#[source] tokio_postgres::Error),
    /// A `--queue` that names no queue.
    #[error("no queue named {0:?} in this database (SQLSTATE 42704)")]
    UnknownQueue(String),
    /// A failure explained in the terms of the command, with the server's
    /// own words appended.
    #[error("{explanation}: {reason}")]
    Explained {
        /// What it means for the command.
        explanation: String,
        /// What the server said, with its SQLSTATE.
        reason: String,
        /// The SQLSTATE, if the server sent one.
        sqlstate: Option<String>,
    },
    /// Something asked for is not there (a row, the extension).
    #[error("{0}")]
    NotFound(String),
    /// `ui` could not listen on its address.
    #[error("could not listen on {0}: {1}")]
    Listen(String, #[source] std::io::Error),
    /// `ui`'s server failed after it started.
    #[error("the dashboard's server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// Writing to stdout failed.
    #[error("could not write the output: {0}")]
    Output(#[from] std::io::Error),
    /// JSON could not be encoded.
    #[error("could not encode JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl CliError {
    /// 2 when nothing was tried (no database, no connection), 1 otherwise;
    /// clap exits 2 by itself on bad arguments.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NoDatabase
            | CliError::BadConnectionString(_)
            | CliError::Connect { .. }
            | CliError::ConnectPg { .. }
            | CliError::Listen(..) => 2,
            _ => 1,
        }
    }

    /// `explanation`, then what the server said in `cause`.
    pub fn explain_pg(explanation: impl Into<String>, cause: &tokio_postgres::Error) -> CliError {
        CliError::Explained {
            explanation: explanation.into(),
            reason: pg_reason(cause),
            sqlstate: cause.as_db_error().map(|d| d.code().code().to_owned()),
        }
    }

    /// `explanation`, then what the client reported in `cause`.
    pub fn explain_client(
        explanation: impl Into<String>,
        cause: &pg_lease_client::Error,
    ) -> CliError {
        CliError::Explained {
            explanation: explanation.into(),
            reason: client_reason(cause),
            sqlstate: cause.sqlstate().map(str::to_owned),
        }
    }

    /// A failed command's error in the command's terms: no pg_lease here
    /// (3F000, 42P01), or a grant missing (42501, naming `needs`).
    pub fn of_command(self, needs: String) -> CliError {
        match self {
            CliError::Client(e) => match e.sqlstate() {
                Some("3F000" | "42P01" | "42883") => CliError::NotInstalled(e),
                Some("42501") => CliError::NotAllowed { needs, source: e },
                _ => CliError::Client(e),
            },
            other => other,
        }
    }

    /// True when stdout was closed under us (`pg-lease jobs list | head`):
    /// not worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// The SQLSTATE behind the error, if the server sent one.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            CliError::Connect { source: e, .. }
            | CliError::Client(e)
            | CliError::NotInstalled(e)
            | CliError::NotAllowed { source: e, .. } => e.sqlstate().map(str::to_owned),
            CliError::ConnectPg { source: e, .. } | CliError::Pg(e) => {
                e.as_db_error().map(|d| d.code().code().to_owned())
            }
            CliError::Explained { sqlstate, .. } => sqlstate.clone(),
            CliError::UnknownQueue(_) => Some("42704".to_owned()),
            _ => None,
        }
    }
}

/// The server's message with its SQLSTATE, detail and hint, on one line:
/// `message (SQLSTATE 42501; hint: ...)`.
fn pg_reason(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return chain(e);
    };
    let mut text = format!("{} (SQLSTATE {}", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        let _ = write!(text, "; detail: {detail}");
    }
    if let Some(hint) = db.hint() {
        let _ = write!(text, "; hint: {hint}");
    }
    text.push(')');
    text
}

/// [`pg_reason`] for the client's errors, which keep the server's error
/// where there was one.
pub fn client_reason(e: &pg_lease_client::Error) -> String {
    use pg_lease_client::Error as E;
    match e {
        E::Database(pg) | E::Connection(pg) if pg.as_db_error().is_some() => pg_reason(pg),
        E::InvalidInput { code, message } if code != "client" => {
            format!("{message} (SQLSTATE {code})")
        }
        E::PermissionDenied(message) => format!("{message} (SQLSTATE 42501)"),
        E::Connection(pg) => chain(pg),
        // The client's own words already say what it is.
        other => other.to_string(),
    }
}

/// A driver error without a server message: its causes, outermost first.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_sqlstates() {
        assert_eq!(CliError::NoDatabase.exit_code(), 2);
        let refused = CliError::Client(pg_lease_client::Error::PermissionDenied(
            "permission denied for schema lease".into(),
        ));
        assert_eq!(refused.exit_code(), 1);
        assert_eq!(refused.sqlstate().as_deref(), Some("42501"));
        assert_eq!(
            refused.to_string(),
            "permission denied for schema lease (SQLSTATE 42501)"
        );
        let unknown = CliError::UnknownQueue("nope".into());
        assert_eq!(unknown.exit_code(), 1);
        assert!(unknown.to_string().contains("42704"));
        let pipe = CliError::Output(std::io::ErrorKind::BrokenPipe.into());
        assert!(pipe.is_broken_pipe());
    }
}
