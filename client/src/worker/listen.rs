//! Wake-ups: `LISTEN` on the worker's queue's channel, on a session of its
//! own; with [`WorkerConfig::bind_session`](super::WorkerConfig::bind_session)
//! that session is also the one the worker's leases are bound to.
//!
//! Each queue has a channel of its own whose name only roles that may work
//! the queue can learn (`lease.ready_channel`); its notifications carry no
//! payload.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Ctx;
use crate::error::Error;
use crate::timing::Backoff;

/// Wakes the claim loop when this queue is notified; reconnects with
/// backoff; ends when `stop` fires. Without a connector or with `listen`
/// off it does nothing (the claim loop polls).
pub(super) async fn listener(ctx: &Ctx, stop: &CancellationToken) {
    if !ctx.config.listen {
        return;
    }
    let Some(connector) = ctx.client.connector() else {
        return;
    };
    let connector = connector.with_application_name(&ctx.config.owner);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let started = Instant::now();
        let session = async {
            let mut connected = connector.open().await?;
            let client = &connected.client;
            let channel = async {
                let row = client
                    .query_one("SELECT lease.ready_channel($1)", &[&ctx.config.queue])
                    .await?;
                let channel: String = row.try_get(0)?;
                // The name is a hash of letters and digits; quoted all the same.
                client
                    .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
                    .await?;
                if ctx.config.bind_session {
                    bind(ctx, client).await?;
                }
                Ok::<_, tokio_postgres::Error>(channel)
            };
            let channel = match tokio::time::timeout(ctx.config.request_timeout, channel).await {
                Ok(result) => result.map_err(Error::from_pg)?,
                Err(_) => return Err(Error::Timeout(ctx.config.request_timeout)),
            };
            // Rows may have become ready while nobody listened.
            ctx.wake.notify_one();
            while let Some(n) = connected.notifications.recv().await {
                if n.channel() == channel {
                    ctx.wake.notify_one();
                }
            }
            Ok(())
        };
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            ended = session => ended,
        };
        match ended {
            Ok(()) => {
                tracing::info!(queue = %ctx.config.queue, "LISTEN connection closed; reconnecting")
            }
            Err(e) => {
                tracing::warn!(queue = %ctx.config.queue, error = %e, "LISTEN connection failed; polling until it is back")
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff.reset();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

/// Binds the worker's leases to this session (`lease.bind_session`), so
/// that the reaper ends them when the session ends.
async fn bind(ctx: &Ctx, client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    let (queue, owner) = (&ctx.config.queue, &ctx.config.owner);
    let row = client
        .query_one("SELECT lease.bind_session($1, $2)", &[queue, owner])
        .await?;
    if row.try_get::<_, bool>(0)? {
        tracing::debug!(%queue, %owner, "leases bound to the listening session");
    } else {
        tracing::warn!(%queue, %owner, "the session the leases were bound to had ended, and they with it");
    }
    // The leases of a session that ended are gone, whether this bind or
    // the reaper ended them: a heartbeat now tells which, and fires their
    // handlers' tokens.
    ctx.renew_now.notify_one();
    Ok(())
}
