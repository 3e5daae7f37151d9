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
//! keeps its error. Each write-back is one short transaction under a
//! statement and a lock timeout ([`bounded`]), so a stuck one delays only
//! its own owner's, and is recorded against its row and retried with
//! backoff.
//!
//! One worker per owner and database at a time: the [`Running`] table in
//! shared memory, which no SQL can reach, says which run (a lock of SQL's,
//! such as an advisory lock, any role could take first and so stop them).
//! The sweeper starts no worker for an owner whose worker runs, nor again
//! within [`PAUSE_AFTER_IDLE`] of one that found nothing it could take or
//! failed, so a write-back that stays due (locked by a session of the
//! owner's, say) is not a worker started every pass.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::bounded::{self, Limits};
use crate::shared;

/// `backend_type` of a write-back worker in `pg_stat_activity`.
pub const WRITE_BACK_TYPE: &str = "pg_lease write-back";

/// Write-backs one worker applies before it exits; the next pass starts
/// another if more are due.
const MAX_PER_RUN: usize = 1000;

/// The bounds of one write-back (and of the look at what is due).
const LIMITS: Limits = Limits {
    statement: Duration::from_secs(10),
    lock: Duration::from_secs(1),
};

/// How long after a worker that applied nothing (what was due was locked
/// elsewhere) or failed the sweeper waits before it starts that owner's
/// next one.
const PAUSE_AFTER_IDLE: Duration = Duration::from_secs(5);

/// An owner with write-backs due, and whether its worker may log in as it.
pub struct Owner {
    oid: pg_sys::Oid,
    logs_in: bool,
}

/// The owners of this database's attached tables with write-backs due;
/// called by a sweeper.
pub fn owners_due() -> Vec<Owner> {
    let owners = bounded::transaction(LIMITS, || {
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

/// Starts a write-back worker for `owner` in database `database`, unless
/// one runs or paused there ([`Running`]), and does not wait for it: a slow
/// owner's write-backs must not hold up the reaper.
pub fn start(database: pg_sys::Oid, owner: &Owner) {
    if !Running::may_start(database, owner.oid) {
        return;
    }
    let started = BackgroundWorkerBuilder::new(WRITE_BACK_TYPE)
        .set_type(WRITE_BACK_TYPE)
        .set_library("pg_lease")
        .set_function("pg_lease_write_back_main")
        .set_argument(database.into_datum())
        .set_extra(&format!("{} {}", owner.oid.to_u32(), owner.logs_in))
        .enable_spi_access()
        .load_dynamic();
    if started.is_err() {
        // Not at once again: a lasting shortage would start (and warn) every pass.
        Running::pause(database, owner.oid, PAUSE_AFTER_IDLE);
        shared::count_slot_shortage();
        if shared::warn_of_shortage() {
            warning!("pg_lease: no free background worker slot to apply write-backs; raise max_worker_processes");
        }
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
    // One worker per owner and database; its exit, however it comes, says
    // so again.
    if !Running::enter(database, owner) {
        return;
    }
    let as_owner = logs_in.then_some(owner);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), as_owner);
    if !logs_in && !bounded::transaction(LIMITS, || become_owner(owner)) {
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
    let mut applied = 0;
    while applied < MAX_PER_RUN {
        if BackgroundWorker::sigterm_received() || !bounded::transaction(LIMITS, apply_one) {
            break;
        }
        applied += 1;
    }
    if applied == 0 {
        Running::idle();
    }
}

/// Makes the session `owner`'s (`SET SESSION AUTHORIZATION`), if pg_lease
/// is installed here. False if there is nothing to do here.
fn become_owner(owner: pg_sys::Oid) -> bool {
    let became = Spi::connect_mut(|client| {
        // The database's owner chooses its settings: pin the path before
        // anything resolves a name.
        client.update("SET search_path = pg_catalog, pg_temp", None, &[])?;
        let found = client.select(
            "SELECT pg_catalog.format('SET SESSION AUTHORIZATION %I', r.rolname)
               FROM pg_catalog.pg_roles r
              WHERE r.oid OPERATOR(pg_catalog.=) $1
                AND EXISTS (SELECT FROM pg_catalog.pg_extension e
                             WHERE e.extname OPERATOR(pg_catalog.=) 'pg_lease')",
            None,
            &[owner.into()],
        )?;
        let role = if found.is_empty() {
            None
        } else {
            found.first().get_one::<String>()?
        };
        match role {
            Some(set_role) => client.update(&set_role, None, &[]).map(|_| true),
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
        client.update("SET LOCAL search_path = pg_catalog, pg_temp", None, &[])?;
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

/// The write-back workers that run, or must not start yet, by database and
/// owner: `WORDS_PER_ENTRY` words an entry, in shared memory.
///
/// An entry is `database << 32 | owner`, then `pid << PID_SHIFT | not
/// before` (milliseconds since the Unix epoch). A worker enters its pid at
/// start ([`Running::enter`]), and its exit writes 0 there again
/// ([`leave`]); a sweeper starts a worker only for an owner without one and
/// past its not-before time. Entries are changed under [`LOCK`], a spin
/// lock held for a few loads and stores.
struct Running;

const ENTRIES: usize = 64;
const WORDS_PER_ENTRY: usize = 2;
const PID_SHIFT: u32 = 42;
const TIME_MASK: u64 = (1 << PID_SHIFT) - 1;

static TABLE: PgAtomic<[AtomicU64; ENTRIES * WORDS_PER_ENTRY]> =
    unsafe { PgAtomic::new(c"pg_lease write-back workers") };
static LOCK: PgAtomic<AtomicBool> = unsafe { PgAtomic::new(c"pg_lease write-back workers lock") };

thread_local! {
    /// This worker's entry, once it entered one.
    static MINE: Cell<Option<usize>> = const { Cell::new(None) };
    /// Whether this worker found nothing it could take.
    static IDLE: Cell<bool> = const { Cell::new(false) };
}

/// Reserves the shared table; call from `_PG_init` while preloading.
pub fn init() {
    pg_shmem_init!(TABLE = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(LOCK = AtomicBool::new(false));
}

impl Running {
    /// Runs `f` over the table, under the lock.
    fn locked<R>(f: impl FnOnce(&[AtomicU64]) -> R) -> R {
        let lock = LOCK.get();
        while lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let result = f(TABLE.get());
        lock.store(false, Ordering::Release);
        result
    }

    /// The entry of `key`, if any.
    fn find(table: &[AtomicU64], key: u64) -> Option<usize> {
        (0..ENTRIES).find(|e| table[e * WORDS_PER_ENTRY].load(Ordering::Relaxed) == key)
    }

    /// Sweeper side: whether a worker may start for `owner` in `database`.
    fn may_start(database: pg_sys::Oid, owner: pg_sys::Oid) -> bool {
        if !shared::preloaded() {
            return false;
        }
        let key = key(database, owner);
        Self::locked(|table| match Self::find(table, key) {
            None => true,
            Some(e) => {
                let state = table[e * WORDS_PER_ENTRY + 1].load(Ordering::Relaxed);
                state >> PID_SHIFT == 0 && now_ms() >= state & TIME_MASK
            }
        })
    }

    /// Sweeper side: no worker for `owner` in `database` until `pause` from
    /// now (no entry is taken if the table is full).
    fn pause(database: pg_sys::Oid, owner: pg_sys::Oid, pause: Duration) {
        if !shared::preloaded() {
            return;
        }
        let key = key(database, owner);
        let until = now_ms().saturating_add(millis(pause)) & TIME_MASK;
        Self::locked(|table| {
            if let Some(e) = Self::find(table, key).or_else(|| Self::free(table)) {
                table[e * WORDS_PER_ENTRY].store(key, Ordering::Relaxed);
                table[e * WORDS_PER_ENTRY + 1].store(until, Ordering::Relaxed);
            }
        });
    }

    /// An entry that nothing runs in and whose pause is over.
    fn free(table: &[AtomicU64]) -> Option<usize> {
        let now = now_ms();
        (0..ENTRIES).find(|e| {
            let state = table[e * WORDS_PER_ENTRY + 1].load(Ordering::Relaxed);
            table[e * WORDS_PER_ENTRY].load(Ordering::Relaxed) == 0
                || (state >> PID_SHIFT == 0 && now >= state & TIME_MASK)
        })
    }

    /// Worker side: enters this worker for `owner` in `database`. False if
    /// another runs there (or the table is full): this one leaves.
    fn enter(database: pg_sys::Oid, owner: pg_sys::Oid) -> bool {
        if !shared::preloaded() {
            return false;
        }
        let key = key(database, owner);
        let pid = u64::try_from(unsafe { pg_sys::MyProcPid }).unwrap_or(0);
        let entered = Self::locked(|table| {
            let e = match Self::find(table, key) {
                Some(e)
                    if table[e * WORDS_PER_ENTRY + 1].load(Ordering::Relaxed) >> PID_SHIFT != 0 =>
                {
                    return None
                }
                Some(e) => e,
                None => Self::free(table)?,
            };
            table[e * WORDS_PER_ENTRY].store(key, Ordering::Relaxed);
            table[e * WORDS_PER_ENTRY + 1].store(pid << PID_SHIFT, Ordering::Relaxed);
            Some(e)
        });
        let Some(e) = entered else {
            return false;
        };
        MINE.with(|m| m.set(Some(e)));
        // SAFETY: a callback of this process's exit, however it exits.
        unsafe { pg_sys::on_proc_exit(Some(leave), pg_sys::Datum::from(0)) };
        true
    }

    /// Worker side: this worker found nothing it could take: its owner's
    /// next worker waits [`PAUSE_AFTER_IDLE`].
    fn idle() {
        IDLE.with(|i| i.set(true));
    }
}

/// At a write-back worker's exit: its entry is free again, paused if the
/// worker failed (exit code other than 0) or applied nothing.
unsafe extern "C-unwind" fn leave(code: std::ffi::c_int, _arg: pg_sys::Datum) {
    let Some(e) = MINE.with(Cell::take) else {
        return;
    };
    let until = if code != 0 || IDLE.with(Cell::get) {
        now_ms().saturating_add(millis(PAUSE_AFTER_IDLE)) & TIME_MASK
    } else {
        0
    };
    Running::locked(|table| table[e * WORDS_PER_ENTRY + 1].store(until, Ordering::Relaxed));
}

fn key(database: pg_sys::Oid, owner: pg_sys::Oid) -> u64 {
    (u64::from(database.to_u32()) << 32) | u64::from(owner.to_u32())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}
