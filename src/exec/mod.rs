//! The executor side of gsnap's custom scans: the "gsnap AS OF" node (`asof_scan.rs`) fills
//! scan slots from [`crate::read::asof::AsofRows`] (or the partitions of a partitioned
//! table, pruned by `pruning.rs`), the "gsnap range" and "gsnap versions" nodes
//! (`range_scan.rs`) from [`crate::read::range::RangeCursor`] and
//! [`crate::read::versions::VersionsCursor`], the "gsnap diff" node (`diff_scan.rs`) from
//! [`crate::read::diff::diff_rows`].
//!
//! What both nodes do the same way is here: at executor start the table is opened and locked
//! ACCESS SHARE (the lock stays until the transaction ends, the relation stays open while the
//! scan runs, so the same session cannot alter it under a cursor) and must still have the row
//! type the plan recorded; the reader itself is opened at the first fetch (and again after a
//! rescan), because the snapshot arguments may use parameters that are only set by then.
//! A node whose executor never reaches its end (an ERROR) is dropped by a reset callback of
//! the query's memory context, which releases its pins.

mod asof_scan;
mod diff_scan;
mod node;
mod pruning;
mod range_agg;
mod range_scan;
mod tables;

pub use tables::init;

use crate::error::{error, null_argument};
use crate::ffi::relation::{relation_name, OpenRelation};
use crate::ffi::{expr, list};
use crate::plan::nodes::{same_row_type, ScanKind, ScanPlan};
use crate::sql::access::{require_column_access, require_gsnap_database};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Creates the executor state of one of gsnap's scan nodes.
#[pg_guard]
pub unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: PostgreSQL passes one of our plan nodes, whose private list ScanPlan encoded.
    let plan = unsafe { ScanPlan::decode((*cscan).custom_private) };
    if plan.kind == ScanKind::Range {
        node::create_state(&range_scan::METHODS)
    } else if plan.kind == ScanKind::Versions {
        node::create_state(&range_scan::VERSIONS_METHODS)
    } else if plan.kind == ScanKind::RangeAggregate {
        node::create_state(&range_agg::METHODS)
    } else if plan.kind == ScanKind::Diff {
        node::create_state(&diff_scan::METHODS)
    } else {
        node::create_state(&asof_scan::METHODS)
    }
}

/// What both scan nodes keep: the table they read and their snapshot arguments.
struct ScanTable {
    kind: ScanKind,
    relid: pg_sys::Oid,
    /// The table, open while the scan runs. Dropped (closed) by EndCustomScan; after an
    /// ERROR the transaction's abort releases it instead.
    rel: Option<OpenRelation>,
    /// The snapshot arguments, ready to evaluate.
    args: Vec<*mut pg_sys::ExprState>,
}

impl ScanTable {
    /// Executor start: the checks every read makes, the table opened and its row type
    /// checked against the plan's, the snapshot arguments prepared.
    ///
    /// # Safety
    /// `css` is one of our scan states being initialized.
    unsafe fn begin(css: *mut pg_sys::CustomScanState) -> ScanTable {
        // SAFETY: the caller's promise: our state, whose plan is one of our CustomScans.
        let cscan = unsafe { node::plan_of(css) };
        // SAFETY: the private list of one of our plan nodes, which ScanPlan encoded.
        let plan = unsafe { ScanPlan::decode(cscan.custom_private) };
        require_gsnap_database();
        require_column_access(
            plan.relid,
            plan.columns.as_deref(),
            plan.rls_user,
            plan.check_as,
        );
        let rel = OpenRelation::open(plan.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
            .unwrap_or_else(|| {
                error(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                    format!(
                        "the table with OID {} read by this query no longer exists",
                        plan.relid.to_u32()
                    ),
                )
                .raise()
            });
        // A cached plan is replanned after a schema change (plan/deps.rs): this is the
        // last line of defence.
        // SAFETY: the signature was recorded by the planner (ScanPlan).
        if !unsafe { same_row_type(plan.signature, &rel) } {
            error(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "cached plan must not change result type",
            )
            .detail(format!(
                "The columns of table {} changed after this query was planned.",
                relation_name(plan.relid)
            ))
            .hint("Prepare the statement again.")
            .raise();
        }
        let args = (0..plan.kind.snapshot_args())
            .map(|i| {
                // SAFETY: the plan's custom_exprs start with its snapshot arguments, prepared
                // in the node's plan state.
                unsafe { pg_sys::ExecInitExpr(list::nth(cscan.custom_exprs, i), &mut (*css).ss.ps) }
            })
            .collect();
        ScanTable {
            kind: plan.kind,
            relid: plan.relid,
            rel: Some(rel),
            args,
        }
    }

    /// The open table.
    fn rel(&self) -> &OpenRelation {
        self.rel
            .as_ref()
            .expect("the table is open while the scan runs")
    }

    /// Evaluates snapshot argument `i`: a snapshot id, or a time resolved to one.
    ///
    /// # Safety
    /// `css` is the node this table belongs to.
    unsafe fn snapshot_argument(&self, css: *mut pg_sys::CustomScanState, i: usize) -> u64 {
        // SAFETY: the caller's promise: the argument was prepared in `begin` for this node,
        // whose expression context ExecInitCustomScan made.
        let datum = unsafe { expr::eval(self.args[i], (*css).ss.ps.ps_ExprContext) };
        let what = match (self.kind, i) {
            (ScanKind::AsofId, _) => "the snapshot of gsnap_asof",
            (ScanKind::AsofTime, _) => "the time of gsnap_asof",
            (ScanKind::Range, 0) => "the first snapshot of gsnap_range",
            (ScanKind::Range, _) => "the last snapshot of gsnap_range",
            (ScanKind::Versions, 0) => "the first snapshot of gsnap_versions",
            (ScanKind::Versions, _) => "the last snapshot of gsnap_versions",
            (ScanKind::RangeAggregate, 0) => "the first snapshot of gsnap_range",
            (ScanKind::RangeAggregate, _) => "the last snapshot of gsnap_range",
            (ScanKind::Diff, 0) => "the first snapshot of gsnap_diff",
            (ScanKind::Diff, _) => "the second snapshot of gsnap_diff",
        };
        let Some(datum) = datum else {
            null_argument(what)
        };
        // The text forms: an id, a label or a time; the timestamptz forms: a time (a
        // range's first snapshot is the first taken at or after the time it starts at).
        use crate::sql::asof::Bound;
        let bound = match (self.kind.over_a_range(), i) {
            (true, 0) => Bound::From,
            (true, _) => Bound::To,
            (false, _) => Bound::At,
        };
        // SAFETY: the argument's state, prepared in `begin`, keeps its expression, whose
        // type the value has.
        unsafe {
            let ty = pg_sys::exprType((*self.args[i]).expr.cast());
            crate::sql::snapshot_of(ty, datum, bound)
        }
    }

    /// EndCustomScan: closes the table (its lock stays until the transaction ends).
    fn end(&mut self) {
        self.rel = None;
    }

    /// After an ERROR: the transaction's abort releases the relation.
    fn abandon(&mut self) {
        if let Some(rel) = self.rel.take() {
            rel.forget();
        }
    }
}
