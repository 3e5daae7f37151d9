//! Failover-safe fencing epochs.
//!
//! A plain per-row counter is not enough once PostgreSQL runs with a
//! streaming standby: with asynchronous replication the last claims before a
//! primary dies can be lost, the promoted standby still has the older epoch
//! for those rows, and its next claim would hand out an epoch that a zombie
//! replica already holds from the dead primary.
//!
//! So every epoch has a floor taken from the WAL timeline, which a promotion
//! always increases: `floor = timeline << 40`. Claims, expiries and named
//! leases issue `greatest(previous + 1, floor)`, so everything issued on
//! timeline `t` lies in `[t << 40, (t + 1) << 40)` (a row would need 2^40
//! claims to leave it) and everything issued after a promotion is greater
//! than anything the old primary could have issued, replicated or not.
//!
//! Owner operations need nothing more: they match the row's exact
//! `(id, owner, epoch)` and its `lease_until` by the database clock. A lease
//! whose claim reached the standby is still its owner's after a promotion
//! (with synchronous replication no acknowledged claim, renewal or release
//! is lost). A lease lost with the old primary matches no row on the new
//! one. And a lease that the old primary let expire and handed on before
//! dying is refused too: its replicated `lease_until` lies before that
//! takeover, hence in the past (this assumes the two servers' clocks agree
//! to well within a ttl).

use pgrx::prelude::*;

/// Bits below the timeline in an epoch.
const TIMELINE_SHIFT: u32 = 40;

/// The smallest epoch this server may issue: its WAL timeline shifted left
/// by 40 bits.
#[pg_extern(stable, parallel_safe)]
fn epoch_floor() -> i64 {
    let timeline = unsafe {
        if pg_sys::RecoveryInProgress() {
            // A standby issues nothing (it is read-only); report the
            // timeline it replays so that the function still answers.
            let mut replayed: pg_sys::TimeLineID = 0;
            pg_sys::GetXLogReplayRecPtr(&mut replayed);
            replayed
        } else {
            pg_sys::GetWALInsertionTimeLine()
        }
    };
    i64::from(timeline) << TIMELINE_SHIFT
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease.epoch_floor() IS
$$The smallest fencing epoch this server may issue: its WAL timeline << 40. A promotion raises the
timeline, so epochs issued after it exceed every epoch the old primary issued, and leases issued on an
earlier timeline count as lost.$$;
"#,
    name = "epoch_floor_comment",
    requires = [epoch_floor],
);
