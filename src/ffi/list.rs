//! PostgreSQL `List`s of node pointers and of Integer nodes, as plan nodes keep them.

use pgrx::pg_sys;
use std::ffi::c_void;

/// A List holding `items` (allocated in the current memory context).
pub fn list_of(items: &[*mut c_void]) -> *mut pg_sys::List {
    let mut list = std::ptr::null_mut();
    for &item in items {
        // SAFETY: appending a pointer to a (possibly empty) list; the pointer is stored, not
        // dereferenced.
        list = unsafe { pg_sys::lappend(list, item) };
    }
    list
}

/// An Integer node (allocated in the current memory context), for a plan's private list.
pub fn int_node(v: i32) -> *mut c_void {
    // SAFETY: makeInteger allocates and fills a new node.
    unsafe { pg_sys::makeInteger(v).cast() }
}

/// The length of `list` (0 for NIL).
///
/// # Safety
/// `list` is NIL or a valid List.
pub unsafe fn len(list: *mut pg_sys::List) -> usize {
    // SAFETY: the caller's promise.
    unsafe { pg_sys::list_length(list) as usize }
}

/// Element `i` of `list`, as a `*mut T`.
///
/// # Safety
/// `list` is a valid List of pointers with more than `i` elements, pointing to `T`s.
pub unsafe fn nth<T>(list: *mut pg_sys::List, i: usize) -> *mut T {
    // SAFETY: the caller's promise.
    unsafe { pg_sys::list_nth(list, i as i32).cast() }
}

/// The value of the Integer node at `i` of `list`.
///
/// # Safety
/// Element `i` of `list` is an Integer node.
pub unsafe fn int_at(list: *mut pg_sys::List, i: usize) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { (*nth::<pg_sys::Integer>(list, i)).ival }
}

/// The elements of `list` as `*mut T`, in order.
///
/// # Safety
/// `list` is NIL or a valid List of pointers to `T`s that outlives the iterator.
pub unsafe fn iter<T>(list: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    // SAFETY: the caller's promise.
    let n = unsafe { len(list) };
    // SAFETY: `i` is below the length read above.
    (0..n).map(move |i| unsafe { nth::<T>(list, i) })
}

/// The OIDs of an OID list (`RelationGetIndexList`, `getOwnedSequences`), copied.
///
/// # Safety
/// `list` is NIL or a valid OID list.
pub unsafe fn oids(list: *mut pg_sys::List) -> Vec<pg_sys::Oid> {
    // SAFETY: the caller's promise.
    let n = unsafe { len(list) };
    // SAFETY: `i` is below the length read above; an OID list's cells hold OIDs.
    (0..n)
        .map(|i| unsafe { pg_sys::list_nth_oid(list, i as i32) })
        .collect()
}
