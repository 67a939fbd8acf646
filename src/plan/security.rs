//! Row-level security over snapshots: the policies of a table that apply to the current user
//! in a SELECT, as PostgreSQL's rewriter adds them to a query of the live table
//! (`get_row_security_policies`), become the first conditions of a scan over the table's old
//! rows: an AS OF scan evaluates them on its columns, a range or versions scan on the fields
//! of `rec` ([`over_rec`]), in its Row Filter. Being first, they are checked before the
//! query's own conditions, so a function in a `WHERE` that leaks what it sees never sees a row
//! the policies hide. The plan then depends on the role (planned again for another one), and
//! the executor refuses row security it was not planned for (`sql::access`). Policies with
//! sub-queries, and policies with volatile functions in a range or versions scan (where a
//! condition on `rec` is checked once per row version, not per row), are refused.

use crate::error::error;
use crate::ffi::node::is_a;
use crate::ffi::relation::{relation_name, relation_row_type};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ffi::c_void;

/// The conditions of the row-level security policies of table `relid` that apply to the
/// current user (or to `check_as`, a view's owner, if set) in a SELECT (PostgreSQL's own
/// `get_row_security_policies`, as the rewriter adds them to a query of the live table), over
/// range-table entry `rti` (the scan returns the table's row type: its attribute numbers are
/// the table's), and that user; None if row security does not apply. A cached plan depends
/// on the role whenever the table has row security (it is planned again for another role, as
/// PostgreSQL does). Policies with sub-queries cannot be evaluated by the scan: an ERROR
/// naming the table.
///
/// # Safety
/// The planner's state, during planning.
pub(super) unsafe fn quals(
    root: *mut pg_sys::PlannerInfo,
    relid: pg_sys::Oid,
    rti: i32,
    check_as: pg_sys::Oid,
) -> Option<(*mut pg_sys::List, pg_sys::Oid)> {
    // SAFETY: a catalog lookup; raises PostgreSQL's own ERROR when row_security is off and
    // policies would apply.
    let status = unsafe { pg_sys::check_enable_rls(relid, check_as, false) };
    if status == pg_sys::CheckEnableRlsResult::RLS_NONE as i32 {
        return None;
    }
    // SAFETY: the caller's promise: the planner's global state.
    unsafe { (*(*root).glob).dependsOnRole = true };
    if status != pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32 {
        return None; // does not apply to this role now
    }
    // What get_row_security_policies reads of a query and of its entry: a SELECT of the table.
    // SAFETY: zeroed nodes of the right tags, in the planner's memory context.
    let (query, rte) = unsafe {
        let query = pg_sys::palloc0(std::mem::size_of::<pg_sys::Query>()).cast::<pg_sys::Query>();
        (*query).type_ = pg_sys::NodeTag::T_Query;
        (*query).commandType = pg_sys::CmdType::CMD_SELECT;
        let rte = pg_sys::palloc0(std::mem::size_of::<pg_sys::RangeTblEntry>())
            .cast::<pg_sys::RangeTblEntry>();
        (*rte).type_ = pg_sys::NodeTag::T_RangeTblEntry;
        (*rte).rtekind = pg_sys::RTEKind::RTE_RELATION;
        (*rte).relid = relid;
        (*rte).relkind = pg_sys::RELKIND_RELATION as std::ffi::c_char;
        (*rte).requiredPerms = pg_sys::ACL_SELECT as pg_sys::AclMode;
        (*rte).checkAsUser = check_as;
        (query, rte)
    };
    let mut quals: *mut pg_sys::List = std::ptr::null_mut();
    let mut checks: *mut pg_sys::List = std::ptr::null_mut();
    let (mut has_row_security, mut has_sublinks) = (false, false);
    // SAFETY: the nodes just made; PostgreSQL fills the four outputs.
    unsafe {
        pg_sys::get_row_security_policies(
            query,
            rte,
            rti,
            &mut quals,
            &mut checks,
            &mut has_row_security,
            &mut has_sublinks,
        )
    };
    if has_sublinks {
        error(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "a row-level security policy of table {} uses a sub-query, which gsnap cannot \
                 apply to the rows of a snapshot",
                relation_name(relid)
            ),
        )
        .hint("The table owner, or a role with BYPASSRLS, can read its snapshots.")
        .raise();
    }
    // SAFETY: the policies' expressions, copies made for this query.
    unsafe { pg_sys::fix_opfuncids(quals.cast()) };
    Some((quals, crate::sql::access::effective_user(check_as)))
}

/// The role a scan of range-table entry `rti` checks privileges and policies as: the entry's
/// `checkAsUser`, which PostgreSQL sets to a view's owner on every entry of the view's query
/// (unless the view is `security_invoker`); InvalidOid: the current user.
///
/// # Safety
/// The planner's state, during planning; `rti` is an entry of its query.
pub(super) unsafe fn check_as_user(root: *mut pg_sys::PlannerInfo, rti: i32) -> pg_sys::Oid {
    // SAFETY: the caller's promise: the planner's array of range-table entries.
    unsafe { (**(*root).simple_rte_array.add(rti as usize)).checkAsUser }
}

/// What [`over_rec`] rewrites: Vars of range-table entry `rti` into fields of its column
/// `rec_attno`, of type `row_type`.
struct RecFields {
    rti: i32,
    rec_attno: i16,
    row_type: pg_sys::Oid,
    /// A Var the scan cannot give (a system column).
    unsupported: bool,
}

/// The policies' conditions `quals` (over the table's columns as Vars of entry `rti`) over
/// the fields of the scan's column `rec_attno` instead, the table's row as one value: column
/// `a` becomes `(rec).a`, the whole row `rec`. An ERROR for conditions a range or versions
/// scan cannot check faithfully (volatile ones, system columns).
///
/// # Safety
/// `quals` are the policies' conditions for this scan (NIL: none), in the planner's memory
/// context.
pub(super) unsafe fn over_rec(
    quals: *mut pg_sys::List,
    rti: i32,
    rec_attno: i16,
    relid: pg_sys::Oid,
) -> *mut pg_sys::List {
    if quals.is_null() {
        return quals; // no policy
    }
    let mut context = RecFields {
        rti,
        rec_attno,
        row_type: relation_row_type(relid),
        unsupported: false,
    };
    // SAFETY: the caller's promise; the mutator copies what it changes.
    let (quals, volatile) = unsafe {
        let quals = to_rec_fields(quals.cast(), (&mut context as *mut RecFields).cast());
        (quals, pg_sys::contain_volatile_functions(quals))
    };
    if volatile || context.unsupported {
        error(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "a row-level security policy of table {} uses {}, which gsnap cannot check on \
                 the row versions of a range of snapshots",
                relation_name(relid),
                if volatile {
                    "a volatile function"
                } else {
                    "a system column"
                }
            ),
        )
        .hint("Read each snapshot with gsnap_asof, which checks the policies on every row.")
        .raise();
    }
    quals.cast()
}

/// `expr` with every Var of range-table entry `rti` (a column of a table whose row type is
/// `row_type`) replaced by the field of `rec`, column `rec_attno` of the same entry, that
/// holds it; and whether it had a Var that cannot be (a system column). Used by partition
/// pruning of range and versions scans (`exec::pruning`), whose conditions are over `rec`.
///
/// # Safety
/// `expr` is an expression tree; in a memory context that outlives the result.
pub(crate) unsafe fn as_rec_fields(
    expr: *mut pg_sys::Node,
    rti: i32,
    rec_attno: i16,
    row_type: pg_sys::Oid,
) -> (*mut pg_sys::Node, bool) {
    let mut context = RecFields {
        rti,
        rec_attno,
        row_type,
        unsupported: false,
    };
    // SAFETY: the caller's promise; the mutator copies what it changes.
    let expr = unsafe { to_rec_fields(expr, (&mut context as *mut RecFields).cast()) };
    (expr, context.unsupported)
}

/// The mutator of [`over_rec`].
///
/// # Safety
/// Called by `expression_tree_mutator` with a node of an expression tree and a `RecFields`.
#[pg_guard]
unsafe extern "C-unwind" fn to_rec_fields(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> *mut pg_sys::Node {
    if node.is_null() {
        return node;
    }
    // SAFETY: the caller's promise: `context` is our RecFields.
    let cx = unsafe { &mut *context.cast::<RecFields>() };
    // SAFETY: a node of the tree; a Var is read as one once its tag says so.
    unsafe {
        if is_a(node.cast(), pg_sys::NodeTag::T_Var) {
            let var = node.cast::<pg_sys::Var>();
            if (*var).varno == cx.rti && (*var).varlevelsup == 0 {
                let rec =
                    pg_sys::makeVar(cx.rti, cx.rec_attno, cx.row_type, -1, pg_sys::InvalidOid, 0);
                if (*var).varattno == 0 {
                    return rec.cast();
                }
                if (*var).varattno < 0 {
                    cx.unsupported = true;
                    return node;
                }
                let field = pg_sys::palloc0(std::mem::size_of::<pg_sys::FieldSelect>())
                    .cast::<pg_sys::FieldSelect>();
                (*field).xpr.type_ = pg_sys::NodeTag::T_FieldSelect;
                (*field).arg = rec.cast();
                (*field).fieldnum = (*var).varattno;
                (*field).resulttype = (*var).vartype;
                (*field).resulttypmod = (*var).vartypmod;
                (*field).resultcollid = (*var).varcollid;
                return field.cast();
            }
        }
        // SAFETY: PostgreSQL declares the mutator without parameters (an old C idiom); it
        // calls it with (node, context), as `to_rec_fields` takes them.
        let mutator = std::mem::transmute::<
            unsafe extern "C-unwind" fn(*mut pg_sys::Node, *mut c_void) -> *mut pg_sys::Node,
            unsafe extern "C-unwind" fn() -> *mut pg_sys::Node,
        >(to_rec_fields);
        pg_sys::expression_tree_mutator(node, Some(mutator), context)
    }
}
