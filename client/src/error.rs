//! The one error type of this crate.

use std::time::Duration;

use tokio_postgres::error::SqlState;

/// SQLSTATE that `lease.fence` and `lease.fence_named` raise when the caller
/// does not hold the lease.
pub const LEASE_LOST_SQLSTATE: &str = "LE001";

/// SQLSTATEs that pg_lease uses for bad input (docs/sql.md, "Conventions"),
/// plus PostgreSQL's own numeric and datetime range errors.
const INVALID_INPUT: &[SqlState] = &[
    SqlState::NULL_VALUE_NOT_ALLOWED,
    SqlState::INVALID_PARAMETER_VALUE,
    SqlState::UNDEFINED_OBJECT,
    SqlState::WRONG_OBJECT_TYPE,
    SqlState::INVALID_TEXT_REPRESENTATION,
    SqlState::INVALID_DATETIME_FORMAT,
    SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
    SqlState::DATETIME_FIELD_OVERFLOW,
];

/// SQLSTATEs of a statement of this client that names an object of
/// pg_lease the database does not have.
const NOT_INSTALLED: &[SqlState] = &[
    SqlState::INVALID_SCHEMA_NAME,
    SqlState::UNDEFINED_FUNCTION,
    SqlState::UNDEFINED_TABLE,
];

/// Everything that can go wrong, in three families a caller usually treats
/// differently:
///
/// * the lease is lost ([`Error::LeaseLost`], [`Error::NamedLeaseLost`]):
///   stop working on behalf of it, another owner may have it now;
/// * the database could not be reached or did not answer in time
///   ([`Error::Connection`], [`Error::Timeout`]): retry later, the lease may
///   or may not still be held;
/// * the request was wrong ([`Error::InvalidInput`], [`Error::Payload`],
///   [`Error::PermissionDenied`]): retrying will not help.
///
/// [`Error::Database`] and [`Error::Protocol`] cover the rest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease on queue row `id` at `epoch` is no longer held: it expired,
    /// was released, or a newer epoch took over. Nothing was changed.
    #[error("lease lost: row {id} at epoch {epoch} is no longer held")]
    LeaseLost {
        /// Row id.
        id: i64,
        /// The epoch the caller presented.
        epoch: i64,
    },

    /// The named lease `name` at `epoch` is no longer held: step down.
    #[error("named lease lost: \"{name}\" at epoch {epoch} is no longer held")]
    NamedLeaseLost {
        /// Name of the lease.
        name: String,
        /// The epoch the caller presented.
        epoch: i64,
    },

    /// The connection failed, was closed, or the server is shutting down.
    #[error("connection error: {}", describe(.0))]
    Connection(#[source] tokio_postgres::Error),

    /// The request (including connecting, if needed) did not complete in
    /// time. The connection it used is discarded; the request may or may not
    /// have taken effect.
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),

    /// The server or this client rejected an argument. `code` is the
    /// SQLSTATE (`22004`, `22023`, `42704`, `22P02`, ...) or `"client"` for a
    /// check done before sending.
    #[error("invalid input ({code}): {message}")]
    InvalidInput {
        /// SQLSTATE, or `"client"`.
        code: String,
        /// What was wrong.
        message: String,
    },

    /// The role lacks a grant, or may not use a restricted queue (SQLSTATE
    /// `42501`); see docs/security.md. A restricted queue that the role
    /// holds no right on at all answers as a queue that does not exist
    /// ([`Error::InvalidInput`], `42704`), so that its name stays unknown.
    #[error("permission denied: {0}")]
    PermissionDenied(String),

    /// The database has no pg_lease, or one older than this client: a
    /// schema, function or view of it is missing (SQLSTATE `3F000`,
    /// `42883` or `42P01`). Retrying will not help until it is installed
    /// or upgraded (`CREATE EXTENSION pg_lease`, `pg-lease upgrade`).
    #[error("pg_lease is not installed in this database, or is older than this client ({code}): {message}")]
    NotInstalled {
        /// SQLSTATE.
        code: String,
        /// What the server said was missing.
        message: String,
    },

    /// A payload could not be serialized to, or deserialized from, JSON.
    #[error("payload is not the expected JSON: {0}")]
    Payload(#[from] serde_json::Error),

    /// Any other error reported by the database or the driver.
    #[error("database error: {}", describe(.0))]
    Database(#[source] tokio_postgres::Error),

    /// Any other error reported by sqlx, in the functions of the `sqlx`
    /// feature (`pg_lease_client::sqlx`).
    #[cfg(feature = "sqlx")]
    #[error("sqlx error: {0}")]
    Sqlx(#[source] ::sqlx::Error),

    /// The database answered something this client did not expect (for
    /// example a NULL where the SQL reference promises a value).
    #[error("unexpected answer from the database: {0}")]
    Protocol(String),
}

/// Shorthand for `std::result::Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for [`Error::LeaseLost`] and [`Error::NamedLeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. } | Error::NamedLeaseLost { .. })
    }

    /// True for [`Error::Connection`] and [`Error::Timeout`]: the outcome of
    /// the request is unknown and retrying on a new connection may work.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_) | Error::Timeout(_))
    }

    /// True when the server lost a statement the connection prepared
    /// (26000) or already had one by its name (42P05): a transaction pooler
    /// moved the connection. Nothing ran; a new connection prepares afresh.
    pub fn is_stale_statement(&self) -> bool {
        matches!(
            self.sqlstate(),
            Some(code) if code == SqlState::INVALID_SQL_STATEMENT_NAME.code()
                || code == SqlState::DUPLICATE_PSTATEMENT.code()
        )
    }

    /// True for [`Error::InvalidInput`], [`Error::Payload`],
    /// [`Error::PermissionDenied`] and [`Error::NotInstalled`]: retrying the
    /// same request will fail again.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidInput { .. }
                | Error::Payload(_)
                | Error::PermissionDenied(_)
                | Error::NotInstalled { .. }
        )
    }

    /// True when trying the same request again later may succeed: the
    /// connection families, and server errors that say so (class 40
    /// serialization failures and deadlocks, lock or statement timeouts,
    /// class 53 resources). The [`Worker`](crate::Worker) retries these.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connection(_) | Error::Timeout(_) => true,
            Error::Database(e) => e.as_db_error().is_some_and(|db| {
                let code = db.code();
                code.code().starts_with("40")
                    || code.code().starts_with("53")
                    || *code == SqlState::LOCK_NOT_AVAILABLE
                    || *code == SqlState::QUERY_CANCELED
            }),
            _ => false,
        }
    }

    /// The SQLSTATE the server sent, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::LeaseLost { .. } | Error::NamedLeaseLost { .. } => Some(LEASE_LOST_SQLSTATE),
            Error::Connection(e) | Error::Database(e) => e.as_db_error().map(|d| d.code().code()),
            Error::InvalidInput { code, .. } if code != "client" => Some(code),
            Error::NotInstalled { code, .. } => Some(code),
            Error::PermissionDenied(_) => Some("42501"),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(e) => pg_error_of(e).map(|db| db.code()),
            _ => None,
        }
    }

    /// A client-side [`Error::InvalidInput`].
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidInput {
            code: "client".to_owned(),
            message: message.into(),
        }
    }

    /// The bad-input and permission families, by SQLSTATE; `None` for
    /// other codes.
    fn from_code(code: &str, message: &str) -> Option<Error> {
        let state = SqlState::from_code(code);
        if INVALID_INPUT.contains(&state) {
            return Some(Error::InvalidInput {
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
        if NOT_INSTALLED.contains(&state) {
            return Some(Error::NotInstalled {
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
        (state == SqlState::INSUFFICIENT_PRIVILEGE)
            .then(|| Error::PermissionDenied(message.to_owned()))
    }

    /// Sorts a driver error into the families above.
    pub(crate) fn from_pg(e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            let code = db.code();
            if let Some(sorted) = Error::from_code(code.code(), db.message()) {
                return sorted;
            }
            // Class 08 connection exceptions, 57P admin/crash shutdown,
            // class 28 authorization, too many connections.
            let class = code.code();
            if class.starts_with("08")
                || class.starts_with("57P")
                || class.starts_with("28")
                || *code == SqlState::TOO_MANY_CONNECTIONS
            {
                return Error::Connection(e);
            }
            return Error::Database(e);
        }
        let io = std::error::Error::source(&e)
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
        if e.is_closed() || io {
            Error::Connection(e)
        } else {
            Error::Database(e)
        }
    }

    /// Like [`Error::from_pg`], but `LE001` becomes [`Error::LeaseLost`].
    pub(crate) fn from_pg_fenced(e: tokio_postgres::Error, id: i64, epoch: i64) -> Error {
        if sqlstate_of(&e) == Some(LEASE_LOST_SQLSTATE) {
            Error::LeaseLost { id, epoch }
        } else {
            Error::from_pg(e)
        }
    }

    /// Like [`Error::from_pg`], but `LE001` becomes [`Error::NamedLeaseLost`].
    pub(crate) fn from_pg_named(e: tokio_postgres::Error, name: &str, epoch: i64) -> Error {
        if sqlstate_of(&e) == Some(LEASE_LOST_SQLSTATE) {
            Error::NamedLeaseLost {
                name: name.to_owned(),
                epoch,
            }
        } else {
            Error::from_pg(e)
        }
    }
}

/// The functions of the `sqlx` feature: the same families from sqlx errors.
#[cfg(feature = "sqlx")]
impl Error {
    /// Sorts a sqlx error into the families above.
    pub(crate) fn from_sqlx(e: ::sqlx::Error) -> Error {
        if let Some(db) = pg_error_of(&e) {
            if let Some(sorted) = Error::from_code(db.code(), db.message()) {
                return sorted;
            }
        }
        Error::Sqlx(e)
    }

    /// Like [`Error::from_sqlx`], but `LE001` becomes `lost()`.
    pub(crate) fn from_sqlx_fenced(e: ::sqlx::Error, lost: impl FnOnce() -> Error) -> Error {
        if pg_error_of(&e).is_some_and(|db| db.code() == LEASE_LOST_SQLSTATE) {
            lost()
        } else {
            Error::from_sqlx(e)
        }
    }
}

#[cfg(feature = "sqlx")]
fn pg_error_of(e: &::sqlx::Error) -> Option<&::sqlx::postgres::PgDatabaseError> {
    e.as_database_error()?.try_downcast_ref()
}

fn sqlstate_of(e: &tokio_postgres::Error) -> Option<&str> {
    e.as_db_error().map(|d| d.code().code())
}

/// The driver's own message for a server error is just "db error"; the
/// server's message is in the `DbError`.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_disjoint() {
        let lost = Error::LeaseLost { id: 1, epoch: 2 };
        assert!(lost.is_lease_lost() && !lost.is_connection() && !lost.is_invalid_input());
        assert_eq!(lost.sqlstate(), Some("LE001"));
        let timeout = Error::Timeout(Duration::from_secs(1));
        assert!(timeout.is_connection() && !timeout.is_lease_lost());
        let bad = Error::invalid("limit must be at least 1");
        assert!(bad.is_invalid_input() && !bad.is_connection() && !bad.is_transient());
        assert_eq!(bad.sqlstate(), None);
        assert!(timeout.is_transient());
        // A batch answer that does not match its input is Protocol, which
        // the Worker retries; before the fix release_and_claim reported it as
        // invalid input, and the Worker gave those leases up.
        let mismatch = Error::Protocol("batch answer does not match".into());
        assert!(!mismatch.is_invalid_input());
    }
}
