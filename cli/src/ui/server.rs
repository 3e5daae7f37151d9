//! The HTTP/1 server under the router. A client that sends half a request
//! holds a connection for as long as it likes unless something ends it,
//! so: a request's head must arrive within [`HEAD_TIMEOUT`] and its body
//! within [`BODY_TIMEOUT`], and at most [`MAX_CONNECTIONS`] connections
//! are open at once (the next ones wait to be accepted until one closes,
//! which the deadlines make soon).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::reply::UiError;

/// Time for a request's head (request line and headers) to arrive, counted
/// from when the server waits for it; an idle kept-alive connection is
/// closed after it too (browsers open a new one).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Time for a request's body to arrive once its head has.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections open at once. A browser opens about six per server.
pub const MAX_CONNECTIONS: usize = 128;

/// The largest request head: long enough for any URL of the dashboard and
/// a browser's cookies for the host.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The largest request body; the forms send a few dozen bytes.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long open connections may finish their requests after `shutdown`.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, router: Router, shutdown: impl Future<Output = ()>) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let mut shutdown = pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener, &open) => accepted,
        };
        let Some((stream, permit)) = accepted else {
            break;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection that ends in error (a deadline, a reset) has
            // nobody to tell.
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// The next connection, once fewer than [`MAX_CONNECTIONS`] are open;
/// `None` if the permits are gone (never: nothing closes them).
async fn accept(
    listener: &TcpListener,
    open: &Arc<Semaphore>,
) -> Option<(TcpStream, OwnedSemaphorePermit)> {
    let permit = Arc::clone(open).acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return Some((stream, permit)),
            // The peer gave up before it was accepted.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) => {}
            // Out of file descriptors or the like: wait rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Middleware: reads a request's body before its handler, within
/// [`BODY_TIMEOUT`] (408 otherwise) and up to [`MAX_BODY_BYTES`] (413).
pub async fn bounded_body(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return UiError::TooLarge(format!(
                "a request's body may have up to {MAX_BODY_BYTES} bytes"
            ))
            .into_response()
        }
        Err(_) => {
            return UiError::Timeout(format!(
                "the request's body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ))
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
