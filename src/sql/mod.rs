//! The SQL functions of gsnap, thin over what they call:
//!
//! | function | planned by | executed by | rows from |
//! |---|---|---|---|
//! | `gsnap_asof` in FROM | `plan::paths`, `plan::nodes` | `exec::asof_scan` | `read::asof` |
//! | `gsnap_asof` elsewhere | (function scan) | `sql::asof` | `read::asof` |
//! | `gsnap_range` in FROM | `plan::paths`, `plan::nodes` | `exec::range_scan` | `read::range` |
//! | `gsnap_range` elsewhere | (function scan) | `sql::range` | `read::range` |
//! | `gsnap_versions` in FROM | `plan::paths`, `plan::nodes` | `exec::range_scan` | `read::versions` |
//! | `gsnap_versions` elsewhere | (function scan) | `sql::versions` | `read::versions` |
//! | `gsnap_diff` | (function scan) | `sql::diff` | `read::diff` |
//! | `gsnap_asof_dropped`, `gsnap_undrop` | (function scan) | `sql::dropped` | `read::recorded` |
//! | `gsnap_snapshot`, listings | | `sql::snapshots` | the worker (`ipc`) |
//! | `gsnap_written_blocks`, `gsnap_full_capture_pending` | | `sql::spans` | the dirty sets |
//!
//! Every query calling a reader also depends on its table (`plan::deps`); who may read what
//! is `access`.

pub mod access;
pub mod asof;
pub mod diff;
mod dropped;
pub mod lifetimes;
pub mod range;
mod restore;
mod snapshots;
mod spans;
pub mod versions;

use crate::error::{error, no_such_snapshot, null_argument};
use crate::ffi::fcinfo::Call;
use crate::ffi::relation::{relation_kind, relation_of_type};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// The table a reader call reads: the relation whose row type its first argument has, locked
/// ACCESS SHARE until the transaction ends (as a SELECT would), after the checks every read
/// makes (database, privileges).
pub fn reader_table(call: Call, function: &str) -> pg_sys::Oid {
    let relid = relation_of_type(call.arg_type(0));
    let kind = relid.and_then(relation_kind);
    let relid = relid.unwrap_or(pg_sys::InvalidOid);
    let partitioned = kind == Some(pg_sys::RELKIND_PARTITIONED_TABLE);
    if !partitioned
        && kind != Some(pg_sys::RELKIND_RELATION)
        && kind != Some(pg_sys::RELKIND_MATVIEW)
    {
        error(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("the first argument of {function} must name a table by its row type"),
        )
        .hint(format!("Write {function}(NULL::my_table, ...)."))
        .raise();
    }
    access::require_gsnap_database();
    access::require_read_access(relid);
    // Already held when the query was analyzed (plan/deps.rs).
    // SAFETY: a lock request on a table just found in the catalog.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    relid
}

/// The result of an SPI statement run by `function` (`gsnap_restore`, `gsnap_undrop`), or
/// an ERROR naming it.
pub fn spi_result<T>(function: &str, r: Result<T, pgrx::spi::SpiError>) -> T {
    r.unwrap_or_else(|e| {
        error(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("{function}: {e}"),
        )
        .raise()
    })
}

/// Argument `i`, a snapshot: an id (not NULL, positive); for the `timestamptz` forms, a
/// time resolved as `bound` says (`asof::resolve_time_as`); for the `text` forms, an id, a
/// label or a time (`asof::resolve_text`).
pub fn snapshot_argument(call: Call, i: usize, what: &str, bound: asof::Bound) -> u64 {
    let value = call.arg(i).unwrap_or_else(|| null_argument(what));
    // SAFETY: the argument's value, of the type the call site resolved it to.
    unsafe { snapshot_of(call.arg_type(i), value, bound) }
}

/// The snapshot a (non-NULL) snapshot argument of type `ty` names: an id (positive); for
/// `timestamptz`, a time resolved as `bound` says (`asof::resolve_time_as`); for `text`, an
/// id, a label or a time (`asof::resolve_text`). Shared by the functions and the custom
/// scans, which evaluate their arguments themselves.
///
/// # Safety
/// `value` is a datum of type `ty`.
pub unsafe fn snapshot_of(ty: pg_sys::Oid, value: pg_sys::Datum, bound: asof::Bound) -> u64 {
    if ty == pg_sys::TEXTOID {
        // SAFETY: a text datum (the caller's promise).
        let text = unsafe { crate::ffi::fcinfo::text_string(value) };
        return asof::resolve_text(&text, bound);
    }
    let snap = value.value() as i64;
    if ty == pg_sys::TIMESTAMPTZOID {
        return asof::resolve_time_as(snap, bound);
    }
    if snap <= 0 {
        no_such_snapshot(snap);
    }
    snap as u64
}
