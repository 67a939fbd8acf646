//! Rows as PostgreSQL holds them: tuple descriptors, heap tuples formed and deformed, and
//! the executor's tuple slots.

use pgrx::pg_sys;

/// The attributes of `desc`, dropped ones included, in order.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives `'a` unchanged.
pub unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    // SAFETY: the caller's promise; a descriptor holds `natts` attributes.
    unsafe { (*desc).attrs.as_slice((*desc).natts as usize) }
}

/// A copy of the descriptor of composite type `type_oid` (a table's row type), in the
/// current memory context; raises an ERROR if the type is not composite.
pub fn row_type_copy(type_oid: pg_sys::Oid) -> pg_sys::TupleDesc {
    // SAFETY: a type cache lookup by OID; the copy belongs to the caller.
    unsafe { pg_sys::lookup_rowtype_tupdesc_copy(type_oid, -1) }
}

/// A heap tuple of `desc` holding `values` and `nulls` (in the current memory context).
///
/// # Safety
/// `desc` is a valid descriptor, and `values` are datums of its attributes' types (where
/// not null).
pub unsafe fn form(
    desc: pg_sys::TupleDesc,
    values: &[pg_sys::Datum],
    nulls: &[bool],
) -> pg_sys::HeapTuple {
    // SAFETY: the caller's promise; heap_form_tuple reads `natts` entries of each array.
    unsafe {
        let natts = (*desc).natts as usize;
        assert!(
            values.len() >= natts && nulls.len() >= natts,
            "a value for every attribute"
        );
        pg_sys::heap_form_tuple(desc, values.as_ptr().cast_mut(), nulls.as_ptr().cast_mut())
    }
}

/// Splits `tuple` into `values` and `nulls` by `desc`; varlena values point into the tuple.
///
/// # Safety
/// `tuple` points to a complete heap tuple of row type `desc` (its data aligned as on a
/// page), valid while the values are used.
pub unsafe fn deform(
    tuple: &mut pg_sys::HeapTupleData,
    desc: pg_sys::TupleDesc,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) {
    // SAFETY: the caller's promise; heap_deform_tuple writes `natts` entries of each array.
    unsafe {
        let natts = (*desc).natts as usize;
        assert!(
            values.len() >= natts && nulls.len() >= natts,
            "room for every attribute"
        );
        pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
    }
}

/// Stores `columns` (value, is null) in the virtual slot `slot`, as its row.
///
/// # Safety
/// `slot` is a valid virtual slot with one column per item of `columns`, whose values are of
/// the slot's column types and stay valid while the slot holds them.
pub unsafe fn store_virtual(
    slot: *mut pg_sys::TupleTableSlot,
    columns: impl IntoIterator<Item = (pg_sys::Datum, bool)>,
) {
    // SAFETY: the caller's promise: the slot's arrays have a place for every column (checked
    // before each write).
    unsafe {
        pg_sys::ExecClearTuple(slot);
        let natts = (*(*slot).tts_tupleDescriptor).natts as usize;
        let mut stored = 0;
        for (i, (value, null)) in columns.into_iter().enumerate() {
            assert!(i < natts, "more values than the slot's {natts} columns");
            *(*slot).tts_values.add(i) = value;
            *(*slot).tts_isnull.add(i) = null;
            stored = i + 1;
        }
        assert_eq!(stored, natts, "a value for every column of the slot");
        pg_sys::ExecStoreVirtualTuple(slot);
    }
}

/// The TID of line pointer `lp` of block `block`.
pub fn item_pointer(block: u32, lp: u16) -> pg_sys::ItemPointerData {
    let mut tid = pg_sys::ItemPointerData::default();
    pgrx::itemptr::item_pointer_set_all(&mut tid, block, lp);
    tid
}
