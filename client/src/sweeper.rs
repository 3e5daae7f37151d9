//! [`Sweeper`]: the reaper's work done from the application, for servers
//! where pg_lease's background reaper does not run (the library not
//! preloaded, or the install without it on managed PostgreSQL).
//!
//! Every replica may run one. They elect one of themselves over a named
//! lease ([`Elector`]); only the holder calls `lease.sweep()`, every
//! [`SweeperConfig::every`], and each sweep commits only under the holder's
//! epoch ([`Client::sweep_fenced`]), so a replica that was paused past its
//! term and wakes up mid-sweep changes nothing.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::elector::{Elector, ElectorConfig};
use crate::error::{Error, Result};

/// Settings of a [`Sweeper`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweeperConfig {
    /// The named lease that picks the replica that sweeps, and how it is
    /// held. Default: `ElectorConfig::new("pg_lease sweeper")`.
    pub elector: ElectorConfig,
    /// Time between two sweeps of the leader. Default 1 s (the reaper's
    /// default `lease.sweep_interval`): an expired lease is recovered
    /// about this long after its expiry.
    pub every: Duration,
    /// `lease.sweep`'s `max_rows`: rows each of its steps may touch per
    /// pass (1 to 10,000). Default 1,000.
    pub max_rows: u32,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            elector: ElectorConfig::new("pg_lease sweeper"),
            every: Duration::from_secs(1),
            max_rows: 1000,
        }
    }
}

/// Runs `lease.sweep()` in the background while this process holds the
/// sweeper's named lease; see the [module](self) documentation. Needs a
/// `Client` whose role is `lease_admin`.
///
/// ```no_run
/// # async fn run() -> pg_lease_client::Result<()> {
/// use pg_lease_client::{Client, Sweeper, SweeperConfig};
///
/// let client = Client::connect("host=127.0.0.1 user=app dbname=app").await?;
/// let sweeper = Sweeper::start(client, SweeperConfig::default())?;
/// // ... the application runs ...
/// sweeper.stop().await; // releases the lease: another replica takes over at once
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Sweeper {
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Checks `config` and starts contending and sweeping in a task.
    /// [`Error::InvalidInput`] for a zero `every`, a `max_rows` outside
    /// 1..=10000, or an invalid elector configuration.
    pub fn start(client: Client, config: SweeperConfig) -> Result<Sweeper> {
        if config.every.is_zero() {
            return Err(Error::invalid("SweeperConfig::every must be above zero"));
        }
        if !(1..=10_000).contains(&config.max_rows) {
            return Err(Error::invalid(
                "SweeperConfig::max_rows must be between 1 and 10000",
            ));
        }
        let elector = Elector::start(client.clone(), config.elector.clone())?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sweep_while_leading(
            client,
            elector,
            config,
            shutdown.clone(),
        ));
        Ok(Sweeper {
            shutdown,
            task: Some(task),
        })
    }

    /// Stops sweeping and releases the lease (so that another replica's
    /// sweeper need not wait for it to expire).
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                tracing::warn!(target: "pg_lease_client", error = %e, "sweeper task ended abnormally");
            }
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The sweeper's task: waits for a term, sweeps every `every` until it
/// ends, and starts over; on shutdown stops the elector.
async fn sweep_while_leading(
    client: Client,
    mut elector: Elector,
    config: SweeperConfig,
    shutdown: CancellationToken,
) {
    let name = config.elector.name.as_str();
    'contend: loop {
        let term = tokio::select! {
            term = elector.wait_for_term() => term,
            () = shutdown.cancelled() => break 'contend,
        };
        tracing::info!(target: "pg_lease_client", name, epoch = term.epoch(), "sweeper leads");
        loop {
            match client
                .sweep_fenced(name, term.epoch(), config.max_rows)
                .await
            {
                Ok((recovered, purged)) => {
                    tracing::debug!(target: "pg_lease_client", recovered, purged, "swept");
                    // Write-backs of the tables this role owns (outcome.sql);
                    // with the library a background worker applies them too.
                    match client.apply_write_backs(config.max_rows).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::debug!(target: "pg_lease_client", n, "applied write-backs")
                        }
                        Err(e) => {
                            tracing::warn!(target: "pg_lease_client", error = %e, "applying write-backs failed")
                        }
                    }
                }
                Err(e) if e.is_lease_lost() => {
                    // The elector steps down at its next renewal; no sweep
                    // until then, nor a busy loop.
                    tracing::warn!(target: "pg_lease_client", name, epoch = term.epoch(), "sweep fenced off: the term is over");
                    tokio::select! {
                        () = term.ended() => continue 'contend,
                        () = shutdown.cancelled() => break 'contend,
                    }
                }
                Err(e) => tracing::warn!(target: "pg_lease_client", error = %e, "sweep failed"),
            }
            tokio::select! {
                () = term.ended() => continue 'contend,
                () = shutdown.cancelled() => break 'contend,
                () = tokio::time::sleep(config.every) => {}
            }
        }
    }
    elector.stop().await;
}
