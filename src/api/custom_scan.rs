//! A custom scan for `FROM gsnap_asof(NULL::t, ...)`: it streams rows to the executor like a
//! sequential scan, instead of materializing the whole result in a tuplestore first (which a
//! set-returning function in FROM always does). `FROM gsnap_range(NULL::t, a, b)` gets one
//! too ("gsnap range"): it streams `(snap_id, rec)` rows from a [`RangeCursor`], forming each
//! row's `rec` once for the run of snapshots that share its page image, and evaluates the
//! query's conditions on `rec` alone (`WHERE (rec).id = 42`) once per such row instead of once
//! per snapshot, so a filtered range costs what its distinct rows cost.
//!
//! A `set_rel_pathlist_hook` recognizes a function RTE that calls gsnap_asof (by the C
//! function behind it, whatever its schema) and replaces the function scan with this path;
//! cases it does not handle (WITH ORDINALITY, LATERAL references, whole-row references)
//! keep the function scan, which returns the same rows. At execution the scan checks the
//! same things the function does (database, SELECT privilege, row-level security), then reads
//! the snapshot page by page (`PageReader`). When the row type recorded at the snapshot is
//! the table's current one (no dropped columns, no changed types, no defaults of added
//! columns to fill in), each visible tuple is handed to the executor in place, straight from
//! the pinned page image in shared memory, like a heap scan hands out buffer tuples; other
//! tuples go through the decoder.

use super::access::{relation_name, require_gsnap_database, require_read_access};
use super::asof::resolve_time;
use super::deps::{reader_kind, Reader};
use super::decode::Decoder;
use super::scan::{table_at, PageReader};
use super::sets::RangeCursor;
use crate::error::error;
use gsnap_format::view;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Unguarded declarations of the calls made for every row (they cannot raise an ERROR
/// here: the slot is ours and of the right kind), to spare the per-call error trap.
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

/// The methods tables PostgreSQL calls us through (they must live for the process).
struct Methods {
    path: pg_sys::CustomPathMethods,
    scan: pg_sys::CustomScanMethods,
    exec: pg_sys::CustomExecMethods,
}

// SAFETY: immutable after construction; only C string pointers to statics and functions.
unsafe impl Sync for Methods {}
// SAFETY: as above.
unsafe impl Send for Methods {}

static METHODS: OnceLock<[Methods; 2]> = OnceLock::new();
static mut PREV_SET_REL_PATHLIST: pg_sys::set_rel_pathlist_hook_type = None;

/// What a scan reads: `gsnap_asof` by snapshot id or by time, or `gsnap_range`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    AsofId = 0,
    AsofTime = 1,
    Range = 2,
}

impl Kind {
    fn from_i32(v: i32) -> Kind {
        match v {
            0 => Kind::AsofId,
            1 => Kind::AsofTime,
            _ => Kind::Range,
        }
    }

    /// The arguments after the table's NULL::t.
    fn args(self) -> i32 {
        if self == Kind::Range {
            2
        } else {
            1
        }
    }
}

/// The methods of the AS OF scan (0) or of the range scan (1).
fn methods(kind: Kind) -> &'static Methods {
    let all = METHODS.get_or_init(|| {
        [c"gsnap AS OF", c"gsnap range"].map(|name| Methods {
            path: pg_sys::CustomPathMethods {
                CustomName: name.as_ptr(),
                PlanCustomPath: Some(plan_path),
                ReparameterizeCustomPathByChild: None,
            },
            scan: pg_sys::CustomScanMethods {
                CustomName: name.as_ptr(),
                CreateCustomScanState: Some(create_state),
            },
            exec: pg_sys::CustomExecMethods {
                CustomName: name.as_ptr(),
                BeginCustomScan: Some(begin_scan),
                ExecCustomScan: Some(exec_scan),
                EndCustomScan: Some(end_scan),
                ReScanCustomScan: Some(rescan),
                ExplainCustomScan: Some(explain),
                ..Default::default()
            },
        })
    });
    &all[usize::from(kind == Kind::Range)]
}

/// Installs the planner hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any planning.
    unsafe {
        pg_sys::RegisterCustomScanMethods(&methods(Kind::AsofId).scan);
        pg_sys::RegisterCustomScanMethods(&methods(Kind::Range).scan);
        PREV_SET_REL_PATHLIST = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(set_rel_pathlist);
    }
}

/// Which scan a reader function gets, if any (`gsnap_diff` keeps its function scan).
fn scan_kind(funcid: pg_sys::Oid) -> Option<Kind> {
    match reader_kind(funcid)? {
        Reader::AsofId => Some(Kind::AsofId),
        Reader::AsofTime => Some(Kind::AsofTime),
        Reader::Range => Some(Kind::Range),
        Reader::Diff => None,
    }
}

/// Integers in a plan node's private list.
fn int_node(v: i32) -> *mut c_void {
    // SAFETY: makeInteger allocates an Integer node in the current memory context.
    unsafe { pg_sys::makeInteger(v).cast() }
}

fn list_of(items: &[*mut c_void]) -> *mut pg_sys::List {
    let mut list = std::ptr::null_mut();
    for &i in items {
        // SAFETY: appending node pointers to a (possibly empty) list.
        list = unsafe { pg_sys::lappend(list, i) };
    }
    list
}

/// The planner hook: swaps the function scan of a gsnap_asof call for the custom scan.
#[pg_guard]
unsafe extern "C-unwind" fn set_rel_pathlist(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: the planner's arguments; we only read them and add a path.
    unsafe {
        if let Some(prev) = PREV_SET_REL_PATHLIST {
            prev(root, rel, rti, rte);
        }
        if (*rte).rtekind != pg_sys::RTEKind::RTE_FUNCTION
            || (*rte).funcordinality
            || pg_sys::list_length((*rte).functions) != 1
            || !(*rel).lateral_relids.is_null()
        {
            return;
        }
        let rtfunc = pg_sys::list_nth((*rte).functions, 0).cast::<pg_sys::RangeTblFunction>();
        let expr = (*rtfunc).funcexpr;
        if (*expr).type_ != pg_sys::NodeTag::T_FuncExpr {
            return;
        }
        let func = expr.cast::<pg_sys::FuncExpr>();
        let Some(kind) = scan_kind((*func).funcid) else {
            return;
        };
        if pg_sys::list_length((*func).args) != 1 + kind.args() {
            return;
        }
        // The table: the type of the first argument.
        let argtype = pg_sys::exprType(pg_sys::list_nth((*func).args, 0).cast());
        let relid = pg_sys::get_typ_typrelid(argtype);
        let relkind = if relid == pg_sys::InvalidOid {
            0
        } else {
            pg_sys::get_rel_relkind(relid) as u8
        };
        if relkind != pg_sys::RELKIND_RELATION && relkind != pg_sys::RELKIND_MATVIEW {
            return; // the function raises the right error
        }
        // Whole-row references need the row as one value: keep the function scan.
        let mut attrs: *mut pg_sys::Bitmapset = std::ptr::null_mut();
        pg_sys::pull_varattnos((*(*rel).reltarget).exprs.cast(), rti, &mut attrs);
        let quals = (*rel).baserestrictinfo;
        for i in 0..pg_sys::list_length(quals) {
            let ri = pg_sys::list_nth(quals, i).cast::<pg_sys::RestrictInfo>();
            pg_sys::pull_varattnos((*ri).clause.cast(), rti, &mut attrs);
        }
        let whole_row = 0 - pg_sys::FirstLowInvalidHeapAttributeNumber;
        if pg_sys::bms_is_member(whole_row, attrs) {
            return;
        }
        if has_placeholders((*(*rel).reltarget).exprs) {
            return;
        }
        // Estimate the rows from the table's current size (a range: as if of 10 snapshots).
        let class = pgrx::PgRelation::open(relid);
        let per_table = if kind == Kind::Range { 10.0 } else { 1.0 };
        let tuples = per_table * f64::from((*class.rd_rel).reltuples).max(1.0);
        let pages = f64::from((*class.rd_rel).relpages.max(1));
        drop(class);
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
        let mut private = vec![int_node(relid.to_u32() as i32), int_node(kind as i32)];
        for i in 1..=kind.args() {
            private.push(pg_sys::copyObjectImpl(
                pg_sys::list_nth((*func).args, i).cast(),
            ));
        }
        (*path).custom_private = list_of(&private);
        (*path).methods = &methods(kind).path;
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

/// True if `exprs` holds anything but plain Vars.
///
/// # Safety
/// `exprs` is a List of expression nodes.
unsafe fn has_placeholders(exprs: *mut pg_sys::List) -> bool {
    // SAFETY: reading node tags of a list.
    unsafe {
        (0..pg_sys::list_length(exprs)).any(|i| {
            let n = pg_sys::list_nth(exprs, i).cast::<pg_sys::Node>();
            (*n).type_ != pg_sys::NodeTag::T_Var
        })
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn plan_path(
    _root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    clauses: *mut pg_sys::List,
    _custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: building a plan node from our own path.
    unsafe {
        let private = (*best_path).custom_private;
        let relid = pg_sys::Oid::from(
            (*pg_sys::list_nth(private, 0).cast::<pg_sys::Integer>()).ival as u32,
        );
        let kind = Kind::from_i32((*pg_sys::list_nth(private, 1).cast::<pg_sys::Integer>()).ival);
        let args: Vec<*mut c_void> = (0..kind.args())
            .map(|i| pg_sys::list_nth(private, 2 + i))
            .collect();
        let cscan =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()).cast::<pg_sys::CustomScan>();
        (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cscan).scan.plan.targetlist = tlist;
        (*cscan).scan.scanrelid = 0;
        (*cscan).flags = (*best_path).flags;
        // The table's row type as planned, checked again at executor start.
        let rel_ = pg_sys::relation_open(relid, pg_sys::AccessShareLock as i32);
        let signature = row_type_signature((*rel_).rd_att);
        (*cscan).custom_private = list_of(&[
            pg_sys::list_nth(private, 0),
            pg_sys::list_nth(private, 1),
            signature.cast(),
        ]);
        (*cscan).methods = &methods(kind).scan;
        let quals = pg_sys::extract_actual_clauses(clauses, false);
        let rti = (*rel).relid;
        if kind == Kind::Range {
            // Conditions on `rec` alone are checked once per row and run of snapshots (in
            // custom_exprs, after the two snapshot arguments); the others once per result row.
            let (mut per_row, mut per_run) = (std::ptr::null_mut(), std::ptr::null_mut());
            for i in 0..pg_sys::list_length(quals) {
                let q = pg_sys::list_nth(quals, i);
                let mut attrs: *mut pg_sys::Bitmapset = std::ptr::null_mut();
                pg_sys::pull_varattnos(q.cast(), rti, &mut attrs);
                let snap_id = 1 - pg_sys::FirstLowInvalidHeapAttributeNumber;
                if pg_sys::bms_is_member(snap_id, attrs)
                    || pg_sys::contain_volatile_functions(q.cast())
                {
                    per_row = pg_sys::lappend(per_row, q);
                } else {
                    per_run = pg_sys::lappend(per_run, q);
                }
            }
            (*cscan).scan.plan.qual = per_row;
            (*cscan).custom_exprs = list_of(&[args[0], args[1], per_run.cast()]);
            let rec_type = pg_sys::get_rel_type_id(relid);
            let columns = [(1, pg_sys::INT8OID, c"snap_id"), (2, rec_type, c"rec")];
            let mut tl = std::ptr::null_mut();
            for (attno, type_, name) in columns {
                let var = pg_sys::makeVar(rti as i32, attno, type_, -1, pg_sys::InvalidOid, 0);
                let entry = pg_sys::makeTargetEntry(
                    var.cast(),
                    attno,
                    pg_sys::pstrdup(name.as_ptr()),
                    false,
                );
                tl = pg_sys::lappend(tl, entry.cast());
            }
            (*cscan).custom_scan_tlist = tl;
            pg_sys::relation_close(rel_, pg_sys::NoLock as i32);
            return cscan.cast();
        }
        (*cscan).scan.plan.qual = quals;
        (*cscan).custom_exprs = list_of(&args);
        // The scan tuple: the table's columns (dropped ones left out), as Vars of this RTE.
        let desc = (*rel_).rd_att;
        let mut tl = std::ptr::null_mut();
        let mut resno = 1;
        for a in (*desc).attrs.as_slice((*desc).natts as usize) {
            if a.attisdropped {
                continue;
            }
            let var = pg_sys::makeVar(
                rti as i32,
                a.attnum,
                a.atttypid,
                a.atttypmod,
                a.attcollation,
                0,
            );
            let name = pg_sys::pstrdup(a.attname.data.as_ptr());
            tl = pg_sys::lappend(
                tl,
                pg_sys::makeTargetEntry(var.cast(), resno, name, false).cast(),
            );
            resno += 1;
        }
        pg_sys::relation_close(rel_, pg_sys::NoLock as i32);
        (*cscan).custom_scan_tlist = tl;
        cscan.cast()
    }
}

/// The row type of a table as a plan records it: the number of attributes, then each
/// attribute's type (0 for a dropped one) and type modifier.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
unsafe fn row_type_signature(desc: pg_sys::TupleDesc) -> *mut pg_sys::List {
    // SAFETY: reading the descriptor's attributes.
    let attrs = unsafe { (*desc).attrs.as_slice((*desc).natts as usize) };
    let mut items = vec![int_node(attrs.len() as i32)];
    for a in attrs {
        let type_ = if a.attisdropped { 0 } else { a.atttypid.to_u32() };
        items.push(int_node(type_ as i32));
        items.push(int_node(a.atttypmod));
    }
    list_of(&items)
}

/// True if `desc` has the row type `signature` recorded.
///
/// # Safety
/// `signature` was made by [`row_type_signature`]; `desc` is valid.
unsafe fn same_row_type(signature: *mut pg_sys::List, desc: pg_sys::TupleDesc) -> bool {
    let now = unsafe { row_type_signature(desc) };
    // SAFETY: both are lists of Integer nodes.
    unsafe { pg_sys::equal(signature.cast(), now.cast()) }
}

/// The executor state: PostgreSQL's custom scan state, then ours.
#[repr(C)]
struct State {
    css: pg_sys::CustomScanState,
    node: *mut AsofNode,
}

/// What the node keeps between fetches. The scan itself is opened at the first fetch (and
/// again after a rescan): the snapshot arguments may use parameters (init plans, outer
/// references) that are only set by then.
struct AsofNode {
    relid: pg_sys::Oid,
    /// The table, open while the scan runs (closed by `end_scan`; on an ERROR, the
    /// transaction's abort releases it).
    rel: pg_sys::Relation,
    kind: Kind,
    /// The snapshot arguments (one for AS OF, two for a range), ready to evaluate.
    args: Vec<*mut pg_sys::ExprState>,
    /// The scan slot is a heap tuple slot (the table has no dropped columns, so rows of an
    /// unchanged row type can be handed out in place). AS OF only.
    heap_slot: bool,
    scan: Option<AsofScan>,
    /// A range: the conditions on `rec` alone (None: no such condition), and the open scan.
    rec_qual: *mut pg_sys::ExprState,
    range: Option<RangeScan>,
}

/// An open range scan: the cursor, and the row being handed out once per snapshot.
struct RangeScan {
    cursor: RangeCursor,
    /// The current row (owned by the cursor) and its snapshots left to hand out.
    rec: pg_sys::Datum,
    snaps: Vec<u64>,
    next_snap: usize,
}

#[pg_guard]
unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: a zeroed state with the node tag and methods set, as the API requires; the
    // plan's private list is ours (relation, kind).
    unsafe {
        let kind = pg_sys::list_nth((*cscan).custom_private, 1).cast::<pg_sys::Integer>();
        let s = pg_sys::palloc0(std::mem::size_of::<State>()).cast::<State>();
        (*s).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        (*s).css.methods = &methods(Kind::from_i32((*kind).ival)).exec;
        s.cast()
    }
}

/// One AS OF scan.
struct AsofScan {
    snap: u64,
    relid: pg_sys::Oid,
    pages: PageReader,
    decoder: Decoder,
    /// The scan slot is a heap tuple slot (made so when the first snapshot read allowed
    /// in-place tuples).
    heap_slot: bool,
    /// Tuples go to the executor in place (see the module comment).
    in_place: bool,
    /// For the decoder path: the table column behind each scan column.
    columns: Vec<usize>,
    /// The current page's tuples: (line pointer, offset, length) into `page`.
    tuples: Vec<(u16, usize, usize)>,
    block: u32,
    page: *const u8,
    next: usize,
    tuple: pg_sys::HeapTupleData,
    scratch: pgrx::PgMemoryContexts,
}

/// Frees a scan whose executor never reached EndCustomScan (an ERROR): runs when the query's
/// memory context goes, releasing the scan's pins.
unsafe extern "C-unwind" fn drop_scan(arg: *mut c_void) {
    let state = arg.cast::<State>();
    // SAFETY: `arg` is the State registered in begin_scan; the box is dropped once.
    unsafe {
        if !(*state).node.is_null() {
            drop(Box::from_raw((*state).node));
            (*state).node = std::ptr::null_mut();
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn begin_scan(
    css: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
) {
    if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
        return;
    }
    // SAFETY: the executor's node, created by create_state, at the end of its init.
    unsafe {
        let state = css.cast::<State>();
        let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
        let private = (*cscan).custom_private;
        let relid = pg_sys::Oid::from(
            (*pg_sys::list_nth(private, 0).cast::<pg_sys::Integer>()).ival as u32,
        );
        let kind = Kind::from_i32((*pg_sys::list_nth(private, 1).cast::<pg_sys::Integer>()).ival);
        require_gsnap_database();
        require_read_access(relid);
        let exprs = (*cscan).custom_exprs;
        let args = (0..kind.args())
            .map(|i| {
                let expr = pg_sys::list_nth(exprs, i).cast::<pg_sys::Expr>();
                pg_sys::ExecInitExpr(expr, &mut (*css).ss.ps)
            })
            .collect();
        let rec_qual = if kind == Kind::Range {
            let quals = pg_sys::list_nth(exprs, 2).cast::<pg_sys::List>();
            pg_sys::ExecInitQual(quals, &mut (*css).ss.ps)
        } else {
            std::ptr::null_mut()
        };
        // The table stays open (and locked ACCESS SHARE until the transaction ends) while
        // the scan runs, as a heap scan keeps its relation: the same session cannot alter or
        // drop it under an open cursor, other sessions wait. It must still have the row
        // type the query was planned with (a cached plan is replanned after a schema change,
        // see deps.rs; this is the last line of defence).
        let rel = pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as i32);
        if rel.is_null() {
            error(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("the table with OID {} read by this query no longer exists", relid.to_u32()),
            )
            .raise();
        }
        let desc = (*rel).rd_att;
        if !same_row_type(pg_sys::list_nth(private, 2).cast(), desc) {
            pg_sys::relation_close(rel, pg_sys::NoLock as i32);
            error(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "cached plan must not change result type",
            )
            .detail(format!(
                "The columns of table {} changed after this query was planned.",
                relation_name(relid)
            ))
            .hint("Prepare the statement again.")
            .raise();
        }
        // The slot type is decided now, before the parent node compiles its expressions
        // against our output: a heap tuple slot when the table has no dropped columns.
        let heap_slot = kind != Kind::Range
            && !(*desc)
                .attrs
                .as_slice((*desc).natts as usize)
                .iter()
                .any(|a| a.attisdropped);
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
            (*css).ss.ps.qual = pg_sys::ExecInitQual((*(*css).ss.ps.plan).qual, &mut (*css).ss.ps);
        }
        (*state).node = Box::into_raw(Box::new(AsofNode {
            relid,
            rel,
            kind,
            args,
            heap_slot,
            scan: None,
            rec_qual,
            range: None,
        }));
        let cb = pg_sys::MemoryContextAlloc(
            (*estate).es_query_cxt,
            std::mem::size_of::<pg_sys::MemoryContextCallback>(),
        )
        .cast::<pg_sys::MemoryContextCallback>();
        (*cb).func = Some(drop_scan);
        (*cb).arg = state.cast();
        pg_sys::MemoryContextRegisterResetCallback((*estate).es_query_cxt, cb);
    }
}

/// Evaluates snapshot argument `i` (an id, or a time resolved to an id).
///
/// # Safety
/// `css` is our node and `node` its state.
unsafe fn snapshot_argument(css: *mut pg_sys::CustomScanState, node: &AsofNode, i: usize) -> u64 {
    // SAFETY: evaluating the plan's own expression in the node's expression context.
    unsafe {
        let econtext = (*css).ss.ps.ps_ExprContext;
        let mut isnull = false;
        let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
        let arg = node.args[i];
        let evalfunc = (*arg)
            .evalfunc
            .expect("an initialized expression has a function");
        let value = evalfunc(arg, econtext, &mut isnull);
        pg_sys::MemoryContextSwitchTo(old);
        let (function, what) = match (node.kind, i) {
            (Kind::AsofId, _) => ("gsnap_asof", "the snapshot id"),
            (Kind::AsofTime, _) => ("gsnap_asof", "the time"),
            (Kind::Range, 0) => ("gsnap_range", "the first snapshot"),
            (Kind::Range, _) => ("gsnap_range", "the last snapshot"),
        };
        if isnull {
            error(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("{what} of {function} must not be NULL"),
            )
            .raise();
        }
        if node.kind == Kind::AsofTime {
            return resolve_time(value.value() as i64);
        }
        let snap = value.value() as i64;
        if snap <= 0 {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("snapshot {snap} does not exist"),
            )
            .hint("Snapshot ids start at 1; gsnap_snapshots() lists them.")
            .raise();
        }
        snap as u64
    }
}

/// Opens the range scan of `relid` over `from..=to`.
///
/// # Safety
/// In a transaction.
unsafe fn open_range(relid: pg_sys::Oid, from: u64, to: u64) -> RangeScan {
    if from > to {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("gsnap_range from snapshot {from} to snapshot {to}: the range is empty"),
        )
        .hint("Give the older snapshot first.")
        .raise();
    }
    // SAFETY: the table's current row type, copied into the current (query) context, which
    // outlives the scan.
    unsafe {
        let row_desc = pg_sys::lookup_rowtype_tupdesc_copy(pg_sys::get_rel_type_id(relid), -1);
        RangeScan {
            cursor: RangeCursor::open(relid, from, to, row_desc),
            rec: pg_sys::Datum::from(0usize),
            snaps: Vec::new(),
            next_snap: 0,
        }
    }
}

impl RangeScan {
    /// Stores the next `(snap_id, rec)` in `slot`; false at the end. `rec_qual` (if any) is
    /// checked once per row version, and the rows it refuses are skipped for all their
    /// snapshots.
    ///
    /// # Safety
    /// `slot` is the node's (virtual) scan slot; `econtext` its expression context.
    unsafe fn next_row(
        &mut self,
        slot: *mut pg_sys::TupleTableSlot,
        rec_qual: *mut pg_sys::ExprState,
        econtext: *mut pg_sys::ExprContext,
    ) -> bool {
        // SAFETY: filling our virtual slot; `rec` is the cursor's until its next row.
        unsafe {
            if self.next_snap >= self.snaps.len() {
                let mut keep = |rec: pg_sys::Datum, snap: u64| {
                    if rec_qual.is_null() {
                        return true;
                    }
                    store(slot, snap, rec);
                    (*econtext).ecxt_scantuple = slot;
                    let ok = pg_sys::ExecQual(rec_qual, econtext);
                    pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
                    ok
                };
                let Some((snaps, rec)) = self.cursor.next_row(&mut keep) else {
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

/// Opens the scan of table `rel` at `snap` and picks the tuple path.
///
/// # Safety
/// In a transaction; `rel` is open.
unsafe fn open_scan(rel: pg_sys::Relation, snap: u64, heap_slot: bool) -> AsofScan {
    // SAFETY: reading the open relation's descriptor.
    unsafe {
        let relid = (*rel).rd_id;
        let table = table_at(snap, relid);
        let desc = pg_sys::CreateTupleDescCopyConstr((*rel).rd_att);
        let natts = (*desc).natts as usize;
        let attrs = (*desc).attrs.as_slice(natts);
        let columns: Vec<usize> = (0..natts).filter(|&i| !attrs[i].attisdropped).collect();
        let old = &table.row_type.attributes;
        let in_place = heap_slot
            && columns.len() == natts
            && old.len() <= natts
            && old.iter().zip(attrs).all(|(o, a)| {
                !o.dropped && o.type_oid == a.atttypid.to_u32() && o.missing.is_none()
            });
        AsofScan {
            snap,
            relid,
            pages: PageReader::open(snap, &table),
            decoder: Decoder::new(snap, relid, table.row_type.clone(), desc),
            heap_slot,
            in_place,
            columns,
            tuples: Vec::new(),
            block: 0,
            page: std::ptr::null(),
            next: 0,
            tuple: std::mem::zeroed(),
            // Not a child of the query's context: PostgreSQL deletes child contexts before
            // running the reset callback that drops an unfinished scan, and the scan deletes
            // its own context. Dropping the scan always deletes it (see `drop_scan`).
            scratch: pgrx::PgMemoryContexts::TopMemoryContext
                .switch_to(|_| pgrx::PgMemoryContexts::new("gsnap AS OF scan")),
        }
    }
}

impl AsofScan {
    /// Moves to the next page with tuples; false at the end.
    fn next_page(&mut self) -> bool {
        loop {
            let Some((block, bytes)) = self.pages.next_page() else {
                return false;
            };
            let tuples = view::decode(bytes).unwrap_or_else(|e| {
                error(
                    PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!(
                        "snapshot {} holds a corrupt page view for block {block}: {e}",
                        self.snap
                    ),
                )
                .raise()
            });
            let base = bytes.as_ptr() as usize;
            self.tuples.clear();
            self.tuples.extend(
                tuples
                    .iter()
                    .map(|t| (t.lp, t.bytes.as_ptr() as usize - base, t.bytes.len())),
            );
            self.block = block;
            self.page = bytes.as_ptr();
            self.next = 0;
            // SAFETY: the previous page's rows are consumed (the executor asked for more).
            unsafe { pg_sys::MemoryContextReset(self.scratch.value()) };
            if !self.tuples.is_empty() {
                return true;
            }
        }
    }

    /// Stores the next row in `slot`; false at the end.
    ///
    /// # Safety
    /// `slot` is the node's scan slot.
    unsafe fn next_row(&mut self, slot: *mut pg_sys::TupleTableSlot) -> bool {
        if self.next >= self.tuples.len() && !self.next_page() {
            return false;
        }
        let (lp, offset, len) = self.tuples[self.next];
        self.next += 1;
        // SAFETY: the page is pinned until the next page is asked for; its tuples are 8-byte
        // aligned (view format) within an 8-byte aligned cache slot.
        unsafe {
            let bytes = std::slice::from_raw_parts(self.page.add(offset), len);
            let has_external = len >= 22
                && u16::from_ne_bytes([bytes[20], bytes[21]]) & pg_sys::HEAP_HASEXTERNAL as u16
                    != 0;
            if self.in_place && !has_external {
                self.tuple.t_len = len as u32;
                self.tuple.t_tableOid = self.relid;
                self.tuple.t_data = self.page.add(offset).cast_mut().cast();
                pgrx::itemptr::item_pointer_set_all(&mut self.tuple.t_self, self.block, lp);
                raw::ExecStoreHeapTuple(&mut self.tuple, slot, false);
                return true;
            }
            let old = pg_sys::MemoryContextSwitchTo(self.scratch.value());
            let (values, nulls) = self.decoder.decode_tuple(self.block, lp, bytes);
            pg_sys::ExecClearTuple(slot);
            if self.heap_slot {
                // A heap slot: form the row (out-of-line values, or an older row type).
                let mut cols: Vec<pg_sys::Datum> =
                    self.columns.iter().map(|&c| values[c]).collect();
                let mut cnulls: Vec<bool> = self.columns.iter().map(|&c| nulls[c]).collect();
                let t = pg_sys::heap_form_tuple(
                    (*slot).tts_tupleDescriptor,
                    cols.as_mut_ptr(),
                    cnulls.as_mut_ptr(),
                );
                pgrx::itemptr::item_pointer_set_all(&mut (*t).t_self, self.block, lp);
                (*t).t_tableOid = self.relid;
                pg_sys::ExecStoreHeapTuple(t, slot, false);
            } else {
                for (j, &c) in self.columns.iter().enumerate() {
                    *(*slot).tts_values.add(j) = values[c];
                    *(*slot).tts_isnull.add(j) = nulls[c];
                }
                pg_sys::ExecStoreVirtualTuple(slot);
            }
            pg_sys::MemoryContextSwitchTo(old);
        }
        true
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn access_next(ss: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: called by ExecScan for our node.
    unsafe {
        let state = ss.cast::<State>();
        let slot = (*ss).ss_ScanTupleSlot;
        let Some(node) = (*state).node.as_mut() else {
            return pg_sys::ExecClearTuple(slot);
        };
        if node.kind == Kind::Range {
            if node.range.is_none() {
                let from = snapshot_argument(ss.cast(), node, 0);
                let to = snapshot_argument(ss.cast(), node, 1);
                node.range = Some(open_range(node.relid, from, to));
            }
            let econtext = (*ss).ps.ps_ExprContext;
            let range = node.range.as_mut().expect("opened");
            if !range.next_row(slot, node.rec_qual, econtext) {
                return pg_sys::ExecClearTuple(slot);
            }
            return slot;
        }
        if node.scan.is_none() {
            let snap = snapshot_argument(ss.cast(), node, 0);
            node.scan = Some(open_scan(node.rel, snap, node.heap_slot));
        }
        if !node.scan.as_mut().expect("opened").next_row(slot) {
            return pg_sys::ExecClearTuple(slot);
        }
        slot
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn recheck(
    _ss: *mut pg_sys::ScanState,
    _slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn exec_scan(
    css: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor's node.
    unsafe { pg_sys::ExecScan(&mut (*css).ss, Some(access_next), Some(recheck)) }
}

#[pg_guard]
unsafe extern "C-unwind" fn end_scan(css: *mut pg_sys::CustomScanState) {
    // SAFETY: our node; the scan is dropped once (the context callback then finds null); the
    // relation was opened by begin_scan (its lock stays until the transaction ends).
    unsafe {
        if let Some(node) = (*css.cast::<State>()).node.as_ref() {
            pg_sys::relation_close(node.rel, pg_sys::NoLock as i32);
        }
        drop_scan(css.cast())
    };
}

/// EXPLAIN: a range scan's conditions on `rec` alone, checked once per row and run of
/// snapshots sharing its page ("Row Filter"; the per-result-row ones are the plan's Filter).
#[pg_guard]
unsafe extern "C-unwind" fn explain(
    css: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: our plan node; deparsing its own expressions the way EXPLAIN does.
    unsafe {
        let cscan = (*css).ss.ps.plan.cast::<pg_sys::CustomScan>();
        let exprs = (*cscan).custom_exprs;
        if pg_sys::list_length(exprs) < 3 {
            return;
        }
        let quals = pg_sys::list_nth(exprs, 2).cast::<pg_sys::List>();
        if quals.is_null() {
            return;
        }
        let context = pg_sys::set_deparse_context_plan((*es).deparse_cxt, cscan.cast(), ancestors);
        let text = pg_sys::deparse_expression(
            pg_sys::make_ands_explicit(quals).cast(),
            context,
            (*es).verbose,
            false,
        );
        pg_sys::ExplainPropertyText(c"Row Filter".as_ptr(), text, es);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn rescan(css: *mut pg_sys::CustomScanState) {
    // SAFETY: our node: the next fetch opens the scan again, re-evaluating the snapshot
    // argument (a parameter may have changed); dropping the old scan releases its pins.
    unsafe {
        if let Some(node) = (*css.cast::<State>()).node.as_mut() {
            node.scan = None;
            node.range = None;
        }
    }
}
