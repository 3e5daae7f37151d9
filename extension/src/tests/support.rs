//! What every `#[pg_test]` file uses: SPI one-liners that fail the test
//! with the statement on any error.

use pgrx::prelude::*;

/// Runs statements, failing the test on any error.
pub(super) fn run(sql: &str) {
    Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Evaluates a boolean SQL expression (a whole SELECT).
pub(super) fn check(sql: &str) -> bool {
    Spi::get_one::<bool>(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: NULL"))
}

pub(super) fn int(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: NULL"))
}

pub(super) fn text(sql: &str) -> Option<String> {
    Spi::get_one::<String>(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The SQLSTATE that `sql` fails with ('00000' if it succeeds). The
/// statement runs in a subtransaction that is rolled back either way.
pub(super) fn sqlstate(sql: &str) -> String {
    if !check("SELECT to_regprocedure('pg_temp.sqlstate_of(text)') IS NOT NULL") {
        run("CREATE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text
             LANGUAGE plpgsql AS $$
             BEGIN EXECUTE q; RETURN '00000';
             EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$");
    }
    let quoted = sql.replace('\'', "''");
    text(&format!("SELECT pg_temp.sqlstate_of('{quoted}')")).expect("a SQLSTATE")
}

/// Claims one row of `queue` for `owner` and returns `(id, epoch)`.
pub(super) fn claim_one(owner: &str, ttl: &str, queue: &str) -> (i64, i64) {
    let row = Spi::get_two::<i64, i64>(&format!(
        "SELECT id, epoch FROM lease.claim_pending(1, '{ttl}', '{owner}', '{queue}')"
    ))
    .expect("claim");
    (row.0.expect("a claimed row"), row.1.expect("an epoch"))
}
