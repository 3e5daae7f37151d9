//! pg_lease: fenced leases on queue rows and named leases, inside PostgreSQL.
//!
//! The SQL surface lives in `sql/` at the top of the repository, one file per
//! concept, and is pulled into the extension script here in dependency order.
//! Rust adds what SQL cannot: the background reaper ([`launcher`] and
//! [`sweeper`], which also [`vacuum`]s `lease.job`) and its [`settings`],
//! active when the library is in `shared_preload_libraries`, and a look at
//! the backend's transaction state ([`statement`]).

use pgrx::prelude::*;

pub mod as_owner;
pub mod bounded;
pub mod cron;
pub mod epoch;
pub mod launcher;
pub mod predicate;
pub mod reserve;
pub mod route_guard;
pub mod settings;
pub mod shared;
pub mod statement;
pub mod sweeper;
pub mod sweeps;
pub mod vacuum;
pub mod write_back;

::pgrx::pg_module_magic!();

// Every SQL file after the bootstrap names in `requires` exactly the files
// and library functions whose objects it uses (pg_tests/tests/sql_layout.rs
// checks it), so the lists below are the call graph, lowest layer first.
pgrx::extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/check.sql", name = "check", requires = ["schema"]);
pgrx::extension_sql_file!(
    "../../sql/transition.sql",
    name = "transition",
    requires = ["schema"]
);
pgrx::extension_sql_file!(
    "../../sql/wake.sql",
    name = "wake",
    requires = ["schema", "check", "access"]
);
pgrx::extension_sql_file!("../../sql/head.sql", name = "head", requires = ["schema"]);
pgrx::extension_sql_file!(
    "../../sql/access.sql",
    name = "access",
    requires = ["schema", "check"]
);
pgrx::extension_sql_file!(
    "../../sql/concurrency.sql",
    name = "concurrency",
    requires = ["schema", "head", "wake"]
);
pgrx::extension_sql_file!(
    "../../sql/fairness.sql",
    name = "fairness",
    requires = ["schema", "check"]
);
pgrx::extension_sql_file!(
    "../../sql/rate.sql",
    name = "rate",
    requires = ["schema", "check", "access", "fairness"]
);
pgrx::extension_sql_file!(
    "../../sql/key_rate.sql",
    name = "key_rate",
    requires = ["schema", "check", "rate", "fairness"]
);
pgrx::extension_sql_file!(
    "../../sql/metrics.sql",
    name = "metrics",
    requires = ["schema", "access", "concurrency", "rate"]
);
pgrx::extension_sql_file!(
    "../../sql/reap.sql",
    name = "reap",
    requires = [
        "schema",
        "check",
        "citus",
        "head",
        "transition",
        "concurrency",
        "metrics",
        "wake",
        epoch::epoch_floor
    ]
);
pgrx::extension_sql_file!(
    "../../sql/outcome.sql",
    name = "outcome",
    requires = [
        "schema",
        "check",
        "transition",
        as_owner::lock_table_rows,
        shared::reaper_touch
    ]
);
pgrx::extension_sql_file!(
    "../../sql/queue.sql",
    name = "queue",
    requires = [
        "schema",
        "check",
        "citus",
        "access",
        "concurrency",
        "head",
        "metrics",
        "rate",
        "fairness",
        "wake",
        shared::reaper_touch
    ]
);
pgrx::extension_sql_file!(
    "../../sql/lease.sql",
    name = "lease",
    requires = [
        "schema",
        "check",
        "citus",
        "transition",
        "access",
        "concurrency",
        "head",
        "metrics"
    ]
);
pgrx::extension_sql_file!(
    "../../sql/claim.sql",
    name = "claim",
    requires = [
        "schema",
        "check",
        "transition",
        "access",
        "head",
        "lease",
        "metrics",
        "rate",
        "fairness",
        "key_rate",
        epoch::epoch_floor,
        shared::reaper_touch,
        statement::own_transaction
    ]
);
pgrx::extension_sql_file!(
    "../../sql/citus.sql",
    name = "citus",
    requires = ["schema", "metrics"]
);
pgrx::extension_sql_file!(
    "../../sql/fence.sql",
    name = "fence",
    requires = [
        "schema",
        "check",
        "citus",
        "access",
        "outcome",
        "queue",
        "transition"
    ]
);
pgrx::extension_sql_file!(
    "../../sql/named.sql",
    name = "named",
    requires = ["schema", "check", epoch::epoch_floor]
);
pgrx::extension_sql_file!(
    "../../sql/attach.sql",
    name = "attach",
    requires = [
        "schema",
        "access",
        "citus",
        "head",
        "metrics",
        "outcome",
        "queue",
        "wake",
        predicate::qualified_predicate
    ]
);
pgrx::extension_sql_file!(
    "../../sql/schedule.sql",
    name = "schedule",
    requires = [
        "schema",
        "check",
        "queue",
        cron::cron_next,
        cron::cron_last,
        shared::reaper_wake
    ]
);
pgrx::extension_sql_file!(
    "../../sql/session.sql",
    name = "session",
    requires = ["schema", "check", "access", "citus", shared::reaper_touch]
);
pgrx::extension_sql_file!(
    "../../sql/sweep.sql",
    name = "sweep",
    requires = [
        "schema",
        "check",
        "head",
        "metrics",
        "outcome",
        "reap",
        "schedule",
        "session",
        "concurrency",
        "fairness",
        "citus"
    ]
);
pgrx::extension_sql_file!(
    "../../sql/views.sql",
    name = "views",
    requires = [
        "schema",
        "check",
        "access",
        "concurrency",
        "fairness",
        "rate",
        "outcome",
        "sweep",
        shared::reaper_slot_shortages,
        shared::reaper_last_slot_shortage
    ]
);
pgrx::extension_sql_file!("../../sql/privileges.sql", name = "privileges", finalize);

/// Loads the background reaper when preloaded; does nothing otherwise, so
/// `CREATE EXTENSION` works without preloading.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    if unsafe { !pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    settings::define();
    shared::init();
    write_back::init();
    launcher::register();
    reserve::register();
    route_guard::init();
}

#[cfg(any(test, feature = "pg_test"))]
mod tests;

/// Hooks that `cargo pgrx test` looks for at the crate root.
#[cfg(test)]
pub mod pg_test {
    /// One-off set-up before the test cluster runs; nothing needed.
    pub fn setup(_options: Vec<&str>) {}

    /// Extra `postgresql.conf` lines for the test cluster; none needed.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
