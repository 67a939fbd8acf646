//! Evaluating a plan node's expressions in its executor, as PostgreSQL's own nodes do.

use super::memcx::in_context;
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;

/// Evaluates `expr` in `econtext`, allocating in its per-tuple memory (C's
/// `ExecEvalExprSwitchContext`, an inline function the bindings lack); None for NULL.
///
/// # Safety
/// `expr` was initialized (`ExecInitExpr`) for the plan node whose expression context is
/// `econtext`.
pub unsafe fn eval(
    expr: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
) -> Option<pg_sys::Datum> {
    // SAFETY: the caller's promise: an initialized expression has its evaluation function.
    let evalfunc = unsafe { (*expr).evalfunc }.expect("an initialized expression has a function");
    let mut isnull = false;
    // SAFETY: the per-tuple memory of a valid expression context lives until the node resets it.
    let memory = unsafe { (*econtext).ecxt_per_tuple_memory };
    // SAFETY: the expression's own function, on its state and context (the caller's promise);
    // the boundary turns an ERROR it raises into a Rust panic, as for any call into C.
    let value = unsafe {
        in_context(memory, || {
            pg_guard_ffi_boundary(|| evalfunc(expr, econtext, &mut isnull))
        })
    };
    (!isnull).then_some(value)
}

/// True if the conditions `qual` hold for `slot` (as the scan tuple of `econtext`); the
/// per-tuple memory they used is freed afterwards.
///
/// # Safety
/// `qual` was initialized (`ExecInitQual`, not null) for the plan node whose expression
/// context is `econtext`, and `slot` holds a row of the type its Vars read.
pub unsafe fn qual_holds(
    qual: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
    slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    // SAFETY: the caller's promise; the slot is the row the conditions are checked on.
    unsafe {
        (*econtext).ecxt_scantuple = slot;
        let holds = pg_sys::ExecQual(qual, econtext);
        pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
        holds
    }
}
