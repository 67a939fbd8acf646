//! The "gsnap range aggregate" executor node: `GROUP BY snap_id` over `gsnap_range`, computed
//! from the range's versions (`plan/aggregates.rs` says which queries get it).
//!
//! At the first fetch the node reads every row version of the range once with its run of
//! snapshots, evaluates the aggregates' arguments on it once, and adds the values to the run
//! as a whole in difference arrays over the range's snapshots (+x at the run's first
//! snapshot, -x after its last); prefix sums then give each snapshot's count, sum and average,
//! which the node hands out one snapshot per row, in snapshot order, skipping the snapshots
//! without rows (a GROUP BY has no group for them). Sums are exact (128-bit); `avg` is the
//! exact sum divided by the count with `numeric_div`, as PostgreSQL's `avg` computes it.

use super::node::{self, ExecMethods, ScanNode};
use super::range_scan::{rel_type_id, row_filter_of, store};
use super::ScanTable;
use crate::error::error;
use crate::ffi::tuple::{self, row_type_copy};
use crate::ffi::{expr, list};
use crate::plan::nodes::ScanPlan;
use crate::plan::AggKind;
use crate::read::range::RangeCursor;
use crate::read::versions::VersionsCursor;
use pgrx::pg_guard;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// One aggregate: its kind, its argument (prepared; null for `count(*)`) and the argument's
/// type.
struct Aggregate {
    kind: AggKind,
    arg: *mut pg_sys::ExprState,
    arg_type: pg_sys::Oid,
}

/// One result row: the snapshot, and its aggregates' values and NULL flags.
type SnapshotResult = (u64, Vec<pg_sys::Datum>, Vec<bool>);

/// What the node keeps between fetches.
pub(super) struct RangeAggScan {
    table: ScanTable,
    row_filter: *mut pg_sys::ExprState,
    aggregates: Vec<Aggregate>,
    row_desc: pg_sys::TupleDesc,
    /// The results (snapshot, values, nulls), computed at the first fetch, and how the
    /// pages were read (images, deltas).
    results: Option<Vec<SnapshotResult>>,
    reads: Option<(u64, u64)>,
    next: usize,
}

/// The node's methods.
/// EXPLAIN shows the Row Filter as the range's node does (the same place in `custom_exprs`).
pub(super) static METHODS: ExecMethods<RangeAggScan> =
    node::methods(c"gsnap range aggregate", Some(explain));

/// EXPLAIN: the Row Filter, and once run (ANALYZE) how the pages were read.
#[pg_guard]
unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: PostgreSQL's own arguments, for our node.
    unsafe { super::range_scan::explain(css, ancestors, es) };
    // SAFETY: as above: the state of a RangeAggScan.
    if let Some(reads) = unsafe { node::node_of::<RangeAggScan>(css) }.and_then(|s| s.reads) {
        // SAFETY: EXPLAIN's state.
        unsafe { super::range_scan::explain_reads(es, reads) };
    }
}

impl ScanNode for RangeAggScan {
    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        _estate: *mut pg_sys::EState,
        table: ScanTable,
    ) -> RangeAggScan {
        // SAFETY: the trait's contract: our node, whose plan is a "gsnap range aggregate"
        // CustomScan (plan/aggregates.rs): custom_exprs from, to, the row filter, the
        // arguments; custom_private is a ScanPlan's list followed by the kinds.
        unsafe {
            let cscan = node::plan_of(css);
            let filter = row_filter_of(cscan);
            let args = list::nth::<pg_sys::List>(cscan.custom_exprs, 3);
            let kinds = list::nth::<pg_sys::List>(cscan.custom_private, ScanPlan::LEN);
            let ps = &mut (*css).ss.ps;
            let aggregates = (0..list::len(kinds))
                .map(|i| {
                    let arg = list::nth::<pg_sys::Expr>(args, i);
                    Aggregate {
                        kind: AggKind::from_i32(list::int_at(kinds, i)),
                        arg: pg_sys::ExecInitExpr(arg, ps),
                        arg_type: pg_sys::exprType(arg.cast()),
                    }
                })
                .collect();
            RangeAggScan {
                row_desc: row_type_copy(rel_type_id(table.relid)),
                row_filter: pg_sys::ExecInitQual(filter, ps),
                table,
                aggregates,
                results: None,
                reads: None,
                next: 0,
            }
        }
    }

    unsafe fn next_row(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> bool {
        if self.results.is_none() {
            // SAFETY: the trait's contract.
            self.results = Some(unsafe { self.compute(css, slot) });
        }
        let results = self.results.as_ref().expect("computed above");
        let Some((snap, values, nulls)) = results.get(self.next) else {
            return false;
        };
        self.next += 1;
        let aggregates = values.iter().copied().zip(nulls.iter().copied());
        let columns = [
            (pg_sys::Datum::from(*snap as i64), false),
            (pg_sys::Datum::from(0usize), true),
        ]
        .into_iter()
        .chain(aggregates)
        .collect::<Vec<_>>();
        // SAFETY: the node's virtual scan slot: (snap_id, rec, aggregates...).
        unsafe { tuple::store_virtual(slot, columns) };
        true
    }

    fn reset(&mut self) {
        self.results = None;
        self.next = 0;
    }

    fn table(&mut self) -> &mut ScanTable {
        &mut self.table
    }
}

/// The running state of one aggregate: per position (one past the last too), the change of
/// the count of non-NULL values and of their sum.
struct Deltas {
    nonnull: Vec<i64>,
    sum: Vec<i128>,
}

impl RangeAggScan {
    /// Reads the range's versions and computes every snapshot's aggregates.
    ///
    /// # Safety
    /// `css` is the node, `slot` its scan slot.
    unsafe fn compute(
        &mut self,
        css: *mut pg_sys::CustomScanState,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> Vec<SnapshotResult> {
        // SAFETY: our node (the caller's promise).
        let (from, to) = unsafe {
            (
                self.table.snapshot_argument(css, 0),
                self.table.snapshot_argument(css, 1),
            )
        };
        // SAFETY: the table's current row type, copied at begin, lives with the query.
        let range = unsafe { RangeCursor::open(self.table.relid, from, to, self.row_desc) };
        let snaps: Vec<u64> = (0..range.len()).map(|p| range.snap_at(p)).collect();
        let mut cursor = VersionsCursor::new(range);
        let n = snaps.len();
        let mut rows = vec![0i64; n + 1];
        let mut deltas: Vec<Deltas> = self
            .aggregates
            .iter()
            .map(|_| Deltas {
                nonnull: vec![0; n + 1],
                sum: vec![0; n + 1],
            })
            .collect();
        // SAFETY: our node's expression context, set up by ExecInitCustomScan.
        let econtext = unsafe { (*css).ss.ps.ps_ExprContext };
        let filter = self.row_filter;
        let mut keep = move |rec: pg_sys::Datum, snap: u64| {
            filter.is_null() || {
                // SAFETY: our virtual scan slot (snap_id, rec, aggregates...); the row filter
                // was prepared for this node and reads it.
                unsafe {
                    store(slot, &[snap], rec);
                    expr::qual_holds(filter, econtext, slot)
                }
            }
        };
        let only_rows = self.aggregates.iter().all(|a| a.kind == AggKind::CountStar);
        while let Some((first, last, rec)) = cursor.next_run_at(&mut keep) {
            rows[first] += 1;
            rows[last + 1] -= 1;
            if only_rows {
                continue;
            }
            // SAFETY: as in `keep`: the arguments read the version from the slot.
            unsafe { store(slot, &[snaps[first]], rec) };
            // SAFETY: the slot holds the version for the arguments to read.
            unsafe { (*econtext).ecxt_scantuple = slot };
            for (a, d) in self.aggregates.iter().zip(deltas.iter_mut()) {
                if a.kind == AggKind::CountStar {
                    continue;
                }
                // SAFETY: the argument was prepared for this node and reads its scan slot.
                let Some(value) = (unsafe { expr::eval(a.arg, econtext) }) else {
                    continue;
                };
                d.nonnull[first] += 1;
                d.nonnull[last + 1] -= 1;
                let x = integer(value, a.arg_type);
                d.sum[first] += x;
                d.sum[last + 1] -= x;
            }
            // SAFETY: the per-tuple memory of the evaluations above.
            unsafe { pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory) };
        }
        self.reads = Some(cursor.reads());
        let mut out = Vec::new();
        let mut count = 0i64;
        let mut running: Vec<(i64, i128)> = vec![(0, 0); self.aggregates.len()];
        for (p, &snap) in snaps.iter().enumerate() {
            count += rows[p];
            for (r, d) in running.iter_mut().zip(&deltas) {
                r.0 += d.nonnull[p];
                r.1 += d.sum[p];
            }
            if count == 0 {
                continue;
            }
            let (values, nulls): (Vec<_>, Vec<_>) = self
                .aggregates
                .iter()
                .zip(&running)
                .map(|(a, &(nonnull, sum))| result(a.kind, count, nonnull, sum))
                .unzip();
            out.push((snap, values, nulls));
        }
        out
    }
}

/// The integer value of an argument of type `type_` (smallint, integer or bigint).
fn integer(value: pg_sys::Datum, type_: pg_sys::Oid) -> i128 {
    match type_ {
        pg_sys::INT2OID => i128::from(value.value() as i16),
        pg_sys::INT4OID => i128::from(value.value() as i32),
        _ => i128::from(value.value() as i64),
    }
}

/// An aggregate's value at one snapshot: (datum, is NULL).
fn result(kind: AggKind, rows: i64, nonnull: i64, sum: i128) -> (pg_sys::Datum, bool) {
    let null = (pg_sys::Datum::from(0usize), true);
    match kind {
        AggKind::CountStar => (pg_sys::Datum::from(rows), false),
        AggKind::Count => (pg_sys::Datum::from(nonnull), false),
        _ if nonnull == 0 => null,
        AggKind::SumToInt8 => match i64::try_from(sum) {
            Ok(v) => (pg_sys::Datum::from(v), false),
            Err(_) => error(
                PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
                "bigint out of range",
            )
            .raise(),
        },
        AggKind::SumToNumeric => (pg_sys::Datum::from(numeric(sum)), false),
        AggKind::Avg => {
            // SAFETY: the division numeric_div makes (errors raised, not returned), as
            // PostgreSQL's avg of integers calls it: the exact sum by the count.
            let avg = unsafe {
                pg_sys::numeric_div_opt_error(
                    numeric(sum),
                    numeric(i128::from(nonnull)),
                    std::ptr::null_mut(),
                )
            };
            (pg_sys::Datum::from(avg), false)
        }
    }
}

/// The numeric of the exact value `v` (in the current memory context).
fn numeric(v: i128) -> pg_sys::Numeric {
    const E18: i128 = 1_000_000_000_000_000_000;
    if let Ok(small) = i64::try_from(v) {
        // SAFETY: a numeric made from an integer.
        return unsafe { pg_sys::int64_to_numeric(small) };
    }
    // v = high * 10^18 + low, with |low| < 10^18; high is split the same way if it is large.
    let (high, low) = (v / E18, v % E18);
    // SAFETY: exact numeric arithmetic on numerics made from integers (errors raised).
    unsafe {
        let scale = pg_sys::int64_to_numeric(E18 as i64);
        let high = pg_sys::numeric_mul_opt_error(numeric(high), scale, std::ptr::null_mut());
        pg_sys::numeric_add_opt_error(high, numeric(low), std::ptr::null_mut())
    }
}
