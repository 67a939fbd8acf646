//! The "gsnap range" executor node: `FROM gsnap_range(NULL::t, from, to)` streamed as
//! `(snap_id, rec)` rows. The cursor hands out each row version once with the snapshots that
//! hold it; the node repeats it once per snapshot. The query's conditions on `rec` alone
//! (EXPLAIN's "Row Filter") are checked once per row version, in the cursor's `keep`
//! callback, and the versions they refuse are skipped for all their snapshots; the other
//! conditions (on `snap_id`, or volatile) are the plan's Filter, checked per result row.

use super::node::{self, ScanNode};
use super::{ExecMethods, ScanTable};
use crate::ffi::list;
use crate::read::range::RangeCursor;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::sync::OnceLock;

/// What the node keeps between fetches.
pub(super) struct RangeScan {
    table: ScanTable,
    /// The conditions on `rec` alone (null: none).
    row_filter: *mut pg_sys::ExprState,
    /// The table's current row type, for the cursor's `rec` datums.
    row_desc: pg_sys::TupleDesc,
    /// The open cursor (opened at the first fetch, again after a rescan).
    cursor: Option<RangeCursor>,
    /// The current row version and its snapshots left to hand out.
    rec: pg_sys::Datum,
    snaps: Vec<u64>,
    next_snap: usize,
}

static METHODS: OnceLock<ExecMethods> = OnceLock::new();

/// A new state of this node.
///
/// # Safety
/// In the executor's memory context.
pub(super) unsafe fn create_state() -> *mut pg_sys::Node {
    let methods = &METHODS
        .get_or_init(|| {
            ExecMethods(pg_sys::CustomExecMethods {
                CustomName: c"gsnap range".as_ptr(),
                BeginCustomScan: Some(node::begin::<RangeScan>),
                ExecCustomScan: Some(node::exec::<RangeScan>),
                EndCustomScan: Some(node::end::<RangeScan>),
                ReScanCustomScan: Some(node::rescan::<RangeScan>),
                ExplainCustomScan: Some(explain),
                ..Default::default()
            })
        })
        .0;
    // SAFETY: the caller's promise.
    unsafe { node::create_state::<RangeScan>(methods) }
}

impl ScanNode for RangeScan {
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        _estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> RangeScan {
        // SAFETY: our node at the end of its initialization; the expressions are the plan's.
        unsafe {
            let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
            let filter = list::nth::<pg_sys::List>((*cscan).custom_exprs, 2);
            let row_filter = pg_sys::ExecInitQual(filter, &mut (*css).ss.ps);
            // The table's current row type, copied into the query's context (which outlives
            // the scan).
            let row_desc =
                pg_sys::lookup_rowtype_tupdesc_copy(pg_sys::get_rel_type_id(table.relid), -1);
            RangeScan {
                table,
                row_filter,
                row_desc,
                cursor: None,
                rec: pg_sys::Datum::from(0usize),
                snaps: Vec::new(),
                next_snap: 0,
            }
        }
    }

    unsafe fn next_row(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        // SAFETY: the trait's contract.
        unsafe { self.fill(css, slot) }
    }

    fn reset(&mut self) {
        self.cursor = None;
        self.snaps.clear();
        self.next_snap = 0;
    }

    fn table(&mut self) -> &mut ScanTable {
        &mut self.table
    }
}

/// Stores `(snap, rec)` in the virtual slot `slot`.
///
/// # Safety
/// `slot` is a virtual slot of two columns (bigint, the table's row type).
unsafe fn store(slot: *mut pg_sys::TupleTableSlot, snap: u64, rec: pg_sys::Datum) {
    // SAFETY: per the contract.
    unsafe {
        pg_sys::ExecClearTuple(slot);
        *(*slot).tts_values = pg_sys::Datum::from(snap as i64);
        *(*slot).tts_isnull = false;
        *(*slot).tts_values.add(1) = rec;
        *(*slot).tts_isnull.add(1) = false;
        pg_sys::ExecStoreVirtualTuple(slot);
    }
}

impl RangeScan {
    /// Stores the next `(snap_id, rec)` in `slot`; false at the end.
    ///
    /// # Safety
    /// `slot` is the node's (virtual) scan slot; `css` the node.
    unsafe fn fill(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        // SAFETY: our node and slot; `rec` is the cursor's until its next row.
        unsafe {
            if self.cursor.is_none() {
                let from = self.table.snapshot_argument(css, 0);
                let to = self.table.snapshot_argument(css, 1);
                self.cursor = Some(RangeCursor::open(self.table.relid, from, to, self.row_desc));
            }
            if self.next_snap >= self.snaps.len() {
                let econtext = (*css).ss.ps.ps_ExprContext;
                let filter = self.row_filter;
                let mut keep = |rec: pg_sys::Datum, snap: u64| {
                    if filter.is_null() {
                        return true;
                    }
                    store(slot, snap, rec);
                    (*econtext).ecxt_scantuple = slot;
                    let ok = pg_sys::ExecQual(filter, econtext);
                    pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
                    ok
                };
                let cursor = self.cursor.as_mut().expect("opened above");
                let Some((snaps, rec)) = cursor.next_row(&mut keep) else {
                    return false;
                };
                self.rec = rec;
                self.snaps.clear();
                self.snaps.extend_from_slice(snaps);
                self.next_snap = 0;
            }
            store(slot, self.snaps[self.next_snap], self.rec);
            self.next_snap += 1;
            true
        }
    }
}

/// EXPLAIN: the conditions on `rec` alone, checked once per row version ("Row Filter"; the
/// per-row ones are the plan's Filter).
#[pg_guard]
unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: our plan node; deparsing its own expressions the way EXPLAIN does.
    unsafe {
        let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
        let filter = list::nth::<pg_sys::List>((*cscan).custom_exprs, 2);
        if filter.is_null() {
            return;
        }
        let context = pg_sys::set_deparse_context_plan((*es).deparse_cxt, cscan.cast(), ancestors);
        let text = pg_sys::deparse_expression(
            pg_sys::make_ands_explicit(filter).cast(),
            context,
            (*es).verbose,
            false,
        );
        pg_sys::ExplainPropertyText(c"Row Filter".as_ptr(), text, es);
    }
}
