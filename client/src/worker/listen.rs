//! Wake-ups: `LISTEN` on [`READY_CHANNEL`] for the worker's queue.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Ctx, READY_CHANNEL};
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
            let listen = format!("LISTEN {READY_CHANNEL}");
            match tokio::time::timeout(
                ctx.config.request_timeout,
                connected.client.batch_execute(&listen),
            )
            .await
            {
                Ok(result) => result.map_err(Error::from_pg)?,
                Err(_) => return Err(Error::Timeout(ctx.config.request_timeout)),
            }
            // Rows may have become ready while nobody listened.
            ctx.wake.notify_one();
            while let Some(n) = connected.notifications.recv().await {
                if n.channel() == READY_CHANNEL && n.payload() == ctx.config.queue {
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
