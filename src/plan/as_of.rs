//! `SET gsnap.as_of = '42'` (an id, a label or a time, as the text forms of the readers take
//! them): the session's queries read every gsnap table as of that snapshot, the tables of
//! views, joins, subqueries and functions alike, until `RESET gsnap.as_of` (README, "A
//! session as of a snapshot"). Oracle's `DBMS_FLASHBACK.ENABLE_AT_TIME` and MariaDB's
//! `system_versioning_asof` give the same one instant to a whole session.
//!
//! A planner hook rewrites the query (views already expanded by the rewriter) before it is
//! planned: each range-table entry of a gsnap table (or of a partitioned table with gsnap
//! partitions) becomes a function entry calling `gsnap_asof(NULL::t, '<setting>')`, which
//! the custom scan then reads as it reads that call written out (`paths`), and a copy of the
//! original entry stays in the range table, referenced by nothing (as `deps` adds for a
//! reader's table): PostgreSQL locks it, checks the same privileges a read of the table
//! checks (the entry's own, with the view owner's role inside a view), makes the plan depend
//! on it, and the executor keeps it open (`exec::tables`). Changing the setting resets the
//! session's cached plans, so no prepared statement or PL/pgSQL plan keeps reading the
//! snapshot (or the live table) it was planned with.
//!
//! `COPY t TO`, which plans no query, is made `COPY (SELECT ... FROM ONLY t) TO` by a
//! utility hook. What cannot be done to a snapshot is refused (55000, naming the table):
//! writing a gsnap table (`COPY t FROM` too), locking its rows (`FOR UPDATE`, and the foreign key checks of writes to tables
//! referencing it), `TABLESAMPLE`, and system columns such as `ctid`. gsnap's own statements
//! (those `gsnap_restore` and `gsnap_undrop` run) read the live tables ([`Suspended`]);
//! the worker plans no query.

use super::deps::{is_read_entry, mark_read_entry, reader_kind, Reader};
use crate::error::error;
use crate::ffi::list;
use crate::ffi::node::palloc_node;
use crate::ffi::relation::{relation_name, OpenRelation};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};

/// The setting's value (PostgreSQL owns the string).
static mut AS_OF: *mut c_char = std::ptr::null_mut();

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

static mut PREV_NEEDS_FMGR: pg_sys::needs_fmgr_hook_type = None;

static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

thread_local! {
    /// Above 0 while gsnap's own statements run (they read the live tables).
    static SUSPENDED: Cell<u32> = const { Cell::new(0) };
}

/// While it lives, queries read the live tables whatever `gsnap.as_of` says.
pub struct Suspended;

impl Suspended {
    pub fn new() -> Suspended {
        SUSPENDED.set(SUSPENDED.get() + 1);
        Suspended
    }
}

impl Drop for Suspended {
    fn drop(&mut self) {
        SUSPENDED.set(SUSPENDED.get() - 1);
    }
}

/// Defines the setting and installs the planner hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process, before any query is planned; the setting's
    // variable is ours, the strings are static.
    unsafe {
        pg_sys::DefineCustomStringVariable(
            c"gsnap.as_of".as_ptr(),
            c"Reads every gsnap table as of this snapshot (an id, a label or a time); empty: the live tables.".as_ptr(),
            c"Queries read the snapshot; writing gsnap tables or locking their rows is refused while it is set.".as_ptr(),
            &raw mut AS_OF,
            c"".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            None,
            Some(assign),
            None,
        );
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
        PREV_NEEDS_FMGR = pg_sys::needs_fmgr_hook;
        pg_sys::needs_fmgr_hook = Some(needs_fmgr);
        PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// `COPY t TO` plans no query (it scans the table itself): while the setting applies, that of
/// a gsnap table is made `COPY (SELECT ... FROM ONLY t) TO` (as PostgreSQL itself makes it
/// for a table under row-level security), which reads the snapshot; `COPY t FROM` into one
/// is a write, refused as the others.
#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    let mut pstmt = pstmt;
    // SAFETY: PostgreSQL's statement; a CopyStmt's table, looked up (and locked ACCESS SHARE
    // as COPY TO would) only while the setting applies.
    if let Some(table) = unsafe { copied_gsnap_table(pstmt) } {
        // SAFETY: the statement, copied first if PostgreSQL's tree is read-only; its CopyStmt.
        unsafe {
            if read_only_tree {
                pstmt = pg_sys::copyObjectImpl(pstmt.cast()).cast();
            }
            copy_from_query((*pstmt).utilityStmt.cast(), &table);
        }
    }
    // SAFETY: PostgreSQL's own arguments (the statement possibly copied), passed on.
    unsafe {
        match PREV_PROCESS_UTILITY {
            Some(prev) => prev(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => pg_sys::standard_ProcessUtility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
}

/// The gsnap table a `COPY t TO` statement copies while the setting applies (an ERROR for
/// `COPY t FROM` into one).
///
/// # Safety
/// `pstmt` is a utility statement PostgreSQL is about to run.
unsafe fn copied_gsnap_table(pstmt: *mut pg_sys::PlannedStmt) -> Option<OpenRelation> {
    // SAFETY: the caller's statement.
    let node = unsafe { (*pstmt).utilityStmt };
    // SAFETY: as above; a CopyStmt if its tag says so.
    if node.is_null() || unsafe { (*node).type_ } != pg_sys::NodeTag::T_CopyStmt {
        return None;
    }
    let copy = node.cast::<pg_sys::CopyStmt>();
    // SAFETY: the CopyStmt's fields.
    if unsafe { (*copy).relation.is_null() } {
        return None;
    }
    active()?;
    // SAFETY: a lookup of the statement's table (missing: COPY says so itself).
    let relid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            (*copy).relation,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    let rel = OpenRelation::open(relid, pg_sys::NoLock as pg_sys::LOCKMODE)?;
    if !snapshotted(&rel) {
        return None;
    }
    // SAFETY: the CopyStmt's direction.
    if unsafe { (*copy).is_from } {
        refuse(relid, "written");
    }
    // PostgreSQL copies no partitioned table or materialized view out, and says so.
    (rel.class().relkind as u8 == pg_sys::RELKIND_RELATION).then_some(rel)
}

/// Makes `COPY table [(columns)] TO` the statement `COPY (SELECT columns FROM ONLY table) TO`.
///
/// # Safety
/// `copy` is a writable CopyStmt naming `table`.
unsafe fn copy_from_query(copy: *mut pg_sys::CopyStmt, table: &OpenRelation) {
    // SAFETY: the caller's statement; raw parse nodes made in the current memory context, as
    // the grammar would make them for the query.
    unsafe {
        let column = |fields: *mut pg_sys::List| {
            let reference = palloc_node(pg_sys::ColumnRef {
                type_: pg_sys::NodeTag::T_ColumnRef,
                fields,
                location: -1,
            });
            palloc_node(pg_sys::ResTarget {
                type_: pg_sys::NodeTag::T_ResTarget,
                name: std::ptr::null_mut(),
                indirection: std::ptr::null_mut(),
                val: reference.cast(),
                location: -1,
            })
            .cast::<c_void>()
        };
        let targets: Vec<*mut c_void> = if (*copy).attlist.is_null() {
            let star = palloc_node(pg_sys::A_Star {
                type_: pg_sys::NodeTag::T_A_Star,
            });
            vec![column(list::list_of(&[star.cast()]))]
        } else {
            list::iter::<pg_sys::Node>((*copy).attlist)
                .map(|name| column(list::list_of(&[pg_sys::copyObjectImpl(name.cast())])))
                .collect()
        };
        let schema = pg_sys::get_namespace_name(table.class().relnamespace);
        let name = pg_sys::pstrdup(table.class().relname.data.as_ptr());
        let from = pg_sys::makeRangeVar(schema, name, -1);
        (*from).inh = false;
        let select = palloc_node(pg_sys::SelectStmt {
            type_: pg_sys::NodeTag::T_SelectStmt,
            targetList: list::list_of(&targets),
            fromClause: list::list_of(&[from.cast()]),
            ..Default::default()
        });
        (*copy).query = select.cast();
        (*copy).relation = std::ptr::null_mut();
        (*copy).attlist = std::ptr::null_mut();
    }
}

/// While the setting applies, SQL-language functions are called, not inlined into the
/// query that calls them: the planner inlines a function's body after this module rewrote
/// the query, so a table the body reads would be read live. (PostgreSQL inlines no function
/// that a `needs_fmgr_hook` claims; called, the body is planned as its own query, and
/// rewritten.)
#[pg_guard]
unsafe extern "C-unwind" fn needs_fmgr(function: pg_sys::Oid) -> bool {
    // SAFETY: set once by `init`; the previous hook, given PostgreSQL's own argument.
    if unsafe { PREV_NEEDS_FMGR.is_some_and(|prev| prev(function)) } {
        return true;
    }
    if active().is_none() {
        return false;
    }
    let cache = pg_sys::SysCacheIdentifier::PROCOID as i32;
    // SAFETY: a catalog cache lookup by OID, released below.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(function));
        if tuple.is_null() {
            return false;
        }
        let language = (*pg_sys::GETSTRUCT(tuple).cast::<pg_sys::FormData_pg_proc>()).prolang;
        pg_sys::ReleaseSysCache(tuple);
        language == SQL_LANGUAGE
    }
}

/// `SQLlanguageId`: the OID of `LANGUAGE sql` (fixed in pg_language.dat).
const SQL_LANGUAGE: pg_sys::Oid = pg_sys::Oid::from_u32(14);

/// A new value: the session's cached plans were made for the old one.
#[pg_guard]
unsafe extern "C-unwind" fn assign(_new: *const c_char, _extra: *mut c_void) {
    // SAFETY: marks every cached plan of this backend for replanning (no catalog access).
    unsafe { pg_sys::ResetPlanCache() };
}

/// The snapshot the session reads, if `gsnap.as_of` is set and applies here.
fn active() -> Option<String> {
    if SUSPENDED.get() > 0 {
        return None;
    }
    setting()
}

/// `gsnap.as_of`, if set.
pub fn setting() -> Option<String> {
    // SAFETY: the setting's variable, which PostgreSQL keeps valid (or NULL).
    let value = unsafe { AS_OF };
    if value.is_null() {
        return None;
    }
    // SAFETY: a C string PostgreSQL owns.
    let text = unsafe { CStr::from_ptr(value) }
        .to_string_lossy()
        .into_owned();
    (!text.trim().is_empty()).then_some(text)
}

#[pg_guard]
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    if let Some(snapshot) = active() {
        // SAFETY: the query about to be planned, rewritten in place in the planner's memory.
        unsafe { rewrite(parse, &snapshot) };
    }
    // SAFETY: PostgreSQL's own arguments, passed on.
    unsafe {
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// The walk's state.
struct Rewrite {
    snapshot: String,
    /// `gsnap_asof(anyelement, text)`, once looked up.
    function: Option<pg_sys::Oid>,
    /// Per query level being walked (outermost first): the entries made snapshot reads.
    levels: Vec<Vec<i32>>,
}

/// Makes every read of a gsnap table in `query` (and its subqueries) a read of the snapshot.
///
/// # Safety
/// `query` is a rewritten query about to be planned.
unsafe fn rewrite(query: *mut pg_sys::Query, snapshot: &str) {
    let mut walk = Rewrite {
        snapshot: snapshot.to_string(),
        function: None,
        levels: Vec::new(),
    };
    // SAFETY: the caller's query; `walk` outlives the walk.
    unsafe { walker(query.cast(), (&raw mut walk).cast()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    let walk = context.cast::<Rewrite>();
    // SAFETY: a node of the query being walked.
    let tag = unsafe { (*node).type_ };
    match tag {
        pg_sys::NodeTag::T_Query => {
            let query = node.cast::<pg_sys::Query>();
            // SAFETY: a (sub)query of the statement; the walk's state, not borrowed across
            // the recursive calls below.
            let converted = unsafe { convert_entries(query, &mut *walk) };
            // SAFETY: as above.
            unsafe { (*walk).levels.push(converted) };
            // SAFETY: walking the query's parts with the same context.
            unsafe { pg_sys::query_tree_walker(query, Some(walker), context, 0) };
            // SAFETY: as above.
            unsafe { (*walk).levels.pop() };
            false
        }
        pg_sys::NodeTag::T_Var => {
            // SAFETY: a Var (its tag says so); the walk's state.
            unsafe { check_var(&*node.cast::<pg_sys::Var>(), &*walk) };
            false
        }
        // SAFETY: walking on into the node's children, with the same context.
        _ => unsafe { pg_sys::expression_tree_walker(node, Some(walker), context) },
    }
}

/// A system column (`ctid`, `xmin`, ...) of a table read as of the snapshot: an ERROR (the
/// snapshot's rows have none).
///
/// # Safety
/// `var` is a Var of the query level the walk is in.
unsafe fn check_var(var: &pg_sys::Var, walk: &Rewrite) {
    if var.varattno >= 0 {
        return;
    }
    let Some(level) = walk.levels.len().checked_sub(1 + var.varlevelsup as usize) else {
        return;
    };
    if walk.levels[level].contains(&var.varno) {
        error(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "gsnap.as_of is set: system column {} cannot be read from a snapshot",
                system_column_name(var.varattno)
            ),
        )
        .hint("RESET gsnap.as_of to read the live table's system columns.")
        .raise();
    }
}

fn system_column_name(attnum: i16) -> &'static str {
    match i32::from(attnum) {
        pg_sys::SelfItemPointerAttributeNumber => "ctid",
        pg_sys::MinTransactionIdAttributeNumber => "xmin",
        pg_sys::MinCommandIdAttributeNumber => "cmin",
        pg_sys::MaxTransactionIdAttributeNumber => "xmax",
        pg_sys::MaxCommandIdAttributeNumber => "cmax",
        pg_sys::TableOidAttributeNumber => "tableoid",
        _ => "(system)",
    }
}

/// Makes the entries of `query`'s own range table that read gsnap tables read the snapshot;
/// returns their indexes.
///
/// # Safety
/// `query` is a query of the statement being planned.
unsafe fn convert_entries(query: *mut pg_sys::Query, walk: &mut Rewrite) -> Vec<i32> {
    // SAFETY: the caller's query and its range table (entries added below are not visited).
    let entries: Vec<*mut pg_sys::RangeTblEntry> =
        unsafe { list::iter::<pg_sys::RangeTblEntry>((*query).rtable).collect() };
    let mut converted = Vec::new();
    for (i, rte) in entries.into_iter().enumerate() {
        let rti = i as i32 + 1;
        // SAFETY: an entry of the query's range table.
        let Some(table) = (unsafe { snapshot_table(rte) }) else {
            continue;
        };
        // SAFETY: the caller's query and the entry.
        unsafe { require_readable(query, rti, rte, &table) };
        // SAFETY: as above.
        unsafe { convert(query, rte, &table, walk) };
        converted.push(rti);
    }
    converted
}

/// The table entry `rte` reads, if it is a gsnap table (or a partitioned table with gsnap
/// partitions) read by the query, not an entry gsnap added.
///
/// # Safety
/// `rte` is a valid range-table entry.
unsafe fn snapshot_table(rte: *mut pg_sys::RangeTblEntry) -> Option<OpenRelation> {
    // SAFETY: the caller's entry.
    let (kind, relid) = unsafe { ((*rte).rtekind, (*rte).relid) };
    // SAFETY: as above.
    if kind != pg_sys::RTEKind::RTE_RELATION || unsafe { is_read_entry(rte) } {
        return None;
    }
    // The parser locked it.
    let rel = OpenRelation::open(relid, pg_sys::NoLock as pg_sys::LOCKMODE)?;
    if snapshotted(&rel) {
        return Some(rel);
    }
    // (A partitioned table not snapshotted has no gsnap partition.)
    let class = rel.class();
    let plain = class.relkind as u8 == pg_sys::RELKIND_RELATION;
    // SAFETY: the caller's entry.
    if plain && class.relhassubclass && unsafe { (*rte).inh } {
        // A table of another access method whose children use gsnap: the planner would read
        // them live through it.
        if let Some(&child) = gsnap_below(relid).first() {
            error(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!(
                    "gsnap.as_of is set: table {} is read live, and with it the gsnap table {} \
                     that inherits from it",
                    relation_name(relid),
                    relation_name(child)
                ),
            )
            .hint("Read it as FROM ONLY, and the gsnap tables by their own names.")
            .raise();
        }
    }
    None
}

/// True if reading `rel` reads snapshots while the setting applies: a gsnap table or
/// materialized view, or a partitioned table with gsnap partitions, not temporary (a
/// temporary table is never snapshotted).
fn snapshotted(rel: &OpenRelation) -> bool {
    let class = rel.class();
    let gsnap = match class.relkind as u8 {
        // SAFETY: an open relation.
        pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW => unsafe {
            crate::am::is_gsnap(rel.as_ptr())
        },
        pg_sys::RELKIND_PARTITIONED_TABLE => !gsnap_below(rel.oid()).is_empty(),
        _ => false,
    };
    gsnap && class.relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP
}

/// The tables below locked table `relid` (partitions, or tables inheriting from it) that
/// use gsnap.
fn gsnap_below(relid: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: the tables below a locked table, only their access methods read.
    unsafe {
        list::oids(crate::ffi::catalog::partitioning::find_all_inheritors(
            relid,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            std::ptr::null_mut(),
        ))
    }
    .into_iter()
    .filter(|&r| r != relid)
    .filter(|&r| {
        OpenRelation::open(r, pg_sys::NoLock as pg_sys::LOCKMODE)
            // SAFETY: an open relation.
            .is_some_and(|p| unsafe { crate::am::is_gsnap(p.as_ptr()) })
    })
    .collect()
}

/// Raises an ERROR if `query` does to entry `rti` what cannot be done to a snapshot.
///
/// # Safety
/// `rte` is entry `rti` of `query`.
unsafe fn require_readable(
    query: *mut pg_sys::Query,
    rti: i32,
    rte: *mut pg_sys::RangeTblEntry,
    table: &OpenRelation,
) {
    // SAFETY: the caller's query and entry.
    let (command, marks, sample) =
        unsafe { ((*query).commandType, (*query).rowMarks, (*rte).tablesample) };
    // SAFETY: a list of RowMarkClauses.
    let locked = unsafe { list::iter::<pg_sys::RowMarkClause>(marks) }
        // SAFETY: a RowMarkClause of the query.
        .any(|m| unsafe { (*m).rti } == rti as pg_sys::Index);
    // SAFETY: the caller's query.
    let target = unsafe { (*query).resultRelation } == rti;
    let what = if command != pg_sys::CmdType::CMD_SELECT && target {
        "written"
    } else if locked {
        "locked (FOR UPDATE, FOR SHARE, or a foreign key check)"
    } else if !sample.is_null() {
        "sampled (TABLESAMPLE)"
    } else {
        return;
    };
    refuse(table.oid(), what)
}

/// The ERROR for a table read as of the snapshot that a statement would `what` ("written",
/// "locked ...").
fn refuse(relid: pg_sys::Oid, what: &str) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "gsnap.as_of is set: table {} is read as of a snapshot, and cannot be {what}",
            relation_name(relid)
        ),
    )
    .hint("RESET gsnap.as_of to write or lock the live table.")
    .raise()
}

/// Makes entry `rte` of `query` read `table` as of the snapshot: a function entry calling
/// `gsnap_asof(NULL::table, snapshot)`, and a copy of the relation entry for the lock,
/// the privileges and the plan's dependency.
///
/// # Safety
/// `rte` is an entry of `query`, a relation entry of `table`.
unsafe fn convert(
    query: *mut pg_sys::Query,
    rte: *mut pg_sys::RangeTblEntry,
    table: &OpenRelation,
    walk: &mut Rewrite,
) {
    let function = match walk.function {
        Some(f) => f,
        None => {
            let f = asof_text_function().unwrap_or_else(|| {
                error(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "gsnap.as_of is set, but the gsnap extension is not created in this database",
                )
                .hint("CREATE EXTENSION gsnap, or RESET gsnap.as_of.")
                .raise()
            });
            walk.function = Some(f);
            f
        }
    };
    let class = table.class();
    let (row_type, natts) = (class.reltype, table_natts(table));
    let snapshot = std::ffi::CString::new(walk.snapshot.as_str()).unwrap_or_default();
    // SAFETY: nodes made in the planner's memory: a NULL of the row type, the setting as a
    // text constant, the call, its range-table function; the copy of the entry.
    unsafe {
        let text = pg_sys::cstring_to_text(snapshot.as_ptr());
        let args = list::list_of(&[
            pg_sys::makeNullConst(row_type, -1, pg_sys::InvalidOid).cast(),
            pg_sys::makeConst(
                pg_sys::TEXTOID,
                -1,
                pg_sys::DEFAULT_COLLATION_OID,
                -1,
                pg_sys::Datum::from(text),
                false,
                false,
            )
            .cast(),
        ]);
        let call = palloc_node(pg_sys::FuncExpr {
            xpr: pg_sys::Expr {
                type_: pg_sys::NodeTag::T_FuncExpr,
            },
            funcid: function,
            funcresulttype: row_type,
            funcretset: true,
            funcvariadic: false,
            funcformat: pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
            funccollid: pg_sys::InvalidOid,
            inputcollid: pg_sys::DEFAULT_COLLATION_OID,
            args,
            location: -1,
        });
        let rtfunc = palloc_node(pg_sys::RangeTblFunction {
            type_: pg_sys::NodeTag::T_RangeTblFunction,
            funcexpr: call.cast(),
            funccolcount: natts,
            ..Default::default()
        });
        let copy = pg_sys::copyObjectImpl(rte.cast()).cast::<pg_sys::RangeTblEntry>();
        (*copy).inh = false;
        (*copy).tablesample = std::ptr::null_mut();
        (*copy).securityQuals = std::ptr::null_mut();
        mark_read_entry(copy);
        if class.relkind as u8 == pg_sys::RELKIND_RELATION && (*rte).inh {
            // The query means the rows of the tables inheriting from it too, which no
            // snapshot records as the table's (each is a table of its own there): reading it
            // alone would return fewer rows than the query had at the snapshot.
            if let Some(below) = crate::read::partitioned::inheriting_tables(table.oid()) {
                let name = relation_name(table.oid());
                error(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!(
                        "gsnap.as_of is set: table {name} would be read with the tables that \
                         inherit from it ({below}), which gsnap does not read together as of a \
                         snapshot"
                    ),
                )
                .hint(format!(
                    "Read FROM ONLY {name}, and each table that inherits from it by its own \
                     name, or RESET gsnap.as_of."
                ))
                .raise();
            }
        }
        (*rte).rtekind = pg_sys::RTEKind::RTE_FUNCTION;
        (*rte).functions = list::list_of(&[rtfunc.cast()]);
        (*rte).funcordinality = false;
        (*rte).relid = pg_sys::InvalidOid;
        (*rte).relkind = 0;
        (*rte).rellockmode = 0;
        (*rte).tablesample = std::ptr::null_mut();
        (*rte).inh = false;
        (*rte).requiredPerms = 0;
        (*rte).selectedCols = std::ptr::null_mut();
        (*rte).insertedCols = std::ptr::null_mut();
        (*rte).updatedCols = std::ptr::null_mut();
        (*rte).extraUpdatedCols = std::ptr::null_mut();
        (*query).rtable = pg_sys::lappend((*query).rtable, copy.cast());
    }
}

/// The number of attributes of `table`'s row type, dropped ones included (the columns of
/// the function entry, in the relation entry's places).
fn table_natts(table: &OpenRelation) -> i32 {
    // SAFETY: the open relation's descriptor.
    unsafe { (*table.descriptor()).natts }
}

/// `gsnap_asof(anyelement, text)`, in whatever schema the extension is: the function of
/// that name and signature whose C function is the AS OF reader's.
fn asof_text_function() -> Option<pg_sys::Oid> {
    let mut name = pg_sys::NameData::default();
    // SAFETY: copies a C string into a name; a catalog cache list by name (released below),
    // its members' pg_proc rows read while it is held.
    unsafe {
        pg_sys::namestrcpy(&mut name, c"gsnap_asof".as_ptr());
        let found = pg_sys::SearchSysCacheList(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as i32,
            1,
            pg_sys::Datum::from(&raw mut name),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
        );
        let members = (*found).members.as_slice((*found).n_members as usize);
        let oid = members.iter().find_map(|&ct| {
            let form = &*pg_sys::GETSTRUCT(&raw mut (*ct).tuple).cast::<pg_sys::FormData_pg_proc>();
            let args = form.proargtypes.values.as_slice(form.pronargs as usize);
            (args == [pg_sys::ANYELEMENTOID, pg_sys::TEXTOID]
                && reader_kind(form.oid) == Some(Reader::AsofId))
            .then_some(form.oid)
        });
        pg_sys::ReleaseCatCacheList(found);
        oid
    }
}
