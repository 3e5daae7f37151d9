//! What a handler answers: a rendered page, or an error page whose status
//! says what went wrong (404 unknown, 400 malformed, 401 not logged in,
//! 403 refused, 408 too slow, 413 too large, 503 the database is
//! unreachable). Never a panic, never the connection string.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use super::views::{ErrorPage, Layout};

/// A page, or why there is none.
pub type Reply = Result<Response, UiError>;

/// Renders `page` as a 200 answer.
pub fn page(page: &impl Template) -> Reply {
    Ok(Html(page.render()?).into_response())
}

/// Why a request has no page of its own.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// No such queue, row or page (404).
    #[error("{0}")]
    NotFound(String),
    /// A parameter that does not parse (400).
    #[error("{0}")]
    BadRequest(String),
    /// The dashboard asks for a login (`--login`) and the request carries
    /// none (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The request is refused before it reaches the database: actions are
    /// off, or the form's token is wrong (403).
    #[error("{0}")]
    Forbidden(String),
    /// The request's body did not arrive in time (408).
    #[error("{0}")]
    Timeout(String),
    /// What was asked for is larger than the dashboard serves (413).
    #[error("{0}")]
    TooLarge(String),
    /// The action found nothing to do: the row was not in a state it
    /// applies to (409).
    #[error("{0}")]
    Conflict(String),
    /// The database said no or failed; unreachable gives 503.
    #[error("{}", crate::error::client_reason(.0))]
    Client(#[from] pg_lease_client::Error),
    /// A template failed to render (a bug: 500).
    #[error("the page could not be rendered: {0}")]
    Render(#[from] askama::Error),
}

impl UiError {
    /// The answer's status.
    fn status(&self) -> StatusCode {
        match self {
            UiError::NotFound(_) => StatusCode::NOT_FOUND,
            UiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            UiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            UiError::Forbidden(_) => StatusCode::FORBIDDEN,
            UiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            UiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            UiError::Conflict(_) => StatusCode::CONFLICT,
            UiError::Client(e) if unreachable(e) => StatusCode::SERVICE_UNAVAILABLE,
            UiError::Client(e) if e.sqlstate() == Some("42501") => StatusCode::FORBIDDEN,
            UiError::Client(e) if e.is_invalid_input() => StatusCode::BAD_REQUEST,
            UiError::Client(_) | UiError::Render(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The page's heading.
    fn title(&self) -> &'static str {
        match self {
            UiError::NotFound(_) => "Not found",
            UiError::BadRequest(_) => "Bad request",
            UiError::Unauthorized(_) => "Log in first",
            UiError::Forbidden(_) => "Not allowed",
            UiError::Timeout(_) => "Too slow",
            UiError::TooLarge(_) => "Too large to show",
            UiError::Conflict(_) => "Nothing changed",
            UiError::Client(e) if unreachable(e) => "Database unreachable",
            UiError::Client(e) if e.sqlstate() == Some("42501") => "Refused by the database",
            UiError::Client(_) => "The database said no",
            UiError::Render(_) => "Internal error",
        }
    }

    /// The SQLSTATE to show, if the server sent one.
    fn sqlstate(&self) -> Option<String> {
        match self {
            UiError::Client(e) => e.sqlstate().map(str::to_owned),
            _ => None,
        }
    }
}

/// True when the database could not be reached or did not answer: the
/// page says so and works again once it is back (the client reconnects on
/// the next request).
fn unreachable(e: &pg_lease_client::Error) -> bool {
    e.is_connection()
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let page = ErrorPage {
            layout: Layout::bare(),
            status: status.as_u16(),
            title: self.title(),
            message: self.to_string(),
            sqlstate: self.sqlstate(),
            retry: status == StatusCode::SERVICE_UNAVAILABLE,
        };
        match page.render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => (status, self.to_string()).into_response(),
        }
    }
}
