//! pg_lease inside *your* transaction: enqueue, cancel and fence on any
//! tokio-postgres [`GenericClient`], normally a `Transaction` of your own
//! pool, so that a job exists exactly when your own writes commit (the
//! outbox pattern). Workers cannot see the row before the commit, the
//! queue's NOTIFY goes out with the commit, and a rollback leaves nothing.
//!
//! Same options, payloads and errors as the [`Client`](crate::Client)
//! methods of the same names. Each statement is sent unnamed
//! (`query_typed`): one round trip, no prepared statement left on your
//! connection, so it also works through a transaction-mode pooler.
//!
//! ```no_run
//! use pg_lease_client::tx;
//!
//! # async fn example(pg: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let order = pg.transaction().await?;
//! let row = order
//!     .query_one("INSERT INTO orders (total) VALUES (42) RETURNING id", &[])
//!     .await?;
//! let id: i64 = row.get(0);
//! tx::enqueue(&order, "emails", &serde_json::json!({ "order": id })).await?;
//! order.commit().await?; // the order and its job, or neither
//! # Ok(()) }
//! ```

use std::time::SystemTime;

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use super::args;
use super::rows::{cancel_result, col};
use super::statements::Query;
use crate::error::{Error, Result};
use crate::lease::{CancelResult, FencingToken};
use crate::queue::{BatchOptions, EnqueueOptions};

/// `lease.enqueue` with default options in `tx`: like
/// [`Client::enqueue`](crate::Client::enqueue), visible to workers when
/// `tx` commits.
pub async fn enqueue<C, P>(tx: &C, queue: &str, payload: &P) -> Result<i64>
where
    C: GenericClient + Sync,
    P: Serialize + ?Sized,
{
    enqueue_with(tx, queue, payload, &EnqueueOptions::default()).await
}

/// `lease.enqueue` with options in `tx`: like
/// [`Client::enqueue_with`](crate::Client::enqueue_with). A key or unique
/// key that another open transaction is inserting waits for that
/// transaction, as any unique index does.
pub async fn enqueue_with<C, P>(
    tx: &C,
    queue: &str,
    payload: &P,
    options: &EnqueueOptions,
) -> Result<i64>
where
    C: GenericClient + Sync,
    P: Serialize + ?Sized,
{
    let args = args::Enqueue::new(queue, payload, options)?;
    let row = tx
        .query_typed_one(Query::Enqueue.sql(), &Query::Enqueue.typed(&args.params()))
        .await
        .map_err(Error::from_pg)?;
    col(&row, 0)
}

/// `lease.enqueue_batch` in `tx`: like
/// [`Client::enqueue_batch`](crate::Client::enqueue_batch), ids in input
/// order.
pub async fn enqueue_batch<C, P>(
    tx: &C,
    queue: &str,
    payloads: &[P],
    options: &BatchOptions,
) -> Result<Vec<i64>>
where
    C: GenericClient + Sync,
    P: Serialize,
{
    let args = args::EnqueueBatch::new(queue, payloads, options)?;
    let rows = tx
        .query_typed(
            Query::EnqueueBatch.sql(),
            &Query::EnqueueBatch.typed(&args.params()),
        )
        .await
        .map_err(Error::from_pg)?;
    rows.iter().map(|r| col(r, 0)).collect()
}

/// `lease.cancel_key` in `tx`: like
/// [`Client::cancel_key`](crate::Client::cancel_key); a pending row is
/// cancelled when `tx` commits, a leased row's owner is told after it.
pub async fn cancel_key<C>(tx: &C, queue: &str, key: &str) -> Result<CancelResult>
where
    C: GenericClient + Sync,
{
    let row = tx
        .query_typed_one(
            Query::CancelKey.sql(),
            &Query::CancelKey.typed(&[&queue, &key]),
        )
        .await
        .map_err(Error::from_pg)?;
    cancel_result(col(&row, 0)?)
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
    fence_on(tx, None, token).await
}

/// [`fence`] for a lease on a row of `queue` (a lease of another queue is
/// not held). On a distributed install (Citus) only this form works: the
/// queue says which node's row your transaction locks.
pub async fn fence_in<C: GenericClient + Sync>(
    tx: &C,
    queue: &str,
    token: FencingToken,
) -> Result<SystemTime> {
    fence_on(tx, Some(queue), token).await
}

async fn fence_on<C: GenericClient + Sync>(
    tx: &C,
    queue: Option<&str>,
    token: FencingToken,
) -> Result<SystemTime> {
    let (id, epoch) = (token.id, token.epoch);
    let row = tx
        .query_typed_one(
            "SELECT lease.fence($1, $2, $3)",
            &[
                (&id, Type::INT8),
                (&epoch, Type::INT8),
                (&queue, Type::TEXT),
            ],
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
