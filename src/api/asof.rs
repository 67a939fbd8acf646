//! `gsnap_asof(NULL::table, snapshot)` and `gsnap_asof(NULL::table, time)`: a table's rows
//! as they were at a snapshot, in the table's current row type.
//!
//! These are plain V1 C functions (the table is named by the row type of the first argument,
//! which is NULL, so they are `CALLED ON NULL INPUT` and check the snapshot argument
//! themselves) returning their rows in materialize mode.

use super::access::{relation_name, require_gsnap_database, require_read_access};
use super::scan::read_table;
use crate::error::error;
use crate::ipc;
use crate::ipc::protocol::Kind;
use crate::worker::UNIX_TO_PG_EPOCH_US;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The table whose row type the first argument has.
///
/// # Safety
/// `fcinfo` must be a valid call of one of the functions below.
pub(super) unsafe fn table_of_first_argument(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &str,
) -> pg_sys::Oid {
    // SAFETY: reading the call's argument types and the catalog.
    unsafe {
        let argtype = pg_sys::get_fn_expr_argtype((*fcinfo).flinfo, 0);
        let relid = pg_sys::get_typ_typrelid(argtype);
        let kind = if relid == pg_sys::InvalidOid {
            0
        } else {
            pg_sys::get_rel_relkind(relid) as u8
        };
        if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
            error(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!(
                    "{function} reads one table, and {} is partitioned",
                    relation_name(relid)
                ),
            )
            .hint("Read each partition, for example with UNION ALL over its partitions.")
            .raise();
        }
        if kind != pg_sys::RELKIND_RELATION && kind != pg_sys::RELKIND_MATVIEW {
            error(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("the first argument of {function} must name a table by its row type"),
            )
            .hint(format!("Write {function}(NULL::my_table, ...)."))
            .raise();
        }
        // Like a SELECT, hold ACCESS SHARE on the table until the transaction ends (already
        // held when the query was analyzed, see deps.rs).
        pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        relid
    }
}

/// Reads table (first argument's row type) at `snap` into the call's result set.
///
/// # Safety
/// `fcinfo` must be a valid set-returning call.
unsafe fn materialize(fcinfo: pg_sys::FunctionCallInfo, relid: pg_sys::Oid, snap: u64) {
    // SAFETY: the materialize-mode SRF protocol.
    unsafe {
        pg_sys::InitMaterializedSRF(fcinfo, 0);
        let rsinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        let desc = (*rsinfo).setDesc;
        let store = (*rsinfo).setResult;
        read_table(snap, relid, desc, &mut |values, nulls| {
            pg_sys::tuplestore_putvalues(
                store,
                desc,
                values.as_ptr().cast_mut(),
                nulls.as_ptr().cast_mut(),
            );
        });
    }
}

/// The checks every AS OF read makes, then the snapshot argument (which must not be NULL).
///
/// # Safety
/// `fcinfo` must be a valid call with two arguments.
unsafe fn prologue(fcinfo: pg_sys::FunctionCallInfo, what: &str) -> (pg_sys::Oid, pg_sys::Datum) {
    // SAFETY: reading the call's arguments.
    unsafe {
        let relid = table_of_first_argument(fcinfo, "gsnap_asof");
        require_gsnap_database();
        require_read_access(relid);
        let arg = &*(*fcinfo).args.as_ptr().add(1);
        if arg.isnull {
            error(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("the {what} of gsnap_asof must not be NULL"),
            )
            .raise();
        }
        (relid, arg.value)
    }
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_gsnap_asof_id() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `gsnap_asof(anyelement, bigint)`.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_asof_id(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    unsafe {
        let (relid, snap) = prologue(fcinfo, "snapshot id");
        let snap = snap.value() as i64;
        if snap <= 0 {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("snapshot {snap} does not exist"),
            )
            .hint("Snapshot ids start at 1; gsnap_snapshots() lists them.")
            .raise();
        }
        materialize(fcinfo, relid, snap as u64);
    }
    pg_sys::Datum::from(0usize)
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_gsnap_asof_time() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `gsnap_asof(anyelement, timestamptz)`: the latest snapshot taken at or before the time.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_asof_time(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    unsafe {
        let (relid, t) = prologue(fcinfo, "time");
        let snap = resolve_time(t.value() as i64);
        materialize(fcinfo, relid, snap);
    }
    pg_sys::Datum::from(0usize)
}

/// The latest readable snapshot taken at or before `t` (a PostgreSQL timestamptz).
pub fn resolve_time(t: pg_sys::TimestampTz) -> u64 {
    ipc::call(Kind::ResolveTime, &[t.saturating_add(UNIX_TO_PG_EPOCH_US)]).result as u64
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
