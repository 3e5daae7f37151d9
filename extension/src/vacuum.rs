//! The sweeper's vacuum of `lease.job`.
//!
//! Why the reaper vacuums at all: autovacuum visits a database at most once
//! per `autovacuum_naptime` (a minute by default, and a server-wide
//! setting), and a busy queue turns its rows over many times in that minute.
//! Each job leaves two dead row versions (its claim and its completion), so
//! 10k jobs/s left ~1.2M of them between two autovacuum visits and the table
//! grew a hundredfold; per-table autovacuum settings cannot shorten the
//! naptime (benches/README.md, "Health"). The sweeper already visits every
//! busy database every `lease.sweep_interval`, so it vacuums `lease.job`
//! when its dead rows outnumber its live ones by `lease.vacuum_dead_rows`.
//!
//! A snapshot held somewhere (a long report, a replica's feedback) keeps
//! dead rows from being removed, and vacuuming again would find them still
//! there: after a vacuum that left `r` dead rows, the next waits until there
//! are `2r`, so a pinned snapshot costs a number of vacuums that grows with
//! the logarithm of the rows it pins, not one per pass.
//!
//! `VACUUM` cannot run inside a transaction block or a function, hence not
//! through SPI; the sweeper runs it as a top-level command, the way
//! autovacuum calls it (`ExecVacuum` with its own portal memory context).
//! It runs no user code: `lease.job`'s indexes and their predicates are the
//! extension's own, and `VACUUM` fires no triggers.

use std::ptr;

use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use pgrx::PgList;

use crate::settings;

/// The statement run. `SKIP_LOCKED`: never wait for another vacuum of the
/// table (autovacuum's, an operator's); `INDEX_CLEANUP ON`: dead index
/// entries at the head of `job_ready` are what claims walk, so they must go
/// even when autovacuum would judge them too few to bother.
const VACUUM: &std::ffi::CStr = c"VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) lease.job";

/// Whether `lease.job` is due a vacuum: its dead rows exceed its live rows
/// by `lease.vacuum_dead_rows`, and are at least twice what the previous
/// vacuum left (`left_before`). Runs in a transaction of its own, with the
/// search_path pinned like every sweeper statement.
pub fn due(left_before: u64) -> bool {
    let threshold = settings::VACUUM_DEAD_ROWS.get();
    if threshold == 0 {
        return false;
    }
    let left_before = i64::try_from(left_before).unwrap_or(i64::MAX);
    let decided = BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            client.update("SET LOCAL search_path = pg_catalog, pg_temp", None, &[])?;
            client
                .select(
                    // GREATEST is a construct, not a function: it resolves
                    // no name.
                    "SELECT dead OPERATOR(pg_catalog.>=) GREATEST(
                                live OPERATOR(pg_catalog.+) $1,
                                $2 OPERATOR(pg_catalog.*) 2)
                       FROM (SELECT pg_catalog.pg_stat_get_dead_tuples(c.oid) AS dead,
                                    pg_catalog.pg_stat_get_live_tuples(c.oid) AS live
                               FROM pg_catalog.pg_class c
                              WHERE c.oid OPERATOR(pg_catalog.=) 'lease.job'::pg_catalog.regclass) s",
                    None,
                    &[i64::from(threshold).into(), left_before.into()],
                )?
                .first()
                .get_one::<bool>()
        })
    });
    match decided {
        Ok(due) => due == Some(true),
        Err(e) => {
            warning!("pg_lease sweeper: could not read lease.job's statistics: {e}");
            false
        }
    }
}

/// Vacuums `lease.job` and returns how many dead rows it could not remove
/// (those a snapshot still sees). Call outside any transaction. An error
/// inside `VACUUM` ends the sweeper process, after its sweep was done and
/// reported.
pub fn run() -> u64 {
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
    left_after()
}

/// Dead rows of `lease.job` as the vacuum just reported them (0 if unknown).
fn left_after() -> u64 {
    let left = BackgroundWorker::transaction(|| {
        Spi::get_one::<i64>(
            "SELECT pg_catalog.pg_stat_get_dead_tuples('lease.job'::pg_catalog.regclass)",
        )
    });
    left.ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}
