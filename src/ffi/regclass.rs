//! `regclass` arguments taken as the OID the caller gave, not opened while the argument is
//! decoded (pgrx's `PgRelation` opens it, so an OID naming no relation became an internal
//! error). The function checks what it was given and raises the right error itself.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum};

/// A `regclass` argument.
#[derive(Debug, Clone, Copy)]
pub struct RegClass(pub pg_sys::Oid);

impl FromDatum for RegClass {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<RegClass> {
        if is_null {
            return None;
        }
        // SAFETY: a regclass datum is an OID by value.
        unsafe { pg_sys::Oid::from_datum(datum, false) }.map(RegClass)
    }
}

impl IntoDatum for RegClass {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(pg_sys::Datum::from(self.0))
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::REGCLASSOID
    }
}

// SAFETY: a regclass is unboxed by value, as an OID; NULL is handled by `Nullable`.
unsafe impl<'fcx> ArgAbi<'fcx> for RegClass {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: the argument has type regclass (the SQL signature says so).
        unsafe { arg.unbox_arg_using_from_datum() }.expect("a strict function gets no NULL")
    }
}

pgrx::impl_sql_translatable!(RegClass, "regclass");

/// The relation `name` names, read as a `regclass` literal is (the caller's search path;
/// `regclass`'s own ERROR for a relation that does not exist).
pub fn regclass_in(name: &str) -> pg_sys::Oid {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    let (input, ioparam) = crate::ffi::catalog::input_function(pg_sys::REGCLASSOID);
    // SAFETY: regclass's input function on a C string, with no type modifier; it returns an
    // OID by value or raises an ERROR.
    let d = unsafe { pg_sys::OidInputFunctionCall(input, c.as_ptr().cast_mut(), ioparam, -1) };
    pg_sys::Oid::from(d.value() as u32)
}
