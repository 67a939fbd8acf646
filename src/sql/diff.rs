//! `gsnap_diff(NULL::t, a, b)`: rows present at b and not at a (`'added'`) and at a and not
//! at b (`'removed'`); an update is one of each, a row that only moved is no change.

use super::range::rec_descriptor;
use super::{reader_table, snapshot_argument};
use crate::ffi::fcinfo::Call;
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
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_diff");
    let a = snapshot_argument(call, 1, "the first snapshot of gsnap_diff");
    let b = snapshot_argument(call, 2, "the second snapshot of gsnap_diff");
    let result = call.materialize();
    let label = |text: &str| text.into_datum().expect("text is not NULL");
    let (added, removed) = (label("added"), label("removed"));
    let mut put = |change, rec| {
        let change = if change == Change::Added {
            added
        } else {
            removed
        };
        // SAFETY: a row of the result's type: a text, then a `rec` formed by diff_rows with
        // the descriptor of the result's `rec` column.
        unsafe { result.put_values(&[change, rec], &[false, false]) };
    };
    // SAFETY: the result's columns are (change text, rec of the table's row type).
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
"#,
    name = "gsnap_diff",
    requires = ["gsnap_preload_check_call"],
);
