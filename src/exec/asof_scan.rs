//! The "gsnap AS OF" executor node: `FROM gsnap_asof(NULL::t, snapshot or time)` streamed to
//! the executor like a sequential scan.
//!
//! When the table has no dropped column its scan slot is a heap tuple slot, and rows the
//! reader hands out as stored tuples go to the executor in place (straight from the pinned
//! page image, like a heap scan's buffer tuples); decoded rows are formed into heap tuples.
//! With dropped columns the slot is virtual and gets the live columns' values. A query that
//! reads whole rows (`SELECT t FROM gsnap_asof(NULL::t, 42) t`) gets them as one more scan
//! column, after the live ones (`plan::nodes`), which this node fills with the row as a
//! composite value; its slot is virtual too.
//!
//! Under a Gather the scan of a table is parallel-aware: the leader resolves the snapshot
//! argument once and puts it, with a block cursor, in the parallel query's shared memory
//! ([`SharedBlocks`]); every participant (the leader too) reads the blocks it takes from the
//! cursor, so the rows are those of one snapshot, each read once. Of a partitioned table,
//! the participants read its partitions one after another, sharing each one's blocks
//! (`read::partitioned`).

use super::node::{self, ExecMethods, ParallelNode, ScanNode};
use super::{pruning, ScanTable};
use crate::ffi::tuple::{self, item_pointer};
use crate::keymap::{self, KeyConditions};
use crate::read::asof::{AsofRows, KeyMapUse, Row};
use crate::read::partitioned::PartitionedRows;
use crate::read::SharedBlocks;
use pgrx::pg_sys;
use pgrx::prelude::*;

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
    /// The scan tuple ends with the whole row, as a value of the table's row type.
    whole_row: bool,
    /// The open reader (opened at the first fetch, again after a rescan).
    rows: Option<Reader>,
    /// Of a partitioned table: partitions at the snapshot and read, at the last open.
    partitions: Option<(usize, usize)>,
    /// The tuple header handed out for a stored tuple.
    tuple: pg_sys::HeapTupleData,
    /// Of a parallel scan: the snapshot and block cursor its participants share.
    shared: Option<&'static SharedBlocks>,
    /// Of a lookup by key (the conditions fix the table's key): what the key map said at
    /// the last open.
    key_map: Option<KeyMapUse>,
}

/// The reader of a table, or of a partitioned table's partitions.
enum Reader {
    Table(Box<AsofRows>),
    Partitioned(Box<PartitionedRows>),
}

/// The node's methods.
pub(super) static METHODS: ExecMethods<AsofScan> =
    node::methods(c"gsnap AS OF", Some(explain)).parallel();

impl ParallelNode for AsofScan {
    type Shared = SharedBlocks;

    /// Resolves the snapshot argument once, for every participant, with a block cursor at
    /// block 0.
    unsafe fn share(&mut self, css: *mut pg_sys::CustomScanState) -> SharedBlocks {
        // SAFETY: our node (the caller's promise).
        SharedBlocks::new(unsafe { self.table.snapshot_argument(css, 0) })
    }

    fn join(&mut self, shared: &'static SharedBlocks) {
        self.shared = Some(shared);
        self.rows = None;
    }
}

/// EXPLAIN: of a partitioned table, the partitions the snapshot held and those read (the
/// others pruned by the conditions), once the scan has run (EXPLAIN ANALYZE).
#[pg_guard]
unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: PostgreSQL passes our node's state.
    let Some(scan) = (unsafe { node::node_of::<AsofScan>(css) }) else {
        return;
    };
    // SAFETY: EXPLAIN's state.
    unsafe { node::explain_partitions(es, scan.partitions, "at the snapshot") };
    let rel = scan.table.rel();
    // SAFETY: our node, and its open table.
    let Some(keys) = (unsafe { key_conditions(css, rel.as_ptr(), &scan.columns) }) else {
        return;
    };
    let (read, used) = match &scan.rows {
        Some(Reader::Table(rows)) => (rows.pages_read(), scan.key_map),
        Some(Reader::Partitioned(rows)) => (rows.pages_read(), rows.key_map.or(scan.key_map)),
        None => (None, scan.key_map),
    };
    let read = read.map(|n| format!("{n} pages read"));
    // SAFETY: EXPLAIN's state; in its transaction.
    unsafe { node::explain_key_map(es, &keys, rel.oid(), used, read) };
}

/// The node's conditions that fix the table's key, if they do (`keymap.rs`): over its scan
/// tuple, whose columns are the table's `columns`.
///
/// # Safety
/// `css` is our node; `rel` its open table; in a transaction.
unsafe fn key_conditions(
    css: *mut pg_sys::CustomScanState,
    rel: pg_sys::Relation,
    columns: &[usize],
) -> Option<KeyConditions> {
    // SAFETY: our node's plan and its conditions, as planned.
    let quals = unsafe { node::plan_of(css).scan.plan.qual };
    let attnum = |scan_column: i16| columns.get(scan_column as usize - 1).map(|&c| c as i16 + 1);
    // SAFETY: nodes of the node's conditions.
    let column_of = |n| unsafe { keymap::column_of(n, pg_sys::INDEX_VAR, None, &attnum) };
    // SAFETY: the caller's promise.
    unsafe { KeyConditions::find(rel, quals, &column_of) }
}

impl ScanNode for AsofScan {
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> AsofScan {
        // SAFETY: the open table's descriptor, valid while it stays open (as long as the scan).
        let attrs = unsafe { tuple::attributes(table.rel().descriptor()) };
        let columns: Vec<usize> = (0..attrs.len())
            .filter(|&i| !attrs[i].attisdropped)
            .collect();
        // SAFETY: the node's scan slot, made by ExecInitCustomScan from the scan's target list.
        let scan_natts =
            unsafe { (*(*(*css).ss.ss_ScanTupleSlot).tts_tupleDescriptor).natts } as usize;
        let whole_row = scan_natts == columns.len() + 1;
        let heap_slot = columns.len() == attrs.len() && !whole_row;
        if heap_slot {
            // SAFETY: the trait's contract: our node, at the end of its initialization.
            unsafe { use_heap_slot(css, estate) };
        }
        AsofScan {
            table,
            heap_slot,
            columns,
            whole_row,
            rows: None,
            partitions: None,
            tuple: pg_sys::HeapTupleData::default(),
            shared: None,
            key_map: None,
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

/// Makes the scan slot of `css` a heap tuple slot (the table has no dropped columns). This
/// is decided now, before the parent node compiles its expressions against our output; the
/// result slot, projection and conditions are set up again to match, as
/// ExecInitCustomScan did for the virtual slot.
///
/// # Safety
/// `css` is our node at the end of its initialization by `estate`.
unsafe fn use_heap_slot(css: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState) {
    // SAFETY: the caller's promise: the node's scan slot (with the scan row's descriptor),
    // plan and conditions are set.
    unsafe {
        let ss = &mut (*css).ss;
        let scan_desc = (*ss.ss_ScanTupleSlot).tts_tupleDescriptor;
        pg_sys::ExecInitScanTupleSlot(estate, ss, scan_desc, &pg_sys::TTSOpsHeapTuple);
        pg_sys::ExecInitResultTupleSlotTL(&mut ss.ps, &pg_sys::TTSOpsVirtual);
        pg_sys::ExecAssignScanProjectionInfoWithVarno(ss, pg_sys::INDEX_VAR);
        ss.ps.qual = pg_sys::ExecInitQual((*ss.ps.plan).qual, &mut ss.ps);
    }
}

impl AsofScan {
    /// Opens the reader: of the table, or of the partitions of a partitioned table that the
    /// scan's conditions do not prune.
    ///
    /// # Safety
    /// `css` is the node.
    unsafe fn open(&mut self, css: *mut pg_sys::CustomScanState) {
        let snap = match self.shared {
            Some(shared) => shared.snap,
            // SAFETY: our node (the caller's promise).
            None => unsafe { self.table.snapshot_argument(css, 0) },
        };
        let rel = self.table.rel();
        let (relid, desc) = (rel.oid(), rel.descriptor());
        if rel.class().relkind as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
            // SAFETY: the open table's current descriptor, valid while the scan runs.
            let mut rows = unsafe { AsofRows::open(relid, desc, snap, self.heap_slot) };
            if let Some(shared) = self.shared {
                rows.share(shared, None);
            // SAFETY: our node (the caller's promise).
            } else if let Some(keys) = unsafe { key_conditions(css, rel.as_ptr(), &self.columns) } {
                // SAFETY: our node's state, initialized; parameters are bound by now.
                let use_ = match unsafe { keys.lookup(&mut (*css).ss.ps) } {
                    Some(lookup) => rows.look_up_keys(&lookup.definition(), &lookup.hashes),
                    None => KeyMapUse::TooMany,
                };
                self.key_map = Some(use_);
            }
            self.rows = Some(Reader::Table(Box::new(rows)));
            return;
        }
        // SAFETY: our node's plan and its conditions, as planned.
        let quals = unsafe { node::plan_of(css).scan.plan.qual };
        let columns = &self.columns;
        // SAFETY: the node's own conditions, over its scan tuple; in a transaction. (They
        // are the plan's, so every participant of a parallel scan prunes alike.)
        let mut keep = |leaf: &_| !unsafe { pruning::refuted(leaf, quals, columns) };
        // SAFETY: the open table's current descriptor, valid while the scan runs.
        let mut rows = unsafe {
            PartitionedRows::open(relid, desc, snap, &mut keep, self.shared, self.heap_slot)
        };
        // A lookup by key reads each partition's key map (`keymap.rs`).
        let keys = match self.shared {
            // SAFETY: our node (the caller's promise).
            None => unsafe { key_conditions(css, rel.as_ptr(), &self.columns) },
            Some(_) => None,
        };
        if let Some(keys) = keys {
            // SAFETY: our node's state, initialized; parameters are bound by now.
            match unsafe { keys.lookup(&mut (*css).ss.ps) } {
                Some(lookup) => rows.look_up_keys(lookup),
                None => self.key_map = Some(KeyMapUse::TooMany),
            }
        }
        self.partitions = Some((rows.partitions, rows.read));
        self.rows = Some(Reader::Partitioned(Box::new(rows)));
    }

    /// Stores the next row in `slot`; false at the end. A row is valid until the next fetch:
    /// its page stays pinned, its decoded values live in the reader's scratch context.
    ///
    /// # Safety
    /// `slot` is the node's scan slot; `css` the node.
    unsafe fn fill(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        if self.rows.is_none() {
            // SAFETY: our node (the caller's promise).
            unsafe { self.open(css) };
        }
        let (row, relid) = match self.rows.as_mut().expect("opened above") {
            Reader::Table(rows) => (rows.next(), self.table.relid),
            Reader::Partitioned(rows) => match rows.next_with_partition() {
                Some((row, leaf)) => (Some(row), pg_sys::Oid::from(leaf)),
                None => (None, pg_sys::InvalidOid),
            },
        };
        let Some(row) = row else {
            return false;
        };
        match row {
            Row::Tuple { block, lp, bytes } => {
                self.tuple = pg_sys::HeapTupleData {
                    t_len: bytes.len() as u32,
                    t_self: item_pointer(block, lp),
                    t_tableOid: relid,
                    t_data: bytes.as_ptr().cast_mut().cast(),
                };
                // SAFETY: stored tuples only come for a heap tuple slot (`open` was told);
                // the slot does not free the bytes, which stay pinned until the next fetch.
                unsafe { raw::ExecStoreHeapTuple(&mut self.tuple, slot, false) };
            }
            Row::Values {
                block,
                lp,
                values,
                nulls,
                scratch,
            } if self.heap_slot => {
                // SAFETY: our slot, emptied before its next row is formed.
                unsafe { pg_sys::ExecClearTuple(slot) };
                // Every column is live: the values are the row as it is.
                // SAFETY: the heap slot's descriptor is the table's row type, which the
                // values are a row of.
                let t = scratch
                    .run(|| unsafe { tuple::form((*slot).tts_tupleDescriptor, values, nulls) });
                // SAFETY: the tuple just formed (in the scratch context), stored in our
                // heap tuple slot, which does not free it.
                unsafe {
                    (*t).t_self = item_pointer(block, lp);
                    (*t).t_tableOid = relid;
                    pg_sys::ExecStoreHeapTuple(t, slot, false);
                }
            }
            Row::Values {
                values,
                nulls,
                scratch,
                ..
            } => {
                let live = self.columns.iter().map(|&c| (values[c], nulls[c]));
                if self.whole_row {
                    let desc = self.table.rel().descriptor();
                    // SAFETY: the values are a row of the table's current descriptor; the
                    // composite value is made in the scratch context, which lives as long as
                    // the row's values.
                    let row = scratch.run(|| unsafe {
                        pg_sys::heap_copy_tuple_as_datum(tuple::form(desc, values, nulls), desc)
                    });
                    let columns = live.chain(std::iter::once((row, false)));
                    // SAFETY: a virtual slot of the live columns and the whole row.
                    unsafe { tuple::store_virtual(slot, columns) };
                } else {
                    // SAFETY: a virtual slot of the table's live columns, given their values.
                    unsafe { tuple::store_virtual(slot, live) };
                }
                // SAFETY: our slot, holding the row just stored.
                unsafe { (*slot).tts_tableOid = relid };
            }
        }
        true
    }
}
