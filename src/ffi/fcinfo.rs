//! Version-1 C functions written by hand (the readers take `anyelement` and must see their
//! call's argument types, which pgrx's wrappers hide): the info record, arguments, and rows
//! returned in materialize mode.

use pgrx::pg_sys;

/// Declares the `pg_finfo_<function>` record PostgreSQL looks up for a version-1 C function:
/// `v1_function_info!(pg_finfo_gsnap_asof_id);`.
#[macro_export]
macro_rules! v1_function_info {
    ($finfo:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}

/// A call of a version-1 function, as PostgreSQL passes it.
#[derive(Clone, Copy)]
pub struct Call(pg_sys::FunctionCallInfo);

impl Call {
    /// Wraps PostgreSQL's call info.
    ///
    /// # Safety
    /// `fcinfo` is the valid call info of the running function.
    pub unsafe fn new(fcinfo: pg_sys::FunctionCallInfo) -> Call {
        Call(fcinfo)
    }

    /// The number of arguments.
    pub fn nargs(self) -> usize {
        // SAFETY: valid call info (see `new`).
        unsafe { (*self.0).nargs as usize }
    }

    /// Argument `i` (None for NULL).
    pub fn arg(self, i: usize) -> Option<pg_sys::Datum> {
        assert!(
            i < self.nargs(),
            "argument {i} of a call with {}",
            self.nargs()
        );
        // SAFETY: valid call info with more than `i` arguments.
        let arg = unsafe { &*(*self.0).args.as_ptr().add(i) };
        (!arg.isnull).then_some(arg.value)
    }

    /// Argument `i` as an int8 or timestamptz (None for NULL).
    pub fn arg_i64(self, i: usize) -> Option<i64> {
        self.arg(i).map(|d| d.value() as i64)
    }

    /// The type of argument `i` as the call site resolved it (the table's row type for the
    /// readers' first argument).
    pub fn arg_type(self, i: usize) -> pg_sys::Oid {
        // SAFETY: valid call info; get_fn_expr_argtype reads the call's expression tree.
        unsafe { pg_sys::get_fn_expr_argtype((*self.0).flinfo, i as i32) }
    }

    /// Sets the call up to return its rows in materialize mode (an ERROR if its caller
    /// cannot take a set that way).
    pub fn materialize(self) -> ResultSet {
        // SAFETY: valid call info; InitMaterializedSRF checks that the caller accepts a
        // materialized set, and makes the descriptor and tuplestore.
        unsafe { pg_sys::InitMaterializedSRF(self.0, 0) };
        // SAFETY: InitMaterializedSRF returned, so `resultinfo` is a ReturnSetInfo, filled in.
        let rsinfo = unsafe { &*(*self.0).resultinfo.cast::<pg_sys::ReturnSetInfo>() };
        ResultSet {
            desc: rsinfo.setDesc,
            store: rsinfo.setResult,
        }
    }
}

/// The rows of a set-returning call in materialize mode: their descriptor and the
/// tuplestore that takes them (both live as long as the query's use of the call).
#[derive(Clone, Copy)]
pub struct ResultSet {
    pub desc: pg_sys::TupleDesc,
    store: *mut pg_sys::Tuplestorestate,
}

impl ResultSet {
    /// Adds the row `values`, `nulls` (copied).
    ///
    /// # Safety
    /// The values are datums of the descriptor's attribute types (where not null).
    pub unsafe fn put_values(self, values: &[pg_sys::Datum], nulls: &[bool]) {
        // SAFETY: the caller's promise; the descriptor's `natts` values are read.
        unsafe {
            let natts = (*self.desc).natts as usize;
            assert!(
                values.len() >= natts && nulls.len() >= natts,
                "a value for every column"
            );
            let (values, nulls) = (values.as_ptr().cast_mut(), nulls.as_ptr().cast_mut());
            pg_sys::tuplestore_putvalues(self.store, self.desc, values, nulls);
        }
    }

    /// Adds a copy of `tuple`.
    ///
    /// # Safety
    /// `tuple` is a valid heap tuple of the descriptor's row type.
    pub unsafe fn put_tuple(self, tuple: pg_sys::HeapTuple) {
        // SAFETY: the caller's promise; the tuplestore copies the tuple.
        unsafe { pg_sys::tuplestore_puttuple(self.store, tuple) };
    }
}

/// The contents of a `text` datum (detoasted if need be).
///
/// # Safety
/// `d` is a valid, non-NULL `text` datum.
pub unsafe fn text_string(d: pg_sys::Datum) -> String {
    // SAFETY: the caller's promise; text_to_cstring detoasts and copies into a palloc'd C string.
    unsafe { super::catalog::string_from(pg_sys::text_to_cstring(d.cast_mut_ptr())) }
}
