//! `gsnap_asof(NULL::table, snapshot)` and `gsnap_asof(NULL::table, time)` as set-returning
//! functions: a table's rows as they were at a snapshot, in the table's current row type. (In
//! FROM they are planned as the "gsnap AS OF" custom scan instead, `exec::asof_scan`.)
//!
//! These are plain V1 C functions (the table is named by the row type of the first argument,
//! which is NULL, so they are `CALLED ON NULL INPUT` and check the snapshot argument
//! themselves) returning their rows in materialize mode.

use super::{materialized_result, reader_table, snapshot_argument};
use crate::error::null_argument;
use crate::ffi::fcinfo::Call;
use crate::ipc;
use crate::read::asof::{AsofRows, Row};
use crate::v1_function_info;
use crate::worker::UNIX_TO_PG_EPOCH_US;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Reads table `relid` at `snap` into the call's result set.
///
/// # Safety
/// `call` is a set-returning call whose result type is the table's row type.
unsafe fn materialize(call: Call, relid: pg_sys::Oid, snap: u64) {
    // SAFETY: the result descriptor is the table's current row type.
    unsafe {
        let (desc, store) = materialized_result(call);
        let mut rows = AsofRows::open(relid, desc, snap, false);
        while let Some(row) = rows.next() {
            if let Row::Values { values, nulls, .. } = row {
                pg_sys::tuplestore_putvalues(
                    store,
                    desc,
                    values.as_ptr().cast_mut(),
                    nulls.as_ptr().cast_mut(),
                );
            }
        }
    }
}

v1_function_info!(pg_finfo_gsnap_asof_id);

/// `gsnap_asof(anyelement, bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_id(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_asof");
    let snap = snapshot_argument(call, 1, "the snapshot id of gsnap_asof");
    // SAFETY: as above.
    unsafe { materialize(call, relid, snap) };
    pg_sys::Datum::from(0usize)
}

v1_function_info!(pg_finfo_gsnap_asof_time);

/// `gsnap_asof(anyelement, timestamptz)`: the latest snapshot taken at or before the time.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_time(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_asof");
    let t = call
        .arg_i64(1)
        .unwrap_or_else(|| null_argument("the time of gsnap_asof"));
    let snap = resolve_time(t);
    // SAFETY: as above.
    unsafe { materialize(call, relid, snap) };
    pg_sys::Datum::from(0usize)
}

/// The latest readable snapshot taken at or before `t` (a PostgreSQL timestamptz).
pub fn resolve_time(t: pg_sys::TimestampTz) -> u64 {
    ipc::resolve_time(t.saturating_add(UNIX_TO_PG_EPOCH_US)).0
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_asof(rel anyelement, snap_id bigint) RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'gsnap_asof_id' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_asof(anyelement, bigint) IS
    'rows of a table as of a snapshot: SELECT * FROM gsnap_asof(NULL::my_table, 42)';
CREATE FUNCTION gsnap_asof(rel anyelement, taken_at timestamptz) RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'gsnap_asof_time' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_asof(anyelement, timestamptz) IS
    'rows of a table as of the latest snapshot taken at or before a time';
"#,
    name = "gsnap_asof",
    requires = ["gsnap_preload_check_call"],
);
