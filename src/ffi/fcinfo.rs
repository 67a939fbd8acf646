//! Version-1 C functions written by hand (the readers take `anyelement` and must see their
//! call's argument types, which pgrx's wrappers hide): the info record, and arguments.

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

    /// The raw call info.
    pub fn raw(self) -> pg_sys::FunctionCallInfo {
        self.0
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
}
