//! The pending predicate of an attached table, printed for a trigger's WHEN
//! clause.
//!
//! Users write the predicate over bare column names (`status = 'SCHEDULED'`);
//! a row trigger's WHEN clause must name `NEW.status` or `OLD.status`. The
//! predicate is never rewritten as text: `lease.attach` has PostgreSQL parse
//! it (as the caller, into a temporary view over the table), and this
//! function prints that parse tree back with every column of the table
//! qualified by the alias asked for. That does not depend on how a server
//! version prints view definitions (PostgreSQL 16 stopped qualifying the
//! columns of single-table views), and string literals are left alone.

use std::ffi::{CStr, CString};

use pgrx::prelude::*;
use pgrx::PgList;

/// The expression of the first column of view `view`, with the columns of
/// `table` qualified by `alias`.
#[pg_extern(stable, parallel_safe, name = "_qualified_predicate")]
fn qualified_predicate(view: pg_sys::Oid, table: pg_sys::Oid, alias: &str) -> String {
    let Ok(alias) = CString::new(alias) else {
        error!("alias must not contain a NUL byte");
    };
    unsafe {
        let rel = pg_sys::relation_open(view, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        if (*(*rel).rd_rel).relkind != pg_sys::RELKIND_VIEW as std::ffi::c_char {
            pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                "not a view"
            );
        }
        // A copy: the rewriter changes Var numbers in place, and the
        // relation cache owns the view's query.
        let query =
            pg_sys::copyObjectImpl(pg_sys::get_view_query(rel).cast()).cast::<pg_sys::Query>();
        pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);

        let Some(varno) = range_table_index(query, table) else {
            error!("the view does not read the attached table");
        };
        let targets = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList);
        let Some(first) = targets.get_ptr(0) else {
            error!("the view has no column");
        };
        let expr = (*first).expr.cast::<pg_sys::Node>();
        // deparse_context_for makes a one-entry range table: the table is 1.
        pg_sys::ChangeVarNodes(expr, varno, 1, 0);
        let context = pg_sys::deparse_context_for(alias.as_ptr(), table);
        let printed = pg_sys::deparse_expression(expr, context, true, false);
        CStr::from_ptr(printed).to_string_lossy().into_owned()
    }
}

/// The 1-based position of `table` in the range table of `query`.
unsafe fn range_table_index(query: *mut pg_sys::Query, table: pg_sys::Oid) -> Option<i32> {
    let rtable = unsafe { PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable) };
    let position = rtable
        .iter_ptr()
        .position(|rte| unsafe { (*rte).relid } == table);
    position.and_then(|i| i32::try_from(i + 1).ok())
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._qualified_predicate(oid, oid, text) IS
$$Internal: the expression of the first column of VIEW, printed with every column of TABLE qualified by
ALIAS (lease.attach turns a predicate into trigger WHEN clauses with it). Errors: 42809 not a view.$$;
"#,
    name = "qualified_predicate_comment",
    requires = [qualified_predicate],
);
