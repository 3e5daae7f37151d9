//! The sweeper: a short-lived background worker that runs `lease.sweep()`
//! in one database, in a few bounded transactions, and exits.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, DynamicBackgroundWorker, SignalWakeFlags,
};
use pgrx::prelude::*;

use crate::bounded::{self, Limits};
use crate::shared::{self, Verdict};
use crate::{settings, vacuum, write_back};

/// `backend_type` of a sweeper in `pg_stat_activity`.
pub const SWEEPER_TYPE: &str = "pg_lease sweeper";

/// The bounds of one batch of a sweep. A sweep never waits on rows (SKIP
/// LOCKED) nor on another sweep (it skips the pass); these bound the rest,
/// so that one stuck database holds one sweeper for at most
/// `MAX_BATCHES_PER_SWEEP` such batches, while the others are swept beside
/// it.
const LIMITS: Limits = Limits {
    statement: Duration::from_secs(10),
    lock: Duration::from_millis(200),
};

/// Starts a sweeper for database `oid` reporting into `slot` (see
/// [`shared::report`]), notifying the calling launcher when it exits, and
/// does not wait for it; `vacuumed` is where the last vacuum of its
/// `lease.job` ran ([`vacuum::due`]). `None` when no worker slot is free.
pub fn start(
    oid: pg_sys::Oid,
    name: &str,
    vacuumed: vacuum::Mark,
    slot: usize,
) -> Option<DynamicBackgroundWorker> {
    BackgroundWorkerBuilder::new(&format!("{SWEEPER_TYPE} {name}"))
        .set_type(SWEEPER_TYPE)
        .set_library("pg_lease")
        .set_function("pg_lease_sweeper_main")
        .set_argument(oid.into_datum())
        .set_extra(&format!("{slot} {}", vacuumed.encode()))
        .enable_spi_access()
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .ok()
}

/// Entry point of a sweeper process; the argument is the database's oid.
///
/// It connects as the bootstrap superuser (PostgreSQL 15 lets a worker
/// connect only as a role that may log in), and the database's owner
/// chooses that database's settings (`ALTER DATABASE ... SET`). So before
/// anything resolves a name, the search_path is pinned; every operator and
/// function after that is schema-qualified; and the sweep itself runs as
/// `lease_admin`, the least role that may call `lease.sweep`.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_lease_sweeper_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGTERM);
    let Some(oid) = (unsafe { pg_sys::Oid::from_datum(arg, false) }) else {
        return;
    };
    let (slot, mark) = BackgroundWorker::get_extra()
        .split_once(' ')
        .unwrap_or(("0", ""));
    shared::report_into(slot.parse().unwrap_or(0));
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(oid), None);
    run(oid, vacuum::Mark::decode(mark));
}

/// The work of a sweeper, in the database this worker is connected to
/// (`oid`), also done by the [`reserve`](crate::reserve): sweeps in
/// batches, starts the write-back workers, and vacuums `lease.job` if that
/// is due since `before`.
pub fn run(oid: pg_sys::Oid, before: vacuum::Mark) {
    let batch = settings::SWEEP_BATCH.get();
    for _ in 0..settings::MAX_BATCHES_PER_SWEEP {
        // One short transaction per batch: its timestamps are fresh and it
        // holds row locks only briefly.
        match bounded::transaction(LIMITS, || sweep_once(oid, batch)) {
            Batch::Full if !BackgroundWorker::sigterm_received() => continue,
            Batch::Full | Batch::Partial | Batch::Held => break,
            Batch::Skipped => return,
        }
    }
    // Each owner's write-backs in a worker of its own, not waited for.
    for owner in write_back::owners_due() {
        write_back::start(oid, &owner);
    }
    // Last, so that a vacuum that fails cannot cost the sweep its verdict.
    if BackgroundWorker::sigterm_received() {
        return;
    }
    if let Some(mark) = vacuum::due(before) {
        vacuum::run();
        shared::report_vacuumed(mark);
    }
}

/// What one batch of a sweep did.
enum Batch {
    /// It came back full: another one may be worth running.
    Full,
    /// It swept what there was.
    Partial,
    /// Another session holds this database's sweep (lease.reaper_stats
    /// names it): looked at again in a sweep interval.
    Held,
    /// pg_lease is not installed, or the sweep failed.
    Skipped,
}

/// Runs one `lease.sweep(batch)` if this database has pg_lease.
fn sweep_once(oid: pg_sys::Oid, batch: i32) -> Batch {
    let outcome = Spi::connect_mut(|client| {
        // A utility statement: it resolves no operator or function.
        client.update("SET LOCAL search_path = pg_catalog, pg_temp", None, &[])?;
        let installed = client
            .select(
                "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension
                                 WHERE extname OPERATOR(pg_catalog.=) 'pg_lease'::pg_catalog.name)",
                None,
                &[],
            )?
            .first()
            .get_one::<bool>()?
            == Some(true);
        shared::report(
            oid,
            if installed {
                Verdict::Installed
            } else {
                Verdict::Absent
            },
        );
        if !installed {
            return Ok(Batch::Skipped);
        }
        // The sweep's own lock (a row only pg_lease's roles can lock, see
        // lease.sweep), taken here first so that a held one is known.
        let held = client
            .update(
                "SELECT FROM lease.sweep_state FOR UPDATE SKIP LOCKED",
                None,
                &[],
            )?
            .is_empty();
        if held {
            let later = SystemTime::now() + settings::sweep_interval();
            shared::report_next_due(
                later
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .and_then(|d| u64::try_from(d.as_millis()).ok()),
            );
            return Ok(Batch::Held);
        }
        client.update("SET LOCAL ROLE lease_admin", None, &[])?;
        let (recovered, purged) = client
            .update(
                "SELECT recovered, purged FROM lease.sweep($1)",
                None,
                &[batch.into()],
            )?
            .first()
            .get_two::<i64, i64>()?;
        // When the reaper next has work here, so that an idle database is
        // not swept every pass. Internal, hence as the sweeper's own role;
        // its body was resolved when the extension was created.
        let due_ms = client
            .update(
                "SET LOCAL ROLE NONE;
                 SELECT (pg_catalog.date_part('epoch', lease._next_sweep_due()) * 1000)::bigint",
                None,
                &[],
            )?
            .first()
            .get_one::<i64>()?;
        shared::report_next_due(due_ms.and_then(|ms| u64::try_from(ms.max(1)).ok()));
        let batch = i64::from(batch);
        Ok(
            if recovered.unwrap_or(0) >= batch || purged.unwrap_or(0) >= batch {
                Batch::Full
            } else {
                Batch::Partial
            },
        )
    });
    outcome.unwrap_or_else(|e: pgrx::spi::Error| {
        warning!("pg_lease sweeper: {e}");
        Batch::Skipped
    })
}
