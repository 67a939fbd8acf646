//! `gsnap_asof(NULL::table, snapshot)` and `gsnap_asof(NULL::table, time)` as set-returning
//! functions: a table's rows as they were at a snapshot, in the table's current row type. (In
//! FROM they are planned as the "gsnap AS OF" custom scan instead, `exec::asof_scan`.)
//!
//! These are plain V1 C functions (the table is named by the row type of the first argument,
//! which is NULL, so they are `CALLED ON NULL INPUT` and check the snapshot argument
//! themselves) returning their rows in materialize mode.

use super::{reader_table, snapshot_argument};
use crate::error::null_argument;
use crate::ffi::fcinfo::Call;
use crate::ffi::relation::relation_kind;
use crate::ipc;
use crate::read::asof::{AsofRows, Row};
use crate::read::partitioned::PartitionedRows;
use crate::v1_function_info;
use crate::worker::UNIX_TO_PG_EPOCH_US;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// A call of `gsnap_asof`: the table of its first argument read at the snapshot `snapshot`
/// finds from the call, into the call's result set.
///
/// # Safety
/// `fcinfo` is the call info of a `gsnap_asof` call, a set-returning function whose result
/// type is its first argument's, the table's row type.
unsafe fn asof(
    fcinfo: pg_sys::FunctionCallInfo,
    snapshot: impl FnOnce(Call) -> u64,
) -> pg_sys::Datum {
    // SAFETY: the caller's promise.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_asof");
    let snap = snapshot(call);
    let result = call.materialize();
    if relation_kind(relid) == Some(pg_sys::RELKIND_PARTITIONED_TABLE) {
        // SAFETY: as below; every partition is read (a function scan has no conditions).
        let mut rows =
            unsafe { PartitionedRows::open(relid, result.desc, snap, &mut |_| true, None, false) };
        while let Some(Row::Values { values, nulls, .. }) = rows.next() {
            // SAFETY: a row of the table's current row type, the result's.
            unsafe { result.put_values(values, nulls) };
        }
        return pg_sys::Datum::from(0usize);
    }
    // SAFETY: the result's descriptor is the table's current row type (the caller's promise),
    // valid during the call.
    let mut rows = unsafe { AsofRows::open(relid, result.desc, snap, false) };
    while let Some(row) = rows.next() {
        if let Row::Values { values, nulls, .. } = row {
            // SAFETY: a row of the table's current row type, the result's.
            unsafe { result.put_values(values, nulls) };
        }
    }
    pg_sys::Datum::from(0usize)
}

v1_function_info!(pg_finfo_gsnap_asof_id);

/// `gsnap_asof(anyelement, bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_id(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let snapshot = |call| snapshot_argument(call, 1, "the snapshot id of gsnap_asof");
    // SAFETY: PostgreSQL calls this with the call info of gsnap_asof(anyelement, bigint).
    unsafe { asof(fcinfo, snapshot) }
}

v1_function_info!(pg_finfo_gsnap_asof_time);

/// `gsnap_asof(anyelement, timestamptz)`: the latest snapshot taken at or before the time.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_time(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let snapshot = |call: Call| {
        let t = call.arg_i64(1);
        resolve_time(t.unwrap_or_else(|| null_argument("the time of gsnap_asof")))
    };
    // SAFETY: PostgreSQL calls this with the call info of gsnap_asof(anyelement, timestamptz).
    unsafe { asof(fcinfo, snapshot) }
}

/// The latest readable snapshot taken at or before `t` (a PostgreSQL timestamptz).
pub fn resolve_time(t: pg_sys::TimestampTz) -> u64 {
    ipc::resolve_time(t.saturating_add(UNIX_TO_PG_EPOCH_US)).0
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_asof(rel anyelement, snap_id bigint) RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'gsnap_asof_id' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_asof(anyelement, bigint) IS
    'rows of a table as of a snapshot: SELECT * FROM gsnap_asof(NULL::my_table, 42)';
CREATE FUNCTION gsnap_asof(rel anyelement, taken_at timestamptz) RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'gsnap_asof_time' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_asof(anyelement, timestamptz) IS
    'rows of a table as of the latest snapshot taken at or before a time';
"#,
    name = "gsnap_asof",
    requires = ["gsnap_preload_check_call"],
);
