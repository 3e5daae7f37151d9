//! Cron expressions for `lease.schedule` (sql/schedule.sql): the one part
//! of scheduling SQL cannot do. Parsing and the next-occurrence search are
//! the `croner` crate's (POSIX/Vixie cron, an optional seconds field, `L`,
//! `W`, `#`); times are UTC.

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

fn parse(spec: &str) -> Result<Cron, String> {
    // croner would read a seventh field as a year; the reference promises
    // five or six.
    let fields = spec.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!("{fields} fields"));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(spec)
        .map_err(|e| e.to_string())
}

/// Seconds since the Unix epoch as a UTC time.
fn utc(secs: f64) -> Result<DateTime<Utc>, String> {
    let whole = secs.floor();
    let nanos = ((secs - whole) * 1e9) as u32;
    DateTime::<Utc>::from_timestamp(whole as i64, nanos)
        .ok_or_else(|| format!("time {secs} is out of range"))
}

fn epoch(t: DateTime<Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

/// The first occurrence of `spec` strictly after `after`, as seconds since
/// the Unix epoch; `None` if it never fires again.
fn next_after(spec: &str, after: f64) -> Result<Option<f64>, String> {
    let from = utc(after)?;
    Ok(parse(spec)?
        .find_next_occurrence(&from, false)
        .ok()
        .map(epoch))
}

/// The last occurrence of `spec` at or before `at`; `None` if none.
fn last_at(spec: &str, at: f64) -> Result<Option<f64>, String> {
    let from = utc(at)?;
    Ok(parse(spec)?
        .find_previous_occurrence(&from, true)
        .ok()
        .map(epoch))
}

fn or_raise(spec: &str, result: Result<Option<f64>, String>) -> Option<f64> {
    match result {
        Ok(t) => t,
        Err(why) => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid cron expression \"{spec}\": {why}"),
                "Five fields (minute hour day-of-month month day-of-week), or six with seconds first; times are UTC."
            );
        }
    }
}

/// `lease._cron_next(spec, after)`: see the COMMENT below.
#[pg_extern(immutable, parallel_safe, name = "_cron_next")]
fn cron_next(spec: &str, after: f64) -> Option<f64> {
    or_raise(spec, next_after(spec, after))
}

/// `lease._cron_last(spec, at)`: see the COMMENT below.
#[pg_extern(immutable, parallel_safe, name = "_cron_last")]
fn cron_last(spec: &str, at: f64) -> Option<f64> {
    or_raise(spec, last_at(spec, at))
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._cron_next(text, double precision) IS
$$Internal (lease.schedule): the first time strictly after AFTER (Unix epoch seconds, UTC) that the cron
expression SPEC fires, as epoch seconds; NULL if it never fires again. Five fields, or six with seconds
first. Errors: 22023 SPEC is not a cron expression.$$;

COMMENT ON FUNCTION lease._cron_last(text, double precision) IS
$$Internal (lease.schedule): the last time at or before AT (Unix epoch seconds, UTC) that the cron
expression SPEC fires, as epoch seconds; NULL if none. Errors: 22023 SPEC is not a cron expression.$$;
"#,
    name = "cron_comments",
    requires = [cron_next, cron_last],
);
