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
//! Owner operations also require `epoch >= floor`: a lease issued on an
//! earlier timeline is lost on the new one, and the reaper recovers it.

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
