//! The launcher: one static background worker that, every
//! `lease.sweep_interval`, lists the databases and has each swept.
//!
//! Why short-lived per-database sweepers rather than one long-lived worker
//! per database: a worker connected to a database makes a plain
//! `DROP DATABASE` fail, and one per database would hold
//! `max_worker_processes` slots forever. A sweeper lives for one pass (a few
//! milliseconds), the launcher starts them one at a time, so pg_lease uses
//! at most two worker slots, databases created later are picked up on the
//! next pass, and `DROP DATABASE` (which waits up to 5 s for other sessions
//! to leave) is never blocked. The launcher never connects to a template, so
//! `CREATE DATABASE` is not blocked either.

use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;

use crate::{settings, sweeper};

/// `backend_type` of the launcher in `pg_stat_activity`.
pub const LAUNCHER_TYPE: &str = "pg_lease launcher";

/// Registers the launcher with the postmaster; call from `_PG_init` while
/// shared_preload_libraries is being processed.
pub fn register() {
    BackgroundWorkerBuilder::new(LAUNCHER_TYPE)
        .set_type(LAUNCHER_TYPE)
        .set_library("pg_lease")
        .set_function("pg_lease_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // Restarted this long after it dies, including after
        // pg_terminate_backend (see the exit code below).
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Entry point of the launcher process.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_lease_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let home = settings::database();
    BackgroundWorker::connect_worker_to_spi(Some(&home), None);
    log!("pg_lease launcher started (lists databases from \"{home}\")");

    while BackgroundWorker::wait_latch(Some(settings::sweep_interval())) {
        if BackgroundWorker::sighup_received() {
            // The flag alone reloads nothing.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if !settings::REAPER_ENABLED.get() {
            continue;
        }
        for (oid, name) in databases() {
            sweeper::sweep(oid, &name);
        }
    }
    // SIGTERM. Exit code 1 makes the postmaster restart the launcher after
    // pg_terminate_backend; during a server shutdown it restarts nothing.
    unsafe { pg_sys::proc_exit(1) };
}

/// Databases that accept connections, templates excluded.
fn databases() -> Vec<(pg_sys::Oid, String)> {
    let listed = BackgroundWorker::transaction(|| {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT oid, datname::text FROM pg_catalog.pg_database
                      WHERE datallowconn AND NOT datistemplate ORDER BY oid",
                    None,
                    &[],
                )?
                .map(|row| Ok((row.get::<pg_sys::Oid>(1)?, row.get::<String>(2)?)))
                .filter_map(|r: Result<_, pgrx::spi::Error>| match r {
                    Ok((Some(oid), Some(name))) => Some(Ok((oid, name))),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()
        })
    });
    listed.unwrap_or_else(|e| {
        warning!("pg_lease launcher: could not list databases: {e}");
        Vec::new()
    })
}
