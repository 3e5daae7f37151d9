//! The write-back worker: applies the `on_dead`/`on_cancel` write-backs of
//! one table owner in one database (`lease.apply_write_backs`, outcome.sql)
//! as that owner, and exits.
//!
//! A write-back is the owner's code, so it runs in a session that is the
//! owner's alone: a process of its own per owner and database, whose
//! session settings die with it. An owner that may log in (and connect to
//! the database) gets a worker logged in as itself, exactly as if it ran
//! `SELECT lease.apply_write_backs()` from its own scheduler. One that may
//! not (PostgreSQL 15 lets a worker connect only as a role that may log in)
//! gets a worker logged in as the bootstrap superuser and turned into the
//! owner with `SET SESSION AUTHORIZATION` before any of the owner's code
//! runs, then kept in a security-restricted operation, as `VACUUM` runs
//! index expressions: the owner's code cannot set the session authorization
//! back to the superuser, nor leave anything behind; PostgreSQL also refuses
//! to fire deferred triggers there, so such a write-back fails (42501) and
//! keeps its error. Each write-back is one short transaction under
//! `statement_timeout` and `lock_timeout`, so a stuck one delays only its
//! own owner's.

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;

use crate::shared;

/// `backend_type` of a write-back worker in `pg_stat_activity`.
pub const WRITE_BACK_TYPE: &str = "pg_lease write-back";

/// Write-backs one worker applies before it exits; the next pass starts
/// another if more are due.
const MAX_PER_RUN: usize = 1000;

/// An owner with write-backs due, and whether its worker may log in as it.
pub struct Owner {
    oid: pg_sys::Oid,
    logs_in: bool,
}

/// The owners of this database's attached tables with write-backs due;
/// called by a sweeper.
pub fn owners_due() -> Vec<Owner> {
    let owners = BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            client.update("SET LOCAL search_path = pg_catalog, pg_temp", None, &[])?;
            client
                .select(
                    "SELECT o.owner, r.rolcanlogin
                            AND pg_catalog.has_database_privilege(r.oid, pg_catalog.current_database(), 'CONNECT')
                       FROM lease._write_back_owners() o(owner)
                       JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.owner",
                    None,
                    &[],
                )?
                .map(|row| {
                    let oid = row.get::<pg_sys::Oid>(1)?;
                    let logs_in = row.get::<bool>(2)?.unwrap_or(false);
                    Ok(oid.map(|oid| Owner { oid, logs_in }))
                })
                .filter_map(Result::transpose)
                .collect::<Result<Vec<_>, _>>()
        })
    });
    owners.unwrap_or_else(|e: pgrx::spi::Error| {
        warning!("pg_lease sweeper: could not list due write-backs: {e}");
        Vec::new()
    })
}

/// Starts a write-back worker for `owner` in database `database` and does
/// not wait for it: a slow owner's write-backs must not hold up the reaper.
pub fn start(database: pg_sys::Oid, owner: &Owner) {
    let started = BackgroundWorkerBuilder::new(WRITE_BACK_TYPE)
        .set_type(WRITE_BACK_TYPE)
        .set_library("pg_lease")
        .set_function("pg_lease_write_back_main")
        .set_argument(database.into_datum())
        .set_extra(&format!("{} {}", owner.oid.to_u32(), owner.logs_in))
        .enable_spi_access()
        .load_dynamic();
    if started.is_err() {
        shared::count_slot_shortage();
        warning!("pg_lease: no free background worker slot to apply write-backs; raise max_worker_processes");
    }
}

/// Entry point of a write-back worker; the argument is the database's oid,
/// the extra the owner's and whether the worker logs in as it.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_lease_write_back_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGTERM);
    let Some(database) = (unsafe { pg_sys::Oid::from_datum(arg, false) }) else {
        return;
    };
    let Some((owner, logs_in)) = BackgroundWorker::get_extra().split_once(' ') else {
        return;
    };
    let (Ok(owner), logs_in) = (owner.parse::<u32>(), logs_in == "true") else {
        return;
    };
    let owner = pg_sys::Oid::from(owner);
    let as_owner = logs_in.then_some(owner);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), as_owner);
    if !BackgroundWorker::transaction(|| take_over(owner, !logs_in)) {
        return;
    }
    if !logs_in {
        // Restricted from here on, for the rest of the process: a
        // transaction's abort returns to what was in force when it started.
        unsafe {
            pg_sys::SetUserIdAndSecContext(
                owner,
                (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION)
                    as i32,
            );
        }
    }
    for _ in 0..MAX_PER_RUN {
        if BackgroundWorker::sigterm_received() || !BackgroundWorker::transaction(apply_one) {
            break;
        }
    }
}

/// Takes this database's lock of `owner`'s write-backs (one worker per
/// owner at a time; a second one leaves) and, if `authorize`, makes the
/// session `owner`'s. False if there is nothing to do here.
fn take_over(owner: pg_sys::Oid, authorize: bool) -> bool {
    let became = Spi::connect_mut(|client| {
        // The database's owner chooses its settings: pin the path before
        // anything resolves a name.
        client.update("SET search_path = pg_catalog, pg_temp", None, &[])?;
        let role = client
            .select(
                "SELECT pg_catalog.format('SET SESSION AUTHORIZATION %I', r.rolname)
                   FROM pg_catalog.pg_roles r
                  WHERE r.oid OPERATOR(pg_catalog.=) $1
                    AND pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('pg_lease write-back'),
                                                        r.oid::pg_catalog.int4)
                    AND EXISTS (SELECT FROM pg_catalog.pg_extension e
                                 WHERE e.extname OPERATOR(pg_catalog.=) 'pg_lease')",
                None,
                &[owner.into()],
            )?
            .first()
            .get_one::<String>()?;
        match role {
            Some(set_role) if authorize => client.update(&set_role, None, &[]).map(|_| true),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    });
    became.unwrap_or_else(|e: pgrx::spi::Error| {
        warning!("pg_lease write-back: {e}");
        false
    })
}

/// Applies one due write-back in a transaction of its own; false when none
/// was due.
fn apply_one() -> bool {
    let handled = Spi::connect_mut(|client| {
        client.update(
            "SET LOCAL search_path = pg_catalog, pg_temp;
             SET LOCAL statement_timeout = '10s'; SET LOCAL lock_timeout = '1s'",
            None,
            &[],
        )?;
        client
            .update("SELECT lease.apply_write_backs(1)", None, &[])?
            .first()
            .get_one::<i32>()
    });
    match handled {
        Ok(n) => n.unwrap_or(0) > 0,
        Err(e) => {
            warning!("pg_lease write-back: {e}");
            false
        }
    }
}
