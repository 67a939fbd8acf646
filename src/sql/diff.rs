//! `gsnap_diff(NULL::t, a, b)`: rows present at b and not at a (`'added'`) and at a and not
//! at b (`'removed'`); an update is one of each, a row that only moved is no change.

use super::range::rec_descriptor;
use super::{materialized_result, reader_table, snapshot_argument};
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
    // SAFETY: called by PostgreSQL as a set-returning function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_diff");
    let a = snapshot_argument(call, 1, "the first snapshot of gsnap_diff");
    let b = snapshot_argument(call, 2, "the second snapshot of gsnap_diff");
    // SAFETY: the materialize-mode protocol; the rows are of the table's current row type.
    unsafe {
        let (desc, store) = materialized_result(call);
        let added = pg_sys::Datum::from(pg_sys::cstring_to_text(c"added".as_ptr()));
        let removed = pg_sys::Datum::from(pg_sys::cstring_to_text(c"removed".as_ptr()));
        diff_rows(relid, a, b, rec_descriptor(desc), &mut |change, rec| {
            let label = if change == Change::Added {
                added
            } else {
                removed
            };
            let cols = [label, rec];
            let cnulls = [false, false];
            pg_sys::tuplestore_putvalues(
                store,
                desc,
                cols.as_ptr().cast_mut(),
                cnulls.as_ptr().cast_mut(),
            );
        });
    }
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
