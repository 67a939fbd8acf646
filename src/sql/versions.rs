//! `gsnap_versions(NULL::t, from, to)` as a set-returning function: `(first_snap, last_snap,
//! rec)` for every distinct row version of the table over the readable snapshots of the
//! range, once per run of consecutive snapshots holding it. (In FROM it is planned as the
//! "gsnap versions" custom scan instead, `exec::range_scan`.)

use super::asof::Bound;
use super::range::rec_descriptor;
use super::{reader_table, snapshot_argument};
use crate::error::error;
use crate::ffi::fcinfo::Call;
use crate::ffi::memcx::OwnedContext;
use crate::ffi::tuple;
use crate::read::range;
use crate::read::versions::VersionsCursor;
use crate::v1_function_info;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

v1_function_info!(pg_finfo_gsnap_versions);

/// `gsnap_versions(anyelement, from_snap bigint, to_snap bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_versions(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls this with the call info of this function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_versions");
    let from = snapshot_argument(call, 1, "the first snapshot of gsnap_versions", Bound::From);
    let to = snapshot_argument(call, 2, "the last snapshot of gsnap_versions", Bound::To);
    let result = call.materialize();
    // SAFETY: the result's descriptor, valid during the call.
    let attrs = unsafe { tuple::attributes(result.desc) };
    if attrs.len() != 3 || attrs[..2].iter().any(|a| a.atttypid != pg_sys::INT8OID) {
        error(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "gsnap_versions must return (first_snap bigint, last_snap bigint, rec)",
        )
        .raise();
    }
    // SAFETY: the result's third column is `rec`, of the table's current row type, which the
    // copy keeps for the cursors.
    let desc = unsafe { rec_descriptor(result.desc, 2) };
    // SAFETY: as above; a function scan has no conditions: every partition is read.
    let ranges = unsafe { range::cursors(relid, from, to, desc, &mut |_, _| false) };
    let rows = OwnedContext::new("gsnap_versions rows");
    for range in ranges {
        let mut cursor = VersionsCursor::new(range);
        while let Some((first, last, rec)) = cursor.next_run(&mut |_, _| true) {
            let values = [
                pg_sys::Datum::from(first as i64),
                pg_sys::Datum::from(last as i64),
                rec,
            ];
            // SAFETY: the rows are (bigint, bigint, rec), `rec` of the table's row type; the
            // tuplestore copies them.
            rows.run(|| unsafe { result.put_values(&values, &[false; 3]) });
            // SAFETY: the tuplestore copied the row formed in the context.
            unsafe { rows.reset() };
        }
    }
    pg_sys::Datum::from(0usize)
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_versions(rel anyelement, from_snap bigint, to_snap bigint)
    RETURNS TABLE (first_snap bigint, last_snap bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_versions' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_versions(anyelement, bigint, bigint) IS
    'every distinct row version of a range of snapshots once, with the run of snapshots holding it: SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::t, 1, 100)';
CREATE FUNCTION gsnap_versions(rel anyelement, from_snap text, to_snap text)
    RETURNS TABLE (first_snap bigint, last_snap bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_versions' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_versions(anyelement, text, text) IS
    'gsnap_versions with its bounds written as ids, labels or times';
CREATE FUNCTION gsnap_versions(rel anyelement, from_time timestamptz, to_time timestamptz)
    RETURNS TABLE (first_snap bigint, last_snap bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_versions' LANGUAGE C STABLE PARALLEL SAFE;
CREATE FUNCTION gsnap_versions(rel anyelement, from_snap bigint, to_snap text)
    RETURNS TABLE (first_snap bigint, last_snap bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_versions' LANGUAGE C STABLE PARALLEL SAFE;
CREATE FUNCTION gsnap_versions(rel anyelement, from_snap text, to_snap bigint)
    RETURNS TABLE (first_snap bigint, last_snap bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_versions' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_versions(anyelement, timestamptz, timestamptz) IS
    'gsnap_versions over the snapshots taken from one time to the other';
"#,
    name = "gsnap_versions",
    requires = ["gsnap_preload_check_call"],
);
