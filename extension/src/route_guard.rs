//! Refuses a call of a function that a distributed install forwards
//! (`lease.distribute()`, sql/citus.sql) when the argument that routes it is
//! NULL, before Citus plans the call.
//!
//! Citus finds the node for a forwarded call by hashing that argument as it
//! plans the statement, and a NULL there is dereferenced: the backend dies
//! with signal 11 and the postmaster restarts the node, the coordinator
//! included. Any role that may call the function could do that, and
//! `lease.renew(id, owner, epoch, ttl)` does it by leaving out its queue, whose
//! default is NULL. This hook runs before Citus's planner (Citus must be the
//! first library in `shared_preload_libraries`) and answers 22004 instead.

use std::ffi::{c_char, c_int, CStr};

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgList;

/// The functions `lease.distribute()` forwards and the argument that routes
/// each (its `create_distributed_function` list).
const ROUTED: &[(&str, &str)] = &[
    ("create_queue", "name"),
    ("enqueue", "queue"),
    ("enqueue_batch", "queue"),
    ("claim_pending", "queue"),
    ("reclaim_own", "queue"),
    ("release_and_claim", "queue"),
    ("ready_channel", "queue"),
    ("renew", "queue"),
    ("renew_batch", "queue"),
    ("release", "queue"),
    ("release_batch", "queue"),
    ("fenced_update", "queue"),
    ("cancel", "queue"),
    ("cancel_key", "queue"),
];

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

/// Installs the hook; called once from `_PG_init` while preloading.
pub fn init() {
    // SAFETY: _PG_init runs once, in the postmaster, before any backend.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(plan);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the planner hands a valid Query and its parameters.
    unsafe {
        if let Some(call) = forwardable_call(parse) {
            refuse_null_route(call, bound_params);
        }
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// The call in a statement of the one shape Citus forwards: `SELECT f(...)`
/// or `SELECT ... FROM f(...)`, nothing else in it.
unsafe fn forwardable_call(parse: *mut pg_sys::Query) -> Option<*mut pg_sys::FuncExpr> {
    // SAFETY: the caller passes a valid Query.
    unsafe {
        let query = &*parse;
        if query.commandType != pg_sys::CmdType::CMD_SELECT || query.jointree.is_null() {
            return None;
        }
        let from = PgList::<pg_sys::Node>::from_pg((*query.jointree).fromlist);
        if from.len() == 1 {
            let reference = from.get_ptr(0)?;
            if !is_a(reference, pg_sys::NodeTag::T_RangeTblRef) {
                return None;
            }
            let index = (*reference.cast::<pg_sys::RangeTblRef>()).rtindex;
            let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg(query.rtable);
            let entry = rtable.get_ptr(usize::try_from(index).ok()?.checked_sub(1)?)?;
            if (*entry).rtekind != pg_sys::RTEKind::RTE_FUNCTION {
                return None;
            }
            let functions = PgList::<pg_sys::RangeTblFunction>::from_pg((*entry).functions);
            let expr = (*functions.get_ptr(0)?).funcexpr;
            return is_a(expr, pg_sys::NodeTag::T_FuncExpr).then(|| expr.cast());
        }
        let targets = PgList::<pg_sys::TargetEntry>::from_pg(query.targetList);
        if !from.is_empty() || targets.len() != 1 {
            return None;
        }
        let expr = (*targets.get_ptr(0)?).expr.cast::<pg_sys::Node>();
        is_a(expr, pg_sys::NodeTag::T_FuncExpr).then(|| expr.cast())
    }
}

/// Raises 22004 if `call` is of a forwarded function of pg_lease, in a
/// database with Citus, and its routing argument is NULL: written so,
/// left to a NULL default, or a parameter bound to NULL.
unsafe fn refuse_null_route(call: *mut pg_sys::FuncExpr, params: pg_sys::ParamListInfo) {
    // SAFETY: the caller passes a FuncExpr of the Query being planned; the
    // syscache tuple is released before anything can raise.
    unsafe {
        // Where Citus is not, one syscache lookup and done: this runs for
        // every statement of that shape, claims included.
        if !citus_here() {
            return;
        }
        let oid = (*call).funcid;
        let Some((function, argument)) = routed(oid) else {
            return;
        };
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as c_int,
            pg_sys::Datum::from(oid),
        );
        if tuple.is_null() {
            return;
        }
        let index = argument_index(tuple, argument);
        let args =
            pg_sys::expand_function_arguments((*call).args, false, (*call).funcresulttype, tuple);
        pg_sys::ReleaseSysCache(tuple);
        let Some(value) = index.and_then(|i| PgList::<pg_sys::Node>::from_pg(args).get_ptr(i))
        else {
            return;
        };
        if is_null(pg_sys::strip_implicit_coercions(value), params) {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("lease.{function}: {argument} must not be NULL where Citus is installed"),
                "On a distributed install it names the node the call goes to."
            );
        }
    }
}

/// The name and routing argument of `oid` if it is one of [`ROUTED`] in
/// schema `lease`.
unsafe fn routed(oid: pg_sys::Oid) -> Option<(&'static str, &'static str)> {
    // SAFETY: lsyscache lookups of a function that exists (it was just
    // resolved by the parser); both return palloc'd copies or NULL.
    unsafe {
        let schema = pg_sys::get_namespace_name(pg_sys::get_func_namespace(oid));
        if schema.is_null() || CStr::from_ptr(schema).to_bytes() != b"lease" {
            return None;
        }
        let name = pg_sys::get_func_name(oid);
        if name.is_null() {
            return None;
        }
        let name = CStr::from_ptr(name).to_str().ok()?;
        ROUTED.iter().copied().find(|(f, _)| *f == name)
    }
}

/// Whether this database has Citus (its catalog `pg_dist_partition`).
unsafe fn citus_here() -> bool {
    // SAFETY: a syscache lookup by name.
    unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE),
        ) != pg_sys::InvalidOid
    }
}

/// The position of the argument named `name` in the pg_proc `tuple`.
unsafe fn argument_index(tuple: pg_sys::HeapTuple, name: &str) -> Option<usize> {
    // SAFETY: get_func_arg_info reads a valid pg_proc tuple and fills the
    // out pointers with palloc'd arrays (names NULL when none are named).
    unsafe {
        let mut types = std::ptr::null_mut();
        let mut names: *mut *mut c_char = std::ptr::null_mut();
        let mut modes = std::ptr::null_mut();
        let count = pg_sys::get_func_arg_info(tuple, &mut types, &mut names, &mut modes);
        if names.is_null() {
            return None;
        }
        (0..usize::try_from(count).ok()?).find(|&i| {
            let n = *names.add(i);
            !n.is_null() && CStr::from_ptr(n).to_bytes() == name.as_bytes()
        })
    }
}

/// Whether `value` is a NULL constant or an external parameter bound to
/// NULL. Anything else (an expression, a parameter not yet bound) is left
/// to Citus, which forwards only constants.
unsafe fn is_null(value: *mut pg_sys::Node, params: pg_sys::ParamListInfo) -> bool {
    // SAFETY: `value` is a node of the Query; `params` is NULL or the
    // statement's bound parameters, whose array holds numParams entries.
    unsafe {
        if is_a(value, pg_sys::NodeTag::T_Const) {
            return (*value.cast::<pg_sys::Const>()).constisnull;
        }
        if !is_a(value, pg_sys::NodeTag::T_Param) || params.is_null() {
            return false;
        }
        let param = &*value.cast::<pg_sys::Param>();
        if param.paramkind != pg_sys::ParamKind::PARAM_EXTERN || (*params).paramFetch.is_some() {
            return false;
        }
        let Some(slot) = usize::try_from(param.paramid)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .filter(|&i| i < usize::try_from((*params).numParams).unwrap_or(0))
        else {
            return false;
        };
        (*(*params).params.as_ptr().add(slot)).isnull
    }
}

/// `IsA(node, tag)`, NULL-safe.
unsafe fn is_a(node: *mut pg_sys::Node, tag: pg_sys::NodeTag) -> bool {
    // SAFETY: a non-NULL Node pointer from the Query.
    unsafe { !node.is_null() && (*node).type_ == tag }
}
