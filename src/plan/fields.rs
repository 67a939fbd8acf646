//! Which columns of the table a query over a range reads: the fields of `rec` it selects.
//!
//! A range or versions scan returns the row as one value, `rec`, and the query picks fields
//! of it above the scan (`(rec).id`), so the scan's own target list only says "rec". For the
//! privilege check (SELECT on each column read, as for the live table: `sql::access`) the
//! whole query is searched: every use of `rec` must be a field selection, whose field is then
//! read; any other use (the whole value passed on, compared, handed to a sub-query as a
//! parameter) reads every column. The answer errs on the side of more columns, never fewer.

use crate::ffi::node::is_a;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::BTreeSet;
use std::ffi::c_void;

/// What the walk looks for and finds.
struct FieldUse {
    /// The scan's range-table entry and its `rec` column.
    rti: i32,
    rec_attno: i16,
    /// How many queries deep the walk is (a Var of ours in a sub-query has this level).
    depth: u32,
    fields: BTreeSet<i16>,
    /// `rec`, or the function's whole row, is used other than through a field.
    whole: bool,
}

impl FieldUse {
    /// True if `node` is a Var of the scan's `rec` (or of its whole row) at this depth.
    ///
    /// # Safety
    /// `node` is a node of the query tree.
    unsafe fn is_ours(&self, node: *mut pg_sys::Node, attnos: &[i16]) -> bool {
        // SAFETY: the caller's promise; a Var is read as one once its tag says so.
        unsafe {
            if !is_a(node.cast(), pg_sys::NodeTag::T_Var) {
                return false;
            }
            let var = node.cast::<pg_sys::Var>();
            (*var).varno == self.rti
                && (*var).varlevelsup == self.depth
                && attnos.contains(&(*var).varattno)
        }
    }
}

/// The columns of the table the query of `root` reads through the `rec` column `rec_attno`
/// of range-table entry `rti` (sorted), or None for every column.
///
/// # Safety
/// The planner's state, during planning.
pub(super) unsafe fn read_through_rec(
    root: *mut pg_sys::PlannerInfo,
    rti: i32,
    rec_attno: i16,
) -> Option<Vec<i16>> {
    let mut found = FieldUse {
        rti,
        rec_attno,
        depth: 0,
        fields: BTreeSet::new(),
        whole: false,
    };
    // SAFETY: the caller's promise: the query being planned; the walker keeps to it.
    unsafe {
        pg_sys::query_tree_walker(
            (*root).parse,
            Some(walk),
            (&mut found as *mut FieldUse).cast(),
            0,
        );
        // Outer values sub-plans take from this query (already turned into parameters).
        for p in crate::ffi::list::iter::<pg_sys::PlannerParamItem>((*root).plan_params) {
            walk((*p).item, (&mut found as *mut FieldUse).cast());
        }
    }
    (!found.whole).then(|| found.fields.into_iter().collect())
}

/// The walker of [`read_through_rec`].
///
/// # Safety
/// Called by PostgreSQL's tree walkers with a node of the query and our `FieldUse`.
#[pg_guard]
unsafe extern "C-unwind" fn walk(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: the caller's promise: `context` is our FieldUse.
    let cx = unsafe { &mut *context.cast::<FieldUse>() };
    // SAFETY: a node of the tree, read as the kind its tag says.
    unsafe {
        if is_a(node.cast(), pg_sys::NodeTag::T_FieldSelect) {
            let select = node.cast::<pg_sys::FieldSelect>();
            if cx.is_ours((*select).arg.cast(), &[cx.rec_attno]) {
                cx.fields.insert((*select).fieldnum);
                return false;
            }
        } else if cx.is_ours(node, &[cx.rec_attno, 0]) {
            cx.whole = true;
            return false;
        } else if is_a(node.cast(), pg_sys::NodeTag::T_Query) {
            cx.depth += 1;
            let stop = pg_sys::query_tree_walker(node.cast(), Some(walk), context, 0);
            cx.depth -= 1;
            return stop;
        }
        pg_sys::expression_tree_walker(node, Some(walk), context)
    }
}
