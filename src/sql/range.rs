//! `gsnap_range(NULL::t, from, to)` as a set-returning function: `(snap_id, rec)` for every
//! row of the table at every readable snapshot of the range. (In FROM it is planned as the
//! "gsnap range" custom scan instead, `exec::range_scan`.)

use super::{materialized_result, reader_table, snapshot_argument};
use crate::error::error;
use crate::ffi::fcinfo::Call;
use crate::ffi::memcx::OwnedContext;
use crate::read::range::RangeCursor;
use crate::v1_function_info;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The descriptor of the `rec` column of a `TABLE(x, rec anyelement)` result: the table's
/// current row type (a copy in the current context).
///
/// # Safety
/// `desc` is a two-column result descriptor.
pub(super) unsafe fn rec_descriptor(desc: pg_sys::TupleDesc) -> pg_sys::TupleDesc {
    // SAFETY: the second result column is the table's composite type.
    unsafe {
        let rec_type = (*desc).attrs.as_slice(2)[1].atttypid;
        pg_sys::lookup_rowtype_tupdesc_copy(rec_type, -1)
    }
}

v1_function_info!(pg_finfo_gsnap_range);

/// `gsnap_range(anyelement, from_snap bigint, to_snap bigint)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_range(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, "gsnap_range");
    let from = snapshot_argument(call, 1, "the first snapshot of gsnap_range");
    let to = snapshot_argument(call, 2, "the last snapshot of gsnap_range");
    // SAFETY: the materialize-mode protocol; the rows are of the table's current row type.
    unsafe {
        let (desc, store) = materialized_result(call);
        let snap_att = (*desc).attrs.as_slice(2)[0];
        if snap_att.atttypid != pg_sys::INT8OID || !snap_att.attbyval {
            error(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "gsnap_range must return (snap_id bigint, rec)",
            )
            .raise();
        }
        let mut cursor = RangeCursor::open(relid, from, to, rec_descriptor(desc));
        let rows = OwnedContext::new("gsnap_range rows");
        while let Some((snaps, rec)) = cursor.next_row(&mut |_, _| true) {
            // One result tuple per row version and run of snapshots; only its snap_id
            // differs from one snapshot to the next (tuplestore_puttuple copies it).
            rows.run(|| {
                let cols = [pg_sys::Datum::from(0i64), rec];
                let cnulls = [false, false];
                let tuple = pg_sys::heap_form_tuple(
                    desc,
                    cols.as_ptr().cast_mut(),
                    cnulls.as_ptr().cast_mut(),
                );
                let header = (*tuple).t_data;
                // No NULLs, so the data starts at t_hoff, and snap_id (int8, by value) first.
                let snap_id = header
                    .cast::<u8>()
                    .add(usize::from((*header).t_hoff))
                    .cast::<i64>();
                for &snap in snaps {
                    snap_id.write_unaligned(snap as i64);
                    pg_sys::tuplestore_puttuple(store, tuple);
                }
            });
            rows.reset();
        }
    }
    pg_sys::Datum::from(0usize)
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_range(rel anyelement, from_snap bigint, to_snap bigint)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_range(anyelement, bigint, bigint) IS
    'rows of a table at every snapshot of a range: SELECT snap_id, (rec).* FROM gsnap_range(NULL::t, 40, 60)';
"#,
    name = "gsnap_range",
    requires = ["gsnap_preload_check_call"],
);
