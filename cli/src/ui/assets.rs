//! The stylesheet and script, compiled into the binary: the dashboard
//! fetches nothing from anywhere else.

use axum::extract::Path;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::reply::{Reply, UiError};

/// `/assets/<file>`.
pub async fn asset(Path(file): Path<String>) -> Reply {
    let (kind, body) = match file.as_str() {
        "app.css" => (
            "text/css; charset=utf-8",
            include_str!("../../assets/app.css"),
        ),
        "app.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../../assets/app.js"),
        ),
        _ => return Err(UiError::NotFound(format!("no asset {file:?}"))),
    };
    Ok(([(CONTENT_TYPE, kind)], body).into_response())
}
