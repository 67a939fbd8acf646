//! The callbacks PostgreSQL calls on every custom scan node, written once for both of gsnap's
//! nodes, and their methods table and state: the node itself (a [`ScanNode`]) says how to
//! start, how to produce the next row, and what to drop on a rescan.

use super::ScanTable;
use crate::ffi::memcx::on_reset;
use crate::ffi::node::palloc_node;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;

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

// A state is plain data PostgreSQL keeps in its memory (never dropped); the node is freed by
// `end` or `drop_after_error`.
impl<N> Clone for NodeState<N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N> Copy for NodeState<N> {}

/// The methods table of node `N` (it must live for the process: each state points to it).
pub(super) struct ExecMethods<N>(pg_sys::CustomExecMethods, PhantomData<fn() -> N>);

// SAFETY: immutable, built at compile time; only a C string pointer to a static and
// function pointers.
unsafe impl<N> Sync for ExecMethods<N> {}

/// The EXPLAIN callback of a node that shows more than PostgreSQL's own lines.
pub(super) type ExplainFn = unsafe extern "C-unwind" fn(
    *mut pg_sys::CustomScanState,
    *mut pg_sys::List,
    *mut pg_sys::ExplainState,
);

/// EXPLAIN's "Partitions Read" line of a scan of a partitioned table, once it has run:
/// `read` of `all` partitions, `where_` ("at the snapshot", "over the range").
///
/// # Safety
/// `es` is the EXPLAIN in progress.
pub(super) unsafe fn explain_partitions(
    es: *mut pg_sys::ExplainState,
    partitions: Option<(usize, usize)>,
    where_: &str,
) {
    if let Some((all, read)) = partitions {
        let text = std::ffi::CString::new(format!("{read} of {all} {where_}")).unwrap_or_default();
        // SAFETY: the caller's promise; a label and a C string EXPLAIN copies.
        unsafe { pg_sys::ExplainPropertyText(c"Partitions Read".as_ptr(), text.as_ptr(), es) };
    }
}

/// The methods of node `N`, shown as `name` in EXPLAIN, with its `explain` callback if any.
pub(super) const fn methods<N: ScanNode>(
    name: &'static CStr,
    explain: Option<ExplainFn>,
) -> ExecMethods<N> {
    ExecMethods(
        pg_sys::CustomExecMethods {
            CustomName: name.as_ptr(),
            BeginCustomScan: Some(begin::<N>),
            ExecCustomScan: Some(exec::<N>),
            EndCustomScan: Some(end::<N>),
            ReScanCustomScan: Some(rescan::<N>),
            MarkPosCustomScan: None,
            RestrPosCustomScan: None,
            EstimateDSMCustomScan: None,
            InitializeDSMCustomScan: None,
            ReInitializeDSMCustomScan: None,
            InitializeWorkerCustomScan: None,
            ShutdownCustomScan: None,
            ExplainCustomScan: explain,
        },
        PhantomData,
    )
}

/// The callbacks of a node that can run in a parallel plan as a parallel-aware scan:
/// the size of its shared state, its initialization by the leader (again before a rescan),
/// and a worker's attachment to it.
pub(super) struct ParallelMethods {
    pub estimate: unsafe extern "C-unwind" fn(
        *mut pg_sys::CustomScanState,
        *mut pg_sys::ParallelContext,
    ) -> pg_sys::Size,
    pub initialize: unsafe extern "C-unwind" fn(
        *mut pg_sys::CustomScanState,
        *mut pg_sys::ParallelContext,
        *mut c_void,
    ),
    pub attach: unsafe extern "C-unwind" fn(
        *mut pg_sys::CustomScanState,
        *mut pg_sys::shm_toc,
        *mut c_void,
    ),
}

/// Writes a parallel scan's shared state `shared` at `coordinate` (the leader, in
/// `initialize`) and returns it.
///
/// # Safety
/// `coordinate` is the node's share of the parallel query's dynamic shared memory, of the
/// size its `estimate` asked for (`size_of::<S>()`), suitably aligned (shm_toc allocations
/// are MAXALIGNed); it lives until the parallel query ends, after the node stops reading.
pub(super) unsafe fn place_shared<S>(coordinate: *mut c_void, shared: S) -> &'static S {
    let at = coordinate.cast::<S>();
    // SAFETY: the caller's promise.
    unsafe {
        at.write(shared);
        &*at
    }
}

/// The shared state the leader placed at `coordinate` ([`place_shared`]), as a worker sees it
/// (in `attach`).
///
/// # Safety
/// `coordinate` is what `initialize` was given, initialized by [`place_shared`]; it lives
/// until the parallel query ends.
pub(super) unsafe fn shared_at<S>(coordinate: *mut c_void) -> &'static S {
    // SAFETY: the caller's promise.
    unsafe { &*coordinate.cast::<S>() }
}

impl<N> ExecMethods<N> {
    /// These methods with `parallel`'s callbacks: the leader initializes the shared state
    /// before the first scan and before each rescan.
    pub(super) const fn parallel(mut self, parallel: ParallelMethods) -> ExecMethods<N> {
        self.0.EstimateDSMCustomScan = Some(parallel.estimate);
        self.0.InitializeDSMCustomScan = Some(parallel.initialize);
        self.0.ReInitializeDSMCustomScan = Some(parallel.initialize);
        self.0.InitializeWorkerCustomScan = Some(parallel.attach);
        self
    }
}

/// A new state of node `N` (in the current memory context, the executor's): PostgreSQL's
/// scan state, zeroed but for its tag and methods, then no node yet.
pub(super) fn create_state<N: ScanNode>(methods: &'static ExecMethods<N>) -> *mut pg_sys::Node {
    let mut css = pg_sys::CustomScanState {
        methods: &methods.0,
        ..Default::default()
    };
    css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
    palloc_node(NodeState::<N> {
        css,
        node: std::ptr::null_mut(),
    })
    .cast()
}

/// The plan node of `css`.
///
/// # Safety
/// `css` is the state of one of gsnap's nodes (whose plan is a CustomScan), initialized at
/// least as far as its plan; the plan outlives `'a`.
pub(super) unsafe fn plan_of<'a>(css: *mut pg_sys::CustomScanState) -> &'a pg_sys::CustomScan {
    // SAFETY: the caller's promise.
    unsafe { &*(*css).ss.ps.plan.cast::<pg_sys::CustomScan>() }
}

/// The node of `css`, if it has one (not under EXPLAIN without ANALYZE, not after its end).
///
/// # Safety
/// `css` is a `NodeState<N>`.
unsafe fn node<'a, N>(css: *mut pg_sys::CustomScanState) -> Option<&'a mut N> {
    // SAFETY: the caller's promise; the node is ours until end or drop_after_error.
    unsafe { (*css.cast::<NodeState<N>>()).node.as_mut() }
}

/// The node of `css` (see [`node`]), for a node's EXPLAIN callback.
///
/// # Safety
/// `css` is a `NodeState<N>`.
pub(super) unsafe fn node_of<'a, N>(css: *mut pg_sys::CustomScanState) -> Option<&'a mut N> {
    // SAFETY: the caller's promise.
    unsafe { node(css) }
}

/// Takes the node out of its state (so it is freed once).
///
/// # Safety
/// `state` is a `NodeState<N>`.
unsafe fn take_node<N>(state: *mut NodeState<N>) -> Option<Box<N>> {
    // SAFETY: the caller's promise.
    let node = unsafe { std::mem::replace(&mut (*state).node, std::ptr::null_mut()) };
    // SAFETY: a non-null node pointer came from Box::into_raw in `begin`, and was just taken
    // out of the state, so it is freed once.
    (!node.is_null()).then(|| unsafe { Box::from_raw(node) })
}

#[pg_guard]
unsafe extern "C-unwind" fn begin<N: ScanNode>(
    css: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
) {
    if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
        return;
    }
    // SAFETY: PostgreSQL begins our node: `css` is a state made by create_state, initialized
    // but for what the node adds.
    let table = unsafe { ScanTable::begin(css) };
    // SAFETY: as above; `estate` is the node's executor state.
    let node = unsafe { N::begin(css, estate, table) };
    let state = css.cast::<NodeState<N>>();
    // SAFETY: our state (create_state made it a NodeState<N>), whose node is still null.
    unsafe { (*state).node = Box::into_raw(Box::new(node)) };
    // SAFETY: the query's memory context outlives the state, which it holds: the callback
    // frees the node if the executor never reaches its end.
    unsafe { on_reset((*estate).es_query_cxt, drop_after_error::<N>, state.cast()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn access_next<N: ScanNode>(
    ss: *mut pg_sys::ScanState,
) -> *mut pg_sys::TupleTableSlot {
    let css = ss.cast::<pg_sys::CustomScanState>();
    // SAFETY: ExecScan calls this with our node's scan state, whose scan slot is set.
    let slot = unsafe { (*ss).ss_ScanTupleSlot };
    // SAFETY: our state: a ScanState is the start of a CustomScanState, itself the start of
    // a NodeState<N>.
    let node = unsafe { node::<N>(css) };
    // SAFETY: the node of this state, and the state's scan slot.
    let more = node.is_some_and(|node| unsafe { node.next_row(css, slot) });
    if more {
        slot
    } else {
        // SAFETY: the node's own slot, emptied to say there are no more rows.
        unsafe { pg_sys::ExecClearTuple(slot) }
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
unsafe extern "C-unwind" fn exec<N: ScanNode>(
    css: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor runs our node: ExecScan fetches through its access method and
    // checks the plan's conditions.
    unsafe { pg_sys::ExecScan(&mut (*css).ss, Some(access_next::<N>), Some(recheck)) }
}

#[pg_guard]
unsafe extern "C-unwind" fn end<N: ScanNode>(css: *mut pg_sys::CustomScanState) {
    // SAFETY: our node, taken out of the state so the query-end callback finds nothing.
    if let Some(mut node) = unsafe { take_node::<N>(css.cast()) } {
        node.reset(); // unpins
        node.table().end();
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn rescan<N: ScanNode>(css: *mut pg_sys::CustomScanState) {
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
