//! Fenced transactions for handlers: [`Job::transaction`](crate::Job::transaction)
//! hands out a transaction on a connection of the worker's own small pool,
//! already fenced by the job's token, so that a handler's multi-statement
//! domain write needs no pool of its own.

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::client::fence_in;
use crate::connect::Connector;
use crate::error::{Error, Result};
use crate::lease::FencingToken;

/// Idle connections for handlers' transactions, opened on demand with the
/// worker's connector and kept up to `keep`.
///
/// Not deadpool or bb8: their Postgres managers connect from a
/// `tokio_postgres::Config` of their own, while these connections must come
/// from the worker's [`Connector`] (its TLS, timeouts and application
/// name); a generic manager over it would be as long as
/// `get` and `put` below, and nothing here waits for a free connection.
pub(crate) struct Pool {
    connector: Option<Connector>,
    idle: Mutex<Vec<Arc<tokio_postgres::Client>>>,
    keep: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.idle().len())
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn new(connector: Option<Connector>, keep: usize) -> Pool {
        Pool {
            connector,
            idle: Mutex::new(Vec::new()),
            keep,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Arc<tokio_postgres::Client>>> {
        // Nothing panics while holding the lock; a poisoned list is intact.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn get(&self) -> Result<Arc<tokio_postgres::Client>> {
        loop {
            let next = self.idle().pop();
            match next {
                Some(pg) if !pg.is_closed() => return Ok(pg),
                Some(_) => continue,
                None => break,
            }
        }
        let connector = self.connector.as_ref().ok_or_else(|| {
            Error::invalid("Job::transaction needs a Client made with a Connector")
        })?;
        Ok(Arc::new(connector.open().await?.client))
    }

    fn put(&self, pg: Arc<tokio_postgres::Client>) {
        let mut idle = self.idle();
        if !pg.is_closed() && idle.len() < self.keep {
            idle.push(pg);
        }
    }
}

/// A transaction that has passed `lease.fence` for one job's token: its
/// writes commit only while the lease is held, and no new epoch can be
/// issued for the row before it ends. Run statements through it (it derefs
/// to a [`tokio_postgres::Client`] inside the open transaction), then
/// [`commit`](FencedTransaction::commit). Dropped without committing, it
/// rolls back.
///
/// ```no_run
/// # async fn example(job: pg_lease_client::Job) -> Result<(), pg_lease_client::BoxError> {
/// let tx = job.transaction().await?;
/// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
/// tx.execute("INSERT INTO ledger (account, amount) VALUES (1, -10)", &[]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FencedTransaction {
    pg: Arc<tokio_postgres::Client>,
    pool: Arc<Pool>,
    lease_until: SystemTime,
    /// Committed or rolled back (or in an unknown state): nothing to undo.
    ended: bool,
}

impl FencedTransaction {
    /// `BEGIN` and `lease.fence` on a pooled connection. [`Error::LeaseLost`]
    /// if the token no longer holds the lease (nothing was written).
    pub(crate) async fn begin(
        pool: &Arc<Pool>,
        queue: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction> {
        let pg = pool.get().await?;
        pg.batch_execute("BEGIN").await.map_err(Error::from_pg)?;
        let mut tx = FencedTransaction {
            pg,
            pool: Arc::clone(pool),
            lease_until: SystemTime::UNIX_EPOCH,
            ended: false,
        };
        // On LE001 the drop below rolls back and returns the connection.
        tx.lease_until = fence_in(&*tx.pg, queue, token).await?;
        Ok(tx)
    }

    /// When the lease ends unless renewed, as `lease.fence` reported it
    /// (database clock).
    pub fn lease_until(&self) -> SystemTime {
        self.lease_until
    }

    /// Commits the transaction and returns its connection to the pool.
    /// An error leaves the outcome unknown (as any failed `COMMIT` does)
    /// and the connection is not reused.
    pub async fn commit(self) -> Result<()> {
        self.end("COMMIT").await
    }

    /// Rolls the transaction back and returns its connection to the pool.
    pub async fn rollback(self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, sql: &str) -> Result<()> {
        self.ended = true;
        self.pg.batch_execute(sql).await.map_err(Error::from_pg)?;
        self.pool.put(Arc::clone(&self.pg));
        Ok(())
    }
}

impl Deref for FencedTransaction {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self.pg
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Roll back in the background and reuse the connection; without a
        // runtime the connection is not reused, and closing it rolls back.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (pg, pool) = (Arc::clone(&self.pg), Arc::clone(&self.pool));
            runtime.spawn(async move {
                if pg.batch_execute("ROLLBACK").await.is_ok() {
                    pool.put(pg);
                }
            });
        }
    }
}
