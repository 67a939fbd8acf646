//! Queries over snapshots depend on their table, as queries over the table do (docs/design.md,
//! "Reading safely").
//!
//! `gsnap_asof(NULL::t, 42)` names its table by a row type, not in FROM, so PostgreSQL alone
//! would see no relation in the query: no lock on `t`, no plan dependency on it. A prepared
//! statement, a PL/pgSQL or SQL function plan, or a cursor would then outlive an `ALTER TABLE
//! t` and read with a row type that is no longer the table's (the crash of issue 11).
//!
//! So right after parse analysis (`post_parse_analyze_hook`) every query that calls one of
//! gsnap's table readers gets, in its own range table, one `RTE_RELATION` entry per table it
//! reads, referenced by nothing in its join tree (as the entries views leave behind for their
//! locks and permission checks), and the table is locked ACCESS SHARE. PostgreSQL's own
//! machinery then does the rest:
//! - the lock is held until the transaction ends, and a cached plan takes it again before it
//!   is reused (`AcquirePlannerLocks`, `AcquireExecutorLocks`), so ALTER, DROP, TRUNCATE,
//!   VACUUM FULL from another session wait for the reading transaction;
//! - the plan cache finds the table among the query's dependencies, so a schema change
//!   invalidates prepared statements and PL/pgSQL and SQL function plans; the query is then
//!   analyzed again, and PostgreSQL raises "cached plan must not change result type" where
//!   the columns changed;
//! - a view over a snapshot depends on its table.
//!
//! The scans add their own checks at executor start (`crate::exec`): they keep the
//! relation open while they run (so the same session cannot alter it under an open cursor)
//! and compare the row type they were planned with to the table's.
//!
//! The lock comes after parse analysis, which took the row type from the type cache: a
//! change that commits while the lock waits leaves the query with the columns of before.
//! The planner checks the columns the query reads against the table's
//! (`super::nodes::require_analyzed_columns`, a clean 40001 where one is gone or retyped).

use crate::error::error;
use crate::ffi::catalog::name_of;
use crate::ffi::list;
use crate::ffi::node::{alias, palloc_node};
use crate::ffi::relation::{relation_kind, relation_of_type, OpenRelation};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

/// gsnap's functions that read a table named by the row type of their first argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reader {
    /// `gsnap_asof(anyelement, bigint)`, and its `text` form (the same C function).
    AsofId,
    /// `gsnap_asof(anyelement, timestamptz)`.
    AsofTime,
    /// `gsnap_range(anyelement, bigint, bigint)`, and its `text` and `timestamptz` forms (the
    /// same C function).
    Range,
    /// `gsnap_diff(anyelement, bigint, bigint)`, and its `text` and `timestamptz` forms.
    Diff,
    /// `gsnap_diff_at(anyelement, bigint, bigint)`: a function scan (no custom scan).
    DiffAt,
    /// `gsnap_diff_by_key(anyelement, bigint, bigint)`: a function scan (no custom scan).
    DiffByKey,
    /// `gsnap_versions(anyelement, bigint, bigint)`, and its `text` and `timestamptz` forms.
    Versions,
}

thread_local! {
    /// Which function OIDs are gsnap's readers (looked up once per backend; cleared when
    /// pg_proc changes).
    static READERS: RefCell<HashMap<u32, Option<Reader>>> = RefCell::new(HashMap::new());
}

static mut PREV_POST_PARSE_ANALYZE: pg_sys::post_parse_analyze_hook_type = None;

/// Installs the hook; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process before any query is analyzed.
    unsafe {
        PREV_POST_PARSE_ANALYZE = pg_sys::post_parse_analyze_hook;
        pg_sys::post_parse_analyze_hook = Some(post_parse_analyze);
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            Some(forget_readers),
            pg_sys::Datum::from(0usize),
        );
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn forget_readers(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    READERS.with(|r| r.borrow_mut().clear());
}

/// Which of gsnap's readers function `funcid` is, if any.
pub fn reader_kind(funcid: pg_sys::Oid) -> Option<Reader> {
    if let Some(known) = READERS.with(|r| r.borrow().get(&funcid.to_u32()).copied()) {
        return known;
    }
    // SAFETY: an fmgr lookup of the function (a catalog read); only C functions of this
    // library have these addresses.
    let addr = unsafe {
        let mut finfo = std::mem::zeroed::<pg_sys::FmgrInfo>();
        pg_sys::fmgr_info(funcid, &mut finfo);
        finfo.fn_addr.map(|f| f as usize)
    };
    let readers = [
        (
            crate::sql::asof::gsnap_asof_id as *const () as usize,
            Reader::AsofId,
        ),
        (
            crate::sql::asof::gsnap_asof_time as *const () as usize,
            Reader::AsofTime,
        ),
        (
            crate::sql::range::gsnap_range as *const () as usize,
            Reader::Range,
        ),
        (
            crate::sql::diff::gsnap_diff as *const () as usize,
            Reader::Diff,
        ),
        (
            crate::sql::diff::gsnap_diff_at as *const () as usize,
            Reader::DiffAt,
        ),
        (
            crate::sql::diff::gsnap_diff_by_key as *const () as usize,
            Reader::DiffByKey,
        ),
        (
            crate::sql::versions::gsnap_versions as *const () as usize,
            Reader::Versions,
        ),
    ];
    let kind = readers
        .iter()
        .find(|(a, _)| Some(*a) == addr)
        .map(|&(_, k)| k);
    READERS.with(|r| r.borrow_mut().insert(funcid.to_u32(), kind));
    kind
}

/// The table a reader call reads: the relation whose row type its first argument has, if
/// it is one a reader can read (a table, materialized view or partitioned table).
///
/// # Safety
/// `func` is a FuncExpr of one of gsnap's readers.
pub unsafe fn table_of_call(func: *mut pg_sys::FuncExpr) -> Option<pg_sys::Oid> {
    // SAFETY: the caller's promise: the call's arguments are NIL or a List of expressions.
    let first = unsafe { list::iter::<pg_sys::Node>((*func).args).next() }?;
    // SAFETY: an expression of the call.
    let relid = relation_of_type(unsafe { pg_sys::exprType(first) })?;
    let readable = [
        pg_sys::RELKIND_RELATION,
        pg_sys::RELKIND_MATVIEW,
        pg_sys::RELKIND_PARTITIONED_TABLE,
    ];
    relation_kind(relid)
        .is_some_and(|kind| readable.contains(&kind))
        .then_some(relid)
}

/// The alias that marks the range-table entries this module adds.
const READ_ENTRY: &std::ffi::CStr = c"gsnap read";

/// True if `rte` is an entry this module added for a table a query reads over snapshots.
///
/// # Safety
/// `rte` is a valid range-table entry.
pub unsafe fn is_read_entry(rte: *const pg_sys::RangeTblEntry) -> bool {
    // SAFETY: the caller's promise; alias names are C strings.
    unsafe {
        (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
            && !(*rte).inFromCl
            && !(*rte).alias.is_null()
            && std::ffi::CStr::from_ptr((*(*rte).alias).aliasname) == READ_ENTRY
    }
}

/// Marks `rte` as an entry gsnap added for a table a query reads over snapshots (referenced
/// by nothing; the executor keeps its table open, `exec::tables`).
///
/// # Safety
/// `rte` is a valid relation entry.
pub unsafe fn mark_read_entry(rte: *mut pg_sys::RangeTblEntry) {
    // SAFETY: the caller's promise.
    unsafe {
        (*rte).alias = alias(READ_ENTRY);
        (*rte).inFromCl = false;
    }
}

/// The walk's state: the tables read by the query being walked (not its subqueries').
struct Walk {
    tables: Vec<pg_sys::Oid>,
}

#[pg_guard]
unsafe extern "C-unwind" fn post_parse_analyze(
    pstate: *mut pg_sys::ParseState,
    query: *mut pg_sys::Query,
    jstate: *mut pg_sys::JumbleState,
) {
    // SAFETY: set once by `init`, before any query is analyzed.
    if let Some(prev) = unsafe { PREV_POST_PARSE_ANALYZE } {
        // SAFETY: the previous hook, given PostgreSQL's own arguments.
        unsafe { prev(pstate, query, jstate) };
    }
    // DECLARE CURSOR, EXPLAIN and CREATE TABLE AS hold their analyzed query inside.
    // SAFETY: PostgreSQL's analyzed query; a utility statement's query if it holds one.
    let query = unsafe {
        if (*query).commandType == pg_sys::CmdType::CMD_UTILITY {
            pg_sys::UtilityContainsQuery((*query).utilityStmt)
        } else {
            query
        }
    };
    if query.is_null() {
        return;
    }
    let mut walk = Walk { tables: Vec::new() };
    // SAFETY: the analyzed query, which we may extend before it is rewritten; `walk` outlives
    // the walk.
    unsafe { walker(query.cast(), (&raw mut walk).cast()) };
}

/// Finds the reader calls of every (sub)query and gives each query the entries of the tables
/// its own calls read.
#[pg_guard]
unsafe extern "C-unwind" fn walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // `context` is the Walk of `post_parse_analyze`, borrowed only between recursive calls.
    let walk = context.cast::<Walk>();
    // SAFETY: a node of the query being walked.
    let tag = unsafe { (*node).type_ };
    match tag {
        pg_sys::NodeTag::T_Query => {
            let query = node.cast::<pg_sys::Query>();
            // SAFETY: the Walk (no borrow of it is live).
            let outer = unsafe { std::mem::take(&mut (*walk).tables) };
            // SAFETY: a (sub)query of the statement, walked with the same context.
            unsafe { pg_sys::query_tree_walker(query, Some(walker), context, 0) };
            // SAFETY: the Walk (no borrow of it is live).
            let mine = unsafe { std::mem::replace(&mut (*walk).tables, outer) };
            for relid in mine {
                // SAFETY: an analyzed query of this statement.
                unsafe { depend_on_table(query, relid) };
            }
            false
        }
        pg_sys::NodeTag::T_FuncExpr => {
            // SAFETY: a FuncExpr (its tag says so), and the Walk (no borrow of it is live).
            unsafe { note_reader_call(node.cast(), &mut (*walk).tables) };
            // SAFETY: walking on into the call's arguments, with the same context.
            unsafe { pg_sys::expression_tree_walker(node, Some(walker), context) }
        }
        // SAFETY: walking on into the node's children, with the same context.
        _ => unsafe { pg_sys::expression_tree_walker(node, Some(walker), context) },
    }
}

/// Adds the table `func` reads to `tables`, if it is a call of one of gsnap's readers.
///
/// # Safety
/// `func` is a valid FuncExpr.
unsafe fn note_reader_call(func: *mut pg_sys::FuncExpr, tables: &mut Vec<pg_sys::Oid>) {
    // SAFETY: the caller's promise.
    let (returns_set, funcid) = unsafe { ((*func).funcretset, (*func).funcid) };
    if !returns_set || reader_kind(funcid).is_none() {
        return;
    }
    // SAFETY: a FuncExpr of one of gsnap's readers.
    if let Some(relid) = unsafe { table_of_call(func) } {
        if !tables.contains(&relid) {
            tables.push(relid);
        }
    }
}

/// Locks `relid` ACCESS SHARE (until the transaction ends) and adds its range-table entry to
/// `query`. The table existed when the query was analyzed (its row type named it); gone once
/// the lock is granted, it was dropped while the query waited for it: a clean ERROR (the
/// query, left to run, failed in PostgreSQL's function scan with an internal error over the
/// row type dropped with the table).
///
/// # Safety
/// `query` is an analyzed query of this statement.
unsafe fn depend_on_table(query: *mut pg_sys::Query, relid: pg_sys::Oid) {
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    let Some(rel) = OpenRelation::open(relid, lock) else {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!(
                "the table with OID {} that this query reads was dropped while the query \
                 waited for it",
                relid.to_u32()
            ),
        )
        .hint("Run the query again.")
        .raise();
    };
    let rte = pg_sys::RangeTblEntry {
        type_: pg_sys::NodeTag::T_RangeTblEntry,
        rtekind: pg_sys::RTEKind::RTE_RELATION,
        relid,
        relkind: rel.class().relkind,
        rellockmode: lock,
        eref: alias(name_of(&rel.class().relname)),
        // The mark the executor looks for (`is_read_entry`); never printed, the entry being
        // referenced by nothing.
        alias: alias(READ_ENTRY),
        // The readers check privileges themselves (access.rs); nothing to check here.
        requiredPerms: 0,
        ..Default::default()
    };
    // SAFETY: the caller's promise: the entry joins the query's range table, in the current
    // (parse) memory context.
    unsafe { (*query).rtable = pg_sys::lappend((*query).rtable, palloc_node(rte).cast()) };
    crate::read::partitioned::note_inheriting_tables(
        relid,
        "reads",
        "Read each of them by its own row type (gsnap_asof(NULL::child, ...)) and combine the \
         results with UNION ALL.",
    );
    // `rel` closes here; its lock stays until the transaction ends.
}
