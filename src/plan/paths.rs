//! Custom scan paths for gsnap's readers in FROM.
//!
//! A set-returning function in FROM is a function scan, which materializes all its rows in a
//! tuplestore before the first one reaches the executor. A `set_rel_pathlist_hook`
//! recognizes a function RTE calling `gsnap_asof` or `gsnap_range` (by the C function behind
//! it, whatever its schema) and replaces the function scan with a streaming custom scan.
//! Cases it does not handle keep the function scan, which returns the same rows: WITH
//! ORDINALITY, several functions in one RTE (ROWS FROM), LATERAL references, whole-row
//! references, anything but plain Vars in the target list.

use super::deps::{reader_kind, Reader};
use super::nodes::{path_methods, ScanKind};
use crate::ffi::list::{self, int_node, list_of};
use crate::ffi::relation::{relation_kind, OpenRelation};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;

static mut PREV_SET_REL_PATHLIST: pg_sys::set_rel_pathlist_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any planning.
    unsafe {
        PREV_SET_REL_PATHLIST = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(set_rel_pathlist);
    }
}

/// Which scan a reader function gets, if any (`gsnap_diff` keeps its function scan).
fn scan_kind(funcid: pg_sys::Oid) -> Option<ScanKind> {
    match reader_kind(funcid)? {
        Reader::AsofId => Some(ScanKind::AsofId),
        Reader::AsofTime => Some(ScanKind::AsofTime),
        Reader::Range => Some(ScanKind::Range),
        Reader::Diff => None,
    }
}

/// The reader call of a function RTE the custom scan can take over: the call and its kind.
///
/// # Safety
/// The planner's RTE and relation.
unsafe fn reader_call(
    rel: *mut pg_sys::RelOptInfo,
    rte: *mut pg_sys::RangeTblEntry,
) -> Option<(*mut pg_sys::FuncExpr, ScanKind)> {
    // SAFETY: reading planner nodes.
    unsafe {
        if (*rte).rtekind != pg_sys::RTEKind::RTE_FUNCTION
            || (*rte).funcordinality
            || list::len((*rte).functions) != 1
            || !(*rel).lateral_relids.is_null()
        {
            return None;
        }
        let rtfunc = list::nth::<pg_sys::RangeTblFunction>((*rte).functions, 0);
        let expr = (*rtfunc).funcexpr;
        if (*expr).type_ != pg_sys::NodeTag::T_FuncExpr {
            return None;
        }
        let func = expr.cast::<pg_sys::FuncExpr>();
        let kind = scan_kind((*func).funcid)?;
        (list::len((*func).args) == 1 + kind.snapshot_args()).then_some((func, kind))
    }
}

/// True if the query needs the function's rows as whole values, or anything but plain Vars
/// of them: the function scan serves those.
///
/// # Safety
/// The planner's relation.
unsafe fn needs_function_scan(rel: *mut pg_sys::RelOptInfo, rti: pg_sys::Index) -> bool {
    // SAFETY: reading planner nodes.
    unsafe {
        let exprs = (*(*rel).reltarget).exprs;
        let mut attrs: *mut pg_sys::Bitmapset = std::ptr::null_mut();
        pg_sys::pull_varattnos(exprs.cast(), rti, &mut attrs);
        for ri in list::iter::<pg_sys::RestrictInfo>((*rel).baserestrictinfo) {
            pg_sys::pull_varattnos((*ri).clause.cast(), rti, &mut attrs);
        }
        let whole_row = 0 - pg_sys::FirstLowInvalidHeapAttributeNumber;
        pg_sys::bms_is_member(whole_row, attrs)
            || list::iter::<pg_sys::Node>(exprs).any(|n| (*n).type_ != pg_sys::NodeTag::T_Var)
    }
}

/// The planner hook: swaps the function scan of a reader call for the custom scan.
#[pg_guard]
unsafe extern "C-unwind" fn set_rel_pathlist(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: the planner's arguments; we read them and replace the relation's paths.
    unsafe {
        if let Some(prev) = PREV_SET_REL_PATHLIST {
            prev(root, rel, rti, rte);
        }
        let Some((func, kind)) = reader_call(rel, rte) else {
            return;
        };
        let Some(relid) = crate::plan::deps::table_of_call(func) else {
            return;
        };
        if relation_kind(relid) == Some(pg_sys::RELKIND_PARTITIONED_TABLE)
            || needs_function_scan(rel, rti)
        {
            return; // the function raises the right error, or serves the query
        }
        let Some(table) = OpenRelation::open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        else {
            return;
        };
        // Estimate the rows from the table's current size (a range: as if of 10 snapshots).
        let per_table = if kind == ScanKind::Range { 10.0 } else { 1.0 };
        let tuples = per_table * f64::from(table.class().reltuples).max(1.0);
        let pages = f64::from(table.class().relpages.max(1));
        drop(table);
        (*rel).rows = pg_sys::clamp_row_est(
            tuples
                * pg_sys::clauselist_selectivity(
                    root,
                    (*rel).baserestrictinfo,
                    0,
                    pg_sys::JoinType::JOIN_INNER,
                    std::ptr::null_mut(),
                ),
        );
        let path =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()).cast::<pg_sys::CustomPath>();
        (*path).path.type_ = pg_sys::NodeTag::T_CustomPath;
        (*path).path.pathtype = pg_sys::NodeTag::T_CustomScan;
        (*path).path.parent = rel;
        (*path).path.pathtarget = (*rel).reltarget;
        (*path).path.rows = (*rel).rows;
        (*path).path.startup_cost = 0.0;
        (*path).path.total_cost = pages * pg_sys::seq_page_cost + tuples * pg_sys::cpu_tuple_cost;
        let mut private: Vec<*mut c_void> =
            vec![int_node(relid.to_u32() as i32), int_node(kind as i32)];
        for i in 1..=kind.snapshot_args() {
            private.push(pg_sys::copyObjectImpl(list::nth::<c_void>((*func).args, i)));
        }
        (*path).custom_private = list_of(&private);
        (*path).methods = path_methods(kind);
        // The plan depends on the table and its row type: a schema change replans it (the
        // query itself depends on the table too, see deps.rs).
        let glob = (*root).glob;
        (*glob).relationOids = pg_sys::lappend_oid((*glob).relationOids, relid);
        pg_sys::record_plan_type_dependency(root, pg_sys::get_rel_type_id(relid));
        // The function scan returns the same rows, later and slower: drop it.
        (*rel).pathlist = std::ptr::null_mut();
        (*rel).partial_pathlist = std::ptr::null_mut();
        pg_sys::add_path(rel, path.cast());
    }
}
