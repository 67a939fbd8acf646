//! Reading PostgreSQL's catalogs: whole system catalogs, types' I/O functions, and the C
//! strings lookups return.

use pgrx::pg_sys;
use std::ffi::{c_char, CStr};

/// A C string PostgreSQL returned, copied (invalid UTF-8 replaced).
///
/// # Safety
/// `s` is a valid NUL-terminated string.
pub unsafe fn string_from(s: *const c_char) -> String {
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// `name` quoted as an SQL identifier where it needs quotes (`quote_identifier`).
pub fn quote_ident(name: &str) -> String {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: quotes a C string (returns it, or a new quoted copy).
    unsafe { string_from(pg_sys::quote_identifier(c.as_ptr())) }
}

/// A `name` (a catalog's fixed-size, NUL-padded name) as a C string.
pub fn name_of(name: &pg_sys::NameData) -> &CStr {
    // SAFETY: the NAMEDATALEN bytes of the name, borrowed from it.
    let bytes =
        unsafe { std::slice::from_raw_parts(name.data.as_ptr().cast::<u8>(), name.data.len()) };
    CStr::from_bytes_until_nul(bytes).unwrap_or_default()
}

/// Calls `f` with the fixed part of every row of system catalog `catalog`, read under an
/// ACCESS SHARE lock released when the scan ends.
///
/// # Safety
/// `T` is the `FormData_*` struct of `catalog`'s rows; call in a transaction.
pub unsafe fn for_each_row<T>(catalog: pg_sys::Oid, mut f: impl FnMut(&T)) {
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: opening a system catalog by OID (an ERROR if there is none).
    let rel = unsafe { pg_sys::table_open(catalog, lock) };
    let (snapshot, no_keys) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: an unordered scan of the whole open catalog (no index, the catalog snapshot,
    // no keys).
    let scan =
        unsafe { pg_sys::systable_beginscan(rel, pg_sys::InvalidOid, false, snapshot, 0, no_keys) };
    loop {
        // SAFETY: the scan began above; a tuple stays valid until the next fetch.
        let tuple = unsafe { pg_sys::systable_getnext(scan) };
        if tuple.is_null() {
            break;
        }
        // SAFETY: a row of `catalog`, whose fixed part is a `T` (the caller's promise).
        f(unsafe { &*pg_sys::GETSTRUCT(tuple).cast::<T>() });
    }
    // SAFETY: ending the scan begun above, closing the catalog opened above.
    unsafe {
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
    }
}

/// The SQL name of type `type_oid` (as `format_type_be` writes it: `integer`,
/// `character varying(10)` without its modifier, `public.t`).
pub fn type_name(type_oid: pg_sys::Oid) -> String {
    // SAFETY: a catalog lookup by OID returning a palloc'd C string (`???` for an unknown
    // type), copied before it is freed with its memory context.
    unsafe { string_from(pg_sys::format_type_be(type_oid)) }
}

/// The output function of type `type_oid` (an ERROR if there is no such type).
pub fn output_function(type_oid: pg_sys::Oid) -> pg_sys::Oid {
    let (mut out_fn, mut varlena) = (pg_sys::InvalidOid, false);
    // SAFETY: a catalog lookup by OID, writing to the two locals.
    unsafe { pg_sys::getTypeOutputInfo(type_oid, &mut out_fn, &mut varlena) };
    out_fn
}

/// The input function of type `type_oid` and the I/O parameter it takes (an ERROR if there
/// is no such type).
pub fn input_function(type_oid: pg_sys::Oid) -> (pg_sys::Oid, pg_sys::Oid) {
    let (mut in_fn, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: a catalog lookup by OID, writing to the two locals.
    unsafe { pg_sys::getTypeInputInfo(type_oid, &mut in_fn, &mut ioparam) };
    (in_fn, ioparam)
}

/// Functions of PostgreSQL's partitioning code that pgrx's bindings leave out (their headers
/// are not in its list), declared here with PostgreSQL 15's signatures and guarded like the
/// bindings' own (an ERROR inside becomes a Rust panic caught at the boundary).
pub mod partitioning {
    use pgrx::pg_guard;
    use pgrx::pg_sys::{Expr, List, Oid, LOCKMODE};

    #[pg_guard]
    unsafe extern "C-unwind" {
        /// `catalog/partition.h`: the OIDs of a partition's ancestors, its parent first.
        pub fn get_partition_ancestors(relid: Oid) -> *mut List;
        /// `utils/partcache.h`: a partition's constraint, its ancestors' included, over its
        /// own attribute numbers (NULL: none).
        pub fn get_partition_qual_relid(relid: Oid) -> *mut Expr;
        /// `catalog/pg_inherits.h`: a table and every table below it (locked `lockmode`).
        pub fn find_all_inheritors(
            parent: Oid,
            lockmode: LOCKMODE,
            numparents: *mut *mut List,
        ) -> *mut List;
    }
}
