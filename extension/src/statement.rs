//! Whether the running statement is its transaction's only one.
//!
//! A claim may move its queue's head up (sql/head.sql), which locks the
//! queue row until the transaction ends and holds producers off until then.
//! That is a millisecond for a statement that is its own transaction, and
//! arbitrarily long inside `BEGIN … COMMIT`, where the client may do its work
//! before committing: only the former raises.

use pgrx::prelude::*;

/// True unless the running statement is inside a transaction block
/// (`BEGIN … COMMIT`, or several statements sent in one query string).
#[pg_extern(volatile, parallel_safe, name = "_own_transaction")]
fn own_transaction() -> bool {
    // SAFETY: reads the backend's transaction state; any backend may.
    !unsafe { pg_sys::IsTransactionBlock() }
}

pgrx::extension_sql!(
    r#"
COMMENT ON FUNCTION lease._own_transaction() IS
$$Internal: whether the running statement is a transaction of its own (not inside BEGIN ... COMMIT or a
multi-statement query string), so that a lock it takes is held only until it ends.$$;
"#,
    name = "own_transaction_comment",
    requires = [own_transaction],
);
