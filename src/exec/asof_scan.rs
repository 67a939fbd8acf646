//! The "gsnap AS OF" executor node: `FROM gsnap_asof(NULL::t, snapshot or time)` streamed to
//! the executor like a sequential scan.
//!
//! When the table has no dropped column its scan slot is a heap tuple slot, and rows the
//! reader hands out as stored tuples go to the executor in place (straight from the pinned
//! page image, like a heap scan's buffer tuples); decoded rows are formed into heap tuples.
//! With dropped columns the slot is virtual and gets the live columns' values.

use super::node::{self, ScanNode};
use super::{ExecMethods, ScanTable};
use crate::read::asof::{AsofRows, Row};
use pgrx::pg_sys;
use std::sync::OnceLock;

/// Unguarded declarations of the call made for every row (it cannot raise an ERROR here: the
/// slot is ours and of the right kind), to spare the per-call error trap.
mod raw {
    use pgrx::pg_sys::{HeapTuple, TupleTableSlot};
    extern "C" {
        pub fn ExecStoreHeapTuple(
            tuple: HeapTuple,
            slot: *mut TupleTableSlot,
            should_free: bool,
        ) -> *mut TupleTableSlot;
    }
}

/// What the node keeps between fetches.
pub(super) struct AsofScan {
    table: ScanTable,
    /// The scan slot is a heap tuple slot (the table has no dropped columns).
    heap_slot: bool,
    /// The table column behind each scan column (the live ones).
    columns: Vec<usize>,
    /// The open reader (opened at the first fetch, again after a rescan).
    rows: Option<AsofRows>,
    /// The tuple header handed out for a stored tuple.
    tuple: pg_sys::HeapTupleData,
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
                CustomName: c"gsnap AS OF".as_ptr(),
                BeginCustomScan: Some(node::begin::<AsofScan>),
                ExecCustomScan: Some(node::exec::<AsofScan>),
                EndCustomScan: Some(node::end::<AsofScan>),
                ReScanCustomScan: Some(node::rescan::<AsofScan>),
                ..Default::default()
            })
        })
        .0;
    // SAFETY: the caller's promise.
    unsafe { node::create_state::<AsofScan>(methods) }
}

impl ScanNode for AsofScan {
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> AsofScan {
        // SAFETY: our node at the end of its initialization; the table is open.
        unsafe {
            let desc = table.rel().descriptor();
            let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
            let columns: Vec<usize> = (0..attrs.len())
                .filter(|&i| !attrs[i].attisdropped)
                .collect();
            // The slot type is decided now, before the parent node compiles its expressions
            // against our output: a heap tuple slot when the table has no dropped columns.
            let heap_slot = columns.len() == attrs.len();
            if heap_slot {
                let scan_desc = (*(*css).ss.ss_ScanTupleSlot).tts_tupleDescriptor;
                pg_sys::ExecInitScanTupleSlot(
                    estate,
                    &mut (*css).ss,
                    scan_desc,
                    &pg_sys::TTSOpsHeapTuple,
                );
                pg_sys::ExecInitResultTupleSlotTL(&mut (*css).ss.ps, &pg_sys::TTSOpsVirtual);
                pg_sys::ExecAssignScanProjectionInfoWithVarno(&mut (*css).ss, pg_sys::INDEX_VAR);
                (*css).ss.ps.qual =
                    pg_sys::ExecInitQual((*(*css).ss.ps.plan).qual, &mut (*css).ss.ps);
            }
            AsofScan {
                table,
                heap_slot,
                columns,
                rows: None,
                tuple: std::mem::zeroed(),
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
        self.rows = None;
    }

    fn table(&mut self) -> &mut ScanTable {
        &mut self.table
    }
}

impl AsofScan {
    /// Stores the next row in `slot`; false at the end.
    ///
    /// # Safety
    /// `slot` is the node's scan slot; `css` the node.
    unsafe fn fill(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        if self.rows.is_none() {
            // SAFETY: our node.
            let snap = unsafe { self.table.snapshot_argument(css, 0) };
            let rel = self.table.rel();
            // SAFETY: the open table's current descriptor, valid while the scan runs.
            self.rows =
                Some(unsafe { AsofRows::open(rel.oid(), rel.descriptor(), snap, self.heap_slot) });
        }
        let relid = self.table.relid;
        let Some(row) = self.rows.as_mut().expect("opened above").next() else {
            return false;
        };
        // SAFETY: filling our slot with a row valid until the next fetch (the page stays
        // pinned, the decoded values live in the reader's scratch context until then).
        unsafe {
            match row {
                Row::Tuple { block, lp, bytes } => {
                    self.tuple.t_len = bytes.len() as u32;
                    self.tuple.t_tableOid = relid;
                    self.tuple.t_data = bytes.as_ptr().cast_mut().cast();
                    pgrx::itemptr::item_pointer_set_all(&mut self.tuple.t_self, block, lp);
                    raw::ExecStoreHeapTuple(&mut self.tuple, slot, false);
                }
                Row::Values {
                    block,
                    lp,
                    values,
                    nulls,
                    scratch,
                } => {
                    pg_sys::ExecClearTuple(slot);
                    if self.heap_slot {
                        // Every column is live: the values are the row as it is.
                        let t = scratch.run(|| {
                            pg_sys::heap_form_tuple(
                                (*slot).tts_tupleDescriptor,
                                values.as_ptr().cast_mut(),
                                nulls.as_ptr().cast_mut(),
                            )
                        });
                        pgrx::itemptr::item_pointer_set_all(&mut (*t).t_self, block, lp);
                        (*t).t_tableOid = relid;
                        pg_sys::ExecStoreHeapTuple(t, slot, false);
                    } else {
                        for (j, &c) in self.columns.iter().enumerate() {
                            *(*slot).tts_values.add(j) = values[c];
                            *(*slot).tts_isnull.add(j) = nulls[c];
                        }
                        pg_sys::ExecStoreVirtualTuple(slot);
                    }
                }
            }
        }
        true
    }
}
