//! The launcher: one static background worker that, every
//! `lease.sweep_interval`, lists the databases and has those with pg_lease
//! swept.
//!
//! Why short-lived per-database sweepers rather than one long-lived worker
//! per database: a worker connected to a database makes a plain
//! `DROP DATABASE` fail, and one per database would hold
//! `max_worker_processes` slots forever. A sweeper lives for one pass (a few
//! milliseconds), the launcher starts them one at a time, so pg_lease uses
//! at most two worker slots, and `DROP DATABASE` (which waits up to 5 s for
//! other sessions to leave) is never blocked. The launcher never connects to
//! a template, so `CREATE DATABASE` is not blocked either.
//!
//! Databases without pg_lease cost next to nothing: the launcher remembers
//! what each sweeper found ([`shared`]) and looks at such a database again
//! only every `lease.discovery_interval`, or at once when `CREATE EXTENSION`
//! asks it to.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;

use crate::shared::{self, Verdict};
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
    shared::publish_launcher_latch();
    log!("pg_lease launcher started (lists databases from \"{home}\")");

    let mut known = Known::default();
    while BackgroundWorker::wait_latch(Some(settings::sweep_interval())) {
        if BackgroundWorker::sighup_received() {
            // The flag alone reloads nothing.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if let Some(oid) = shared::take_discovery() {
            known.rediscover(oid);
        }
        if !settings::REAPER_ENABLED.get() {
            continue;
        }
        let listed = databases();
        known.retain(&listed);
        for (oid, name) in listed {
            if known.due(oid) {
                shared::clear_verdict();
                sweeper::sweep(oid, &name);
                known.record(oid, shared::take_verdict(oid));
            }
        }
    }
    // SIGTERM. Exit code 1 makes the postmaster restart the launcher after
    // pg_terminate_backend; during a server shutdown it restarts nothing.
    unsafe { pg_sys::proc_exit(1) };
}

/// What the launcher knows about each database: whether pg_lease is
/// installed there, and when that was last looked at.
#[derive(Default)]
struct Known {
    databases: HashMap<pg_sys::Oid, Knowledge>,
}

struct Knowledge {
    installed: bool,
    checked_at: Instant,
    /// Until then the database is looked at every pass even if pg_lease was
    /// absent: an install asked for it, and its transaction may not have
    /// committed at the first look.
    eager_until: Option<Instant>,
}

impl Known {
    /// Whether database `oid` should get a sweeper this pass: always where
    /// pg_lease is installed, otherwise only when it was never looked at,
    /// an install asked for it, or the last look is older than
    /// `lease.discovery_interval`.
    fn due(&self, oid: pg_sys::Oid) -> bool {
        match self.databases.get(&oid) {
            None => true,
            Some(k) if k.installed => true,
            Some(k) => {
                k.eager_until.is_some_and(|t| Instant::now() < t)
                    || k.checked_at.elapsed() >= settings::discovery_interval()
            }
        }
    }

    /// Records a sweeper's verdict; a sweeper that failed before it could
    /// tell leaves what was known, so it is retried no sooner than a look.
    fn record(&mut self, oid: pg_sys::Oid, verdict: Option<Verdict>) {
        let entry = self.databases.entry(oid).or_insert(Knowledge {
            installed: false,
            checked_at: Instant::now(),
            eager_until: None,
        });
        entry.checked_at = Instant::now();
        if let Some(verdict) = verdict {
            entry.installed = verdict == Verdict::Installed;
        }
    }

    fn rediscover(&mut self, oid: pg_sys::Oid) {
        self.databases.insert(
            oid,
            Knowledge {
                installed: false,
                checked_at: Instant::now(),
                eager_until: Some(Instant::now() + EAGER_LOOK),
            },
        );
    }

    /// Forgets databases that were dropped.
    fn retain(&mut self, listed: &[(pg_sys::Oid, String)]) {
        self.databases
            .retain(|oid, _| listed.iter().any(|(o, _)| o == oid));
    }
}

/// How long after `CREATE EXTENSION` its database is looked at every pass.
const EAGER_LOOK: Duration = Duration::from_secs(10);

/// Databases that accept connections and are valid, templates excluded.
/// Operators are schema-qualified: the home database's search_path is its
/// owner's to choose.
fn databases() -> Vec<(pg_sys::Oid, String)> {
    let listed = BackgroundWorker::transaction(|| {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT oid, datname::pg_catalog.text FROM pg_catalog.pg_database
                      WHERE datallowconn AND NOT datistemplate
                        AND datconnlimit OPERATOR(pg_catalog.<>) -2
                      ORDER BY oid",
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
