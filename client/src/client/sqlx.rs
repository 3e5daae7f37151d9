//! pg_lease inside a sqlx transaction (cargo feature `sqlx`): the
//! functions of [`tx`](super::tx) for an application whose pool is sqlx's.
//!
//! Each takes any sqlx Postgres executor: `&mut *tx` for a
//! `sqlx::Transaction<'_, Postgres>`, a `&mut PgConnection`, or a `&PgPool`
//! (then the call is its own transaction). Same options, payloads and
//! errors as the [`Client`](crate::Client) methods; a server error that is
//! none of [`Error`]'s families is [`Error::Sqlx`]. Statements are not kept
//! prepared on your connection (`persistent(false)`), so they also work
//! through a transaction-mode pooler.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! let order: i64 = sqlx::query_scalar("INSERT INTO orders (total) VALUES (42) RETURNING id")
//!     .fetch_one(&mut *tx)
//!     .await?;
//! pg_lease_client::sqlx::enqueue(&mut *tx, "emails", &serde_json::json!({ "order": order })).await?;
//! tx.commit().await?; // the order and its job, or neither
//! # Ok(()) }
//! ```

use std::time::SystemTime;

use ::sqlx::postgres::{PgArguments, PgRow};
use ::sqlx::query::Query as SqlxQuery;
use ::sqlx::{PgExecutor, Postgres, Row};
use serde::Serialize;

use super::args;
use super::rows::cancel_result;
use super::statements::Query;
use crate::error::{Error, Result};
use crate::lease::{CancelResult, FencingToken};
use crate::queue::{BatchOptions, EnqueueOptions};

/// A pg_lease statement for sqlx, not kept prepared.
fn statement(q: Query) -> SqlxQuery<'static, Postgres, PgArguments> {
    ::sqlx::query(q.sql()).persistent(false)
}

/// A timestamp the statement returned as microseconds since the Unix
/// epoch (sqlx decodes `timestamptz` only into chrono or time types).
fn at_micros(us: i64) -> SystemTime {
    let since = std::time::Duration::from_micros(us.unsigned_abs());
    if us >= 0 {
        SystemTime::UNIX_EPOCH + since
    } else {
        SystemTime::UNIX_EPOCH - since
    }
}

/// Column `i` of `row`, or a protocol error.
fn column<'r, T>(row: &'r PgRow, i: usize) -> Result<T>
where
    T: ::sqlx::Decode<'r, Postgres> + ::sqlx::Type<Postgres>,
{
    row.try_get(i)
        .map_err(|e| Error::Protocol(format!("column {i}: {e}")))
}

/// `lease.enqueue` with default options: like
/// [`Client::enqueue`](crate::Client::enqueue), visible to workers when
/// the transaction commits.
pub async fn enqueue<'c, E, P>(executor: E, queue: &str, payload: &P) -> Result<i64>
where
    E: PgExecutor<'c>,
    P: Serialize + ?Sized,
{
    enqueue_with(executor, queue, payload, &EnqueueOptions::default()).await
}

/// `lease.enqueue` with options: like
/// [`Client::enqueue_with`](crate::Client::enqueue_with).
pub async fn enqueue_with<'c, E, P>(
    executor: E,
    queue: &str,
    payload: &P,
    options: &EnqueueOptions,
) -> Result<i64>
where
    E: PgExecutor<'c>,
    P: Serialize + ?Sized,
{
    let a = args::Enqueue::new(queue, payload, options)?;
    let row = statement(Query::Enqueue)
        .bind(a.queue)
        .bind(&a.payload)
        .bind(a.key)
        .bind(a.delay)
        .bind(a.priority)
        .bind(a.unique_key)
        .bind(a.concurrency_key)
        .bind(a.fairness_key)
        .fetch_one(executor)
        .await
        .map_err(Error::from_sqlx)?;
    column(&row, 0)
}

/// `lease.enqueue_batch`: like
/// [`Client::enqueue_batch`](crate::Client::enqueue_batch), ids in input
/// order.
pub async fn enqueue_batch<'c, E, P>(
    executor: E,
    queue: &str,
    payloads: &[P],
    options: &BatchOptions,
) -> Result<Vec<i64>>
where
    E: PgExecutor<'c>,
    P: Serialize,
{
    let a = args::EnqueueBatch::new(queue, payloads, options)?;
    let rows = statement(Query::EnqueueBatch)
        .bind(a.queue)
        .bind(&a.payloads)
        .bind(a.keys)
        .bind(a.delay)
        .bind(a.priority)
        .bind(a.concurrency_keys)
        .bind(a.fairness_keys)
        .fetch_all(executor)
        .await
        .map_err(Error::from_sqlx)?;
    rows.iter().map(|r| column(r, 0)).collect()
}

/// `lease.cancel_key`: like
/// [`Client::cancel_key`](crate::Client::cancel_key).
pub async fn cancel_key<'c, E>(executor: E, queue: &str, key: &str) -> Result<CancelResult>
where
    E: PgExecutor<'c>,
{
    let row = statement(Query::CancelKey)
        .bind(queue)
        .bind(key)
        .fetch_one(executor)
        .await
        .map_err(Error::from_sqlx)?;
    cancel_result(column(&row, 0)?)
}

/// `lease.fence(id, epoch)` first in your sqlx transaction: like
/// [`fence`](crate::fence). [`Error::LeaseLost`] (SQLSTATE `LE001`) when
/// `token` is no longer the lease: roll back.
pub async fn fence<'c, E>(executor: E, token: FencingToken) -> Result<SystemTime>
where
    E: PgExecutor<'c>,
{
    fence_on(executor, None, token).await
}

/// [`fence`] for a lease on a row of `queue`: like
/// [`fence_in`](crate::tx::fence_in), the form a distributed install needs.
pub async fn fence_in<'c, E>(executor: E, queue: &str, token: FencingToken) -> Result<SystemTime>
where
    E: PgExecutor<'c>,
{
    fence_on(executor, Some(queue), token).await
}

async fn fence_on<'c, E>(
    executor: E,
    queue: Option<&str>,
    token: FencingToken,
) -> Result<SystemTime>
where
    E: PgExecutor<'c>,
{
    let (id, epoch) = (token.id, token.epoch);
    let row =
        ::sqlx::query("SELECT (extract(epoch FROM lease.fence($1, $2, $3)) * 1000000)::bigint")
            .persistent(false)
            .bind(id)
            .bind(epoch)
            .bind(queue)
            .fetch_one(executor)
            .await
            .map_err(|e| Error::from_sqlx_fenced(e, || Error::LeaseLost { id, epoch }))?;
    column(&row, 0).map(at_micros)
}

/// `lease.fence_named(name, epoch)` first in the leader's sqlx
/// transaction: like [`fence_named`](crate::fence_named).
/// [`Error::NamedLeaseLost`] when `epoch` no longer holds `name`.
pub async fn fence_named<'c, E>(executor: E, name: &str, epoch: i64) -> Result<SystemTime>
where
    E: PgExecutor<'c>,
{
    let row =
        ::sqlx::query("SELECT (extract(epoch FROM lease.fence_named($1, $2)) * 1000000)::bigint")
            .persistent(false)
            .bind(name)
            .bind(epoch)
            .fetch_one(executor)
            .await
            .map_err(|e| {
                Error::from_sqlx_fenced(e, || Error::NamedLeaseLost {
                    name: name.to_owned(),
                    epoch,
                })
            })?;
    column(&row, 0).map(at_micros)
}
