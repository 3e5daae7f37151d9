//! The sweeper's vacuum of `lease.job`.
//!
//! Why the reaper vacuums at all: autovacuum visits a database at most once
//! per `autovacuum_naptime` (a minute by default, and a server-wide
//! setting), and a busy queue turns its rows over many times in that minute.
//! Each job leaves two dead row versions (its claim and its completion), so
//! 10k jobs/s left ~1.2M of them between two autovacuum visits and the table
//! grew a hundredfold; per-table autovacuum settings cannot shorten the
//! naptime (docs/performance.md, "Health"). The sweeper already visits every
//! busy database every `lease.sweep_interval`, so it vacuums `lease.job`
//! when its dead rows outnumber its live ones by `lease.vacuum_dead_rows`,
//! and the launcher comes back every `lease.vacuum_interval` while it does
//! ([`crate::launcher`]). The dead rows are read from the statistics and
//! from the queues' own counters, which do not lag ([`due`]).
//!
//! A snapshot held somewhere (a long report, a replica's feedback) keeps
//! dead rows from being removed, and vacuuming again would find them still
//! there. So the sweeper remembers the removal horizon (the oldest
//! transaction whose snapshots still count) it vacuumed at, and vacuums
//! again only once the horizon has moved: until then no row that died
//! since can be removed either. A first version waited instead for twice
//! the dead rows the last vacuum left; under churn that counted the rows
//! dying during the vacuum, and vacuums fell several seconds apart.
//!
//! `VACUUM` cannot run inside a transaction block or a function, hence not
//! through SPI; the sweeper runs it as a top-level command, the way
//! autovacuum calls it (`ExecVacuum` with its own portal memory context).
//! It runs no user code: `lease.job`'s indexes and their predicates are the
//! extension's own, `VACUUM` fires no triggers, and it switches to the
//! table owner's role (restricted) for whatever index code it calls.

use std::ptr;

use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgList;

use crate::settings;

/// The statement run. `SKIP_LOCKED`: never wait for another vacuum of the
/// table (autovacuum's, an operator's); `INDEX_CLEANUP ON`: dead index
/// entries at the head of `job_ready` are what claims walk, so they must go
/// even when autovacuum would judge them too few to bother; `TRUNCATE
/// false`: cutting empty pages off the file's end takes an exclusive lock
/// that a busy queue never lets go of, and `VACUUM` asks for it for up to
/// five seconds. Under churn that wait was 4.4–5.2 s of every ~5 s pass,
/// while dead rows piled up behind it. The table's `vacuum_truncate =
/// false` keeps autovacuum from trying too (sql/schema.sql).
const VACUUM: &std::ffi::CStr = c"VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false) lease.job";

/// Where the last vacuum of a database's `lease.job` ran, which the
/// launcher keeps between sweepers to decide the next one ([`due`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The removal horizon it ran at (0: none ran).
    pub horizon: u32,
    /// Rows the queues' counters (`lease.counter`) had moved out of a state
    /// by then: claimed, done, retried, died or cancelled.
    pub moved: i64,
}

impl Mark {
    /// The form a sweeper gets it in (its `extra`).
    pub fn encode(self) -> String {
        format!("{} {}", self.horizon, self.moved)
    }

    /// The inverse of [`Mark::encode`]; no mark (the default) if garbled.
    pub fn decode(text: &str) -> Mark {
        let mut parts = text.split(' ');
        let horizon = parts.next().and_then(|p| p.parse().ok());
        let moved = parts.next().and_then(|p| p.parse().ok());
        match (horizon, moved) {
            (Some(horizon), Some(moved)) => Mark { horizon, moved },
            _ => Mark::default(),
        }
    }
}

/// Whether `lease.job` is due a vacuum: its dead rows exceed its live rows
/// by `lease.vacuum_dead_rows`, and the removal horizon is not the one the
/// last vacuum ran at (`before`). Dead rows are counted two ways, and
/// either may decide: by the statistics, and by the rows the counters saw
/// change state since `before` (each leaves a dead version). Under churn
/// the statistics lag by seconds: a backend sends them at most once a
/// second and skips a send when another holds the table's entry, and in a
/// 30k jobs/s run they showed 2–4k dead rows for three seconds in a row.
/// The counters are committed with the changes they count. Returns the mark
/// to vacuum at. Runs in a transaction of its own, with the search_path
/// pinned like every sweeper statement.
pub fn due(before: Mark) -> Option<Mark> {
    let threshold = settings::VACUUM_DEAD_ROWS.get();
    if threshold == 0 {
        return None;
    }
    let decided = BackgroundWorker::transaction(|| {
        let Some(now) = Spi::connect_mut(counts)? else {
            return Ok(None);
        };
        let over = |rows: i64| rows >= now.live.saturating_add(i64::from(threshold));
        // Fewer than at the mark: a queue was dropped with its counters, so
        // count from zero rather than wait for the old total to come back.
        let since = if now.moved < before.moved {
            now.moved
        } else {
            now.moved - before.moved
        };
        let piled_up = now.dead.is_some_and(over) || over(since);
        Ok::<_, pgrx::spi::Error>(piled_up.then(|| Mark {
            horizon: horizon(now.table),
            moved: now.moved,
        }))
    });
    match decided {
        Ok(mark) => mark.filter(|m| m.horizon != before.horizon),
        Err(e) => {
            warning!("pg_lease sweeper: could not read lease.job's statistics: {e}");
            None
        }
    }
}

/// What [`due`] decides on.
struct Counts {
    /// `lease.job`'s oid.
    table: pg_sys::Oid,
    /// Its dead rows, as the statistics have them.
    dead: Option<i64>,
    /// Its live rows, as the statistics have them.
    live: i64,
    /// [`Mark::moved`] now; 0 without `lease.counter`.
    moved: i64,
}

/// Reads [`Counts`]; `None` if `lease.job`'s statistics are missing.
fn counts(client: &mut SpiClient<'_>) -> Result<Option<Counts>, pgrx::spi::Error> {
    client.update("SET LOCAL search_path = pg_catalog, pg_temp", None, &[])?;
    if distributed(client)? {
        return Ok(None);
    }
    let row = client
        .select(
            "SELECT pg_catalog.pg_stat_get_dead_tuples(c.oid), pg_catalog.pg_stat_get_live_tuples(c.oid),
                    c.oid, pg_catalog.to_regclass('lease.counter') IS NOT NULL
               FROM pg_catalog.pg_class c
              WHERE c.oid OPERATOR(pg_catalog.=) 'lease.job'::pg_catalog.regclass",
            None,
            &[],
        )?
        .first();
    let (dead, live, table) = row.get_three::<i64, i64, pg_sys::Oid>()?;
    let (Some(live), Some(table)) = (live, table) else {
        return Ok(None);
    };
    // lease.counter came with 0.2.0; without it, the statistics decide.
    // Reading it as the bootstrap superuser runs nobody's code: only a
    // superuser can install pg_lease (not trusted), so its schema and this
    // plain table are theirs.
    let moved = if row.get::<bool>(4)? == Some(true) {
        client
            .select(
                "SELECT pg_catalog.sum(claimed OPERATOR(pg_catalog.+) done OPERATOR(pg_catalog.+) retried
                                       OPERATOR(pg_catalog.+) died OPERATOR(pg_catalog.+) cancelled)::pg_catalog.int8
                   FROM lease.counter",
                None,
                &[],
            )?
            .first()
            .get_one::<i64>()?
    } else {
        None
    };
    Ok(Some(Counts {
        table,
        dead,
        live,
        moved: moved.unwrap_or(0),
    }))
}

/// Whether `lease.job` is a Citus distributed table (sql/citus.sql). Its
/// rows then live in shards, which autovacuum looks after on each node;
/// here it is an empty shell, and a read of `lease.counter` would ask
/// every node, over connections to each of them, on every sweep.
fn distributed(client: &mut SpiClient<'_>) -> Result<bool, pgrx::spi::Error> {
    let citus = client
        .select(
            "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL",
            None,
            &[],
        )?
        .first()
        .get_one::<bool>()?;
    if citus != Some(true) {
        return Ok(false);
    }
    // Named only once Citus is known to be here: its catalog is resolved
    // when the statement is parsed.
    Ok(client
        .select(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                             WHERE logicalrelid OPERATOR(pg_catalog.=) 'lease.job'::pg_catalog.regclass)",
            None,
            &[],
        )?
        .first()
        .get_one::<bool>()?
        == Some(true))
}

/// The oldest transaction id whose effects a vacuum of `table` must keep
/// (what `VACUUM` itself computes). Call inside a transaction.
fn horizon(table: pg_sys::Oid) -> u32 {
    // SAFETY: inside a transaction; the relation exists (the caller just
    // resolved it) and is closed again before returning.
    unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let relation = pg_sys::relation_open(table, lock);
        let horizon = pg_sys::GetOldestNonRemovableTransactionId(relation);
        pg_sys::relation_close(relation, lock);
        horizon.into_inner()
    }
}

/// Vacuums `lease.job`. Call outside any transaction. An error inside
/// `VACUUM` ends the sweeper process, after its sweep was done and
/// reported.
pub fn run() {
    // SAFETY: called by a sweeper between transactions, as autovacuum
    // calls vacuum(): the parse tree and ExecVacuum's cross-transaction
    // state live in a context of our own (ExecVacuum commits the
    // transaction it was called in and starts its own per table).
    unsafe {
        pg_sys::StartTransactionCommand();
        let context = pg_sys::AllocSetContextCreateExtended(
            pg_sys::TopMemoryContext,
            c"pg_lease vacuum".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        pg_sys::PortalContext = context;
        // Not switched back: ExecVacuum leaves us in the transaction it
        // started last, in that transaction's context.
        pg_sys::CurrentMemoryContext = context;
        let parsed = PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
            VACUUM.as_ptr(),
            pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
        ));
        let statement = parsed.head().map_or(ptr::null_mut(), |raw| {
            (*raw).stmt.cast::<pg_sys::VacuumStmt>()
        });
        if !statement.is_null() {
            let state = pg_sys::make_parsestate(ptr::null_mut());
            pg_sys::ExecVacuum(state, statement, true);
        }
        pg_sys::CommitTransactionCommand();
        pg_sys::PortalContext = ptr::null_mut();
        pg_sys::MemoryContextDelete(context);
    }
}
