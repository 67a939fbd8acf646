//! Parse and plan nodes built in Rust: a node is filled in as a Rust value (the bindings'
//! `Default` is PostgreSQL's zeroed `makeNode`), then moved into the current memory context,
//! where PostgreSQL keeps its nodes.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Moves `node` into the current memory context and returns where it now lives. The value
/// must be a whole node with its tag set (`type_`, in its first field), as `makeNode` leaves
/// it; PostgreSQL frees it with its context (it is never dropped).
pub fn palloc_node<T: Copy>(node: T) -> *mut T {
    // SAFETY: palloc0 returns memory of the size asked for, MAXALIGNed (enough for any node),
    // or raises an ERROR; it is written whole before anyone reads it.
    unsafe {
        let at = pg_sys::palloc0(std::mem::size_of::<T>()).cast::<T>();
        at.write(node);
        at
    }
}

/// True if `node` is a node with tag `tag`.
///
/// # Safety
/// `node` is a valid node (every node starts with its tag).
pub unsafe fn is_a(node: *const pg_sys::Node, tag: pg_sys::NodeTag) -> bool {
    // SAFETY: the caller's promise.
    unsafe { (*node).type_ == tag }
}

/// An `Alias` node naming `name` (copied), in the current memory context.
pub fn alias(name: &CStr) -> *mut pg_sys::Alias {
    // SAFETY: makeAlias copies the name (a valid C string) and takes an empty column list.
    unsafe { pg_sys::makeAlias(name.as_ptr(), std::ptr::null_mut()) }
}

/// The attributes of one range-table entry that expressions read, as PostgreSQL's
/// `pull_varattnos` collects them.
pub struct VarAttnos {
    rti: pg_sys::Index,
    /// Attribute numbers offset by `FirstLowInvalidHeapAttributeNumber` (NULL: none yet).
    set: *mut pg_sys::Bitmapset,
}

impl VarAttnos {
    /// None yet, of range-table entry `rti`.
    pub fn new(rti: pg_sys::Index) -> VarAttnos {
        VarAttnos {
            rti,
            set: std::ptr::null_mut(),
        }
    }

    /// Adds the attributes `expr` reads.
    ///
    /// # Safety
    /// `expr` is a valid expression tree.
    pub unsafe fn add(&mut self, expr: *mut pg_sys::Node) {
        // SAFETY: the caller's promise; the set is NULL or the one pull_varattnos made.
        unsafe { pg_sys::pull_varattnos(expr, self.rti, &mut self.set) };
    }

    /// The user attributes read (1 to `natts`), ascending.
    pub fn columns(&self, natts: i16) -> Vec<i16> {
        (1..=natts)
            .filter(|&a| self.contains(i32::from(a)))
            .collect()
    }

    /// True if attribute `attno` (0: the whole row) is read.
    pub fn contains(&self, attno: i32) -> bool {
        let member = attno - pg_sys::FirstLowInvalidHeapAttributeNumber;
        // SAFETY: the set is NULL (empty) or the one pull_varattnos made.
        unsafe { pg_sys::bms_is_member(member, self.set) }
    }
}
