//! The "gsnap range" executor node: `FROM gsnap_range(NULL::t, from, to)` streamed as
//! `(snap_id, rec)` rows. The cursor hands out each row version once with the snapshots that
//! hold it; the node repeats it once per snapshot. The query's conditions on `rec` alone
//! (EXPLAIN's "Row Filter") are checked once per row version, in the cursor's `keep`
//! callback, and the versions they refuse are skipped for all their snapshots; the other
//! conditions (on `snap_id`, or volatile) are the plan's Filter, checked per result row.
//!
//! The "gsnap versions" node (`FROM gsnap_versions(NULL::t, from, to)`) is the same node
//! over the versions cursor: one `(first_snap, last_snap, rec)` row per run of a version.
//!
//! Under a Gather the scan of a table is parallel-aware: the leader resolves the range once
//! and puts it, with a block cursor, in the parallel query's shared memory ([`SharedRange`]);
//! every participant (the leader too) reads the blocks it takes from the cursor, all the
//! images of each, so every version and its run is handed out by one participant only.

use super::node::{self, ExecMethods, ParallelNode, ScanNode};
use super::{pruning, ScanTable};
use crate::ffi::relation::relation_kind;
use crate::ffi::tuple::{self, row_type_copy};
use crate::ffi::{expr, list};
use crate::keymap::{self, KeyConditions};
use crate::plan::nodes::ScanKind;
use crate::read::asof::KeyMapUse;
use crate::read::range::{self, RangeCursor};
use crate::read::versions::VersionsCursor;
use crate::read::SharedRange;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// What the node keeps between fetches.
pub(super) struct RangeScan {
    table: ScanTable,
    /// The conditions on `rec` alone (null: none).
    row_filter: *mut pg_sys::ExprState,
    /// The table's current row type, for the cursor's `rec` datums.
    row_desc: pg_sys::TupleDesc,
    /// The open cursor (opened at the first fetch, again after a rescan).
    cursor: Option<Cursor>,
    /// Of a partitioned table: its partitions over the range, and those read (at one
    /// snapshot at least; the others pruned), at the last open.
    partitions: Option<(usize, usize)>,
    /// The current row version and its snapshots left to hand out.
    rec: pg_sys::Datum,
    snaps: Vec<u64>,
    next_snap: usize,
    /// Of a parallel scan: the range and block cursor its participants share.
    shared: Option<&'static SharedRange>,
    /// Of a lookup by key (the Row Filter fixes the table's key): what the key maps said
    /// at the last open.
    key_map: Option<KeyMapUse>,
}

/// The cursor of a range (row versions, each repeated per snapshot) or of its versions (one
/// row per run).
/// A table has one cursor; a partitioned table one per partition. With the one being read.
enum Cursor {
    Range(Vec<RangeCursor>, usize),
    Versions(Vec<VersionsCursor>, usize),
}

/// The node's methods.
pub(super) static METHODS: ExecMethods<RangeScan> =
    node::methods(c"gsnap range", Some(explain_range)).parallel();

/// The methods of the versions node.
pub(super) static VERSIONS_METHODS: ExecMethods<RangeScan> =
    node::methods(c"gsnap versions", Some(explain_range)).parallel();

impl ParallelNode for RangeScan {
    type Shared = SharedRange;

    /// Resolves the range once, for every participant, with a block cursor at the first
    /// block.
    unsafe fn share(&mut self, css: *mut pg_sys::CustomScanState) -> SharedRange {
        // SAFETY: our node (the caller's promise).
        let (from, to) = unsafe {
            (
                self.table.snapshot_argument(css, 0),
                self.table.snapshot_argument(css, 1),
            )
        };
        SharedRange::new(from, to)
    }

    fn join(&mut self, shared: &'static SharedRange) {
        self.shared = Some(shared);
        self.reset();
    }
}

/// EXPLAIN of a range or versions node: its Row Filter ([`explain`]) and, of a partitioned
/// table, the partitions over the range and those read (the others pruned at every
/// snapshot), once the scan has run (EXPLAIN ANALYZE).
#[pg_guard]
unsafe extern "C-unwind" fn explain_range(
    css: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: PostgreSQL's own arguments, for our range or versions node.
    unsafe { explain(css, ancestors, es) };
    // SAFETY: as above: the state of a RangeScan.
    let Some(scan) = (unsafe { node::node_of::<RangeScan>(css) }) else {
        return;
    };
    // SAFETY: EXPLAIN's state.
    unsafe { node::explain_partitions(es, scan.partitions, "over the range") };
    if let Some(Cursor::Versions(cursors, _)) = &scan.cursor {
        let reads = cursors.iter().map(VersionsCursor::reads);
        // SAFETY: EXPLAIN's state.
        unsafe { explain_reads(es, reads.fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))) };
    }
    let rel = scan.table.rel();
    // SAFETY: our node, and its open table.
    let Some(keys) = (unsafe { key_conditions(css, rel.as_ptr(), scan.table.kind) }) else {
        return;
    };
    let read = match &scan.cursor {
        Some(Cursor::Range(cursors, _)) => Some(cursors.iter().map(RangeCursor::images_read).sum()),
        Some(Cursor::Versions(cursors, _)) => {
            Some(cursors.iter().map(VersionsCursor::images_read).sum::<u64>())
        }
        None => None,
    };
    let read = read.map(|n| format!("{n} page images read"));
    // SAFETY: EXPLAIN's state; in its transaction.
    unsafe { node::explain_key_map(es, &keys, rel.oid(), scan.key_map, read) };
}

/// EXPLAIN ANALYZE of a node reading versions: how many page images it read whole and how
/// many from their deltas (this process's part of a parallel scan).
///
/// # Safety
/// `es` is EXPLAIN's state.
pub(super) unsafe fn explain_reads(es: *mut pg_sys::ExplainState, (images, deltas): (u64, u64)) {
    let text = format!("{images} images, {deltas} from deltas");
    // SAFETY: the caller's promise.
    unsafe { node::explain_property(es, "Pages Read", &text) };
}

/// The node's Row Filter conditions that fix the table's key, if they do (`keymap.rs`).
///
/// # Safety
/// `css` is a range or versions node; `rel` its open table; in a transaction.
unsafe fn key_conditions(
    css: *mut pg_sys::CustomScanState,
    rel: pg_sys::Relation,
    kind: ScanKind,
) -> Option<KeyConditions> {
    // SAFETY: the caller's promise: the plan of a range or versions node.
    let quals = unsafe { row_filter_of(node::plan_of(css)) };
    let rec = kind.rec_column()? as i16;
    // SAFETY: nodes of the node's conditions.
    let column_of = |n| unsafe { keymap::column_of(n, pg_sys::INDEX_VAR, Some(rec), &|a| Some(a)) };
    // SAFETY: the caller's promise.
    unsafe { KeyConditions::find(rel, quals, &column_of) }
}

/// The conditions on `rec` alone (a List of conditions, NIL for none), after the snapshot
/// arguments in the plan's expressions (plan/nodes.rs).
///
/// # Safety
/// `cscan` is the plan of a "gsnap range", "gsnap versions" or "gsnap range aggregate" node.
pub(super) unsafe fn row_filter_of(cscan: &pg_sys::CustomScan) -> *mut pg_sys::List {
    // SAFETY: the caller's promise: its custom_exprs are from, to, the row filter.
    unsafe { list::nth::<pg_sys::List>(cscan.custom_exprs, 2) }
}

impl ScanNode for RangeScan {
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        _estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> RangeScan {
        // SAFETY: the trait's contract: our node, whose plan is a "gsnap range" CustomScan.
        let filter = unsafe { row_filter_of(node::plan_of(css)) };
        // SAFETY: the plan's own conditions, prepared in the node's plan state (null for NIL).
        let row_filter = unsafe { pg_sys::ExecInitQual(filter, &mut (*css).ss.ps) };
        RangeScan {
            // The table's current row type, copied into the query's context (which outlives
            // the scan).
            row_desc: row_type_copy(rel_type_id(table.relid)),
            table,
            row_filter,
            cursor: None,
            partitions: None,
            rec: pg_sys::Datum::from(0usize),
            snaps: Vec::new(),
            next_snap: 0,
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
        self.cursor = None;
        self.snaps.clear();
        self.next_snap = 0;
    }

    fn table(&mut self) -> &mut ScanTable {
        &mut self.table
    }
}

/// The row type of table `relid`.
pub(super) fn rel_type_id(relid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a catalog lookup by OID (InvalidOid if there is no such relation).
    unsafe { pg_sys::get_rel_type_id(relid) }
}

/// Stores `(snaps..., rec)` in the virtual slot `slot`, and NULL in any column after them:
/// `(snap_id, rec)` for a range, `(first_snap, last_snap, rec)` for versions, `(snap_id,
/// rec, aggregates...)` for the aggregate node.
///
/// # Safety
/// `slot` is a virtual slot whose columns start with those (bigints, the table's row type),
/// and `rec` a datum of that row type valid while the slot holds it.
pub(super) unsafe fn store(slot: *mut pg_sys::TupleTableSlot, snaps: &[u64], rec: pg_sys::Datum) {
    // SAFETY: the caller's promise: a slot with its descriptor.
    let natts = unsafe { (*(*slot).tts_tupleDescriptor).natts } as usize;
    let columns = (0..natts).map(|i| match i.cmp(&snaps.len()) {
        std::cmp::Ordering::Less => (pg_sys::Datum::from(snaps[i] as i64), false),
        std::cmp::Ordering::Equal => (rec, false),
        std::cmp::Ordering::Greater => (pg_sys::Datum::from(0usize), true),
    });
    // SAFETY: the caller's promise.
    unsafe { tuple::store_virtual(slot, columns) };
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
        if self.cursor.is_none() {
            // A participant of a parallel scan reads the range the leader resolved.
            let (from, to) = match self.shared {
                Some(shared) => (shared.from, shared.to),
                // SAFETY: our node (the caller's promise).
                None => unsafe {
                    (
                        self.table.snapshot_argument(css, 0),
                        self.table.snapshot_argument(css, 1),
                    )
                },
            };
            let versions = self.table.kind == ScanKind::Versions;
            let relid = self.table.relid;
            // SAFETY: our node's plan: its Row Filter (conditions on `rec` alone).
            let quals = unsafe { row_filter_of(node::plan_of(css)) };
            let rec_column = if versions { 3 } else { 2 };
            let row_type = rel_type_id(relid);
            // Of a partitioned table: the partitions the Row Filter excludes are not read.
            // SAFETY: the node's own conditions, over its scan tuple; in a transaction.
            let mut refuted = |constraint: &str, attnums: &[i16]| unsafe {
                pruning::refuted_over_rec(constraint, attnums, quals, rec_column, row_type)
            };
            // SAFETY: the table's current row type, copied at begin, lives with the query.
            let mut cursors =
                unsafe { range::cursors(relid, from, to, self.row_desc, &mut refuted) };
            let partitioned = relation_kind(relid) == Some(pg_sys::RELKIND_PARTITIONED_TABLE);
            if partitioned {
                let read = cursors.iter().filter(|c| !c.is_empty()).count();
                self.partitions = Some((cursors.len(), read));
            }
            // A lookup by key reads the table's key map, or each partition's.
            let keys = match self.shared {
                None => {
                    let rel = self.table.rel().as_ptr();
                    // SAFETY: our node (the caller's promise); its open table.
                    unsafe { key_conditions(css, rel, self.table.kind) }
                }
                Some(_) => None,
            };
            if let Some(shared) = self.shared {
                // (Of a partitioned table, every participant opens the partitions' cursors
                // in the same order, pruned alike by the plan's Row Filter.)
                range::share(&mut cursors, shared);
            } else if let Some(keys) = keys {
                // SAFETY: our node's state, initialized; parameters are bound by now.
                self.key_map = match unsafe { keys.lookup(&mut (*css).ss.ps) } {
                    Some(lookup) if partitioned => {
                        let mut summary = KeyMapUse::PARTITIONS;
                        for cursor in cursors.iter_mut().filter(|c| !c.is_empty()) {
                            summary.count(cursor.look_up_keys(&lookup));
                        }
                        Some(summary)
                    }
                    Some(lookup) => cursors.first_mut().map(|c| c.look_up_keys(&lookup)),
                    None => Some(KeyMapUse::TooMany),
                };
            }
            self.cursor = Some(if versions {
                Cursor::Versions(cursors.into_iter().map(VersionsCursor::new).collect(), 0)
            } else {
                Cursor::Range(cursors, 0)
            });
        }
        if self.next_snap >= self.snaps.len() {
            // SAFETY: our node's expression context, set up by ExecInitCustomScan.
            let econtext = unsafe { (*css).ss.ps.ps_ExprContext };
            let filter = self.row_filter;
            let versions = matches!(self.cursor, Some(Cursor::Versions(..)));
            // SAFETY: the row filter was prepared for this node and reads its scan slot, given
            // a row of that type; `rec` is the cursor's until its next row.
            let mut keep = |rec: pg_sys::Datum, snap: u64| unsafe {
                filter.is_null() || {
                    let snaps = [snap, snap];
                    store(slot, &snaps[..if versions { 2 } else { 1 }], rec);
                    expr::qual_holds(filter, econtext, slot)
                }
            };
            match self.cursor.as_mut().expect("opened above") {
                Cursor::Versions(cursors, at) => loop {
                    let Some(cursor) = cursors.get_mut(*at) else {
                        return false;
                    };
                    if let Some((first, last, rec)) = cursor.next_run(&mut keep) {
                        // SAFETY: our virtual slot; the version is the cursor's until its
                        // next run.
                        unsafe { store(slot, &[first, last], rec) };
                        return true;
                    }
                    *at += 1;
                },
                Cursor::Range(cursors, at) => loop {
                    let Some(cursor) = cursors.get_mut(*at) else {
                        return false;
                    };
                    if let Some((snaps, rec)) = cursor.next_row(&mut keep) {
                        self.snaps.clear();
                        self.snaps.extend_from_slice(snaps);
                        self.rec = rec;
                        break;
                    }
                    *at += 1;
                },
            }
            self.next_snap = 0;
        }
        // SAFETY: our virtual slot; the row version is the cursor's until its next row.
        unsafe { store(slot, &[self.snaps[self.next_snap]], self.rec) };
        self.next_snap += 1;
        true
    }
}

/// EXPLAIN: the conditions on `rec` alone, checked once per row version ("Row Filter"; the
/// per-row ones are the plan's Filter). Also the aggregate node's (`range_agg.rs`), whose
/// `custom_exprs` hold its Row Filter at the same place.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: EXPLAIN calls this for our node, whose plan is a "gsnap range", "gsnap
    // versions" or "gsnap range aggregate" CustomScan.
    let cscan = unsafe { node::plan_of(css) };
    // SAFETY: as above.
    let filter = unsafe { row_filter_of(cscan) };
    if filter.is_null() {
        return;
    }
    let plan = std::ptr::from_ref(cscan).cast_mut().cast();
    // SAFETY: deparsing the plan's own conditions in the context of its plan tree, the way
    // EXPLAIN shows a Filter; `es` is the EXPLAIN in progress.
    unsafe {
        let context = pg_sys::set_deparse_context_plan((*es).deparse_cxt, plan, ancestors);
        let conditions = pg_sys::make_ands_explicit(filter).cast();
        let text = pg_sys::deparse_expression(conditions, context, (*es).verbose, false);
        pg_sys::ExplainPropertyText(c"Row Filter".as_ptr(), text, es);
    }
}
