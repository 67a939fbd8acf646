//! Custom scan paths for gsnap's readers in FROM.
//!
//! A set-returning function in FROM is a function scan, which materializes all its rows in a
//! tuplestore before the first one reaches the executor. A `set_rel_pathlist_hook`
//! recognizes a function RTE calling `gsnap_asof`, `gsnap_range`, `gsnap_versions` or `gsnap_diff` (by the C
//! function behind it, whatever its schema) and replaces the function scan with a streaming
//! custom scan.
//! Cases it does not handle keep the function scan, which returns the same rows: WITH
//! ORDINALITY, several functions in one RTE (ROWS FROM), LATERAL references, whole-row
//! references to a range or versions call, anything but plain Vars in the target list.

use super::deps::{reader_kind, table_of_call, Reader};
use super::nodes::{attributes_read, new_path, PathPlan, ScanKind};
use crate::ffi::catalog::partitioning;
use crate::ffi::list;
use crate::ffi::node::is_a;
use crate::ffi::relation::{relation_row_type, OpenRelation};
use pgrx::pg_sys;
use pgrx::prelude::*;

static mut PREV_SET_REL_PATHLIST: pg_sys::set_rel_pathlist_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any planning.
    unsafe {
        PREV_SET_REL_PATHLIST = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(set_rel_pathlist);
    }
}

/// Which scan a reader function gets.
fn scan_kind(funcid: pg_sys::Oid) -> Option<ScanKind> {
    match reader_kind(funcid)? {
        Reader::AsofId => Some(ScanKind::AsofId),
        Reader::AsofTime => Some(ScanKind::AsofTime),
        Reader::Range => Some(ScanKind::Range),
        Reader::Versions => Some(ScanKind::Versions),
        Reader::Diff => Some(ScanKind::Diff),
        Reader::DiffAt | Reader::DiffByKey => None,
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
    // SAFETY: the caller's promise; reading the entry and the relation.
    let plain_function = unsafe {
        (*rte).rtekind == pg_sys::RTEKind::RTE_FUNCTION
            && !(*rte).funcordinality
            && list::len((*rte).functions) == 1
            && (*rel).lateral_relids.is_null()
    };
    if !plain_function {
        return None;
    }
    // SAFETY: a function RTE's one RangeTblFunction, and its (valid) expression.
    let expr = unsafe { (*list::nth::<pg_sys::RangeTblFunction>((*rte).functions, 0)).funcexpr };
    // SAFETY: as above.
    if !unsafe { is_a(expr, pg_sys::NodeTag::T_FuncExpr) } {
        return None;
    }
    let func = expr.cast::<pg_sys::FuncExpr>();
    // SAFETY: a FuncExpr, checked above.
    let (funcid, args) = unsafe { ((*func).funcid, (*func).args) };
    let kind = scan_kind(funcid)?;
    // SAFETY: the call's argument list.
    (unsafe { list::len(args) } == 1 + kind.snapshot_args()).then_some((func, kind))
}

/// True if the query needs anything but plain Vars of the function's rows (a whole-row Var
/// is one: an AS OF scan hands out the row as a value too), or whole rows of a range or
/// versions call: the function scan serves those.
///
/// # Safety
/// The planner's relation.
unsafe fn needs_function_scan(
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    kind: ScanKind,
) -> bool {
    // SAFETY: the caller's promise: the planner's relation of the scan.
    let attrs = unsafe { attributes_read(rel, rti) };
    // SAFETY: as above; the target's expressions are nodes.
    let all_vars = unsafe {
        list::iter::<pg_sys::Node>((*(*rel).reltarget).exprs)
            .all(|n| is_a(n, pg_sys::NodeTag::T_Var))
    };
    (attrs.contains(0) && kind.rec_column().is_some()) || !all_vars
}

/// The planner hook: swaps the function scan of a reader call for the custom scan.
#[pg_guard]
unsafe extern "C-unwind" fn set_rel_pathlist(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: set once by `init`, before any planning.
    if let Some(prev) = unsafe { PREV_SET_REL_PATHLIST } {
        // SAFETY: the previous hook, given PostgreSQL's own arguments.
        unsafe { prev(root, rel, rti, rte) };
    }
    // SAFETY: the planner's relation and range-table entry.
    let Some((func, kind)) = (unsafe { reader_call(rel, rte) }) else {
        return;
    };
    // SAFETY: a FuncExpr of one of gsnap's readers (reader_call checked).
    let Some(relid) = (unsafe { table_of_call(func) }) else {
        return;
    };
    // SAFETY: the planner's relation and its range-table index.
    if unsafe { needs_function_scan(rel, rti, kind) } {
        return; // the function scan serves the query
    }
    let Some(table) = OpenRelation::open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) else {
        return;
    };
    // Estimate the rows from the table's current size (a range: as if of 10 snapshots; its
    // versions: as if a tenth of the rows changed in each; a diff: a tenth of the rows).
    let per_table = match kind {
        ScanKind::Range | ScanKind::RangeAggregate => 10.0,
        ScanKind::Versions => 2.0,
        ScanKind::AsofId | ScanKind::AsofTime => 1.0,
        ScanKind::Diff => 0.1,
    };
    let partitioned = table.class().relkind as u8 == pg_sys::RELKIND_PARTITIONED_TABLE;
    let (tuples, pages) = if partitioned {
        partitions_size(relid)
    } else {
        table_size(&table)
    };
    let (tuples, pages) = (per_table * tuples.max(1.0), pages.max(1.0));
    // An AS OF, range or versions scan whose conditions fix the table's key reads only the
    // pages its key map names (`keymap.rs`), when the snapshots have one.
    let by_key = matches!(
        kind,
        ScanKind::AsofId
            | ScanKind::AsofTime
            | ScanKind::Range
            | ScanKind::Versions
    )
        // SAFETY: the open table, and the planner's conditions over the relation `rti`.
        && unsafe {
            let rec = kind.rec_column().map(|c| c as i16);
            let column_of =
                |n| crate::keymap::column_of(n, rti as i32, rec, &|a: i16| Some(a));
            crate::keymap::KeyConditions::find(table.as_ptr(), (*rel).baserestrictinfo, &column_of)
                .is_some()
        };
    drop(table);
    // SAFETY: the planner's state and the relation's conditions.
    let rows = unsafe {
        let selectivity = pg_sys::clauselist_selectivity(
            root,
            (*rel).baserestrictinfo,
            0,
            pg_sys::JoinType::JOIN_INNER,
            std::ptr::null_mut(),
        );
        pg_sys::clamp_row_est(tuples * selectivity)
    };
    // SAFETY: the call's argument list: the table's NULL::t, then the snapshot arguments,
    // copied into the path.
    let args = unsafe {
        list::iter::<pg_sys::Node>((*func).args)
            .skip(1)
            .map(|arg| pg_sys::copyObjectImpl(arg.cast()))
            .collect()
    };
    // SAFETY: the planner's relation, which the path scans.
    let pathtarget = unsafe {
        (*rel).rows = rows;
        (*rel).reltarget
    };
    let private = PathPlan { relid, kind, args }.encode();
    let cost = if by_key {
        // About a page per row found.
        scan_cost(rows.min(pages), rows, 1.0)
    } else {
        scan_cost(pages, tuples, 1.0)
    };
    let path = new_path(kind, private, rel, pathtarget, rows, cost);
    // SAFETY: the planner's relation: the scan may run in a parallel worker if everything
    // the relation computes may (the reader function is PARALLEL SAFE).
    let parallel_safe = unsafe { (*rel).consider_parallel };
    // SAFETY: the path just made.
    unsafe { (*path).path.parallel_safe = parallel_safe };
    // SAFETY: the planner's state and relation.
    unsafe { replace_paths(root, rel, relid, path) };
    // The aggregate node and the diff stay serial.
    let parallel_aware = matches!(
        kind,
        ScanKind::AsofId | ScanKind::AsofTime | ScanKind::Range | ScanKind::Versions
    );
    if parallel_aware && parallel_safe && !by_key {
        // SAFETY: the planner's relation; `private` is a valid plan encoding.
        unsafe { add_parallel_path(rel, kind, private, (tuples, pages), rows) };
    }
}

/// Adds the parallel-aware AS OF, range or versions scan of a table as a partial path of
/// `rel` (a Gather above it collects the participants' rows), costed as PostgreSQL costs a
/// parallel sequential scan: the pages read once between the participants, the rows' CPU
/// divided among them.
///
/// # Safety
/// The planner's relation, whose scan may run in parallel workers.
unsafe fn add_parallel_path(
    rel: *mut pg_sys::RelOptInfo,
    kind: ScanKind,
    private: *mut pg_sys::List,
    (tuples, pages): (f64, f64),
    rows: f64,
) {
    // SAFETY: the planner's relation and this backend's settings.
    let workers = unsafe {
        pg_sys::compute_parallel_worker(rel, pages, -1.0, pg_sys::max_parallel_workers_per_gather)
    };
    if workers <= 0 {
        return;
    }
    // SAFETY: reading a planner setting (GUC) of this backend.
    let divisor = parallel_divisor(workers, unsafe { pg_sys::parallel_leader_participation });
    let cost = scan_cost(pages, tuples, divisor);
    // SAFETY: the planner's relation (the caller's promise).
    let target = unsafe { (*rel).reltarget };
    let path = new_path(kind, private, rel, target, rows / divisor, cost);
    // SAFETY: the path just made, added to the relation's partial paths.
    unsafe {
        (*path).path.parallel_aware = true;
        (*path).path.parallel_safe = true;
        (*path).path.parallel_workers = workers;
        pg_sys::add_partial_path(rel, path.cast());
    }
}

/// The cost of a scan reading `pages` pages and forming `tuples` rows, the rows' CPU divided
/// among `participants` (1 for a serial scan): no startup cost, as for a sequential scan.
fn scan_cost(pages: f64, tuples: f64, participants: f64) -> (f64, f64) {
    // SAFETY: reading two planner settings (GUCs) of this backend.
    let (seq_page_cost, cpu_tuple_cost) =
        unsafe { (pg_sys::seq_page_cost, pg_sys::cpu_tuple_cost) };
    (
        0.0,
        pages * seq_page_cost + tuples * cpu_tuple_cost / participants,
    )
}

/// The share of a parallel scan's rows each participant is expected to produce, as
/// PostgreSQL's planner counts it: the workers, plus the leader's part when it takes one
/// (less the more workers it must also collect rows from).
fn parallel_divisor(workers: i32, leader_participates: bool) -> f64 {
    let leader = if leader_participates {
        (1.0 - 0.3 * f64::from(workers)).max(0.0)
    } else {
        0.0
    };
    f64::from(workers) + leader
}

/// The rows and pages PostgreSQL's planner would estimate for `table` now: its statistics,
/// or, never analyzed, its blocks times a tuple density from its columns' widths.
fn table_size(table: &OpenRelation) -> (f64, f64) {
    let (mut pages, mut tuples, mut all_visible) = (0, 0.0, 0.0);
    // SAFETY: an open table; the estimate reads its size and statistics.
    unsafe {
        pg_sys::estimate_rel_size(
            table.as_ptr(),
            std::ptr::null_mut(),
            &mut pages,
            &mut tuples,
            &mut all_visible,
        )
    };
    (tuples, f64::from(pages))
}

/// The rows and pages of the partitions a partitioned table has now, each estimated as
/// PostgreSQL's planner estimates a table ([`table_size`]; a partition never analyzed is
/// estimated from its size, as the planner does for a live query of the partitioned
/// table). Each is locked as that planning locks it (ACCESS SHARE, until the transaction
/// ends).
fn partitions_size(relid: pg_sys::Oid) -> (f64, f64) {
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: the tables below `relid`, locked as they are listed.
    let all = unsafe {
        list::oids(partitioning::find_all_inheritors(
            relid,
            lock,
            std::ptr::null_mut(),
        ))
    };
    let (mut tuples, mut pages) = (0.0, 0.0);
    for oid in all {
        // (None: dropped since it was listed.)
        let Some(part) = OpenRelation::open(oid, lock) else {
            continue;
        };
        if part.class().relkind as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
            let (t, p) = table_size(&part);
            tuples += t.max(0.0);
            pages += p;
        }
    }
    (tuples, pages)
}

/// Makes `path` the only path of `rel`, and the plan depend on table `relid` and its row
/// type: a schema change replans it (the query itself depends on the table too, see
/// deps.rs).
///
/// # Safety
/// The planner's state and relation, and a path of that relation.
unsafe fn replace_paths(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    relid: pg_sys::Oid,
    path: *mut pg_sys::CustomPath,
) {
    // SAFETY: the caller's promise; the dependency lists live in the planner's memory.
    unsafe {
        let glob = (*root).glob;
        (*glob).relationOids = pg_sys::lappend_oid((*glob).relationOids, relid);
        pg_sys::record_plan_type_dependency(root, relation_row_type(relid));
        // The function scan returns the same rows, later and slower: drop it.
        (*rel).pathlist = std::ptr::null_mut();
        (*rel).partial_pathlist = std::ptr::null_mut();
        pg_sys::add_path(rel, path.cast());
    }
}
