//! Partition pruning for the AS OF scan of a partitioned table: a partition at the snapshot
//! is not read if the query's conditions refute its partition constraint, as PostgreSQL's
//! constraint exclusion decides for a live table (`predicate_refuted_by`).
//!
//! The constraint recorded at the snapshot is over the partition's own attribute numbers; its
//! Vars are mapped to the partitioned table's attributes (recorded with it), then to the
//! scan's columns (the node's conditions are over its scan tuple, `INDEX_VAR`), and compared
//! with the node's conditions as planned. Conditions on parameters of a generic plan refute
//! nothing (every partition is read); a column whose type changed since the snapshot makes
//! its Vars differ from the query's, which refutes nothing either.

use crate::read::partitioned::Leaf;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_void, CString};

/// What the walk over a recorded constraint does to its Vars: the scan column of each
/// partition attribute (0: none), and whether every Var had one.
struct Remap {
    columns: Vec<i16>,
    all_mapped: bool,
}

/// True if `quals` (the node's conditions, implicitly AND-ed, over its scan tuple) refute
/// `leaf`'s partition constraint: the partition has no row to return. `scan_columns` are the
/// partitioned table's attributes (0-based) behind the scan tuple's columns.
///
/// # Safety
/// `quals` is NIL or a valid list of the node's condition expressions; in a transaction.
pub unsafe fn refuted(leaf: &Leaf, quals: *mut pg_sys::List, scan_columns: &[usize]) -> bool {
    if quals.is_null() || leaf.constraint.is_empty() {
        return false;
    }
    let columns = leaf
        .attnums
        .iter()
        .map(|&a| {
            scan_columns
                .iter()
                .position(|&c| i32::from(a) == c as i32 + 1)
                .map_or(0, |k| k as i16 + 1)
        })
        .collect();
    // SAFETY: the caller's promise.
    unsafe {
        mapped_constraint(&leaf.constraint, columns)
            .is_some_and(|constraint| refutes(quals, constraint))
    }
}

/// A recorded partition constraint (stored node form) with each Var of the partition
/// (range-table entry 1) pointed at `columns[attno - 1]` of the node's scan tuple
/// (`INDEX_VAR`); None if a Var has no column there, or the text is not a constraint.
///
/// # Safety
/// In a transaction; the tree is made in the current memory context.
unsafe fn mapped_constraint(constraint: &str, columns: Vec<i16>) -> Option<*mut pg_sys::Node> {
    let stored = CString::new(constraint).ok()?;
    let mut remap = Remap {
        columns,
        all_mapped: true,
    };
    // SAFETY: the recorded constraint in PostgreSQL's stored node form (written by
    // nodeToString at the snapshot), a fresh tree changed in place.
    unsafe {
        let constraint = pg_sys::stringToNode(stored.as_ptr()).cast::<pg_sys::Node>();
        remap_vars(constraint, std::ptr::from_mut(&mut remap).cast());
        remap.all_mapped.then_some(constraint)
    }
}

/// True if the node's conditions `quals` refute `constraint` (an expression over the same
/// scan tuple).
///
/// # Safety
/// `quals` is a valid list of the node's conditions; `constraint` a tree this call may change.
unsafe fn refutes(quals: *mut pg_sys::List, constraint: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's promise; the conditions are copied before they are changed;
    // predicate_refuted_by only reads both.
    unsafe {
        remap_vars(constraint, std::ptr::null_mut());
        let quals = pg_sys::copyObjectImpl(quals.cast()).cast::<pg_sys::Node>();
        remap_vars(quals, std::ptr::null_mut());
        let predicate = pg_sys::make_ands_implicit(constraint.cast());
        pg_sys::predicate_refuted_by(predicate, quals.cast(), false)
    }
}

/// True if `quals` (a range or versions node's Row Filter, implicitly AND-ed, over the fields
/// of its `rec` column `rec_column`, of row type `row_type`) refute the partition constraint
/// `constraint` of a partition whose attributes hold the partitioned table's `attnums`: the
/// partition has no row version to return at that snapshot.
///
/// # Safety
/// `quals` is NIL or a valid list of the node's conditions; in a transaction.
pub unsafe fn refuted_over_rec(
    constraint: &str,
    attnums: &[i16],
    quals: *mut pg_sys::List,
    rec_column: i16,
    row_type: pg_sys::Oid,
) -> bool {
    if quals.is_null() || constraint.is_empty() {
        return false;
    }
    // SAFETY: the caller's promise; the constraint's Vars become the partitioned table's
    // columns (INDEX_VAR), then fields of the node's `rec` (an INDEX_VAR column too).
    unsafe {
        let Some(constraint) = mapped_constraint(constraint, attnums.to_vec()) else {
            return false;
        };
        let (fields, unsupported) = crate::plan::security::as_rec_fields(
            constraint,
            pg_sys::INDEX_VAR,
            rec_column,
            row_type,
        );
        !unsupported && refutes(quals, fields)
    }
}

/// With a [`Remap`] context: points each Var of the constraint (over the partition, entry
/// 1) at its scan column. Without: leaves the Vars where they are. Either way each Var's
/// syntactic referent becomes the Var itself (`varnosyn`, `varattnosyn`), which PostgreSQL 15
/// compares when it matches Vars, and which the query's and the constraint's set apart.
#[pg_guard]
unsafe extern "C-unwind" fn remap_vars(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: a node of the expression being walked (a Var by its tag); the context is the
    // caller's Remap or null.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_Var {
            let var = node.cast::<pg_sys::Var>();
            if let Some(remap) = context.cast::<Remap>().as_mut() {
                let column = usize::try_from((*var).varattno - 1)
                    .ok()
                    .and_then(|i| remap.columns.get(i).copied())
                    .unwrap_or(0);
                remap.all_mapped &= column > 0 && (*var).varlevelsup == 0;
                (*var).varno = pg_sys::INDEX_VAR;
                (*var).varattno = column;
            }
            (*var).varnosyn = (*var).varno as pg_sys::Index;
            (*var).varattnosyn = (*var).varattno;
            return false;
        }
        pg_sys::expression_tree_walker(node, Some(remap_vars), context)
    }
}
