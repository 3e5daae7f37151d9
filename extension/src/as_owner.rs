//! Locking the rows of an attached table, as the table's owner.
//!
//! `lease.fence` locks an attached row's table row before its lease row
//! (the lock order of every writer of the table, sql/fence.sql), and it runs
//! as the extension owner. Reading a table can run its owner's code: a
//! table turned into a view, row security policies, and what the planner
//! evaluates while it plans the read (an immutable function of no column in
//! an index predicate, say). So the read never runs as the extension owner:
//! it runs as the table's owner, in a security-restricted operation whose
//! settings are undone when it returns, the sandbox PostgreSQL itself puts
//! around a table owner's code in other sessions (`VACUUM`, `REFRESH
//! MATERIALIZED VIEW`, `CREATE INDEX`). There the owner's code has the
//! owner's rights, may not `SET ROLE`, create temporary objects, `LISTEN` or
//! keep cursors, and whatever it sets (a `search_path`, with `set_config`)
//! is gone before the next statement of `fence` or of the caller's session.
//! The relation must still be a table when it is read: its kind is checked
//! under the lock the read takes, so that it cannot become a view between
//! the check and the read.
//!
//! An error inside unwinds through here without restoring anything: the
//! (sub)transaction's abort restores the user and undoes the settings, as
//! for PostgreSQL's own callers of the same sandbox.

use std::ffi::CStr;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{function_name, PgLogLevel, PgSqlErrorCode};

/// The key types `lease.attach` accepts, with the name of each in
/// `pg_catalog` (for a cast that nothing of the owner's can shadow).
const KEY_TYPES: [(pg_sys::Oid, &str); 6] = [
    (pg_sys::INT8OID, "int8"),
    (pg_sys::INT4OID, "int4"),
    (pg_sys::INT2OID, "int2"),
    (pg_sys::UUIDOID, "uuid"),
    (pg_sys::TEXTOID, "text"),
    (pg_sys::VARCHAROID, "varchar"),
];

/// Locks the rows of table `rel` whose column `key_column` holds one of
/// `keys`, `FOR NO KEY UPDATE` in key order, as the table's owner (see the
/// module's docs), and returns the keys of the rows it locked. The table
/// stays locked (`ROW SHARE`) until the transaction ends.
#[pg_extern(volatile, parallel_unsafe, name = "_lock_table_rows")]
fn lock_table_rows(rel: pg_sys::Oid, key_column: &str, keys: Vec<Option<String>>) -> Vec<String> {
    let target = Target::open(rel, key_column);
    let locked = as_owner(target.owner, || {
        Spi::connect_mut(|client| {
            client
                .update(&target.lock_sql, None, &[keys.into()])?
                .first()
                .get_one::<Vec<Option<String>>>()
        })
    });
    match locked {
        Ok(keys) => keys.unwrap_or_default().into_iter().flatten().collect(),
        Err(e) => error!("pg_lease: could not lock rows of an attached table: {e}"),
    }
}

/// What reading the table needs, found under its lock.
struct Target {
    owner: pg_sys::Oid,
    lock_sql: String,
}

impl Target {
    /// Locks `rel` (`ROW SHARE`, until the transaction ends: what the read
    /// takes anyway, and enough to keep it from becoming a view) and checks
    /// that it is a table with a key column `key_column` of a type attach
    /// accepts; raises 55000 otherwise.
    fn open(rel: pg_sys::Oid, key_column: &str) -> Target {
        // SAFETY: relation_open raises an ERROR for an oid that is no
        // relation; the relation is closed below, keeping its lock.
        unsafe {
            let relation = pg_sys::relation_open(rel, pg_sys::RowShareLock as pg_sys::LOCKMODE);
            let form = &*(*relation).rd_rel;
            let kind = form.relkind as u8;
            let owner = form.relowner;
            let schema = name_of(pg_sys::get_namespace_name(form.relnamespace));
            let table = name_of(form.relname.data.as_ptr());
            let key_type = key_type(relation, key_column);
            pg_sys::relation_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
            if kind != pg_sys::RELKIND_RELATION && kind != pg_sys::RELKIND_PARTITIONED_TABLE {
                not_ready(format!("relation {schema}.{table} is no longer a table"));
            }
            let Some(key_type) = key_type else {
                not_ready(format!(
                    "column \"{key_column}\" of {schema}.{table} is gone or no longer of a key type attach accepts"
                ));
            };
            let column = quoted(key_column);
            Target {
                owner,
                lock_sql: format!(
                    "SELECT pg_catalog.array_agg(l.k)
                       FROM (SELECT t.{column}::pg_catalog.text AS k
                               FROM {}.{} t
                              WHERE t.{column} OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.{key_type}[])
                              ORDER BY t.{column}
                                FOR NO KEY UPDATE OF t) l",
                    quoted(&schema),
                    quoted(&table),
                ),
            }
        }
    }
}

/// The `pg_catalog` name of the type of column `column` of `relation`, if
/// it exists and has a type attach accepts.
///
/// # Safety
/// `relation` must be open.
unsafe fn key_type(relation: pg_sys::Relation, column: &str) -> Option<&'static str> {
    // SAFETY: the open relation's descriptor, not freed by this wrapper.
    let desc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked((*relation).rd_att) };
    let attribute = desc
        .iter()
        .find(|a| !a.attisdropped && name_of(a.attname.data.as_ptr()) == column)?;
    KEY_TYPES
        .iter()
        .find(|(oid, _)| *oid == attribute.atttypid)
        .map(|(_, name)| *name)
}

/// Runs `f` as `owner` in a security-restricted operation with
/// `search_path = pg_catalog, pg_temp`, and undoes every setting it made.
fn as_owner<R>(owner: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: the calls PostgreSQL's own sandbox makes (ExecRefreshMatView),
    // in the same order; an error inside is cleaned up by the abort.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            context
                | (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION)
                    as i32,
        );
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let result = f();
        pg_sys::AtEOXact_GUC(false, nest);
        pg_sys::SetUserIdAndSecContext(user, context);
        result
    }
}

/// Raises 55000 with `message`.
fn not_ready(message: String) -> ! {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        message,
        function_name!(),
    )
    .set_hint("Only a table, plain or partitioned, can stay attached: detach it.")
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}

/// A NUL-terminated name as a Rust string (lossy: names are UTF-8 in a
/// UTF-8 database, and only compared and quoted here).
fn name_of(name: *const std::ffi::c_char) -> String {
    if name.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated catalog name.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// `name` quoted as an identifier when it needs to be.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._lock_table_rows(oid, text, text[]) IS
$$Internal (lease.fence): locks the rows of table REL whose KEY_COLUMN is among KEYS, FOR NO KEY UPDATE in
key order, as the table's owner in a security-restricted operation whose settings are undone, and returns
the keys it locked; raises 55000 if REL is no longer a table or its key column is gone or retyped.$$;
"#,
    name = "lock_table_rows_comment",
    requires = [lock_table_rows],
);
