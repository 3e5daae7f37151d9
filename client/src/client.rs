//! [`Client`]: typed, async wrappers over every SQL function of pg_lease.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{GenericClient, Row, Statement};

use crate::connect::Connector;
use crate::error::{Error, Result};
use crate::lease::{CancelResult, Claimed, FencingToken, JobState, Lease, Outcome, Renewal};
use crate::queue::{
    BatchOptions, DeadLetter, EnqueueOptions, Holder, InFlight, QueueOptions, QueueStats, Reaped,
};

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
/// Behind a transaction-mode pooler, the pooler must support prepared
/// statements (PgBouncer ≥ 1.21 with `max_prepared_statements`); turn
/// [`WorkerConfig::listen`](crate::WorkerConfig::listen) off there.
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
    statements: Vec<OnceCell<Statement>>,
}

impl Conn {
    fn new(pg: tokio_postgres::Client) -> Conn {
        Conn {
            pg,
            statements: (0..Q::COUNT).map(|_| OnceCell::new()).collect(),
        }
    }

    async fn query(&self, q: Q, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
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

    async fn query_one(&self, q: Q, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
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

/// The prepared statements. Durations travel as microseconds (`bigint`):
/// tokio-postgres has no `interval` mapping, and the server builds the
/// interval, so no client clock is involved.
#[derive(Clone, Copy, Debug)]
enum Q {
    Enqueue,
    EnqueueBatch,
    Claim,
    Reclaim,
    Renew,
    RenewBatch,
    Release,
    ReleaseBatch,
    ReleaseAndClaim,
    FencedUpdate,
    Cancel,
    TryAcquire,
    RenewNamed,
    ReleaseNamed,
    CreateQueue,
    DropQueue,
    Reap,
    Purge,
    QueueStats,
    InFlight,
    Holders,
    CancelKey,
    Requeue,
    ReleaseNamedMany,
    Grant,
    Revoke,
    DeadLetters,
}

/// `$n` microseconds from now by the database clock, or NULL.
macro_rules! at_or_null {
    ($n:literal) => {
        concat!(
            "CASE WHEN $",
            $n,
            "::bigint IS NULL THEN NULL ELSE clock_timestamp() + $",
            $n,
            "::bigint * interval '1 microsecond' END"
        )
    };
}

/// `$n` microseconds as an interval.
macro_rules! micros {
    ($n:literal) => {
        concat!("$", $n, "::bigint * interval '1 microsecond'")
    };
}

/// An interval column as microseconds.
macro_rules! as_micros {
    ($col:literal) => {
        concat!("(extract(epoch FROM ", $col, ") * 1000000)::bigint")
    };
}

impl Q {
    const COUNT: usize = Q::DeadLetters as usize + 1;

    fn sql(self) -> &'static str {
        match self {
            Q::Enqueue => concat!(
                "SELECT lease.enqueue($1::text, $2::jsonb, $3::text, ",
                at_or_null!("4"),
                ", $5::int)"
            ),
            Q::EnqueueBatch => concat!(
                "SELECT e.id FROM lease.enqueue_batch($1::text, $2::jsonb[], $3::text[], ",
                at_or_null!("4"),
                ", $5::int) WITH ORDINALITY AS e(id, ord) ORDER BY e.ord"
            ),
            Q::Claim => concat!(
                "SELECT c.id, c.queue, c.key, c.payload, c.epoch, c.attempt, c.lease_until ",
                "FROM lease.claim_pending($1::int, ",
                micros!("2"),
                ", $3::text, $4::text) AS c"
            ),
            Q::Reclaim => concat!(
                "SELECT c.id, c.queue, c.key, c.payload, c.epoch, c.attempt, c.lease_until ",
                "FROM lease.reclaim_own($1::int, ",
                micros!("2"),
                ", $3::text, $4::text) AS c"
            ),
            Q::Renew => concat!(
                "SELECT r.id, r.held, r.lease_until, r.cancel_requested ",
                "FROM lease.renew($1::bigint, $2::text, $3::bigint, ",
                micros!("4"),
                ") AS r"
            ),
            Q::RenewBatch => concat!(
                "SELECT r.id, r.held, r.lease_until, r.cancel_requested ",
                "FROM lease.renew_batch($1::bigint[], $2::text, $3::bigint[], ",
                micros!("4"),
                ") WITH ORDINALITY AS r(id, held, lease_until, cancel_requested, ord) ORDER BY r.ord"
            ),
            Q::Release => concat!(
                "SELECT lease.release($1::bigint, $2::text, $3::bigint, $4::text, ",
                at_or_null!("5"),
                ", $6::text)"
            ),
            Q::ReleaseBatch => concat!(
                "SELECT r.id, r.released FROM lease.release_batch($1::bigint[], $2::text, $3::bigint[], $4::text, ",
                at_or_null!("5"),
                ", $6::text) WITH ORDINALITY AS r(id, released, ord) ORDER BY r.ord"
            ),
            Q::ReleaseAndClaim => concat!(
                "SELECT r.released, r.id, $6::text, r.key, r.payload, r.epoch, r.attempt, r.lease_until ",
                "FROM lease.release_and_claim($1::bigint[], $2::text, $3::bigint[], $4::int, ",
                micros!("5"),
                ", $6::text) WITH ORDINALITY AS r(released, id, key, payload, epoch, attempt, lease_until, ord) ",
                "ORDER BY r.ord"
            ),
            Q::FencedUpdate => "SELECT lease.fenced_update($1::bigint, $2::bigint, $3::jsonb)",
            Q::Cancel => "SELECT lease.cancel($1::bigint)",
            Q::TryAcquire => concat!(
                "SELECT lease.try_acquire($1::text, $2::text, ",
                micros!("3"),
                ")"
            ),
            Q::RenewNamed => concat!(
                "SELECT lease.renew_named($1::text, $2::text, $3::bigint, ",
                micros!("4"),
                ")"
            ),
            Q::ReleaseNamed => "SELECT lease.release_named($1::text, $2::text, $3::bigint)",
            Q::CreateQueue => concat!(
                "SELECT lease.create_queue($1::text, $2::int, ",
                micros!("3"),
                ", ",
                micros!("4"),
                ", ",
                micros!("5"),
                ", ",
                micros!("6"),
                ")"
            ),
            Q::DropQueue => "SELECT lease.drop_queue($1::text, $2::boolean)",
            Q::Reap => {
                "SELECT r.queue, r.requeued, r.dead, r.cancelled FROM lease.reap($1::int) AS r"
            }
            Q::Purge => "SELECT lease.purge($1::int)",
            Q::QueueStats => concat!(
                "SELECT queue, pending, ready, leased, expired, done, dead, cancelled, ",
                as_micros!("oldest_ready_age"),
                ", recovered_total FROM lease.queue_stats ORDER BY queue"
            ),
            Q::InFlight => concat!(
                "SELECT id, queue, key, owner, epoch, attempt, lease_until, ",
                as_micros!("remaining"),
                ", cancel_requested FROM lease.in_flight ",
                "WHERE $1::text IS NULL OR queue = $1::text ORDER BY id"
            ),
            Q::Holders => concat!(
                "SELECT name, owner, epoch, acquired_at, lease_until, ",
                as_micros!("remaining"),
                " FROM lease.holders ORDER BY name"
            ),
            Q::CancelKey => "SELECT lease.cancel_key($1::text, $2::text)",
            Q::Requeue => "SELECT lease.requeue($1::bigint)",
            Q::ReleaseNamedMany => {
                "SELECT name, released FROM lease.release_named($1::text[], $2::text, $3::bigint[])"
            }
            Q::Grant => "SELECT lease.grant($1::text, $2::text::regrole, $3::boolean, $4::boolean)",
            Q::Revoke => "SELECT lease.revoke($1::text, $2::text::regrole)",
            Q::DeadLetters => concat!(
                "SELECT id, queue, key, payload, attempt, last_error, finished_at ",
                "FROM lease.dead_letters WHERE $1::text IS NULL OR queue = $1::text ",
                "ORDER BY id LIMIT $2::bigint"
            ),
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
                current: Mutex::new(Some(Arc::new(Conn::new(pg)))),
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
        *current = None;
        let connected = connector.open().await?;
        let conn = Arc::new(Conn::new(connected.client));
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
            *current = None;
        }
    }

    /// Runs one request within the timeout, on the current connection.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        // Connecting is bounded by the connector's own timeout.
        let conn = self.conn().await?;
        // A year stands in for "no timeout" and keeps the addition finite.
        let allowed = self.timeout.min(Duration::from_secs(365 * 24 * 3600));
        match tokio::time::timeout(allowed, f(Arc::clone(&conn))).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if e.is_connection() {
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

    // ---- queues -------------------------------------------------------

    /// `lease.create_queue`: creates queue `name` or updates its policy (so
    /// every replica may call it at start). Needs `lease_admin`.
    pub async fn create_queue(&self, name: &str, options: &QueueOptions) -> Result<()> {
        let base = micros(options.backoff_base, "backoff_base")?;
        let max = micros(options.backoff_max, "backoff_max")?;
        let retention = micros(options.retention, "retention")?;
        let dead = micros(options.dead_retention, "dead_retention")?;
        let attempts = options.max_attempts;
        self.call(|c| async move {
            c.query(
                Q::CreateQueue,
                &[&name, &attempts, &base, &max, &retention, &dead],
            )
            .await
            .map(drop)
        })
        .await
    }

    /// `lease.drop_queue`: deletes queue `name` and its rows, returning how
    /// many rows went. Refused (SQLSTATE `55006`, [`Error::Database`]) while
    /// rows are pending or leased unless `force`. Needs `lease_admin`.
    pub async fn drop_queue(&self, name: &str, force: bool) -> Result<i64> {
        self.call(|c| async move {
            let row = c.query_one(Q::DropQueue, &[&name, &force]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.enqueue` with default options: adds `payload` to `queue`,
    /// claimable at once, and returns the row id.
    pub async fn enqueue<P: Serialize + ?Sized>(&self, queue: &str, payload: &P) -> Result<i64> {
        self.enqueue_with(queue, payload, &EnqueueOptions::default())
            .await
    }

    /// `lease.enqueue` with a key (idempotent on `(queue, key)`), a delay
    /// and a priority.
    pub async fn enqueue_with<P: Serialize + ?Sized>(
        &self,
        queue: &str,
        payload: &P,
        options: &EnqueueOptions,
    ) -> Result<i64> {
        let payload = serde_json::to_value(payload)?;
        let delay = options.delay.map(|d| micros(d, "delay")).transpose()?;
        let key = options.key.as_deref();
        let priority = options.priority;
        let payload = &payload;
        self.call(|c| async move {
            let row = c
                .query_one(Q::Enqueue, &[&queue, payload, &key, &delay, &priority])
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.enqueue_batch`: adds many rows in one statement and returns
    /// their ids in input order.
    pub async fn enqueue_batch<P: Serialize>(
        &self,
        queue: &str,
        payloads: &[P],
        options: &BatchOptions,
    ) -> Result<Vec<i64>> {
        let payloads = payloads
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?;
        let delay = options.delay.map(|d| micros(d, "delay")).transpose()?;
        let keys = options.keys.as_ref();
        let priority = options.priority;
        let payloads = &payloads;
        self.call(|c| async move {
            let rows = c
                .query(
                    Q::EnqueueBatch,
                    &[&queue, payloads, &keys, &delay, &priority],
                )
                .await?;
            rows.iter().map(|r| col(r, 0)).collect()
        })
        .await
    }

    /// `lease.cancel`: a pending row is cancelled at once; a leased row is
    /// marked and its owner told on its next renewal.
    pub async fn cancel(&self, id: i64) -> Result<CancelResult> {
        let state: Option<String> = self
            .call(|c| async move {
                let row = c.query_one(Q::Cancel, &[&id]).await?;
                col(&row, 0)
            })
            .await?;
        cancel_result(state)
    }

    /// `lease.cancel_key`: [`cancel`](Client::cancel) for the row of
    /// `queue` with `key` (an attached table's row: its primary key as
    /// text), when the id is not known.
    pub async fn cancel_key(&self, queue: &str, key: &str) -> Result<CancelResult> {
        let state: Option<String> = self
            .call(|c| async move {
                let row = c.query_one(Q::CancelKey, &[&queue, &key]).await?;
                col(&row, 0)
            })
            .await?;
        cancel_result(state)
    }

    /// `lease.requeue`: a dead letter back to pending, claimable now, its
    /// attempts reset. `false` if the row is not dead. Needs `lease_admin`.
    pub async fn requeue(&self, id: i64) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Q::Requeue, &[&id]).await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.grant`: gives `role` the right to work `queue` and/or to
    /// produce into it; the first grant restricts the queue to its grantees
    /// and `lease_admin`. Needs `lease_admin`.
    pub async fn grant(&self, queue: &str, role: &str, work: bool, produce: bool) -> Result<()> {
        self.call(|c| async move {
            c.query(Q::Grant, &[&queue, &role, &work, &produce]).await?;
            Ok(())
        })
        .await
    }

    /// `lease.revoke`: removes `role`'s grant on `queue` (which stays
    /// restricted); whether there was one. Needs `lease_admin`.
    pub async fn revoke(&self, queue: &str, role: &str) -> Result<bool> {
        self.call(|c| async move {
            let row = c.query_one(Q::Revoke, &[&queue, &role]).await?;
            col(&row, 0)
        })
        .await
    }

    // ---- leases on queue rows ----------------------------------------

    /// `lease.claim_pending`: leases up to `limit` claimable rows of `queue`
    /// to `owner` for `ttl`.
    ///
    /// Each [`Lease`] records the instant this request was sent, before any
    /// connecting: the lease cannot be held past that instant plus `ttl`
    /// ([`Lease::local_expiry`]), whatever the network did.
    pub async fn claim(
        &self,
        queue: &str,
        limit: u32,
        ttl: Duration,
        owner: &str,
    ) -> Result<Vec<Claimed>> {
        self.lease_rows(Q::Claim, queue, limit, ttl, owner).await
    }

    /// `lease.reclaim_own`: for a process restarted under a stable `owner`
    /// name, leases again (under new epochs, for `ttl`) up to `limit` rows
    /// of `queue` that its earlier incarnation still holds, so that work
    /// resumes at once instead of after the old leases expire. Call it at
    /// start-up, before claiming: it would re-issue this incarnation's own
    /// leases too.
    pub async fn reclaim_own(
        &self,
        queue: &str,
        limit: u32,
        ttl: Duration,
        owner: &str,
    ) -> Result<Vec<Claimed>> {
        self.lease_rows(Q::Reclaim, queue, limit, ttl, owner).await
    }

    /// Runs a claim-shaped query (`claim_pending`, `reclaim_own`).
    async fn lease_rows(
        &self,
        query: Q,
        queue: &str,
        limit: u32,
        ttl: Duration,
        owner: &str,
    ) -> Result<Vec<Claimed>> {
        let limit_sql = i32::try_from(limit)
            .map_err(|_| Error::invalid(format!("limit {limit} is out of range")))?;
        let ttl_us = micros(ttl, "ttl")?;
        let sent = Instant::now();
        let rows = self
            .call(|c| async move { c.query(query, &[&limit_sql, &ttl_us, &owner, &queue]).await })
            .await?;
        rows.iter()
            .map(|row| claimed_from(row, 0, owner, sent, ttl))
            .collect()
    }

    /// `lease.renew`: extends `lease` to now + `ttl` (database clock).
    /// [`Error::LeaseLost`] if it is no longer held. Check
    /// [`Renewal::cancel_requested`]: if set, stop and release.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renewal> {
        let ttl_us = micros(ttl, "ttl")?;
        let (id, epoch, owner) = (lease.id, lease.epoch, lease.owner.as_str());
        let row = self
            .call(|c| async move { c.query_one(Q::Renew, &[&id, &owner, &epoch, &ttl_us]).await })
            .await?;
        let renewal = renewal_from_row(&row)?;
        if !renewal.held {
            return Err(Error::LeaseLost { id, epoch });
        }
        Ok(renewal)
    }

    /// `lease.renew_batch`: one heartbeat for many leases of `owner`; one
    /// [`Renewal`] per token, in input order. A lost lease is reported as
    /// `held: false`, not as an error.
    pub async fn renew_batch(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        ttl: Duration,
    ) -> Result<Vec<Renewal>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let ttl_us = micros(ttl, "ttl")?;
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let rows = self
            .call(|c| async move {
                c.query(Q::RenewBatch, &[ids, &owner, epochs, &ttl_us])
                    .await
            })
            .await?;
        let renewals = rows
            .iter()
            .map(renewal_from_row)
            .collect::<Result<Vec<_>>>()?;
        check_order(tokens, renewals.iter().map(|r| r.id))?;
        Ok(renewals)
    }

    /// `lease.release`: ends `lease` with `outcome`.
    /// [`Error::LeaseLost`] (and nothing changed) if it was no longer held.
    pub async fn release(&self, lease: &Lease, outcome: &Outcome) -> Result<()> {
        let token = lease.token();
        if self.release_token(&lease.owner, token, outcome).await? {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                id: token.id,
                epoch: token.epoch,
            })
        }
    }

    /// `lease.release` by token: `Ok(false)` if the lease was lost.
    pub(crate) async fn release_token(
        &self,
        owner: &str,
        token: FencingToken,
        outcome: &Outcome,
    ) -> Result<bool> {
        if *outcome == Outcome::Finished {
            return Ok(true);
        }
        let delay = outcome.delay().map(|d| micros(d, "delay")).transpose()?;
        let name = outcome.as_sql();
        let error = outcome.error();
        let (id, epoch) = (token.id, token.epoch);
        self.call(|c| async move {
            let row = c
                .query_one(Q::Release, &[&id, &owner, &epoch, &name, &delay, &error])
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.release_batch`: ends many leases of `owner` with one outcome
    /// in one statement (batched completions). One `bool` per token, in
    /// input order: `false` means that lease was lost.
    pub async fn release_batch(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        outcome: &Outcome,
    ) -> Result<Vec<bool>> {
        if *outcome == Outcome::Finished {
            return Ok(vec![true; tokens.len()]);
        }
        let delay = outcome.delay().map(|d| micros(d, "delay")).transpose()?;
        let name = outcome.as_sql();
        let error = outcome.error();
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let rows = self
            .call(|c| async move {
                c.query(
                    Q::ReleaseBatch,
                    &[ids, &owner, epochs, &name, &delay, &error],
                )
                .await
            })
            .await?;
        let mut released = Vec::with_capacity(rows.len());
        let mut seen = Vec::with_capacity(rows.len());
        for row in &rows {
            seen.push(col::<i64>(row, 0)?);
            released.push(col::<bool>(row, 1)?);
        }
        check_order(tokens, seen.into_iter())?;
        Ok(released)
    }

    /// `lease.release_and_claim`: records the leases of `owner` in
    /// `tokens` as done and claims up to `limit` rows of `queue` for `ttl`,
    /// in one statement and one commit (a worker refilling the slots its
    /// finished jobs freed). Returns one `bool` per token, in order
    /// (`false`: that lease was lost), and the claimed rows.
    pub async fn release_and_claim(
        &self,
        owner: &str,
        tokens: &[FencingToken],
        queue: &str,
        limit: u32,
        ttl: Duration,
    ) -> Result<(Vec<bool>, Vec<Claimed>)> {
        let limit_sql = i32::try_from(limit)
            .map_err(|_| Error::invalid(format!("limit {limit} is out of range")))?;
        let ttl_us = micros(ttl, "ttl")?;
        let (ids, epochs) = split(tokens);
        let (ids, epochs) = (&ids, &epochs);
        let sent = Instant::now();
        let rows = self
            .call(|c| async move {
                c.query(
                    Q::ReleaseAndClaim,
                    &[ids, &owner, epochs, &limit_sql, &ttl_us, &queue],
                )
                .await
            })
            .await?;
        let mut released = Vec::with_capacity(tokens.len());
        let mut claimed = Vec::new();
        for row in &rows {
            match col::<Option<bool>>(row, 0)? {
                Some(ok) => released.push(ok),
                None => claimed.push(claimed_from(row, 1, owner, sent, ttl)?),
            }
        }
        if released.len() != tokens.len() {
            return Err(Error::invalid(format!(
                "release_and_claim answered {} of {} releases",
                released.len(),
                tokens.len()
            )));
        }
        Ok((released, claimed))
    }

    /// `lease.fenced_update`: merges `patch` (must serialize to a JSON
    /// object) into the row's payload, only while `token` is the current
    /// lease. [`Error::LeaseLost`] otherwise.
    pub async fn fenced_update<P: Serialize + ?Sized>(
        &self,
        token: FencingToken,
        patch: &P,
    ) -> Result<()> {
        let patch = serde_json::to_value(patch)?;
        let patch = &patch;
        let (id, epoch) = (token.id, token.epoch);
        let applied: bool = self
            .call(|c| async move {
                let row = c.query_one(Q::FencedUpdate, &[&id, &epoch, patch]).await?;
                col(&row, 0)
            })
            .await?;
        if applied {
            Ok(())
        } else {
            Err(Error::LeaseLost { id, epoch })
        }
    }

    // ---- named leases -------------------------------------------------

    /// `lease.try_acquire`: takes named lease `name` for `owner` for `ttl`
    /// if it is free, expired, or already `owner`'s, and returns the new
    /// epoch; `None` if someone else holds it.
    pub async fn try_acquire(&self, name: &str, owner: &str, ttl: Duration) -> Result<Option<i64>> {
        let ttl_us = micros(ttl, "ttl")?;
        self.call(|c| async move {
            let row = c
                .query_one(Q::TryAcquire, &[&name, &owner, &ttl_us])
                .await?;
            col(&row, 0)
        })
        .await
    }

    /// `lease.renew_named`: extends the hold to now + `ttl` and returns its
    /// new end (database clock); [`Error::NamedLeaseLost`] when the hold is
    /// lost: step down.
    pub async fn renew_named(
        &self,
        name: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> Result<SystemTime> {
        let ttl_us = micros(ttl, "ttl")?;
        let until: Option<SystemTime> = self
            .call(|c| async move {
                let row = c
                    .query_one(Q::RenewNamed, &[&name, &owner, &epoch, &ttl_us])
                    .await?;
                col(&row, 0)
            })
            .await?;
        until.ok_or_else(|| Error::NamedLeaseLost {
            name: name.to_owned(),
            epoch,
        })
    }

    /// `lease.release_named`: gives the hold up so another contender can
    /// take it at once. [`Error::NamedLeaseLost`] if it was already lost.
    pub async fn release_named(&self, name: &str, owner: &str, epoch: i64) -> Result<()> {
        let released: bool = self
            .call(|c| async move {
                let row = c
                    .query_one(Q::ReleaseNamed, &[&name, &owner, &epoch])
                    .await?;
                col(&row, 0)
            })
            .await?;
        if released {
            Ok(())
        } else {
            Err(Error::NamedLeaseLost {
                name: name.to_owned(),
                epoch,
            })
        }
    }

    /// `lease.release_named` for many `(name, epoch)` holds of `owner` in
    /// one statement; returns `(name, released)` per hold, in order
    /// (`false`: that hold was already lost).
    pub async fn release_named_many(
        &self,
        owner: &str,
        holds: &[(&str, i64)],
    ) -> Result<Vec<(String, bool)>> {
        let names: Vec<&str> = holds.iter().map(|(name, _)| *name).collect();
        let epochs: Vec<i64> = holds.iter().map(|(_, epoch)| *epoch).collect();
        self.call(|c| async move {
            let rows = c
                .query(Q::ReleaseNamedMany, &[&names, &owner, &epochs])
                .await?;
            rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
        })
        .await
    }

    // ---- housekeeping -------------------------------------------------

    /// `lease.reap`: recovers up to `max_rows` expired leases (new epoch,
    /// backoff, dead letter or cancelled). The extension's background worker
    /// runs it when preloaded. Needs `lease_admin`.
    pub async fn reap(&self, max_rows: u32) -> Result<Vec<Reaped>> {
        let n = i32::try_from(max_rows)
            .map_err(|_| Error::invalid(format!("max_rows {max_rows} is out of range")))?;
        self.call(|c| async move {
            let rows = c.query(Q::Reap, &[&n]).await?;
            rows.iter()
                .map(|r| {
                    Ok(Reaped {
                        queue: col(r, 0)?,
                        requeued: col(r, 1)?,
                        dead: col(r, 2)?,
                        cancelled: col(r, 3)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.purge`: deletes up to `max_rows` finished rows past their
    /// queue's retention; returns how many. Needs `lease_admin`.
    pub async fn purge(&self, max_rows: u32) -> Result<i64> {
        let n = i32::try_from(max_rows)
            .map_err(|_| Error::invalid(format!("max_rows {max_rows} is out of range")))?;
        self.call(|c| async move {
            let row = c.query_one(Q::Purge, &[&n]).await?;
            col(&row, 0)
        })
        .await
    }

    // ---- views --------------------------------------------------------

    /// `lease.queue_stats`, one entry per queue. Needs `lease_admin`.
    pub async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.call(|c| async move {
            let rows = c.query(Q::QueueStats, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(QueueStats {
                        queue: col(r, 0)?,
                        pending: col(r, 1)?,
                        ready: col(r, 2)?,
                        leased: col(r, 3)?,
                        expired: col(r, 4)?,
                        done: col(r, 5)?,
                        dead: col(r, 6)?,
                        cancelled: col(r, 7)?,
                        oldest_ready_age: col::<Option<i64>>(r, 8)?.map(from_micros),
                        recovered_total: col(r, 9)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.in_flight`: leased rows, of one queue or all. Needs
    /// `lease_admin`.
    pub async fn in_flight(&self, queue: Option<&str>) -> Result<Vec<InFlight>> {
        self.call(|c| async move {
            let rows = c.query(Q::InFlight, &[&queue]).await?;
            rows.iter()
                .map(|r| {
                    let remaining: i64 = col(r, 7)?;
                    Ok(InFlight {
                        id: col(r, 0)?,
                        queue: col(r, 1)?,
                        key: col(r, 2)?,
                        owner: col(r, 3)?,
                        epoch: col(r, 4)?,
                        attempt: col(r, 5)?,
                        lease_until: col(r, 6)?,
                        remaining: from_micros(remaining),
                        expired: remaining <= 0,
                        cancel_requested: col(r, 8)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.holders`: current holders of named leases. Needs
    /// `lease_admin`.
    pub async fn holders(&self) -> Result<Vec<Holder>> {
        self.call(|c| async move {
            let rows = c.query(Q::Holders, &[]).await?;
            rows.iter()
                .map(|r| {
                    Ok(Holder {
                        name: col(r, 0)?,
                        owner: col(r, 1)?,
                        epoch: col(r, 2)?,
                        acquired_at: col(r, 3)?,
                        lease_until: col(r, 4)?,
                        remaining: from_micros(col(r, 5)?),
                    })
                })
                .collect()
        })
        .await
    }

    /// `lease.dead_letters`: up to `limit` dead rows (oldest id first), of
    /// one queue or all. Needs `lease_admin`.
    pub async fn dead_letters(&self, queue: Option<&str>, limit: u32) -> Result<Vec<DeadLetter>> {
        let limit = i64::from(limit);
        self.call(|c| async move {
            let rows = c.query(Q::DeadLetters, &[&queue, &limit]).await?;
            rows.iter()
                .map(|r| {
                    Ok(DeadLetter {
                        id: col(r, 0)?,
                        queue: col(r, 1)?,
                        key: col(r, 2)?,
                        payload: col(r, 3)?,
                        attempts: col(r, 4)?,
                        last_error: col(r, 5)?,
                        finished_at: col(r, 6)?,
                    })
                })
                .collect()
        })
        .await
    }
}

/// `lease.fence(id, epoch)` inside *your* transaction: call it first, then
/// write your own tables. It returns the lease's end (database clock) while
/// `token` is the current lease, and keeps the row locked until your
/// transaction ends, so no takeover is ordered before your writes commit.
/// [`Error::LeaseLost`] (SQLSTATE `LE001`) otherwise: roll back.
///
/// `tx` is anything tokio-postgres can query on, normally a
/// `tokio_postgres::Transaction`. The statement is sent unnamed (one round
/// trip, no prepared statement left on your connection).
///
/// ```no_run
/// # async fn example(pg: &mut tokio_postgres::Client, token: pg_lease_client::FencingToken)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// let tx = pg.transaction().await?;
/// pg_lease_client::fence(&tx, token).await?; // LeaseLost: the transaction rolls back on drop
/// tx.execute("UPDATE invoices SET sent = true WHERE id = $1", &[&9_i64]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn fence<C: GenericClient + Sync>(tx: &C, token: FencingToken) -> Result<SystemTime> {
    let (id, epoch) = (token.id, token.epoch);
    let row = tx
        .query_typed_one(
            "SELECT lease.fence($1, $2)",
            &[(&id, Type::INT8), (&epoch, Type::INT8)],
        )
        .await
        .map_err(|e| Error::from_pg_fenced(e, id, epoch))?;
    col(&row, 0)
}

/// `lease.fence_named(name, epoch)` inside the leader's transaction: like
/// [`fence`], for a named lease. [`Error::NamedLeaseLost`] (SQLSTATE
/// `LE001`) when `epoch` no longer holds `name`: roll back.
pub async fn fence_named<C: GenericClient + Sync>(
    tx: &C,
    name: &str,
    epoch: i64,
) -> Result<SystemTime> {
    let row = tx
        .query_typed_one(
            "SELECT lease.fence_named($1, $2)",
            &[(&name, Type::TEXT), (&epoch, Type::INT8)],
        )
        .await
        .map_err(|e| Error::from_pg_named(e, name, epoch))?;
    col(&row, 0)
}

/// A column, with a conversion failure as [`Error::Protocol`].
fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| Error::Protocol(format!("column {i}: {e}")))
}

/// What `lease.cancel` and `lease.cancel_key` answered.
fn cancel_result(state: Option<String>) -> Result<CancelResult> {
    Ok(match state.as_deref() {
        None => CancelResult::NotFound,
        Some("cancelled") => CancelResult::Cancelled,
        Some("cancel_requested") => CancelResult::CancelRequested,
        Some(other) => CancelResult::AlreadyFinished(other.parse::<JobState>()?),
    })
}

fn renewal_from_row(row: &Row) -> Result<Renewal> {
    // NULL: held but locked by another transaction, not extended (busy).
    let held: Option<bool> = col(row, 1)?;
    Ok(Renewal {
        id: col(row, 0)?,
        held: held.unwrap_or(true),
        busy: held.is_none(),
        lease_until: col(row, 2)?,
        cancel_requested: col::<Option<bool>>(row, 3)?.unwrap_or(false),
    })
}

/// A duration as whole microseconds for the server.
pub(crate) fn micros(d: Duration, what: &str) -> Result<i64> {
    i64::try_from(d.as_micros()).map_err(|_| Error::invalid(format!("{what} {d:?} is too long")))
}

/// Microseconds from the server as a duration; negative becomes zero.
fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn split(tokens: &[FencingToken]) -> (Vec<i64>, Vec<i64>) {
    tokens.iter().map(|t| (t.id, t.epoch)).unzip()
}

/// Batch answers must come back one per input, in input order.
fn check_order(tokens: &[FencingToken], ids: impl Iterator<Item = i64>) -> Result<()> {
    let ids: Vec<i64> = ids.collect();
    if ids.len() != tokens.len() || tokens.iter().zip(&ids).any(|(t, id)| t.id != *id) {
        return Err(Error::Protocol(format!(
            "batch answer does not match its input ({} ids for {} tokens)",
            ids.len(),
            tokens.len()
        )));
    }
    Ok(())
}

/// A claimed row from the claim columns `(id, queue, key, payload, epoch,
/// attempt, lease_until)` of `row`, starting at column `first`.
fn claimed_from(
    row: &tokio_postgres::Row,
    first: usize,
    owner: &str,
    sent: Instant,
    ttl: Duration,
) -> Result<Claimed> {
    Ok(Claimed {
        lease: Lease {
            id: col(row, first)?,
            queue: col(row, first + 1)?,
            key: col(row, first + 2)?,
            epoch: col(row, first + 4)?,
            attempt: col(row, first + 5)?,
            lease_until: col(row, first + 6)?,
            owner: owner.to_owned(),
            claim_sent_at: sent,
            ttl,
        },
        payload: col(row, first + 3)?,
    })
}
