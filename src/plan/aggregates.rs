//! Per-snapshot aggregates at the cost of the versions (issue 9, point 2).
//!
//! `SELECT snap_id, count(*), sum((rec).x) FROM gsnap_range(NULL::t, a, b) GROUP BY snap_id`
//! would aggregate every row of every snapshot: versions x snapshots. A
//! `create_upper_paths_hook` recognizes that shape and offers a "gsnap range aggregate" path
//! for the grouping instead: it reads each row version once with its run of snapshots
//! (`read::versions`) and adds its value to the run as a whole (a difference array over the
//! snapshots: +x at the run's first snapshot, -x after its last), so the work follows the
//! distinct versions, not the rows of every snapshot. The results are exactly PostgreSQL's:
//! integer arithmetic, and `avg` divides the exact sum by the count with `numeric_div`, as
//! PostgreSQL's own `avg` does.
//!
//! Recognized: one grouping column, the range's `snap_id`; aggregates `count(*)`,
//! `count(x)`, `sum(x)` and `avg(x)` of `smallint`, `integer` and `bigint` values, `x` any
//! expression of `rec` alone (no DISTINCT, ORDER BY or FILTER); conditions on `rec` alone (the
//! Row Filter); any expression over those aggregates and `snap_id` in the select list. Any
//! other query (min/max, HAVING, conditions on `snap_id`, sums of numeric or float values
//! whose rounding or display scale would depend on the order) keeps PostgreSQL's own
//! aggregation over the range scan, with the same results.

use super::nodes::{
    new_path, path_methods, row_type_signature, split_range_conditions, PathPlan, ScanKind,
    ScanPlan,
};
use crate::ffi::list::{self, int_node, list_of};
use crate::ffi::node::{is_a, palloc_node};
use crate::ffi::relation::OpenRelation;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;

/// The aggregates the path computes, by the OID of their function in pg_proc (fixed in
/// PostgreSQL 15's catalog).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AggKind {
    /// `count(*)`.
    CountStar = 0,
    /// `count(x)`: the non-NULL values.
    Count = 1,
    /// `sum(smallint)`, `sum(integer)`: bigint.
    SumToInt8 = 2,
    /// `sum(bigint)`: numeric.
    SumToNumeric = 3,
    /// `avg(smallint)`, `avg(integer)`, `avg(bigint)`: numeric.
    Avg = 4,
}

impl AggKind {
    /// The kind of aggregate function `fnoid`, if the path computes it.
    fn of(fnoid: pg_sys::Oid) -> Option<AggKind> {
        Some(match fnoid.to_u32() {
            2803 => AggKind::CountStar,
            2147 => AggKind::Count,
            2108 | 2109 => AggKind::SumToInt8,
            2107 => AggKind::SumToNumeric,
            2100..=2102 => AggKind::Avg,
            _ => return None,
        })
    }

    /// The kind encoded by `v` (see [`AggKind`]'s discriminants).
    pub fn from_i32(v: i32) -> AggKind {
        match v {
            0 => AggKind::CountStar,
            1 => AggKind::Count,
            2 => AggKind::SumToInt8,
            3 => AggKind::SumToNumeric,
            _ => AggKind::Avg,
        }
    }
}

static mut PREV_CREATE_UPPER_PATHS: pg_sys::create_upper_paths_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any planning.
    unsafe {
        PREV_CREATE_UPPER_PATHS = pg_sys::create_upper_paths_hook;
        pg_sys::create_upper_paths_hook = Some(create_upper_paths);
    }
}

/// The range scan path of `rel`, if its cheapest path is one (under the projection the
/// planner puts over it when the query's columns come in another order).
///
/// # Safety
/// The planner's relation.
unsafe fn range_path(rel: *mut pg_sys::RelOptInfo) -> Option<*mut pg_sys::CustomPath> {
    // SAFETY: the caller's promise: the relation's path list.
    let paths = unsafe { (*rel).pathlist };
    // SAFETY: a path list holds paths.
    let mut path = unsafe { list::iter::<pg_sys::Path>(paths).next() }?;
    // SAFETY: a path; a ProjectionPath if its type says so.
    while unsafe { is_a(path.cast(), pg_sys::NodeTag::T_ProjectionPath) } {
        // SAFETY: as above.
        path = unsafe { (*path.cast::<pg_sys::ProjectionPath>()).subpath };
    }
    // SAFETY: a path; a CustomPath if its type says so.
    unsafe {
        if !is_a(path.cast(), pg_sys::NodeTag::T_CustomPath) {
            return None;
        }
        let custom = path.cast::<pg_sys::CustomPath>();
        std::ptr::eq((*custom).methods, path_methods(ScanKind::Range)).then_some(custom)
    }
}

/// True if `node` is the Var of column `attno` of range-table entry `rti`.
///
/// # Safety
/// `node` is an expression node.
unsafe fn is_column(node: *mut pg_sys::Node, rti: pg_sys::Index, attno: i16) -> bool {
    // SAFETY: the caller's promise; a Var if its tag says so.
    unsafe {
        is_a(node.cast(), pg_sys::NodeTag::T_Var) && {
            let var = node.cast::<pg_sys::Var>();
            (*var).varno as pg_sys::Index == rti
                && (*var).varattno == attno
                && (*var).varlevelsup == 0
        }
    }
}

/// The aggregate `aggref` if the path computes it: its kind and its argument (null for
/// `count(*)`), an expression of `rec` alone.
///
/// # Safety
/// `aggref` is an Aggref of the query being planned.
unsafe fn supported(
    aggref: *mut pg_sys::Aggref,
    rti: pg_sys::Index,
) -> Option<(AggKind, *mut c_void)> {
    // SAFETY: the caller's promise.
    let a = unsafe { &*aggref };
    let kind = AggKind::of(a.aggfnoid)?;
    let plain = a.aggdistinct.is_null()
        && a.aggorder.is_null()
        && a.aggfilter.is_null()
        && a.aggdirectargs.is_null()
        && a.agglevelsup == 0
        && a.aggkind == b'n' as std::ffi::c_char
        && a.aggsplit == pg_sys::AggSplit::AGGSPLIT_SIMPLE;
    if !plain {
        return None;
    }
    if kind == AggKind::CountStar {
        return Some((kind, std::ptr::null_mut()));
    }
    // SAFETY: an aggregate's arguments are TargetEntries.
    let args: Vec<*mut pg_sys::TargetEntry> = unsafe { list::iter(a.args).collect() };
    let [arg] = args[..] else {
        return None;
    };
    // SAFETY: the argument's expression.
    let expr = unsafe { (*arg).expr };
    let mut attrs = crate::ffi::node::VarAttnos::new(rti);
    // SAFETY: an expression of the query.
    let volatile = unsafe {
        attrs.add(expr.cast());
        pg_sys::contain_volatile_functions(expr.cast())
    };
    (!volatile && !attrs.contains(1) && !attrs.contains(0)).then_some((kind, expr.cast()))
}

/// The planner hook: offers the aggregate path for a grouping by `snap_id` of a range scan.
#[pg_guard]
unsafe extern "C-unwind" fn create_upper_paths(
    root: *mut pg_sys::PlannerInfo,
    stage: pg_sys::UpperRelationKind::Type,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut c_void,
) {
    // SAFETY: set once by `init`, before any planning.
    if let Some(prev) = unsafe { PREV_CREATE_UPPER_PATHS } {
        // SAFETY: the previous hook, given PostgreSQL's own arguments.
        unsafe { prev(root, stage, input_rel, output_rel, extra) };
    }
    if stage != pg_sys::UpperRelationKind::UPPERREL_GROUP_AGG {
        return;
    }
    // SAFETY: the planner's state; for this stage `extra` is a GroupPathExtraData.
    if let Some(path) = unsafe { aggregate_path(root, input_rel, output_rel, extra.cast()) } {
        // SAFETY: a path of the grouping relation, in the planner's memory.
        unsafe { pg_sys::add_path(output_rel, path.cast()) };
    }
}

/// The aggregate path for this grouping, if the query has the shape it computes.
///
/// # Safety
/// The planner's state at the grouping stage.
unsafe fn aggregate_path(
    root: *mut pg_sys::PlannerInfo,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut pg_sys::GroupPathExtraData,
) -> Option<*mut pg_sys::CustomPath> {
    // SAFETY: the caller's promise: the query, the relations and the grouping's extra data.
    unsafe {
        let parse = (*root).parse;
        let simple = (*input_rel).reloptkind == pg_sys::RelOptKind::RELOPT_BASEREL
            && (*parse).groupingSets.is_null()
            && list::len((*parse).groupClause) == 1
            && (*extra).havingQual.is_null()
            && !(*parse).hasTargetSRFs;
        if !simple {
            return None;
        }
        let range = range_path(input_rel)?;
        let plan = PathPlan::decode((*range).custom_private);
        // A partitioned table is read partition by partition (`read::partitioned`); the
        // aggregate node reads one table.
        if crate::ffi::relation::relation_kind(plan.relid)
            == Some(pg_sys::RELKIND_PARTITIONED_TABLE)
        {
            return None;
        }
        // Row-level security: the range scan below applies the policies to each row; the
        // aggregate node has no place for them.
        let check_as = super::security::check_as_user(root, (*input_rel).relid as i32);
        let rls = pg_sys::check_enable_rls(plan.relid, check_as, true);
        if rls != pg_sys::CheckEnableRlsResult::RLS_NONE as i32 {
            return None;
        }
        // Likewise a role with grants on some columns only: the range scan checks the
        // columns the query reads; the aggregate node would need them all.
        let user = crate::sql::access::effective_user(check_as);
        let select = pg_sys::pg_class_aclcheck(plan.relid, user, pg_sys::ACL_SELECT);
        if select != pg_sys::AclResult::ACLCHECK_OK {
            return None;
        }
        let rti = (*input_rel).relid;
        // The grouping column is snap_id.
        let clause = list::nth::<pg_sys::SortGroupClause>((*parse).groupClause, 0);
        let group_expr = pg_sys::get_sortgroupclause_expr(clause, (*parse).targetList);
        if !is_column(group_expr.cast(), rti, 1) {
            return None;
        }
        // Conditions on rec alone only: they become the Row Filter.
        let quals = pg_sys::extract_actual_clauses((*input_rel).baserestrictinfo, false);
        let (per_version, per_row) = split_range_conditions(quals, rti as i32, 2);
        if !per_row.is_empty() {
            return None;
        }
        // The grouping target: snap_id and expressions over supported aggregates of rec.
        let target = (*output_rel).reltarget;
        let mut aggs: Vec<(AggKind, *mut c_void, *mut c_void)> = Vec::new();
        for expr in list::iter::<pg_sys::Node>((*target).exprs) {
            let flags = pg_sys::PVC_INCLUDE_AGGREGATES as i32;
            for node in list::iter::<pg_sys::Node>(pg_sys::pull_var_clause(expr, flags)) {
                if is_a(node.cast(), pg_sys::NodeTag::T_Aggref) {
                    let (kind, arg) = supported(node.cast(), rti)?;
                    if !aggs
                        .iter()
                        .any(|a| pg_sys::equal(a.1.cast_const().cast(), node.cast()))
                    {
                        aggs.push((kind, node.cast(), arg));
                    }
                } else if !is_column(node, rti, 1) {
                    return None;
                }
            }
        }
        let mut private = vec![
            int_node(plan.relid.to_u32() as i32),
            int_node(ScanKind::RangeAggregate as i32),
        ];
        private.extend_from_slice(&plan.args);
        private.push(list_of(&per_version).cast());
        let kinds: Vec<*mut c_void> = aggs.iter().map(|a| int_node(a.0 as i32)).collect();
        private.push(list_of(&kinds).cast());
        let exprs: Vec<*mut c_void> = aggs.iter().map(|a| a.1).collect();
        private.push(list_of(&exprs).cast());
        let args: Vec<*mut c_void> = aggs
            .iter()
            .map(|a| {
                if a.2.is_null() {
                    pg_sys::makeNullConst(pg_sys::INT4OID, -1, pg_sys::InvalidOid).cast()
                } else {
                    a.2
                }
            })
            .collect();
        private.push(list_of(&args).cast());
        private.push(int_node(rti as i32));
        private.push(int_node(check_as.to_u32() as i32));
        // Cheaper than aggregating the range's rows: about the versions, a tenth of them.
        let cost = (*range).path.total_cost * 0.1;
        Some(new_path(
            ScanKind::RangeAggregate,
            list_of(&private),
            output_rel,
            target,
            10.0,
            (cost, cost),
        ))
    }
}

/// The private list of an aggregate path, decoded.
struct AggregatePlan {
    relid: pg_sys::Oid,
    from: *mut c_void,
    to: *mut c_void,
    row_filter: *mut pg_sys::List,
    kinds: *mut pg_sys::List,
    aggrefs: *mut pg_sys::List,
    args: *mut pg_sys::List,
    rti: i32,
    /// The role whose privileges the scan checks (a view's owner; InvalidOid: the current
    /// user), as in `ScanPlan`.
    check_as: pg_sys::Oid,
}

impl AggregatePlan {
    /// Decodes the list `aggregate_path` made.
    ///
    /// # Safety
    /// `private` is the private list of an aggregate path.
    unsafe fn decode(private: *mut pg_sys::List) -> AggregatePlan {
        // SAFETY: the caller's promise: the layout written by `aggregate_path`.
        unsafe {
            AggregatePlan {
                relid: pg_sys::Oid::from(list::int_at(private, 0) as u32),
                from: list::nth(private, 2),
                to: list::nth(private, 3),
                row_filter: list::nth(private, 4),
                kinds: list::nth(private, 5),
                aggrefs: list::nth(private, 6),
                args: list::nth(private, 7),
                rti: list::int_at(private, 8),
                check_as: pg_sys::Oid::from(list::int_at(private, 9) as u32),
            }
        }
    }
}

/// Builds the "gsnap range aggregate" node of an aggregate path: its scan tuple is
/// `(snap_id, rec, aggregate...)`, which the target list's expressions refer to; its
/// `custom_exprs` are the snapshot arguments, the Row Filter, and the aggregates' arguments
/// (expressions of `rec`); its private list adds the aggregates' kinds.
///
/// # Safety
/// `best_path` is an aggregate path; `tlist` its target list.
pub(super) unsafe fn plan_aggregate(
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: the caller's promise.
    let (plan, flags) = unsafe {
        (
            AggregatePlan::decode((*best_path).custom_private),
            (*best_path).flags,
        )
    };
    let mut scan_tlist = super::nodes::snap_id_and_rec_entries(plan.relid, plan.rti);
    // SAFETY: the path's aggregates (Aggref nodes of the query).
    for (i, aggref) in unsafe { list::iter::<c_void>(plan.aggrefs) }.enumerate() {
        // SAFETY: a node constructor; the name is copied.
        let entry = unsafe {
            pg_sys::makeTargetEntry(aggref.cast(), (i + 3) as i16, std::ptr::null_mut(), false)
        };
        scan_tlist.push(entry.cast());
    }
    let table = OpenRelation::open(plan.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        .expect("the planner holds a lock on the table it plans");
    let scan_plan = ScanPlan {
        relid: plan.relid,
        kind: ScanKind::RangeAggregate,
        signature: row_type_signature(&table),
        columns: None,
        rls_user: pg_sys::InvalidOid,
        check_as: plan.check_as,
    };
    // SAFETY: appending to the list just made, in the current memory context.
    let private = unsafe { pg_sys::lappend(scan_plan.encode(), plan.kinds.cast()) };
    let mut cscan = pg_sys::CustomScan {
        flags,
        methods: super::nodes::scan_methods(ScanKind::RangeAggregate),
        custom_exprs: list_of(&[plan.from, plan.to, plan.row_filter.cast(), plan.args.cast()]),
        custom_private: private,
        custom_scan_tlist: list_of(&scan_tlist),
        ..Default::default()
    };
    cscan.scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
    cscan.scan.plan.targetlist = tlist;
    palloc_node(cscan).cast()
}
