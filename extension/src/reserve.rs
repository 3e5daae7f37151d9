//! The reserve: a static background worker that keeps one worker slot for
//! the reaper, so that no role can stop reaping by taking every slot.
//!
//! Sweepers are dynamic background workers, and dynamic slots are shared
//! with parallel query, whose `max_parallel_workers` any role may raise for
//! its own session. A static worker's slot is its own from server start, so
//! the reserve waits, unconnected, until the launcher finds no free slot
//! for a sweeper and hands it that database instead. It then sweeps exactly
//! as a sweeper would ([`sweeper::run`]), reporting into a slot of its own
//! ([`shared::RESERVE_SLOT`]), and exits with code 1, which makes the
//! postmaster start it again at once (a worker can connect to only one
//! database in its life), ready for the next hand-off.
//!
//! The hand-off is one word in shared memory, [`ASK`]: the launcher puts a
//! database in it ([`ask`]), the reserve marks it taken, and its exit
//! clears it, however the sweep ended, and wakes the launcher, which does
//! not wait for the sweep meanwhile ([`busy`]). A reserve that does not take it
//! within [`PICKUP`] (not running: `max_worker_processes` too small to
//! register it, or it is restarting) gets nothing, and the sweep counts as
//! a slot shortage.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::{shared, sweeper, vacuum};

/// `backend_type` of the reserve in `pg_stat_activity`.
pub const RESERVE_TYPE: &str = "pg_lease reserve";

/// The hand-off: `oid << 2 | state`, 0 when there is none.
static ASK: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"pg_lease reserve ask") };
const ASKED: u64 = 1;
const TAKEN: u64 = 2;

/// The vacuum mark that goes with the asked database (see [`vacuum::due`]):
/// written before [`ASK`], read after it.
static MARK_HORIZON: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"pg_lease reserve horizon") };
static MARK_MOVED: PgAtomic<AtomicI64> = unsafe { PgAtomic::new(c"pg_lease reserve moved") };

/// The reserve's latch while it waits for a hand-off (0: none waits), and
/// the launcher's, which the reserve sets when it is done.
static RESERVE_LATCH: PgAtomic<AtomicUsize> = unsafe { PgAtomic::new(c"pg_lease reserve latch") };
static CALLER_LATCH: PgAtomic<AtomicUsize> =
    unsafe { PgAtomic::new(c"pg_lease reserve caller latch") };

/// Whether a reserve ever started: if none did (too few worker slots to
/// register it), the launcher does not wait for one.
static STARTED: PgAtomic<AtomicBool> = unsafe { PgAtomic::new(c"pg_lease reserve started") };

/// How long the launcher waits for the reserve to take a hand-off: long
/// enough for the postmaster to restart it after the previous one.
const PICKUP: Duration = Duration::from_secs(1);

/// Reserves the shared state and registers the reserve; call from
/// `_PG_init` while preloading, after [`shared::init`].
pub fn register() {
    pg_shmem_init!(ASK = AtomicU64::new(0));
    pg_shmem_init!(MARK_HORIZON = AtomicU64::new(0));
    pg_shmem_init!(MARK_MOVED = AtomicI64::new(0));
    pg_shmem_init!(RESERVE_LATCH = AtomicUsize::new(0));
    pg_shmem_init!(CALLER_LATCH = AtomicUsize::new(0));
    pg_shmem_init!(STARTED = AtomicBool::new(false));
    BackgroundWorkerBuilder::new(RESERVE_TYPE)
        .set_type(RESERVE_TYPE)
        .set_library("pg_lease")
        .set_function("pg_lease_reserve_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // Back at once after each hand-off (exit code 1).
        .set_restart_time(Some(Duration::ZERO))
        .load();
}

/// Launcher side, when no slot was free for a sweeper: hands database
/// `oid` to the reserve, waiting at most [`PICKUP`] for it to take it, and
/// does not wait for the sweep: [`busy`] says when it is over. False if the
/// reserve did not take it (busy, or not running).
pub fn ask(oid: pg_sys::Oid, vacuumed: vacuum::Mark) -> bool {
    if !shared::preloaded() || !STARTED.get().load(Ordering::Acquire) {
        return false;
    }
    let asked = (u64::from(oid.to_u32()) << 2) | ASKED;
    MARK_HORIZON
        .get()
        .store(u64::from(vacuumed.horizon), Ordering::Relaxed);
    MARK_MOVED.get().store(vacuumed.moved, Ordering::Relaxed);
    CALLER_LATCH
        .get()
        .store(unsafe { pg_sys::MyLatch } as usize, Ordering::Release);
    if ASK
        .get()
        .compare_exchange(0, asked, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let asked_at = Instant::now();
    loop {
        let word = ASK.get().load(Ordering::Acquire);
        if word & TAKEN != 0 || word == 0 {
            return true;
        }
        // Again each time: a reserve that was restarting missed it.
        set_latch(&RESERVE_LATCH);
        if asked_at.elapsed() >= PICKUP {
            // Withdrawn, unless it was taken this very moment.
            if ASK
                .get()
                .compare_exchange(asked, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return false;
            }
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_millis(10))) {
            // Shutting down: the reserve's own exit clears the word.
            return true;
        }
    }
}

/// Launcher side: whether the reserve is still sweeping what it took (its
/// exit clears the hand-off and sets the asking launcher's latch).
pub fn busy() -> bool {
    shared::preloaded() && ASK.get().load(Ordering::Acquire) != 0
}

/// Entry point of the reserve process.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_lease_reserve_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGTERM);
    RESERVE_LATCH
        .get()
        .store(unsafe { pg_sys::MyLatch } as usize, Ordering::Release);
    STARTED.get().store(true, Ordering::Release);
    let oid = loop {
        if let Some(oid) = take() {
            break oid;
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(10))) {
            RESERVE_LATCH.get().store(0, Ordering::Release);
            // Code 1: restarted after pg_terminate_backend, not during a
            // server shutdown.
            unsafe { pg_sys::proc_exit(1) };
        }
    };
    let mark = vacuum::Mark {
        horizon: u32::try_from(MARK_HORIZON.get().load(Ordering::Relaxed)).unwrap_or(0),
        moved: MARK_MOVED.get().load(Ordering::Relaxed),
    };
    shared::report_into(shared::RESERVE_SLOT);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(oid), None);
    sweeper::run(oid, mark);
    unsafe { pg_sys::proc_exit(1) };
}

/// Reserve side: takes the asked database, if any. From then on its exit,
/// however it comes, ends the hand-off.
fn take() -> Option<pg_sys::Oid> {
    let word = ASK.get().load(Ordering::Acquire);
    if word & ASKED == 0 {
        return None;
    }
    ASK.get()
        .compare_exchange(
            word,
            (word ^ ASKED) | TAKEN,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .ok()?;
    RESERVE_LATCH.get().store(0, Ordering::Release);
    unsafe { pg_sys::on_proc_exit(Some(hand_back), pg_sys::Datum::from(0)) };
    u32::try_from(word >> 2).ok().map(pg_sys::Oid::from)
}

/// At the reserve's exit: the hand-off is over; wake the launcher.
unsafe extern "C-unwind" fn hand_back(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    ASK.get().store(0, Ordering::Release);
    set_latch(&CALLER_LATCH);
}

fn set_latch(latch: &PgAtomic<AtomicUsize>) {
    let latch = latch.get().load(Ordering::Acquire);
    if latch != 0 {
        // In a PGPROC, in shared memory, mapped at the same address in every
        // process.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}
