//! `gsnap_range(NULL::t, from, to)` as a set-returning function: `(snap_id, rec)` for every
//! row of the table at every readable snapshot of the range. (In FROM it is planned as the
//! "gsnap range" custom scan instead, `exec::range_scan`.)

use super::asof::Bound;
use super::{reader_table, snapshot_argument};
use crate::error::error;
use crate::ffi::fcinfo::{Call, ResultSet};
use crate::ffi::memcx::OwnedContext;
use crate::ffi::tuple::{self, row_type_copy};
use crate::read::range;
use crate::v1_function_info;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The descriptor of the `rec` column (column `column`, from 0) of a result such as
/// `TABLE(x, rec anyelement)`: the table's current row type (a copy in the current context).
///
/// # Safety
/// `desc` is a valid result descriptor with that column.
pub(super) unsafe fn rec_descriptor(desc: pg_sys::TupleDesc, column: usize) -> pg_sys::TupleDesc {
    // SAFETY: the caller's promise.
    let rec = unsafe { tuple::attributes(desc) }[column];
    row_type_copy(rec.atttypid)
}

v1_function_info!(pg_finfo_gsnap_range);

/// `gsnap_range(anyelement, from_snap bigint, to_snap bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_range(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls this with the call info of this function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_range");
    let from = snapshot_argument(call, 1, "the first snapshot of gsnap_range", Bound::From);
    let to = snapshot_argument(call, 2, "the last snapshot of gsnap_range", Bound::To);
    let result = call.materialize();
    // SAFETY: the result's descriptor, valid during the call.
    let snap_id = unsafe { tuple::attributes(result.desc) }[0];
    if snap_id.atttypid != pg_sys::INT8OID || !snap_id.attbyval {
        error(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "gsnap_range must return (snap_id bigint, rec)",
        )
        .raise();
    }
    // SAFETY: the result's `rec` column has the table's current row type, which the copy
    // keeps for the cursors.
    let desc = unsafe { rec_descriptor(result.desc, 1) };
    // SAFETY: as above; a function scan has no conditions: every partition is read.
    let cursors = unsafe { range::cursors(relid, from, to, desc, &mut |_, _| false) };
    let rows = OwnedContext::new("gsnap_range rows");
    for mut cursor in cursors {
        while let Some((snaps, rec)) = cursor.next_row(&mut |_, _| true) {
            // SAFETY: the rows are (snap_id bigint, rec), `rec` of the table's row type.
            rows.run(|| unsafe { put_versions(result, rec, snaps) });
            // SAFETY: the tuplestore copied the tuple formed in the context.
            unsafe { rows.reset() };
        }
    }
    pg_sys::Datum::from(0usize)
}

/// Adds `(snap, rec)` to the result for each snapshot of `snaps`: one tuple is formed, and
/// only its snap_id changes from one snapshot to the next (tuplestore_puttuple copies it).
///
/// # Safety
/// The result's rows are `(snap_id bigint, rec)`, and `rec` a datum of the `rec` column's
/// type.
unsafe fn put_versions(result: ResultSet, rec: pg_sys::Datum, snaps: &[u64]) {
    // SAFETY: the caller's promise.
    let tuple = unsafe { tuple::form(result.desc, &[pg_sys::Datum::from(0i64), rec], &[false; 2]) };
    // No NULLs, so the data starts at t_hoff, and snap_id (int8, by value) first.
    // SAFETY: the header of the tuple just formed, and its first column's 8 bytes.
    let snap_id = unsafe {
        let header = (*tuple).t_data;
        header
            .cast::<u8>()
            .add(usize::from((*header).t_hoff))
            .cast::<i64>()
    };
    for &snap in snaps {
        // SAFETY: as above; then a copy of the tuple, of the result's row type.
        unsafe {
            snap_id.write_unaligned(snap as i64);
            result.put_tuple(tuple);
        }
    }
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_range(rel anyelement, from_snap bigint, to_snap bigint)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_range(anyelement, bigint, bigint) IS
    'rows of a table at every snapshot of a range: SELECT snap_id, (rec).* FROM gsnap_range(NULL::t, 40, 60)';
CREATE FUNCTION gsnap_range(rel anyelement, from_snap text, to_snap text)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_range(anyelement, text, text) IS
    'gsnap_range with its bounds written as ids, labels or times (the snapshots taken from one time to the other)';
CREATE FUNCTION gsnap_range(rel anyelement, from_time timestamptz, to_time timestamptz)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL SAFE;
CREATE FUNCTION gsnap_range(rel anyelement, from_snap bigint, to_snap text)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL SAFE;
CREATE FUNCTION gsnap_range(rel anyelement, from_snap text, to_snap bigint)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_range(anyelement, timestamptz, timestamptz) IS
    'rows of a table at every snapshot taken from one time to the other: gsnap_range(NULL::t, now() - interval ''7 days'', now())';
"#,
    name = "gsnap_range",
    requires = ["gsnap_preload_check_call"],
);
