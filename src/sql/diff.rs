//! `gsnap_diff(NULL::t, a, b)`: rows present at b and not at a (`'added'`) and at a and not
//! at b (`'removed'`); an update is one of each, a row that only moved is no change.

use super::range::rec_descriptor;
use super::{reader_table, snapshot_argument};
use crate::ffi::fcinfo::Call;
use crate::ffi::tuple::item_pointer;
use crate::read::diff::diff_rows;
use crate::v1_function_info;
use gsnap_format::diff::Change;
use pgrx::pg_sys;
use pgrx::prelude::*;

v1_function_info!(pg_finfo_gsnap_diff);

/// `gsnap_diff(anyelement, a bigint, b bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_diff(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls this with the call info of this function.
    unsafe { diff(fcinfo, "gsnap_diff", false) }
}

v1_function_info!(pg_finfo_gsnap_diff_at);

/// `gsnap_diff_at(anyelement, a bigint, b bigint)`: `gsnap_diff` with each row's TID at its
/// snapshot.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_diff_at(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls this with the call info of this function.
    unsafe { diff(fcinfo, "gsnap_diff_at", true) }
}

/// A call of `name`: the rows of the diff into the call's result set, `(change, rec)` and,
/// `with_tid`, the row's TID at its snapshot.
///
/// # Safety
/// `fcinfo` is the call info of `name`, whose result columns are those.
unsafe fn diff(fcinfo: pg_sys::FunctionCallInfo, name: &str, with_tid: bool) -> pg_sys::Datum {
    // SAFETY: the caller's promise.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, name);
    let a = snapshot_argument(call, 1, &format!("the first snapshot of {name}"));
    let b = snapshot_argument(call, 2, &format!("the second snapshot of {name}"));
    let result = call.materialize();
    let label = |text: &str| text.into_datum().expect("text is not NULL");
    let (added, removed) = (label("added"), label("removed"));
    let columns = if with_tid { 3 } else { 2 };
    let mut put = |change, rec, (block, lp)| {
        let change = if change == Change::Added {
            added
        } else {
            removed
        };
        let mut tid = item_pointer(block, lp);
        let at = pg_sys::Datum::from(std::ptr::addr_of_mut!(tid));
        // SAFETY: a row of the result's type: a text, a `rec` formed by diff_rows with the
        // descriptor of the result's `rec` column, then (if asked) a tid, copied by the put.
        unsafe { result.put_values(&[change, rec, at][..columns], &[false; 3][..columns]) };
    };
    // SAFETY: the result's columns are (change text, rec of the table's row type[, at tid]).
    let rec_desc = unsafe { rec_descriptor(result.desc, 1) };
    // SAFETY: the table's current row type, copied for this call.
    unsafe { diff_rows(relid, a, b, rec_desc, &mut put) };
    pg_sys::Datum::from(0usize)
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_diff(rel anyelement, a bigint, b bigint)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff(anyelement, bigint, bigint) IS
    'rows added and removed between two snapshots (an update is one of each)';
CREATE FUNCTION gsnap_diff_at(rel anyelement, a bigint, b bigint)
    RETURNS TABLE (change text, rec anyelement, at tid)
    AS 'MODULE_PATHNAME', 'gsnap_diff_at' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff_at(anyelement, bigint, bigint) IS
    'gsnap_diff with each row''s TID at its snapshot (b for an added row, a for a removed one)';
"#,
    name = "gsnap_diff",
    requires = ["gsnap_preload_check_call"],
);
