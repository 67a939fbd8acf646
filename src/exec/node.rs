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
        // SAFETY: the caller's promise.
        unsafe { explain_property(es, "Partitions Read", &format!("{read} of {all} {where_}")) };
    }
}

/// EXPLAIN's "Key Lookup" line of a scan whose conditions fix the table's key (`keys`, of
/// table `relid`), and once it has run, its "Key Map" line: what the map said (`used`), and
/// `read` (what the scan read through it).
///
/// # Safety
/// `es` is the EXPLAIN in progress; in its transaction.
pub(super) unsafe fn explain_key_map(
    es: *mut pg_sys::ExplainState,
    keys: &crate::keymap::KeyConditions,
    relid: pg_sys::Oid,
    used: Option<crate::read::asof::KeyMapUse>,
    read: Option<String>,
) {
    use crate::read::asof::KeyMapUse;
    // SAFETY: the caller's promise.
    unsafe { explain_property(es, "Key Lookup", &keys.column_names(relid)) };
    let text = match (used, read) {
        (None, _) => return, // not run (EXPLAIN without ANALYZE)
        (Some(KeyMapUse::Pages(n)), Some(read)) => format!("{n} candidate blocks, {read}"),
        (Some(KeyMapUse::Pages(n)), None) => format!("{n} candidate blocks"),
        (Some(KeyMapUse::NoMap), _) => "none at this snapshot: every page read".to_string(),
        (Some(KeyMapUse::Later(s)), _) => format!("starts at snapshot {s}: every page read"),
        (Some(KeyMapUse::TooMany), _) => "too many keys or pages: every page read".to_string(),
        (
            Some(KeyMapUse::Partitions {
                mapped: 0, whole, ..
            }),
            _,
        ) => format!("none covers it in the {whole} partitions: every page read"),
        (
            Some(KeyMapUse::Partitions {
                candidates,
                mapped,
                whole: 0,
            }),
            read,
        ) => {
            let text = format!("{candidates} candidate blocks in {mapped} partitions");
            read.map_or(text.clone(), |read| format!("{text}, {read}"))
        }
        (
            Some(KeyMapUse::Partitions {
                candidates,
                mapped,
                whole,
            }),
            _,
        ) => format!(
            "{candidates} candidate blocks in {mapped} partitions, every page read in {whole} \
             more (no map of theirs covers it)"
        ),
    };
    // SAFETY: the caller's promise.
    unsafe { explain_property(es, "Key Map", &text) };
}

/// One line (text property) of EXPLAIN.
///
/// # Safety
/// `es` is the EXPLAIN in progress.
pub(super) unsafe fn explain_property(es: *mut pg_sys::ExplainState, label: &str, text: &str) {
    let label = std::ffi::CString::new(label).unwrap_or_default();
    let text = std::ffi::CString::new(text).unwrap_or_default();
    // SAFETY: the caller's promise; C strings EXPLAIN copies.
    unsafe { pg_sys::ExplainPropertyText(label.as_ptr(), text.as_ptr(), es) };
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

/// A node that can run in a parallel plan as a parallel-aware scan: the leader resolves what
/// the participants share (before the first scan and before each rescan) into `Shared`,
/// placed in the parallel query's dynamic shared memory; every participant reads from it.
pub(super) trait ParallelNode: ScanNode {
    /// The participants' shared state (plain data and atomics: it lives in shared memory).
    type Shared: 'static;

    /// The leader: the shared state for the next scan (its parameters are set by now).
    ///
    /// # Safety
    /// `css` is this node's state.
    unsafe fn share(&mut self, css: *mut pg_sys::CustomScanState) -> Self::Shared;

    /// Reads from now on as a participant of the scan `shared` describes (the leader after
    /// [`ParallelNode::share`], each worker when it attaches): drops an open reader.
    fn join(&mut self, shared: &'static Self::Shared);
}

impl<N: ParallelNode> ExecMethods<N> {
    /// These methods with the callbacks of a parallel-aware scan.
    pub(super) const fn parallel(mut self) -> ExecMethods<N> {
        self.0.EstimateDSMCustomScan = Some(estimate_shared::<N>);
        self.0.InitializeDSMCustomScan = Some(initialize_shared::<N>);
        self.0.ReInitializeDSMCustomScan = Some(initialize_shared::<N>);
        self.0.InitializeWorkerCustomScan = Some(attach_shared::<N>);
        self
    }
}

/// The size of a parallel scan's shared state.
#[pg_guard]
unsafe extern "C-unwind" fn estimate_shared<N: ParallelNode>(
    _css: *mut pg_sys::CustomScanState,
    _pcxt: *mut pg_sys::ParallelContext,
) -> pg_sys::Size {
    std::mem::size_of::<N::Shared>()
}

/// The leader, before the scan and before each rescan: places the node's shared state in its
/// share of the parallel query's shared memory.
#[pg_guard]
unsafe extern "C-unwind" fn initialize_shared<N: ParallelNode>(
    css: *mut pg_sys::CustomScanState,
    _pcxt: *mut pg_sys::ParallelContext,
    coordinate: *mut c_void,
) {
    // SAFETY: PostgreSQL passes our begun node's state (not under EXPLAIN without ANALYZE:
    // nothing runs then).
    let Some(scan) = (unsafe { node_of::<N>(css) }) else {
        return;
    };
    // SAFETY: our node.
    let shared = unsafe { scan.share(css) };
    let at = coordinate.cast::<N::Shared>();
    // SAFETY: `coordinate` is the node's share of the parallel query's shared memory, of the
    // size estimate_shared asked for, suitably aligned (shm_toc allocations are MAXALIGNed);
    // it lives until the parallel query ends, after the node stops reading.
    let shared: &'static N::Shared = unsafe {
        at.write(shared);
        &*at
    };
    scan.join(shared);
}

/// A worker: reads from the leader's shared state.
#[pg_guard]
unsafe extern "C-unwind" fn attach_shared<N: ParallelNode>(
    css: *mut pg_sys::CustomScanState,
    _toc: *mut pg_sys::shm_toc,
    coordinate: *mut c_void,
) {
    // SAFETY: PostgreSQL passes our begun node's state.
    if let Some(scan) = unsafe { node_of::<N>(css) } {
        // SAFETY: the shared state the leader placed there (initialize_shared), which lives
        // until the parallel query ends.
        scan.join(unsafe { &*coordinate.cast::<N::Shared>() });
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
    // SAFETY: ExecScan calls this with our node's scan state.
    unsafe { next_into_slot::<N>(ss) }
}

/// The next row of our node `ss` in its scan slot, or the slot emptied at the end.
///
/// # Safety
/// `ss` is the scan state of a `NodeState<N>`, initialized (its scan slot set); call under a
/// guard (`exec` or `access_next`).
unsafe fn next_into_slot<N: ScanNode>(ss: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    let css = ss.cast::<pg_sys::CustomScanState>();
    // SAFETY: the caller's promise: the scan slot is set.
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

/// Runs the node for one row. A node without conditions, outside an EvalPlanQual recheck,
/// whose rows need no projection or are projected to no columns (`count(*)`), fetches here,
/// as ExecScan's shortcut for the first case does (reset the per-row memory, check for
/// interrupts, fetch): one guarded call per row instead of a guarded call into ExecScan, the
/// guarded callback from it and a projection evaluated per row. Anything else goes through
/// ExecScan.
#[pg_guard]
unsafe extern "C-unwind" fn exec<N: ScanNode>(
    css: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor runs our initialized node: its plan, plan state, expression
    // context, executor state and (if it projects) projection are set.
    unsafe {
        let ss = &raw mut (*css).ss;
        let ps = &(*ss).ps;
        let projection = ps.ps_ProjInfo;
        let plain = ps.qual.is_null() && (*ps.state).es_epq_active.is_null();
        if plain && (projection.is_null() || (*ps.plan).targetlist.is_null()) {
            let per_row = (*ps.ps_ExprContext).ecxt_per_tuple_memory;
            if !(*per_row).isReset {
                pg_sys::MemoryContextReset(per_row);
            }
            pgrx::check_for_interrupts!();
            let slot = next_into_slot::<N>(ss);
            if projection.is_null() {
                return slot;
            }
            // Projected to no columns: the projection's result is an empty row, stored once
            // (what ExecProject stores for every row), emptied at the end.
            let result = (*projection).pi_state.resultslot;
            if (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                return pg_sys::ExecClearTuple(result);
            }
            if (*result).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                pg_sys::ExecStoreVirtualTuple(result);
            }
            return result;
        }
        // ExecScan fetches through the access method, checks the plan's conditions and
        // projects.
        pg_sys::ExecScan(ss, Some(access_next::<N>), Some(recheck))
    }
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
