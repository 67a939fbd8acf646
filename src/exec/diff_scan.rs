//! The "gsnap diff" executor node: `FROM gsnap_diff(NULL::t, a, b)` as `(change, rec)` rows.
//!
//! Being a scan (not a function scan), it gets what the other scans get from the planner: the
//! columns the query reads through `rec` are the ones checked for privileges, and the
//! row-level security policies that apply to the user are its first conditions, over the
//! fields of `rec` (`plan::security`), evaluated on each row before the query's own. The rows
//! themselves are `read::diff`'s, computed at the first fetch (the diff cancels rows that only
//! moved, so it has them all before it hands out the first). EXPLAIN ANALYZE says how the
//! changed pages were read ("Changed Pages": from the capture's deltas, or both images).

use super::node::{self, ExecMethods, ScanNode};
use super::range_scan::rel_type_id;
use super::ScanTable;
use crate::ffi::memcx::OwnedContext;
use crate::ffi::tuple::{self, row_type_copy};
use crate::read::diff::{diff_rows, DiffReads};
use gsnap_format::diff::Change;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// What the node keeps between fetches.
pub(super) struct DiffScan {
    table: ScanTable,
    /// The table's current row type, for the `rec` datums.
    row_desc: pg_sys::TupleDesc,
    /// The rows, once computed (at the first fetch, again after a rescan), and the next one.
    rows: Option<Vec<(Change, pg_sys::Datum)>>,
    next: usize,
    /// Where the rows live (reset at a rescan).
    memory: OwnedContext,
    /// How the last computation read the changed pages (none before the first fetch).
    reads: Option<DiffReads>,
    /// The two values of `change`.
    added: pg_sys::Datum,
    removed: pg_sys::Datum,
}

/// The node's methods.
pub(super) static METHODS: ExecMethods<DiffScan> = node::methods(c"gsnap diff", Some(explain));

/// EXPLAIN ANALYZE: how many blocks changed between the two snapshots, and how many of them
/// were read from their deltas rather than from their images.
#[pg_guard]
unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: PostgreSQL passes our node's state.
    let Some(scan) = (unsafe { node::node_of::<DiffScan>(css) }) else {
        return;
    };
    let Some(r) = scan.reads else {
        return; // not run (EXPLAIN without ANALYZE)
    };
    let text = format!(
        "{}: {} from deltas, {} from images",
        r.pages,
        r.from_deltas,
        r.pages - r.from_deltas
    );
    // SAFETY: EXPLAIN's state.
    unsafe { node::explain_property(es, "Changed Pages", &text) };
}

impl ScanNode for DiffScan {
    unsafe fn begin(
        _css: *mut pg_sys::CustomScanState,
        _estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> DiffScan {
        let label = |text: &str| text.into_datum().expect("text is not NULL");
        DiffScan {
            // The table's current row type, copied into the query's context (which outlives
            // the scan).
            row_desc: row_type_copy(rel_type_id(table.relid)),
            table,
            rows: None,
            reads: None,
            next: 0,
            memory: OwnedContext::new("gsnap diff rows"),
            added: label("added"),
            removed: label("removed"),
        }
    }

    unsafe fn next_row(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        if self.rows.is_none() {
            // SAFETY: our node (the trait's contract).
            let (a, b) = unsafe {
                (
                    self.table.snapshot_argument(css, 0),
                    self.table.snapshot_argument(css, 1),
                )
            };
            let (relid, desc) = (self.table.relid, self.row_desc);
            let mut rows = Vec::new();
            // SAFETY: the table's current row type, copied at begin; the rows' datums are
            // made in the node's memory, which lives until a rescan or the node's end.
            let reads = self.memory.run(|| unsafe {
                diff_rows(relid, a, b, desc, &mut |change, rec, _| {
                    rows.push((change, rec))
                })
            });
            self.rows = Some(rows);
            self.reads = Some(reads);
            self.next = 0;
        }
        let rows = self.rows.as_ref().expect("computed above");
        let Some(&(change, rec)) = rows.get(self.next) else {
            return false;
        };
        self.next += 1;
        let change = if change == Change::Added {
            self.added
        } else {
            self.removed
        };
        // SAFETY: our virtual slot of (change text, rec of the table's row type); the datums
        // live in the node's memory until a rescan.
        unsafe { tuple::store_virtual(slot, [(change, false), (rec, false)]) };
        true
    }

    fn reset(&mut self) {
        self.rows = None;
        // SAFETY: the rows that pointed into the memory are gone.
        unsafe { self.memory.reset() };
    }

    fn table(&mut self) -> &mut ScanTable {
        &mut self.table
    }
}
