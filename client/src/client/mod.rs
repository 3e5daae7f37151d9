//! [`Client`]: typed, async wrappers over every SQL function of pg_lease.
//!
//! This file holds the connection handling; the calls are grouped by what
//! they act on: `queues` (queues and their rows), `leases` (claims and the
//! leases on rows), `named` (named leases), `schedules`
//! (periodic enqueues), `admin` (housekeeping and the views),
//! `summaries` (rows without their payloads, for listings); `tx` has
//! the calls made in the caller's own transaction. `statements` is their
//! SQL, `args` binds the enqueue arguments, `rows` reads their answers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OnceCell};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

mod admin;
mod args;
mod leases;
mod named;
mod queues;
mod rows;
mod schedules;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod statements;
mod summaries;
pub mod tx;

pub use tx::{fence, fence_in, fence_named};

use crate::connect::Connector;
use crate::error::{Error, Result};
use statements::Query;

/// Default time allowed for one request once a connection is in hand
/// ([`Client::with_timeout`] changes it). Connecting has its own budget,
/// [`Connector::with_connect_timeout`](crate::Connector::with_connect_timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle to pg_lease in one database: typed wrappers over every SQL
/// function of schema `lease`, each one round trip over a prepared
/// statement.
///
/// Durations are [`Duration`]s, sent as microseconds and turned into
/// intervals by the server; times come from the database clock. Payloads go
/// through serde as `jsonb`.
///
/// A `Client` is cheap to clone; clones share one connection, on which
/// tokio-postgres pipelines concurrent requests. Made with
/// [`Client::connect`] or [`Client::with_connector`], it reconnects by
/// itself: a request that finds the connection closed opens a new one, and
/// a request that fails with a connection error or times out discards the
/// connection it used (its statements are prepared again on the next one).
/// Made with [`Client::from_postgres`], it uses that one connection only.
///
/// For a highly available PostgreSQL, list every server and ask for the
/// primary: `host=db1,db2 target_session_attrs=read-write`. After a
/// failover the next request reconnects to whichever server accepts
/// writes; a lease taken before the failover counts only once the new
/// primary confirms it (the [`Worker`](crate::Worker) renews it there, and
/// fires the job's cancellation token if that fails).
///
/// Behind a transaction-mode pooler, turn
/// [`WorkerConfig::listen`](crate::WorkerConfig::listen) off, and unless the
/// pooler keeps prepared statements (PgBouncer ≥ 1.21 with
/// `max_prepared_statements`), connect with
/// [`Connector::with_prepared_statements(false)`](Connector::with_prepared_statements).
/// A prepared statement the pooler lost anyway (26000 or 42P05, nothing
/// ran) is sent once more on a new connection: a reconnect, not a stall.
///
/// Calls made under a lease ([`release`](Client::release),
/// [`renew`](Client::renew), [`fenced_update`](Client::fenced_update), ...)
/// return [`Error::LeaseLost`] when the database says the lease is no longer
/// held; nothing was changed then.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("connector", &self.inner.connector)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

struct Inner {
    connector: Option<Connector>,
    current: Mutex<Option<Arc<Conn>>>,
}

/// One connection and the statements prepared on it.
struct Conn {
    pg: tokio_postgres::Client,
    /// Whether statements are prepared (`Connector::with_prepared_statements`).
    prepare: bool,
    statements: Vec<OnceCell<Statement>>,
}

impl Conn {
    fn new(pg: tokio_postgres::Client, prepare: bool) -> Conn {
        Conn {
            pg,
            prepare,
            statements: (0..Query::COUNT).map(|_| OnceCell::new()).collect(),
        }
    }

    async fn query(&self, q: Query, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        if !self.prepare || q.planned_per_call() {
            return self
                .pg
                .query_typed(q.sql(), &q.typed(params))
                .await
                .map_err(Error::from_pg);
        }
        let cell = self
            .statements
            .get(q as usize)
            .ok_or_else(|| Error::Protocol(format!("no statement slot for {q:?}")))?;
        let statement = cell
            .get_or_try_init(|| self.pg.prepare(q.sql()))
            .await
            .map_err(Error::from_pg)?;
        self.pg
            .query(statement, params)
            .await
            .map_err(Error::from_pg)
    }

    async fn query_one(&self, q: Query, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
        let mut rows = self.query(q, params).await?;
        match (rows.pop(), rows.is_empty()) {
            (Some(row), true) => Ok(row),
            _ => Err(Error::Protocol(format!(
                "{q:?} returned {} rows, expected one",
                rows.len() + 1
            ))),
        }
    }
}

impl Client {
    /// Connects without TLS to `conn` (a libpq-style connection string or a
    /// `postgresql://` URL) and returns a reconnecting client. The first
    /// connection is opened now, so a wrong address or password shows here.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pg_lease_client::Error> {
    /// let client = pg_lease_client::Client::connect("host=127.0.0.1 user=app dbname=app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(conn: &str) -> Result<Client> {
        let client = Client::with_connector(Connector::no_tls(conn)?);
        client.conn().await?;
        Ok(client)
    }

    /// Opens the connection now if none is open, so that a wrong address,
    /// database or password shows here rather than at the first call; sends
    /// no statement.
    pub async fn open(&self) -> Result<()> {
        self.conn().await.map(drop)
    }

    /// A reconnecting client that opens its connections with `connector`
    /// (first one on first use).
    pub fn with_connector(connector: Connector) -> Client {
        Client {
            inner: Arc::new(Inner {
                connector: Some(connector),
                current: Mutex::new(None),
            }),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// A client over a connection you opened yourself (its connection task
    /// must be running). It never reconnects; once that connection is
    /// closed, every call fails with [`Error::Connection`]. Workers and
    /// electors built on it cannot `LISTEN` and poll instead.
    pub fn from_postgres(pg: tokio_postgres::Client) -> Client {
        Client {
            inner: Arc::new(Inner {
                connector: None,
                current: Mutex::new(Some(Arc::new(Conn::new(pg, true)))),
            }),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// A clone that allows `timeout` per request instead of
    /// [`DEFAULT_REQUEST_TIMEOUT`], not counting the time to (re)connect,
    /// which the connector's own timeout bounds: a slow connect must not
    /// eat the budget of a request that would then commit after the
    /// client gave up on it. It shares the connection.
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client {
            inner: Arc::clone(&self.inner),
            timeout,
        }
    }

    /// Time allowed per request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The connector this client reconnects with, if any.
    pub fn connector(&self) -> Option<&Connector> {
        self.inner.connector.as_ref()
    }

    /// A client with the same connector but its own connection (for
    /// heartbeats that must not queue behind other work), tagged with
    /// `application_name` if given; a plain clone when there is no
    /// connector.
    pub(crate) fn separate(&self, application_name: Option<&str>) -> Client {
        match (&self.inner.connector, application_name) {
            (Some(connector), Some(name)) => {
                Client::with_connector(connector.with_application_name(name))
                    .with_timeout(self.timeout)
            }
            (Some(connector), None) => {
                Client::with_connector(connector.clone()).with_timeout(self.timeout)
            }
            (None, _) => self.clone(),
        }
    }

    async fn conn(&self) -> Result<Arc<Conn>> {
        let mut current = self.inner.current.lock().await;
        if let Some(conn) = current.as_ref() {
            if !conn.pg.is_closed() || self.inner.connector.is_none() {
                return Ok(Arc::clone(conn));
            }
        }
        let Some(connector) = &self.inner.connector else {
            return Err(Error::Protocol("client has no connection".to_owned()));
        };
        let reconnecting = current.take().is_some();
        let connected = connector.open().await?;
        if reconnecting {
            tracing::info!("reconnected: the previous connection had closed");
        } else {
            tracing::debug!("connected");
        }
        let conn = Arc::new(Conn::new(connected.client, connector.prepared_statements()));
        *current = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// Forgets `conn` if it is still the current connection, so that the
    /// next request opens a new one.
    async fn discard(&self, conn: &Arc<Conn>) {
        if self.inner.connector.is_none() {
            return;
        }
        let mut current = self.inner.current.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            tracing::info!(
                "connection given up (failed or timed out); the next request reconnects"
            );
            *current = None;
        }
    }

    /// Runs one request within the timeout, on the current connection.
    ///
    /// A server that no longer has a statement this connection prepared
    /// (26000), or already has one of that name (42P05), is a transaction
    /// pooler that moved the connection to another server connection
    /// (PgBouncer in transaction mode without prepared-statement support).
    /// Nothing ran then: the request is sent once more on a new connection,
    /// which prepares its statements afresh, instead of failing for as long
    /// as the cached statements live.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        match self.call_on_current(&f).await {
            Err(e) if e.is_stale_statement() && self.inner.connector.is_some() => {
                tracing::info!(error = %e, "prepared statements lost to a pooler; retrying on a new connection");
                self.call_on_current(&f).await
            }
            result => result,
        }
    }

    /// [`Client::call`] without its retry.
    async fn call_on_current<T, F, Fut>(&self, f: &F) -> Result<T>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        // Connecting is bounded by the connector's own timeout.
        let conn = self.conn().await?;
        // A year stands in for "no timeout" and keeps the addition finite.
        let allowed = self.timeout.min(Duration::from_secs(365 * 24 * 3600));
        match tokio::time::timeout(allowed, f(Arc::clone(&conn))).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if e.is_connection() || e.is_stale_statement() {
                    self.discard(&conn).await;
                }
                Err(e)
            }
            Err(_) => {
                self.discard(&conn).await;
                Err(Error::Timeout(self.timeout))
            }
        }
    }
}
