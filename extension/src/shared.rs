//! What the reaper's processes tell each other through shared memory.
//!
//! The launcher must learn which databases have pg_lease without connecting
//! to each of them every pass: a sweeper reports what it found in its
//! database into a slot of its own ([`report`], read back by
//! [`take_findings`]; several sweeps run at once), and
//! `CREATE EXTENSION` asks the launcher to look at its database now
//! ([`request_discovery`]) instead of at the next rare re-check.
//!
//! Idle databases cost next to nothing too: a sweeper reports when its
//! database next has work for the reaper ([`report_next_due`]: the earliest
//! lease expiry or purge), and every transaction that can create such work
//! (a claim, a cancel) marks its database at commit ([`reaper_touch`]), so
//! the launcher sweeps a database only when something is due or changed.
//!
//! A burst must not wait for the next pass: claims also count their rows
//! per database, and every `lease.vacuum_dead_rows / 2` rows the
//! committing backend marks its database hot and wakes the launcher, which
//! looks at it at once ([`take_hot`]).
//!
//! All of it exists only when pg_lease is preloaded; elsewhere the functions
//! do nothing and report nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::settings;
use crate::vacuum::Mark;

/// Set by `_PG_init` while preloading; forked backends inherit it, so it
/// tells every process whether the shared state below exists.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// How many sweeps may run at once: the sweepers the launcher runs side by
/// side, and the reserve ([`RESERVE_SLOT`]). Each reports into a slot of
/// its own ([`report`]).
pub const SWEEP_SLOTS: usize = 4;

/// The slot the reserve reports into; the launcher's sweepers use the others.
pub const RESERVE_SLOT: usize = SWEEP_SLOTS - 1;

/// Each slot's finding: `oid << 8 | verdict`. The launcher clears a slot
/// before it starts a sweep in it.
static VERDICT: PgAtomic<[AtomicU64; SWEEP_SLOTS]> =
    unsafe { PgAtomic::new(c"pg_lease sweep verdict") };

/// When the slot's database next has work, in milliseconds since the Unix
/// epoch (0: nothing is due until something changes). Written before the
/// verdict, read after it.
static NEXT_DUE: PgAtomic<[AtomicU64; SWEEP_SLOTS]> =
    unsafe { PgAtomic::new(c"pg_lease next due") };

/// The removal horizon the slot's sweep vacuumed `lease.job` at
/// ([`crate::vacuum`]); `NOT_VACUUMED` when it did not vacuum.
static VACUUM_HORIZON: PgAtomic<[AtomicU64; SWEEP_SLOTS]> =
    unsafe { PgAtomic::new(c"pg_lease vacuum horizon") };
const NOT_VACUUMED: u64 = u64::MAX;

/// The rest of that vacuum's [`Mark`]: the counters' moved rows. Written
/// before the horizon, read after it.
static VACUUM_MOVED: PgAtomic<[AtomicI64; SWEEP_SLOTS]> =
    unsafe { PgAtomic::new(c"pg_lease vacuum moved") };

/// Bit `oid % TOUCH_BITS` is set when a transaction of that database that
/// may have created work for the reaper commits. Collisions only cost an
/// extra sweep.
pub const TOUCH_WORDS: usize = 16;
const TOUCH_BITS: u32 = 64 * TOUCH_WORDS as u32;
static TOUCHED: PgAtomic<[AtomicU64; TOUCH_WORDS]> = unsafe { PgAtomic::new(c"pg_lease touched") };

/// Rows claimed in the databases of bit `oid % TOUCH_BITS` since the server
/// started (wrapping). Only crossings of a multiple of the wake step matter.
static CLAIMED: PgAtomic<[AtomicU64; TOUCH_BITS as usize]> =
    unsafe { PgAtomic::new(c"pg_lease claimed") };

/// Bits like [`TOUCHED`]'s, set when a database's claims crossed a wake
/// step: it may need a vacuum before the next pass.
static HOT: PgAtomic<[AtomicU64; TOUCH_WORDS]> = unsafe { PgAtomic::new(c"pg_lease hot") };

/// Bits like [`TOUCHED`]'s, set by an explicit wake (`lease._reaper_wake`):
/// the database has work due before the next pass, such as a new
/// schedule's first occurrence. Unlike [`HOT`], not held back by
/// `lease.vacuum_interval`.
static WOKEN: PgAtomic<[AtomicU64; TOUCH_WORDS]> = unsafe { PgAtomic::new(c"pg_lease woken") };

/// A database that just ran `CREATE EXTENSION pg_lease` (0: none).
static DISCOVER: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"pg_lease discover") };

/// How often the launcher found no free worker slot for a sweeper, and the
/// last time (Unix seconds): what `lease.reaper_stats` shows of it.
static SLOT_SHORTAGES: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"pg_lease slot shortages") };
static LAST_SLOT_SHORTAGE: PgAtomic<AtomicU64> =
    unsafe { PgAtomic::new(c"pg_lease last slot shortage") };

/// When the log last warned of a slot shortage (Unix seconds).
static LAST_SHORTAGE_WARNING: PgAtomic<AtomicU64> =
    unsafe { PgAtomic::new(c"pg_lease last shortage warning") };

/// Address of the launcher's latch in shared memory (0 while none runs).
static LAUNCHER_LATCH: PgAtomic<AtomicUsize> = unsafe { PgAtomic::new(c"pg_lease launcher latch") };

/// What a sweeper found in its database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// pg_lease is installed there (and was swept, or tried).
    Installed,
    /// pg_lease is not installed there.
    Absent,
}

/// Reserves the shared state; call from `_PG_init` while preloading.
pub fn init() {
    pg_shmem_init!(VERDICT = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(NEXT_DUE = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(VACUUM_HORIZON = std::array::from_fn(|_| AtomicU64::new(NOT_VACUUMED)));
    pg_shmem_init!(VACUUM_MOVED = std::array::from_fn(|_| AtomicI64::new(0)));
    pg_shmem_init!(TOUCHED = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(CLAIMED = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(HOT = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(WOKEN = std::array::from_fn(|_| AtomicU64::new(0)));
    pg_shmem_init!(DISCOVER = AtomicU32::new(0));
    pg_shmem_init!(LAUNCHER_LATCH = AtomicUsize::new(0));
    pg_shmem_init!(SLOT_SHORTAGES = AtomicU64::new(0));
    pg_shmem_init!(LAST_SLOT_SHORTAGE = AtomicU64::new(0));
    pg_shmem_init!(LAST_SHORTAGE_WARNING = AtomicU64::new(0));
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Whether pg_lease was preloaded, so that its shared state exists.
pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

thread_local! {
    /// The slot this process reports into: a sweeper's is in its start
    /// arguments, the reserve's is [`RESERVE_SLOT`].
    static MY_SLOT: Cell<usize> = const { Cell::new(0) };
}

/// Sweeper side: the slot its findings go to.
pub fn report_into(slot: usize) {
    MY_SLOT.with(|s| s.set(slot.min(SWEEP_SLOTS - 1)));
}

fn my_slot() -> usize {
    MY_SLOT.with(Cell::get)
}

/// Sweeper side: records what it found in database `oid`.
pub fn report(oid: pg_sys::Oid, verdict: Verdict) {
    if preloaded() {
        let code = match verdict {
            Verdict::Installed => 1,
            Verdict::Absent => 2,
        };
        VERDICT.get()[my_slot()].store((u64::from(oid.to_u32()) << 8) | code, Ordering::Release);
    }
}

/// Sweeper side: when its database next has work (ms since the Unix epoch),
/// or `None` if nothing is due until something changes.
pub fn report_next_due(due_ms: Option<u64>) {
    if preloaded() {
        NEXT_DUE.get()[my_slot()].store(due_ms.unwrap_or(0), Ordering::Release);
    }
}

/// Sweeper side: it vacuumed `lease.job` at `mark`.
pub fn report_vacuumed(mark: Mark) {
    if preloaded() {
        let slot = my_slot();
        VACUUM_MOVED.get()[slot].store(mark.moved, Ordering::Release);
        VACUUM_HORIZON.get()[slot].store(u64::from(mark.horizon), Ordering::Release);
    }
}

/// What a sweep reported, read back by the launcher once it ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct Findings {
    /// Whether pg_lease is there; `None` if the sweep ended before it could
    /// tell.
    pub verdict: Option<Verdict>,
    /// When the database next has work (ms since the Unix epoch).
    pub next_due_ms: Option<u64>,
    /// Where it vacuumed `lease.job`, if it did.
    pub vacuumed: Option<Mark>,
}

/// Launcher side: forgets what slot `slot` held before a sweep starts in it.
pub fn clear_findings(slot: usize) {
    if preloaded() {
        VERDICT.get()[slot].store(0, Ordering::Release);
        NEXT_DUE.get()[slot].store(0, Ordering::Release);
        VACUUM_HORIZON.get()[slot].store(NOT_VACUUMED, Ordering::Release);
    }
}

/// Launcher side, once the sweep of `oid` in slot `slot` ended: what it
/// reported, clearing the slot.
pub fn take_findings(slot: usize, oid: pg_sys::Oid) -> Findings {
    if !preloaded() {
        return Findings::default();
    }
    let word = VERDICT.get()[slot].swap(0, Ordering::AcqRel);
    let verdict = match (word >> 8 == u64::from(oid.to_u32()), word & 0xff) {
        (true, 1) => Some(Verdict::Installed),
        (true, 2) => Some(Verdict::Absent),
        _ => None,
    };
    let next_due_ms = match NEXT_DUE.get()[slot].swap(0, Ordering::AcqRel) {
        0 => None,
        ms => Some(ms),
    };
    let horizon = VACUUM_HORIZON.get()[slot].swap(NOT_VACUUMED, Ordering::AcqRel);
    let moved = VACUUM_MOVED.get()[slot].load(Ordering::Acquire);
    let vacuumed = u32::try_from(horizon)
        .ok()
        .map(|horizon| Mark { horizon, moved });
    Findings {
        verdict,
        next_due_ms,
        vacuumed,
    }
}

/// Launcher side, once per full pass: which databases were touched since
/// the last one (a set of bits, see [`touched`]), clearing them.
pub fn take_touched() -> [u64; TOUCH_WORDS] {
    take_bits(&TOUCHED)
}

/// Launcher side, every time it wakes: which databases' claims crossed a
/// wake step since the last call (bits as in [`take_touched`]), clearing
/// them.
pub fn take_hot() -> [u64; TOUCH_WORDS] {
    take_bits(&HOT)
}

/// Launcher side, every time it wakes: which databases were woken
/// explicitly since the last call (bits as in [`take_touched`]), clearing
/// them.
pub fn take_woken() -> [u64; TOUCH_WORDS] {
    take_bits(&WOKEN)
}

/// Launcher side, before it waits: whether a wake, a hot database or an
/// install asked for a pass that has not taken it yet. Waiting for a
/// sweeper to exit resets the launcher's latch, so a request that came
/// during a sweep is known by its bits alone. (Touches are not counted:
/// they wait for the next full pass by design.)
pub fn pass_requested() -> bool {
    if !preloaded() {
        return false;
    }
    let set = |words: &PgAtomic<[AtomicU64; TOUCH_WORDS]>| {
        words.get().iter().any(|w| w.load(Ordering::Acquire) != 0)
    };
    set(&WOKEN) || set(&HOT) || DISCOVER.get().load(Ordering::Acquire) != 0
}

fn take_bits(shared: &PgAtomic<[AtomicU64; TOUCH_WORDS]>) -> [u64; TOUCH_WORDS] {
    let mut words = [0; TOUCH_WORDS];
    if preloaded() {
        for (word, bits) in words.iter_mut().zip(shared.get()) {
            *word = bits.swap(0, Ordering::AcqRel);
        }
    }
    words
}

/// Whether `oid`'s bit is set in a [`take_touched`] or [`take_hot`]
/// snapshot.
pub fn touched(words: &[u64; TOUCH_WORDS], oid: pg_sys::Oid) -> bool {
    let (word, mask) = word_and_mask(slot_of(oid));
    words[word] & mask != 0
}

/// `oid`'s slot: its bit in a set of databases, and its [`CLAIMED`] count.
fn slot_of(oid: pg_sys::Oid) -> usize {
    (oid.to_u32() % TOUCH_BITS) as usize
}

/// Where a slot's bit is in a set of databases.
fn word_and_mask(slot: usize) -> (usize, u64) {
    (slot / 64, 1 << (slot % 64))
}

thread_local! {
    /// Rows this transaction claimed so far; `None` until it first asked to
    /// touch at commit.
    static TOUCH_PENDING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Marks the current database for the reaper when the current transaction
/// commits (not before: a sweep that ran between now and the commit would
/// not see this transaction's rows), counting `rows` claimed. Called by
/// claims (with their row count), cancels and schedules; costs a flag test
/// and an addition after the first call in a transaction. A no-op where
/// pg_lease is not preloaded.
#[pg_extern(volatile, parallel_unsafe, name = "_reaper_touch")]
fn reaper_touch(rows: default!(i64, 0)) {
    if !preloaded() {
        return;
    }
    let rows = u64::try_from(rows).unwrap_or(0);
    let pending =
        TOUCH_PENDING.with(|p| p.replace(Some(p.get().unwrap_or(0).saturating_add(rows))));
    if pending.is_some() {
        return;
    }
    let database = unsafe { pg_sys::MyDatabaseId };
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        let rows = TOUCH_PENDING.with(Cell::take).unwrap_or(0);
        mark_committed(database, rows);
    });
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || {
        TOUCH_PENDING.with(|p| p.set(None));
    });
}

/// At commit: marks `database` touched, and hot (waking the launcher) if
/// its `rows` claimed crossed a multiple of the wake step: half of
/// `lease.vacuum_dead_rows`, as each claimed row leaves two dead versions
/// once completed. A trickle never crosses one between two passes; a burst
/// crosses one every few hundred milliseconds, so its first vacuum comes
/// when it is due instead of at the next pass, up to a sweep interval of
/// churn later (docs/performance.md, "Health").
fn mark_committed(database: pg_sys::Oid, rows: u64) {
    let slot = slot_of(database);
    let (word, mask) = word_and_mask(slot);
    TOUCHED.get()[word].fetch_or(mask, Ordering::AcqRel);
    let threshold = u64::try_from(settings::VACUUM_DEAD_ROWS.get()).unwrap_or(0);
    if rows == 0 || threshold == 0 {
        return;
    }
    let step = (threshold / 2).max(1);
    let before = CLAIMED.get()[slot].fetch_add(rows, Ordering::AcqRel);
    if before / step != before.wrapping_add(rows) / step {
        HOT.get()[word].fetch_or(mask, Ordering::AcqRel);
        wake_launcher();
    }
}

/// Asks the preloaded reaper to look at this database as soon as the
/// current transaction commits, not at its next pass: a new schedule's
/// first occurrence may come before that. A no-op where pg_lease is not
/// preloaded.
#[pg_extern(volatile, parallel_unsafe, name = "_reaper_wake")]
fn reaper_wake() {
    if !preloaded() {
        return;
    }
    let database = unsafe { pg_sys::MyDatabaseId };
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        let (word, mask) = word_and_mask(slot_of(database));
        TOUCHED.get()[word].fetch_or(mask, Ordering::AcqRel);
        WOKEN.get()[word].fetch_or(mask, Ordering::AcqRel);
        wake_launcher();
    });
}

/// Sets the launcher's latch, if a launcher runs.
fn wake_launcher() {
    let latch = LAUNCHER_LATCH.get().load(Ordering::Acquire);
    if latch != 0 {
        // The latch lives in the launcher's PGPROC, in shared memory, which
        // every backend maps at the same address.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// Counts a worker of the reaper (a sweeper, a write-back worker) that
/// could not start for want of a worker slot.
pub fn count_slot_shortage() {
    if preloaded() {
        SLOT_SHORTAGES.get().fetch_add(1, Ordering::Relaxed);
        LAST_SLOT_SHORTAGE
            .get()
            .store(unix_seconds(), Ordering::Relaxed);
    }
}

/// Whether to warn of a slot shortage now: true at most once in
/// [`SHORTAGE_WARNING_GAP`], so that a lasting shortage costs one log line a
/// minute, not one a pass.
pub fn warn_of_shortage() -> bool {
    if !preloaded() {
        return true;
    }
    let now = unix_seconds();
    let last = LAST_SHORTAGE_WARNING.get();
    let before = last.load(Ordering::Relaxed);
    now.saturating_sub(before) >= SHORTAGE_WARNING_GAP.as_secs()
        && last
            .compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The least time between two warnings of a worker slot shortage.
pub const SHORTAGE_WARNING_GAP: std::time::Duration = std::time::Duration::from_secs(60);

/// Sweeps the reaper could not start for want of a worker slot since the
/// server started; NULL where pg_lease is not preloaded.
#[pg_extern(volatile, parallel_safe, name = "_reaper_slot_shortages")]
fn reaper_slot_shortages() -> Option<i64> {
    preloaded()
        .then(|| i64::try_from(SLOT_SHORTAGES.get().load(Ordering::Relaxed)).unwrap_or(i64::MAX))
}

/// When that last happened, in Unix seconds; NULL if never or not preloaded.
#[pg_extern(volatile, parallel_safe, name = "_reaper_last_slot_shortage")]
fn reaper_last_slot_shortage() -> Option<i64> {
    if !preloaded() {
        return None;
    }
    match LAST_SLOT_SHORTAGE.get().load(Ordering::Relaxed) {
        0 => None,
        secs => i64::try_from(secs).ok(),
    }
}

/// Launcher side: publishes its latch so installs can wake it.
pub fn publish_launcher_latch() {
    if preloaded() {
        let latch = unsafe { pg_sys::MyLatch } as usize;
        LAUNCHER_LATCH.get().store(latch, Ordering::Release);
    }
}

/// Launcher side: the database an install asked about since the last call.
pub fn take_discovery() -> Option<pg_sys::Oid> {
    if !preloaded() {
        return None;
    }
    match DISCOVER.get().swap(0, Ordering::AcqRel) {
        0 => None,
        oid => Some(pg_sys::Oid::from(oid)),
    }
}

/// Asks the launcher to look for pg_lease in the current database soon; a
/// no-op where pg_lease is not preloaded. Called by the install script.
#[pg_extern(volatile, parallel_unsafe, name = "_reaper_discover")]
fn reaper_discover() {
    if !preloaded() {
        return;
    }
    DISCOVER
        .get()
        .store(unsafe { pg_sys::MyDatabaseId }.to_u32(), Ordering::Release);
    wake_launcher();
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._reaper_discover() IS
$$Internal: asks the preloaded reaper to look for pg_lease in this database now (the install script
calls it); does nothing where pg_lease is not preloaded.$$;
"#,
    name = "reaper_discover_comment",
    requires = [reaper_discover],
);

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._reaper_wake() IS
$$Internal: asks the preloaded reaper to look at this database as soon as the current transaction commits
(lease.schedule calls it); does nothing where pg_lease is not preloaded.$$;
"#,
    name = "reaper_wake_comment",
    requires = [reaper_wake],
);

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._reaper_touch(bigint) IS
$$Internal: tells the preloaded reaper, when the current transaction commits, that this database may
have work for it (claims, cancels and write-backs call it), counting ROWS claimed so that a burst wakes
the reaper at once; does nothing where pg_lease is not preloaded.$$;
"#,
    name = "reaper_touch_comment",
    requires = [reaper_touch],
);

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._reaper_slot_shortages() IS
    'Internal: sweeps the reaper could not start for want of a worker slot since the server started (NULL: not preloaded).';
COMMENT ON FUNCTION lease._reaper_last_slot_shortage() IS
    'Internal: Unix time of the last such shortage (NULL: never, or not preloaded).';
"#,
    name = "reaper_slot_comments",
    requires = [reaper_slot_shortages, reaper_last_slot_shortage],
);
