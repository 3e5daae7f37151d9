//! Bounded transactions for the reaper's background workers.
//!
//! Every step a background worker takes must end in bounded time, whatever
//! a database's owner, a tenant or a stuck session does. `lock_timeout` is
//! read by the lock manager, so setting it bounds lock waits in a worker as
//! in any session. `statement_timeout` is not: only the client protocol's
//! loop arms its timer (postgres.c, at the start of each statement), and SPI
//! in a background worker never does, so `SET statement_timeout` there
//! bounds nothing. So [`transaction`] arms the same timer itself around the
//! transaction's work: when it fires, PostgreSQL cancels what runs with
//! "canceling statement due to statement timeout" (57014), as it would for
//! a client.

use std::ffi::CString;
use std::time::Duration;

use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;

/// How long one transaction of a background worker may take, and wait for
/// one lock.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Armed as the statement timeout over the whole transaction.
    pub statement: Duration,
    /// `lock_timeout` for the transaction.
    pub lock: Duration,
}

/// `STATEMENT_TIMEOUT` of `utils/timeout.h`'s `TimeoutId` (the same in
/// PostgreSQL 15 to 18), which pgrx's bindings leave out.
const STATEMENT_TIMEOUT: std::ffi::c_int = 3;

unsafe extern "C-unwind" {
    fn enable_timeout_after(id: std::ffi::c_int, delay_ms: std::ffi::c_int);
    fn disable_timeout(id: std::ffi::c_int, keep_indicator: bool);
}

/// Runs `work` in a transaction of this background worker, under `limits`.
/// An error inside (a timeout among them) ends the worker, as any error
/// does, after PostgreSQL rolled the transaction back.
pub fn transaction<R>(
    limits: Limits,
    work: impl FnOnce() -> R + std::panic::UnwindSafe + std::panic::RefUnwindSafe,
) -> R {
    BackgroundWorker::transaction(move || {
        set_local("lock_timeout", limits.lock);
        let ms =
            std::ffi::c_int::try_from(limits.statement.as_millis()).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: the timer PostgreSQL registers for every backend,
        // background workers included (InitPostgres).
        unsafe { enable_timeout_after(STATEMENT_TIMEOUT, ms.max(1)) };
        let result = work();
        unsafe { disable_timeout(STATEMENT_TIMEOUT, false) };
        result
    })
}

/// Sets `name` to `value` (in milliseconds) for the current transaction.
fn set_local(name: &str, value: Duration) {
    let (Ok(name), Ok(value)) = (
        CString::new(name),
        CString::new(format!("{}ms", value.as_millis())),
    ) else {
        return;
    };
    // SAFETY: a SET LOCAL of a setting every role may set.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}
