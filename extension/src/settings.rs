//! The `lease.*` settings (GUCs) of the background reaper.
//!
//! They exist only when pg_lease is in `shared_preload_libraries`; the SQL
//! surface needs none of them. All but `lease.database` reload on SIGHUP
//! (`SELECT pg_reload_conf()`).

use std::ffi::{CStr, CString};
use std::time::Duration;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `lease.reaper_enabled`: whether the launcher sweeps at all.
pub static REAPER_ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `lease.sweep_interval` (ms): pause between two passes over all databases.
/// With the default, an expired lease is recovered about one second after
/// its expiry.
pub static SWEEP_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `lease.discovery_interval` (s): how often the launcher looks again at a
/// database where pg_lease was absent, or present but idle. `CREATE
/// EXTENSION` asks for a look at once and claims and cancels mark their
/// database at commit, so this is only the fallback for a lost request (two
/// installs at the same moment). Each look costs a fork and a connection,
/// about 14 ms of CPU (docs/performance.md, "Reaper cost in idle databases").
pub static DISCOVERY_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(300);

/// `lease.sweep_batch`: rows reaped or purged per transaction; a sweep runs
/// at most [`MAX_BATCHES_PER_SWEEP`] such transactions per database.
pub static SWEEP_BATCH: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `lease.vacuum_dead_rows`: the sweeper vacuums `lease.job` when its dead
/// row versions outnumber its live rows by this many ([`crate::vacuum`]);
/// 0 leaves it to autovacuum.
pub static VACUUM_DEAD_ROWS: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `lease.vacuum_interval` (ms): how soon the launcher comes back to a
/// database whose `lease.job` it vacuumed within the last
/// `lease.sweep_interval` ([`crate::launcher`]). Under churn a table holds
/// about one vacuum cycle's dead rows, so this, not the sweep interval, sets
/// its size.
pub static VACUUM_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(200);

/// `lease.database`: where the launcher connects to list databases. It
/// stays connected, so that database cannot be dropped while the server
/// runs with pg_lease preloaded.
pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// Upper bound on transactions per database and pass, so one busy database
/// cannot starve the others.
pub const MAX_BATCHES_PER_SWEEP: usize = 10;

/// Registers the settings; call only while shared_preload_libraries is
/// being processed.
pub fn define() {
    GucRegistry::define_bool_guc(
        c"lease.reaper_enabled",
        c"Whether pg_lease's background reaper sweeps databases.",
        c"When off, expired leases are recovered only by explicit calls to lease.sweep() or lease.reap().",
        &REAPER_ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lease.sweep_interval",
        c"Pause between two reaper passes over all databases.",
        c"Expired leases are recovered within about this long after they expire.",
        &SWEEP_INTERVAL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"lease.discovery_interval",
        c"How often the reaper looks again at a database without pg_lease, or with pg_lease but idle.",
        c"CREATE EXTENSION pg_lease, claims and cancels ask for a look at once; this is the fallback.",
        &DISCOVERY_INTERVAL_S,
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"lease.sweep_batch",
        c"Rows the reaper recovers or purges per transaction.",
        c"Each database gets at most 10 such transactions per pass.",
        &SWEEP_BATCH,
        1,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lease.vacuum_dead_rows",
        c"Dead row versions beyond its live rows at which the reaper vacuums lease.job.",
        c"Autovacuum visits a database once per naptime, too rarely for a busy queue; 0 leaves lease.job to autovacuum.",
        &VACUUM_DEAD_ROWS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lease.vacuum_interval",
        c"Pause before the reaper looks again at a database whose lease.job it has just vacuumed.",
        c"Applies while that database was vacuumed within the last lease.sweep_interval; a busy queue holds about one such interval's dead rows.",
        &VACUUM_INTERVAL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_string_guc(
        c"lease.database",
        c"Database the pg_lease launcher connects to in order to list databases.",
        c"The launcher stays connected to it; choose one that is never dropped.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"lease".as_ptr()) };
}

/// The current `lease.sweep_interval`.
pub fn sweep_interval() -> Duration {
    Duration::from_millis(u64::try_from(SWEEP_INTERVAL_MS.get()).unwrap_or(1000))
}

/// The current `lease.vacuum_interval`.
pub fn vacuum_interval() -> Duration {
    Duration::from_millis(u64::try_from(VACUUM_INTERVAL_MS.get()).unwrap_or(200))
}

/// The current `lease.discovery_interval`.
pub fn discovery_interval() -> Duration {
    Duration::from_secs(u64::try_from(DISCOVERY_INTERVAL_S.get()).unwrap_or(300))
}

/// The current `lease.database`, `postgres` if unset.
pub fn database() -> String {
    DATABASE
        .get()
        .as_deref()
        .and_then(|name: &CStr| name.to_str().ok())
        .unwrap_or("postgres")
        .to_owned()
}
