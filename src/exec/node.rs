//! The callbacks PostgreSQL calls on every custom scan node, written once for both of gsnap's
//! nodes: the node itself (a [`ScanNode`]) says how to start, how to produce the next row,
//! and what to drop on a rescan.

use super::ScanTable;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;

/// One of gsnap's executor nodes.
pub(super) trait ScanNode: Sized {
    /// Executor start, after the table checks: prepare slots and expressions.
    ///
    /// # Safety
    /// `css` is this node's state being initialized, `estate` its executor state.
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> Self;

    /// Stores the next row in `slot`; false at the end.
    ///
    /// # Safety
    /// `css` is this node's state, `slot` its scan slot.
    unsafe fn next_row(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool;

    /// Drops the open reader (releasing its pins): a rescan opens it again.
    fn reset(&mut self);

    /// The table the node reads.
    fn table(&mut self) -> &mut ScanTable;
}

/// PostgreSQL's scan state, then the node.
#[repr(C)]
pub(super) struct NodeState<N> {
    css: pg_sys::CustomScanState,
    node: *mut N,
}

/// A zeroed state with the node tag and `methods` set.
///
/// # Safety
/// In the executor's memory context.
pub(super) unsafe fn create_state<N: ScanNode>(
    methods: &'static pg_sys::CustomExecMethods,
) -> *mut pg_sys::Node {
    // SAFETY: a zeroed allocation of the state's size (a null node pointer).
    unsafe {
        let s = pg_sys::palloc0(std::mem::size_of::<NodeState<N>>()).cast::<NodeState<N>>();
        (*s).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        (*s).css.methods = methods;
        s.cast()
    }
}

/// The node of `css`, if it has one (not under EXPLAIN without ANALYZE, not after its end).
///
/// # Safety
/// `css` is a `NodeState<N>`.
unsafe fn node<'a, N>(css: *mut pg_sys::CustomScanState) -> Option<&'a mut N> {
    // SAFETY: the caller's promise; the node is ours until end or drop_after_error.
    unsafe { (*css.cast::<NodeState<N>>()).node.as_mut() }
}

/// Takes the node out of its state (so it is freed once).
///
/// # Safety
/// `state` is a `NodeState<N>`.
unsafe fn take_node<N>(state: *mut NodeState<N>) -> Option<Box<N>> {
    // SAFETY: the caller's promise; the pointer came from Box::into_raw.
    unsafe {
        let node = std::mem::replace(&mut (*state).node, std::ptr::null_mut());
        (!node.is_null()).then(|| Box::from_raw(node))
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn begin<N: ScanNode>(
    css: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
) {
    if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
        return;
    }
    // SAFETY: our state, created by create_state, at the end of its initialization; the
    // callback frees the node if the executor never reaches its end.
    unsafe {
        let table = ScanTable::begin(css);
        let node = N::begin(css, estate, table);
        let state = css.cast::<NodeState<N>>();
        (*state).node = Box::into_raw(Box::new(node));
        let cb = pg_sys::MemoryContextAlloc(
            (*estate).es_query_cxt,
            std::mem::size_of::<pg_sys::MemoryContextCallback>(),
        )
        .cast::<pg_sys::MemoryContextCallback>();
        (*cb).func = Some(drop_after_error::<N>);
        (*cb).arg = state.cast();
        pg_sys::MemoryContextRegisterResetCallback((*estate).es_query_cxt, cb);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn access_next<N: ScanNode>(
    ss: *mut pg_sys::ScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: called by ExecScan for our node.
    unsafe {
        let slot = (*ss).ss_ScanTupleSlot;
        let more = match node::<N>(ss.cast()) {
            Some(node) => node.next_row(ss.cast(), slot),
            None => false,
        };
        if more {
            slot
        } else {
            pg_sys::ExecClearTuple(slot)
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn recheck(
    _ss: *mut pg_sys::ScanState,
    _slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    true
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn exec<N: ScanNode>(
    css: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor's node.
    unsafe { pg_sys::ExecScan(&mut (*css).ss, Some(access_next::<N>), Some(recheck)) }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn end<N: ScanNode>(css: *mut pg_sys::CustomScanState) {
    // SAFETY: our node, taken out of the state so the query-end callback finds nothing.
    if let Some(mut node) = unsafe { take_node::<N>(css.cast()) } {
        node.reset(); // unpins
        node.table().end();
    }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn rescan<N: ScanNode>(css: *mut pg_sys::CustomScanState) {
    // SAFETY: our node: the next fetch opens the reader again, re-evaluating the snapshot
    // arguments (a parameter may have changed).
    if let Some(node) = unsafe { node::<N>(css) } {
        node.reset();
    }
}

/// Frees a node whose executor never reached its end (an ERROR): runs when the query's
/// memory context goes, releasing the reader's pins; the transaction's abort releases the
/// relation.
unsafe extern "C-unwind" fn drop_after_error<N: ScanNode>(arg: *mut c_void) {
    // SAFETY: `arg` is the state registered in `begin`.
    if let Some(mut node) = unsafe { take_node::<N>(arg.cast()) } {
        node.table().abandon();
    }
}
