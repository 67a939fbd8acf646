//! The custom scan plan nodes: "gsnap AS OF" (`FROM gsnap_asof(NULL::t, id or time)`),
//! "gsnap range" (`FROM gsnap_range(NULL::t, from, to)`), "gsnap versions" (`FROM
//! gsnap_versions(NULL::t, from, to)`) and "gsnap diff" (`FROM gsnap_diff(NULL::t, a, b)`),
//! built from the paths of `paths.rs`, and the one place that knows the layout of their
//! private lists.
//!
//! A path's `custom_private` is [`PathPlan`]: the table, the kind of scan, and the call's
//! snapshot arguments. A node's `custom_private` is [`ScanPlan`]: the table, the kind of
//! scan, and the table's row type as planned (checked again at executor start). Its
//! `custom_exprs` are the snapshot arguments and, for a range or versions, the conditions on
//! `rec` alone (its Row Filter). The aggregate node's lists are `aggregates.rs`'s.

use super::security;
use crate::error::error;
use crate::ffi::catalog::{name_of, type_name};
use crate::ffi::list::{self, int_node, list_of};
use crate::ffi::node::{palloc_node, VarAttnos};
use crate::ffi::relation::{relation_name, relation_row_type, OpenRelation};
use crate::ffi::tuple;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_void, CStr};

/// What a scan reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ScanKind {
    /// `gsnap_asof(NULL::t, snapshot id)`.
    AsofId = 0,
    /// `gsnap_asof(NULL::t, time)`: the latest snapshot at or before it.
    AsofTime = 1,
    /// `gsnap_range(NULL::t, from, to)`.
    Range = 2,
    /// `gsnap_versions(NULL::t, from, to)`.
    Versions = 3,
    /// `GROUP BY snap_id` over `gsnap_range(NULL::t, from, to)` (`aggregates.rs`).
    RangeAggregate = 4,
    /// `gsnap_diff(NULL::t, a, b)`.
    Diff = 5,
}

impl ScanKind {
    fn from_i32(v: i32) -> ScanKind {
        match v {
            0 => ScanKind::AsofId,
            1 => ScanKind::AsofTime,
            2 => ScanKind::Range,
            3 => ScanKind::Versions,
            4 => ScanKind::RangeAggregate,
            _ => ScanKind::Diff,
        }
    }

    /// The snapshot arguments (after the table's `NULL::t`).
    pub fn snapshot_args(self) -> usize {
        if self.over_a_range() || self == ScanKind::Diff {
            2
        } else {
            1
        }
    }

    /// True for the scans of a range of snapshots (range and versions).
    pub fn over_a_range(self) -> bool {
        matches!(
            self,
            ScanKind::Range | ScanKind::Versions | ScanKind::RangeAggregate
        )
    }

    /// The column holding the row as a `rec` value (range, versions and diff scans).
    pub fn rec_column(self) -> Option<i32> {
        match self {
            ScanKind::Range | ScanKind::Diff => Some(2),
            ScanKind::Versions => Some(3),
            ScanKind::RangeAggregate | ScanKind::AsofId | ScanKind::AsofTime => None,
        }
    }

    /// The name EXPLAIN shows.
    const fn name(self) -> &'static CStr {
        match self {
            ScanKind::Diff => c"gsnap diff",
            ScanKind::Range => c"gsnap range",
            ScanKind::Versions => c"gsnap versions",
            ScanKind::RangeAggregate => c"gsnap range aggregate",
            ScanKind::AsofId | ScanKind::AsofTime => c"gsnap AS OF",
        }
    }
}

/// A path's private list, decoded.
pub struct PathPlan {
    pub relid: pg_sys::Oid,
    pub kind: ScanKind,
    /// The call's snapshot arguments (expressions).
    pub args: Vec<*mut c_void>,
}

impl PathPlan {
    /// Encodes the private list (in the current memory context).
    pub fn encode(&self) -> *mut pg_sys::List {
        let mut items = vec![
            int_node(self.relid.to_u32() as i32),
            int_node(self.kind as i32),
        ];
        items.extend_from_slice(&self.args);
        list_of(&items)
    }

    /// Decodes a private list made by [`PathPlan::encode`].
    ///
    /// # Safety
    /// `private` is the `custom_private` of one of gsnap's scan paths.
    pub unsafe fn decode(private: *mut pg_sys::List) -> PathPlan {
        // SAFETY: the layout written by `encode`: two Integer nodes, then the arguments.
        unsafe {
            let kind = ScanKind::from_i32(list::int_at(private, 1));
            PathPlan {
                relid: pg_sys::Oid::from(list::int_at(private, 0) as u32),
                kind,
                args: (0..kind.snapshot_args())
                    .map(|i| list::nth(private, 2 + i))
                    .collect(),
            }
        }
    }
}

/// A scan node's private list, decoded.
pub struct ScanPlan {
    pub relid: pg_sys::Oid,
    pub kind: ScanKind,
    /// The table's row type when the plan was made (see [`row_type_signature`]).
    pub signature: *mut pg_sys::List,
    /// The columns of the table the query reads through this scan (its output and its
    /// conditions), for the privilege check; None: all of them.
    pub columns: Option<Vec<i16>>,
    /// The role whose row-level security policies the scan's conditions apply (InvalidOid:
    /// none were applied).
    pub rls_user: pg_sys::Oid,
    /// The role whose privileges the scan checks: the owner of the view the scan comes from
    /// (its range-table entry's `checkAsUser`, as PostgreSQL checks the tables a view reads);
    /// InvalidOid: the current user when it runs.
    pub check_as: pg_sys::Oid,
}

impl ScanPlan {
    /// The length of the list [`ScanPlan::encode`] makes (a node may append its own items).
    pub const LEN: usize = 6;

    /// Encodes the private list (in the current memory context): the table, the kind, the
    /// signature, the columns as a list (0 first: all columns; 1 first: those after it), then
    /// the role whose policies were applied and the role whose privileges are checked.
    pub fn encode(&self) -> *mut pg_sys::List {
        let columns: Vec<_> = match &self.columns {
            None => vec![int_node(0)],
            Some(c) => std::iter::once(int_node(1))
                .chain(c.iter().map(|&a| int_node(i32::from(a))))
                .collect(),
        };
        let items: [*mut c_void; ScanPlan::LEN] = [
            int_node(self.relid.to_u32() as i32),
            int_node(self.kind as i32),
            self.signature.cast(),
            list_of(&columns).cast(),
            int_node(self.rls_user.to_u32() as i32),
            int_node(self.check_as.to_u32() as i32),
        ];
        list_of(&items)
    }

    /// Decodes a private list made by [`ScanPlan::encode`].
    ///
    /// # Safety
    /// `private` is the `custom_private` of one of gsnap's scan nodes.
    pub unsafe fn decode(private: *mut pg_sys::List) -> ScanPlan {
        // SAFETY: the layout written by `encode`: two Integer nodes, a List, then a List of
        // Integer nodes.
        unsafe {
            let columns: *mut pg_sys::List = list::nth(private, 3);
            let listed = (1..list::len(columns))
                .map(|i| list::int_at(columns, i) as i16)
                .collect();
            ScanPlan {
                relid: pg_sys::Oid::from(list::int_at(private, 0) as u32),
                kind: ScanKind::from_i32(list::int_at(private, 1)),
                signature: list::nth(private, 2),
                columns: (list::int_at(columns, 0) == 1).then_some(listed),
                rls_user: pg_sys::Oid::from(list::int_at(private, 4) as u32),
                check_as: pg_sys::Oid::from(list::int_at(private, 5) as u32),
            }
        }
    }
}

/// The row type of a table as a plan records it: the number of attributes, then each
/// attribute's type (0 for a dropped one) and type modifier.
pub fn row_type_signature(rel: &OpenRelation) -> *mut pg_sys::List {
    // SAFETY: the open relation's descriptor, valid while it is open.
    let attrs = unsafe { tuple::attributes(rel.descriptor()) };
    let mut items = vec![int_node(attrs.len() as i32)];
    for a in attrs {
        let type_ = if a.attisdropped {
            0
        } else {
            a.atttypid.to_u32()
        };
        items.push(int_node(type_ as i32));
        items.push(int_node(a.atttypmod));
    }
    list_of(&items)
}

/// True if `rel` has the row type `signature` recorded.
///
/// # Safety
/// `signature` was made by [`row_type_signature`].
pub unsafe fn same_row_type(signature: *mut pg_sys::List, rel: &OpenRelation) -> bool {
    let now = row_type_signature(rel);
    // SAFETY: both are lists of Integer nodes.
    unsafe { pg_sys::equal(signature.cast(), now.cast()) }
}

/// The methods tables PostgreSQL calls the plans through (they live for the process).
struct Methods {
    path: pg_sys::CustomPathMethods,
    scan: pg_sys::CustomScanMethods,
}

// SAFETY: immutable, built at compile time; only C string pointers to statics and functions.
unsafe impl Sync for Methods {}

impl Methods {
    const fn of(kind: ScanKind) -> Methods {
        Methods {
            path: pg_sys::CustomPathMethods {
                CustomName: kind.name().as_ptr(),
                PlanCustomPath: Some(plan_path),
                ReparameterizeCustomPathByChild: None,
            },
            scan: pg_sys::CustomScanMethods {
                CustomName: kind.name().as_ptr(),
                CreateCustomScanState: Some(crate::exec::create_state),
            },
        }
    }
}

static ASOF_METHODS: Methods = Methods::of(ScanKind::AsofId);
static RANGE_METHODS: Methods = Methods::of(ScanKind::Range);
static VERSIONS_METHODS: Methods = Methods::of(ScanKind::Versions);
static AGGREGATE_METHODS: Methods = Methods::of(ScanKind::RangeAggregate);
static DIFF_METHODS: Methods = Methods::of(ScanKind::Diff);

fn methods(kind: ScanKind) -> &'static Methods {
    match kind {
        ScanKind::Range => &RANGE_METHODS,
        ScanKind::Versions => &VERSIONS_METHODS,
        ScanKind::RangeAggregate => &AGGREGATE_METHODS,
        ScanKind::Diff => &DIFF_METHODS,
        ScanKind::AsofId | ScanKind::AsofTime => &ASOF_METHODS,
    }
}

/// A path of `kind` for `parent` (in the current memory context): its private list, what it
/// returns, its rows, and its startup and total costs.
pub fn new_path(
    kind: ScanKind,
    private: *mut pg_sys::List,
    parent: *mut pg_sys::RelOptInfo,
    target: *mut pg_sys::PathTarget,
    rows: f64,
    (startup_cost, total_cost): (f64, f64),
) -> *mut pg_sys::CustomPath {
    let mut path = pg_sys::CustomPath {
        custom_private: private,
        methods: path_methods(kind),
        ..Default::default()
    };
    path.path.type_ = pg_sys::NodeTag::T_CustomPath;
    path.path.pathtype = pg_sys::NodeTag::T_CustomScan;
    path.path.parent = parent;
    path.path.pathtarget = target;
    path.path.rows = rows;
    path.path.startup_cost = startup_cost;
    path.path.total_cost = total_cost;
    palloc_node(path)
}

/// The plan methods of a scan of `kind`.
pub fn scan_methods(kind: ScanKind) -> &'static pg_sys::CustomScanMethods {
    &methods(kind).scan
}

/// The path methods of a scan of `kind`.
pub fn path_methods(kind: ScanKind) -> &'static pg_sys::CustomPathMethods {
    &methods(kind).path
}

/// Registers the scan methods (so plans can be copied and read back by name).
pub fn register() {
    let kinds = [
        ScanKind::AsofId,
        ScanKind::Range,
        ScanKind::Versions,
        ScanKind::RangeAggregate,
        ScanKind::Diff,
    ];
    for kind in kinds {
        // SAFETY: _PG_init; the methods live for the process.
        unsafe { pg_sys::RegisterCustomScanMethods(&methods(kind).scan) };
    }
}

/// A target entry for a Var of range-table entry `rti` (in the current memory context).
fn var_entry(
    rti: i32,
    attno: i16,
    (type_, typmod, collation): (pg_sys::Oid, i32, pg_sys::Oid),
    resno: i16,
    name: &CStr,
) -> *mut c_void {
    // SAFETY: node constructors taking values, allocating in the current context; the name
    // is copied.
    unsafe {
        let var = pg_sys::makeVar(rti, attno, type_, typmod, collation, 0);
        pg_sys::makeTargetEntry(var.cast(), resno, pg_sys::pstrdup(name.as_ptr()), false).cast()
    }
}

/// The scan tuple of an AS OF scan: the table's live columns, as Vars of range-table entry
/// `rti`, then, if `whole_row`, the row as one value of the table's row type (a whole-row
/// Var, which the node fills: `exec::asof_scan`).
fn live_columns(table: &OpenRelation, rti: i32, whole_row: bool) -> *mut pg_sys::List {
    // SAFETY: the open table's descriptor, valid while it is open.
    let attrs = unsafe { tuple::attributes(table.descriptor()) };
    let mut entries: Vec<_> = attrs
        .iter()
        .filter(|a| !a.attisdropped)
        .enumerate()
        .map(|(i, a)| {
            let type_ = (a.atttypid, a.atttypmod, a.attcollation);
            var_entry(rti, a.attnum, type_, i as i16 + 1, name_of(&a.attname))
        })
        .collect();
    if whole_row {
        let row_type = (relation_row_type(table.oid()), -1, pg_sys::InvalidOid);
        let resno = entries.len() as i16 + 1;
        entries.push(var_entry(rti, 0, row_type, resno, c"gsnap whole row"));
    }
    list_of(&entries)
}

/// Raises an ERROR if the query reads a column of `table` (the AS OF scan's relation, at
/// range-table index `rti`) as the table no longer has it.
///
/// Parse analysis expands `gsnap_asof(NULL::t, 42)` with `t`'s row type as the type cache
/// has it, without keeping `t` locked; `deps.rs` locks it right after. An ALTER TABLE that
/// commits in between (the lock waits for it) leaves the query reading the table's earlier
/// columns, while the scan's tuple is made of its current ones: PostgreSQL then failed with
/// an internal "variable not found in subplan target list" (a column dropped) or "attribute
/// N of type record has wrong type" (its type changed). A concurrent change of the table is
/// what happened, and running the query again reads the new columns.
///
/// # Safety
/// The planner's relation of the scan, and its range-table index.
unsafe fn require_analyzed_columns(rel: *mut pg_sys::RelOptInfo, rti: i32, table: &OpenRelation) {
    let flags = (pg_sys::PVC_RECURSE_AGGREGATES
        | pg_sys::PVC_RECURSE_WINDOWFUNCS
        | pg_sys::PVC_RECURSE_PLACEHOLDERS) as i32;
    // SAFETY: the caller's promise: the relation's target (a List, which is a Node) and its
    // conditions' clauses; pull_var_clause returns a List of their Vars.
    let vars: Vec<*mut pg_sys::Var> = unsafe {
        let mut vars: Vec<_> = list::iter(pg_sys::pull_var_clause(
            (*(*rel).reltarget).exprs.cast(),
            flags,
        ))
        .collect();
        for ri in list::iter::<pg_sys::RestrictInfo>((*rel).baserestrictinfo) {
            vars.extend(list::iter(pg_sys::pull_var_clause(
                (*ri).clause.cast(),
                flags,
            )));
        }
        vars
    };
    // SAFETY: the open table's descriptor, valid while it is open.
    let attrs = unsafe { tuple::attributes(table.descriptor()) };
    for var in vars {
        // SAFETY: a Var of the relation's target or conditions.
        let (varno, levelsup, attno, vartype) = unsafe {
            (
                (*var).varno,
                (*var).varlevelsup,
                (*var).varattno,
                (*var).vartype,
            )
        };
        if varno != rti || levelsup != 0 || attno <= 0 {
            continue;
        }
        let now = match attrs.get(attno as usize - 1) {
            None => "no longer exists".to_string(),
            Some(a) if a.attisdropped => "has been dropped".to_string(),
            Some(a) if a.atttypid != vartype => {
                format!("is now of type {}", type_name(a.atttypid))
            }
            Some(_) => continue,
        };
        error(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!(
                "table \"{}\" changed while this query was being planned",
                relation_name(table.oid())
            ),
        )
        .detail(format!(
            "The query reads column {attno} of the table as type {}; that column {now}.",
            type_name(vartype)
        ))
        .hint("Run the query again.")
        .raise();
    }
}

/// The scan tuple of a range scan: `(snap_id bigint, rec)`, `rec` of the table's row type.
fn snap_id_and_rec(relid: pg_sys::Oid, rti: i32) -> *mut pg_sys::List {
    list_of(&snap_id_and_rec_entries(relid, rti))
}

/// The target entries of [`snap_id_and_rec`].
pub(super) fn snap_id_and_rec_entries(relid: pg_sys::Oid, rti: i32) -> Vec<*mut c_void> {
    let no_collation = pg_sys::InvalidOid;
    let snap_id = (pg_sys::INT8OID, -1, no_collation);
    let rec = (relation_row_type(relid), -1, no_collation);
    vec![
        var_entry(rti, 1, snap_id, 1, c"snap_id"),
        var_entry(rti, 2, rec, 2, c"rec"),
    ]
}

/// What a scan's query reads of the function's columns: the attributes its output (what the
/// plan above needs, joins and sub-queries included) and its conditions refer to, 0 for whole
/// rows. (An AS OF scan returns the table's row type: its attribute numbers are the table's.)
///
/// # Safety
/// The planner's relation of the scan, `rti` its range-table index.
pub(super) unsafe fn attributes_read(
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
) -> VarAttnos {
    let mut attrs = VarAttnos::new(rti);
    // SAFETY: the caller's promise: the relation's target and its conditions.
    unsafe {
        attrs.add((*(*rel).reltarget).exprs.cast());
        for ri in list::iter::<pg_sys::RestrictInfo>((*rel).baserestrictinfo) {
            attrs.add((*ri).clause.cast());
        }
    }
    attrs
}

/// The scan tuple of a diff scan: `(change text, rec)`, `rec` of the table's row type.
fn change_and_rec(relid: pg_sys::Oid, rti: i32) -> *mut pg_sys::List {
    let change = (pg_sys::TEXTOID, -1, pg_sys::DEFAULT_COLLATION_OID);
    let rec = (relation_row_type(relid), -1, pg_sys::InvalidOid);
    list_of(&[
        var_entry(rti, 1, change, 1, c"change"),
        var_entry(rti, 2, rec, 2, c"rec"),
    ])
}

/// The scan tuple of a versions scan: `(first_snap bigint, last_snap bigint, rec)`, `rec` of
/// the table's row type.
fn run_and_rec(relid: pg_sys::Oid, rti: i32) -> *mut pg_sys::List {
    let no_collation = pg_sys::InvalidOid;
    let snap = (pg_sys::INT8OID, -1, no_collation);
    let rec = (relation_row_type(relid), -1, no_collation);
    list_of(&[
        var_entry(rti, 1, snap, 1, c"first_snap"),
        var_entry(rti, 2, snap, 2, c"last_snap"),
        var_entry(rti, 3, rec, 3, c"rec"),
    ])
}

/// The conditions of a range or versions scan on `rec` (column `rec_attno`) alone, checked
/// once per row version, and the others (on the snapshot columns, or volatile), checked once
/// per result row.
///
/// # Safety
/// `quals` is a List of the scan's condition expressions, over range-table entry `rti`.
pub(super) unsafe fn split_range_conditions(
    quals: *mut pg_sys::List,
    rti: i32,
    rec_attno: i32,
) -> (Vec<*mut c_void>, Vec<*mut c_void>) {
    let (mut per_version, mut per_row) = (Vec::new(), Vec::new());
    // SAFETY: the caller's promise.
    for q in unsafe { list::iter::<c_void>(quals) } {
        let mut attrs = VarAttnos::new(rti as pg_sys::Index);
        // SAFETY: a condition expression of the scan.
        let volatile = unsafe {
            attrs.add(q.cast());
            pg_sys::contain_volatile_functions(q.cast())
        };
        if (1..rec_attno).any(|a| attrs.contains(a)) || volatile {
            per_row.push(q);
        } else {
            per_version.push(q);
        }
    }
    (per_version, per_row)
}

/// Builds the plan node of one of our paths.
#[pg_guard]
unsafe extern "C-unwind" fn plan_path(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    clauses: *mut pg_sys::List,
    _custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: PostgreSQL plans one of our paths; an aggregate path has its own layout.
    if unsafe { std::ptr::eq((*best_path).methods, path_methods(ScanKind::RangeAggregate)) } {
        // SAFETY: an aggregate path and its target list.
        return unsafe { super::aggregates::plan_aggregate(best_path, tlist) };
    }
    // SAFETY: PostgreSQL plans one of our paths (made by paths.rs, with its private list).
    let (path, flags) = unsafe {
        (
            PathPlan::decode((*best_path).custom_private),
            (*best_path).flags,
        )
    };
    // SAFETY: the path's relation, the planner's.
    let rti = unsafe { (*rel).relid } as i32;
    // SAFETY: the planner's list of the path's RestrictInfos.
    let quals = unsafe { pg_sys::extract_actual_clauses(clauses, false) };
    let table = OpenRelation::open(path.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        .expect("the planner holds a lock on the table it plans");
    // The row-level security policies that apply to the user come first among the scan's
    // conditions, so that the query's own (which may leak what they see) only see the rows
    // the policies let through (`security.rs`).
    // Privileges and policies are those of the view's owner when the scan comes from a view
    // (PostgreSQL's rule for the tables a view reads), else of the current user.
    // SAFETY: the planner's state; the scan's range-table index.
    let check_as = unsafe { security::check_as_user(root, rti) };
    // SAFETY: the planner's state; the scan's range-table index.
    let (policies, rls_user) = unsafe { security::quals(root, path.relid, rti, check_as) }
        .unwrap_or((std::ptr::null_mut(), pg_sys::InvalidOid));
    // The columns the query reads, for the privilege check (None: all of them).
    let columns: Option<Vec<i16>>;
    let (qual, exprs, scan_tlist) = if let Some(rec_attno) = path.kind.rec_column() {
        let scan_tlist = match path.kind {
            ScanKind::Range => snap_id_and_rec(path.relid, rti),
            ScanKind::Diff => change_and_rec(path.relid, rti),
            _ => run_and_rec(path.relid, rti),
        };
        // The policies over the fields of `rec`.
        // SAFETY: the policies' conditions (NIL: none), over this scan's entry; two lists in
        // the planner's memory context.
        let quals = unsafe {
            let policies = security::over_rec(policies, rti, rec_attno as i16, path.relid);
            pg_sys::list_concat(policies, quals)
        };
        // SAFETY: the planner's state; the scan's range-table index and rec column.
        columns = unsafe { super::fields::read_through_rec(root, rti, rec_attno as i16) };
        // SAFETY: the scan's conditions, over its range-table entry. (A diff's rows are each
        // a row version once: its conditions are all per row, the plan's Filter.)
        let (per_version, per_row) = if path.kind == ScanKind::Diff {
            // SAFETY: a List of the scan's conditions.
            (Vec::new(), unsafe { list::iter::<c_void>(quals) }.collect())
        } else {
            // SAFETY: as above.
            unsafe { split_range_conditions(quals, rti, rec_attno) }
        };
        let exprs = list_of(&[path.args[0], path.args[1], list_of(&per_version).cast()]);
        (list_of(&per_row), exprs, scan_tlist)
    } else {
        // SAFETY: the planner's relation of this scan, and its range-table index.
        unsafe { require_analyzed_columns(rel, rti, &table) };
        // SAFETY: two lists (or NIL) in the planner's memory context.
        let quals = unsafe { pg_sys::list_concat(policies, quals) };
        // SAFETY: the planner's relation of this scan, and its range-table index.
        let read = unsafe { attributes_read(rel, rti as pg_sys::Index) };
        let whole_row = read.contains(0);
        // SAFETY: the open table's descriptor.
        let natts = unsafe { (*table.descriptor()).natts } as i16;
        // Whole rows need every column, as `SELECT t FROM t` does.
        columns = (!whole_row).then(|| read.columns(natts));
        (
            quals,
            list_of(&path.args),
            live_columns(&table, rti, whole_row),
        )
    };
    let mut cscan = pg_sys::CustomScan {
        flags,
        methods: &methods(path.kind).scan,
        custom_exprs: exprs,
        custom_private: ScanPlan {
            relid: path.relid,
            kind: path.kind,
            signature: row_type_signature(&table),
            columns,
            rls_user,
            check_as,
        }
        .encode(),
        custom_scan_tlist: scan_tlist,
        ..Default::default()
    };
    cscan.scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
    cscan.scan.plan.targetlist = tlist;
    cscan.scan.plan.qual = qual;
    palloc_node(cscan).cast()
}
