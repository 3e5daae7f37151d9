//! The launcher: one static background worker that, every
//! `lease.sweep_interval`, lists the databases and has those with pg_lease
//! swept.
//!
//! Why short-lived per-database sweepers rather than one long-lived worker
//! per database: a worker connected to a database makes a plain
//! `DROP DATABASE` fail, and one per database would hold
//! `max_worker_processes` slots forever. A sweeper lives for one pass (a few
//! milliseconds), and `DROP DATABASE` (which waits up to 5 s for other
//! sessions to leave) is never blocked. The launcher does not wait for a
//! sweeper: up to three run side by side, one per database ([`Sweeps`]), so
//! a database whose sweep takes long delays none of the others, and the
//! reaper uses at most five worker slots (its own, the
//! [reserve](crate::reserve)'s, three sweepers'). When parallel query has
//! taken every free slot, the reserve sweeps instead. The launcher never
//! connects to a template, so `CREATE DATABASE` is not blocked either.
//!
//! Databases without pg_lease, and idle ones with it, cost next to nothing:
//! the launcher remembers what each sweeper found ([`shared`]): whether
//! pg_lease is there and when its next lease expiry or purge is due. It
//! sweeps a database with pg_lease when that time comes or when a claim or
//! cancel committed there since the last pass, and looks at any other
//! database again only every `lease.discovery_interval`, or at once when
//! `CREATE EXTENSION` asks it to (and every `EAGER_GAP` after that until
//! the install's commit shows).
//!
//! A database whose `lease.job` a sweeper vacuumed within the last
//! `lease.sweep_interval` is churning: the launcher comes back to it every
//! `lease.vacuum_interval` instead, and only to it. Under churn the table
//! holds about one vacuum cycle's dead rows, so the cycle sets its size:
//! with a vacuum at most every 1.2–1.5 s (the pause plus the vacuum), a
//! queue at 27k jobs/s held 26–29 MB for 10,000 live rows (11.7×); vacuumed
//! twice a second, 16 MB (6.5×; docs/performance.md, "Health"). Touches of
//! other databases wait for the next full pass.
//!
//! The file never shrinks, so what a burst adds before its first vacuum
//! stays, and that vacuum waited for the next pass. Claims therefore wake the launcher whenever a
//! database's claimed rows cross a step ([`shared::take_hot`]), and a hot
//! database is looked at on that wake. Neither a hot nor a churning
//! database is looked at more often than every `lease.vacuum_interval`.
//! An explicit wake (`lease._reaper_wake`: a new schedule, whose first
//! occurrence may come before the next pass) is looked at on that wake, at
//! most once every `DUE_GAP`.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;

use crate::settings;
use crate::shared::{self, Verdict};
use crate::sweeps::Sweeps;
use crate::vacuum::Mark;

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
    let mut sweeps = Sweeps::default();
    // A request that came while the launcher was busy lost its latch
    // wake-up: such a pass starts at once. (With the reaper off the
    // requests are never taken: no hurry then.)
    let wait = |known: &Known| {
        if settings::REAPER_ENABLED.get() && shared::pass_requested() {
            Duration::ZERO
        } else {
            known.pause()
        }
    };
    while BackgroundWorker::wait_latch(Some(wait(&known))) {
        if BackgroundWorker::sighup_received() {
            // The flag alone reloads nothing.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if let Some(oid) = shared::take_discovery() {
            known.rediscover(oid);
        }
        // The sweeps that ended since the last wake (a sweeper's exit sets
        // this latch): what they found.
        for ended in sweeps.finished() {
            let findings = ended.findings;
            known.record(
                ended.oid,
                findings.verdict,
                findings.next_due_ms,
                findings.vacuumed,
            );
            if ended.again {
                known.look_after(ended.oid, Duration::ZERO);
            }
        }
        if !settings::REAPER_ENABLED.get() {
            continue;
        }
        // Between full passes only churning databases are due; the other
        // databases' touches stay set until the next full pass takes them.
        let touched = if known.full_pass_due() {
            known.touches_taken_at = Some(Instant::now());
            shared::take_touched()
        } else {
            [0; shared::TOUCH_WORDS]
        };
        let hot = shared::take_hot();
        let woken = shared::take_woken();
        // An idle pass costs nothing, not even a look at pg_database.
        if !known.worth_a_pass(&touched, &hot, &woken) {
            continue;
        }
        let mut listed = databases();
        known.listed(&listed);
        // Longest unlooked-at first: when sweep slots are scarce (every
        // worker slot taken, the reserve sweeping one database at a time),
        // a database that is due every pass must not keep the others out.
        listed.sort_by_key(|(oid, _)| known.last_look(*oid));
        for (oid, name) in listed {
            let hot = shared::touched(&hot, oid);
            // An explicit wake counts as a touch, at most once a DUE_GAP.
            let woken = shared::touched(&woken, oid);
            let touched =
                shared::touched(&touched, oid) || (woken && known.looked_before(oid, DUE_GAP));
            if sweeps.running(oid) {
                // Its sweep may have started before what asked: once more
                // when it ends.
                if touched || woken || hot {
                    sweeps.again(oid);
                }
            } else if known.due(oid, touched, hot) {
                // Not started: it stays due (a touch is kept as a due
                // time), and an ending sweep wakes the launcher.
                if sweeps.start(oid, &name, known.vacuumed(oid)).is_err() && touched {
                    known.look_after(oid, Duration::ZERO);
                }
            } else if woken {
                // Looked at too recently: the wake is kept as a due time.
                known.look_after(oid, DUE_GAP);
            } else if hot {
                known.look_after(oid, settings::vacuum_interval());
            }
        }
    }
    // SIGTERM. Exit code 1 makes the postmaster restart the launcher after
    // pg_terminate_backend; during a server shutdown it restarts nothing.
    unsafe { pg_sys::proc_exit(1) };
}

/// What the launcher knows about each database: whether pg_lease is
/// installed there, when that was last looked at, and when it next has work.
#[derive(Default)]
struct Known {
    databases: HashMap<pg_sys::Oid, Knowledge>,
    /// When pg_database was last listed.
    listed_at: Option<Instant>,
    /// When the last full pass took the touched databases.
    touches_taken_at: Option<Instant>,
}

struct Knowledge {
    installed: bool,
    checked_at: Instant,
    /// When the reaper next has work there (a lease expiry or a purge);
    /// `None`: nothing until a claim or cancel touches the database.
    due_at: Option<Instant>,
    /// Until then the database is looked at every pass even if pg_lease was
    /// absent: an install asked for it, and its transaction may not have
    /// committed at the first look.
    eager_until: Option<Instant>,
    /// Where its `lease.job` was last vacuumed (the default: never).
    vacuumed: Mark,
    /// When a sweeper last vacuumed its `lease.job`.
    vacuumed_at: Option<Instant>,
}

impl Known {
    /// Whether database `oid` should get a sweeper this pass. One with
    /// pg_lease: when its work is due, when a transaction there may have
    /// created work since the last pass (`touched`), when a sweep failed,
    /// or, at most every `lease.vacuum_interval`, when it is churning
    /// ([`Knowledge::churning`]) or its claims made it `hot`.
    /// One without: when never looked at, when an install asked, or when
    /// the last look is older than `lease.discovery_interval` (which also
    /// bounds how long an idle database goes unswept).
    fn due(&self, oid: pg_sys::Oid, touched: bool, hot: bool) -> bool {
        let now = Instant::now();
        match self.databases.get(&oid) {
            None => true,
            Some(k) if k.installed => {
                touched
                    || ((hot || k.churning()) && k.quick_wait().is_zero())
                    || k.due_at.is_some_and(|t| now >= t)
                    || k.checked_at.elapsed() >= settings::discovery_interval()
            }
            Some(k) => {
                k.eager_until.is_some_and(|t| now < t)
                    || k.checked_at.elapsed() >= settings::discovery_interval()
            }
        }
    }

    /// Records what a sweeper found. One that failed before it could tell
    /// leaves what was known and is tried again next pass.
    fn record(
        &mut self,
        oid: pg_sys::Oid,
        verdict: Option<Verdict>,
        next_due_ms: Option<u64>,
        vacuumed: Option<Mark>,
    ) {
        let now = Instant::now();
        let entry = self
            .databases
            .entry(oid)
            .or_insert_with(|| Knowledge::unknown(None));
        entry.checked_at = now;
        if let Some(mark) = vacuumed {
            entry.vacuumed = mark;
            entry.vacuumed_at = Some(now);
        }
        match verdict {
            Some(verdict) => {
                entry.installed = verdict == Verdict::Installed;
                entry.due_at = next_due_ms.map(instant_of);
            }
            None => entry.due_at = Some(now),
        }
    }

    /// Makes `oid` due `gap` after its last look, if it is not due sooner.
    fn look_after(&mut self, oid: pg_sys::Oid, gap: Duration) {
        if let Some(k) = self.databases.get_mut(&oid).filter(|k| k.installed) {
            let then = k.checked_at + gap;
            k.due_at = Some(k.due_at.map_or(then, |t| t.min(then)));
        }
    }

    /// When `oid` was last looked at (`None`: never).
    fn last_look(&self, oid: pg_sys::Oid) -> Option<Instant> {
        self.databases.get(&oid).map(|k| k.checked_at)
    }

    /// Whether `oid` was last looked at `gap` ago or longer (or never).
    fn looked_before(&self, oid: pg_sys::Oid, gap: Duration) -> bool {
        self.databases
            .get(&oid)
            .is_none_or(|k| k.checked_at.elapsed() >= gap)
    }

    fn rediscover(&mut self, oid: pg_sys::Oid) {
        self.databases
            .insert(oid, Knowledge::unknown(Some(Instant::now() + EAGER_LOOK)));
    }

    /// How long to wait before the next pass: until the first churning
    /// database's next look or the first time a database has work due (a
    /// schedule's next occurrence, a lease's expiry), if sooner than
    /// `lease.sweep_interval`. Waking at the due time, not at the next
    /// interval, is what makes a schedule's occurrences punctual.
    fn pause(&self) -> Duration {
        let now = Instant::now();
        let churning = self
            .databases
            .values()
            .filter(|k| k.churning())
            .map(Knowledge::quick_wait);
        // A due time already passed is a sweep that failed or is about to
        // run: the next pass takes it, so it must not shorten the wait. Nor
        // is a database looked at again within DUE_GAP of the last look,
        // however close its due times lie.
        let due = self
            .databases
            .values()
            .filter(|k| k.installed)
            .filter_map(|k| k.due_at.map(|t| t.max(k.checked_at + DUE_GAP)))
            .filter(|t| *t > now)
            .map(|t| t - now);
        // An install not seen yet (the first look may come before its
        // transaction commits) is looked at again every EAGER_GAP while it
        // is eager: nothing else need wake the launcher before the next pass.
        let eager = self
            .databases
            .values()
            .filter(|k| !k.installed && k.eager_until.is_some_and(|t| t > now))
            .map(|k| (k.checked_at + EAGER_GAP).saturating_duration_since(now));
        let quick = churning.chain(due).chain(eager).min();
        let interval = settings::sweep_interval();
        // At least a millisecond: a shorter wait rounds down to none, and a
        // look due in under a millisecond is not due yet.
        quick.map_or(interval, |wait| {
            interval.min(wait.max(Duration::from_millis(1)))
        })
    }

    /// Whether this pass is a full one: `lease.sweep_interval` has passed
    /// since the last took the touched databases.
    fn full_pass_due(&self) -> bool {
        self.touches_taken_at
            .is_none_or(|t| t.elapsed() >= settings::sweep_interval())
    }

    /// Where `oid`'s `lease.job` was last vacuumed.
    fn vacuumed(&self, oid: pg_sys::Oid) -> Mark {
        self.databases
            .get(&oid)
            .map_or_else(Mark::default, |k| k.vacuumed)
    }

    /// Whether this pass may have something to do: the first pass, a
    /// touch anywhere (it may come from a database not seen yet, e.g. one
    /// created from a template that has pg_lease), a known database due, or
    /// a periodic look due. A hot database counts as touched here.
    fn worth_a_pass(&self, touched: &[u64], hot: &[u64], woken: &[u64]) -> bool {
        let periodic = self
            .listed_at
            .is_none_or(|t| t.elapsed() >= settings::discovery_interval());
        periodic
            || touched
                .iter()
                .chain(hot)
                .chain(woken)
                .any(|word| *word != 0)
            || self
                .databases
                .keys()
                .any(|oid| self.due(*oid, false, false))
    }

    /// Takes a fresh list of databases, forgetting those that were dropped.
    fn listed(&mut self, listed: &[(pg_sys::Oid, String)]) {
        self.listed_at = Some(Instant::now());
        self.databases
            .retain(|oid, _| listed.iter().any(|(o, _)| o == oid));
    }
}

impl Knowledge {
    /// A database just seen, or asked about by an install.
    fn unknown(eager_until: Option<Instant>) -> Self {
        Knowledge {
            installed: false,
            checked_at: Instant::now(),
            due_at: None,
            eager_until,
            vacuumed: Mark::default(),
            vacuumed_at: None,
        }
    }

    /// Whether its `lease.job` was vacuumed within the last
    /// `lease.sweep_interval`: the sign of a queue turning over faster than
    /// the sweep interval can keep clean.
    fn churning(&self) -> bool {
        self.vacuumed_at
            .is_some_and(|t| t.elapsed() < settings::sweep_interval())
    }

    /// How long until it may be looked at again for churn or heat: a
    /// `lease.vacuum_interval` after the last look.
    fn quick_wait(&self) -> Duration {
        settings::vacuum_interval().saturating_sub(self.checked_at.elapsed())
    }
}

/// The monotonic instant of a wall-clock time in ms since the Unix epoch
/// (the database clock is this machine's clock).
fn instant_of(ms: u64) -> Instant {
    let target = UNIX_EPOCH + Duration::from_millis(ms);
    let now = Instant::now();
    match target.duration_since(SystemTime::now()) {
        Ok(ahead) => now + ahead,
        Err(_) => now,
    }
}

/// The least time between two looks at a database for its due work.
const DUE_GAP: Duration = Duration::from_millis(100);

/// How long after `CREATE EXTENSION` its database is looked at every pass.
const EAGER_LOOK: Duration = Duration::from_secs(10);

/// How often, in that time, a database whose install is not seen yet is
/// looked at: at most 50 sweepers for an install that rolls back.
const EAGER_GAP: Duration = Duration::from_millis(200);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::*;

    /// `CREATE EXTENSION` asks for a look from inside its transaction, so
    /// the first look may find no pg_lease. Failed before: the launcher
    /// then waited a whole `lease.sweep_interval` (30 s in the reaper_vacuum
    /// suite, which failed now and then), unless a stray latch wake-up (a
    /// sinval catch-up after the install's commit) came first.
    #[pg_test]
    fn an_install_not_seen_yet_is_looked_at_again_soon() {
        let oid = pg_sys::Oid::from(4242);
        let mut known = Known::default();
        known.rediscover(oid);
        known.record(oid, Some(Verdict::Absent), None, None);
        assert!(known.pause() <= EAGER_GAP, "{:?}", known.pause());
        // Once the eager time is over, the sweep interval again.
        if let Some(k) = known.databases.get_mut(&oid) {
            k.eager_until = Some(Instant::now());
        }
        assert_eq!(known.pause(), settings::sweep_interval());
    }
}

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
