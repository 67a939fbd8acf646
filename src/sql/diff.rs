//! `gsnap_diff(NULL::t, a, b)`: rows present at b and not at a (`'added'`) and at a and not
//! at b (`'removed'`); an update is one of each, a row that only moved is no change.

use super::asof::Bound;
use super::range::rec_descriptor;
use super::{reader_table, snapshot_argument};
use crate::ffi::fcinfo::Call;
use crate::ffi::relation::OpenRelation;
use crate::ffi::tuple::item_pointer;
use crate::read::by_key::{diff_by_key, require_key, KeyedChange};
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

/// A call of the diff function `name`: the call, the table it reads (checked and locked as
/// every reader's) and its two snapshots.
///
/// # Safety
/// `fcinfo` is the call info of `name`, whose arguments are (anyelement, bigint, bigint).
unsafe fn diff_call(fcinfo: pg_sys::FunctionCallInfo, name: &str) -> (Call, pg_sys::Oid, u64, u64) {
    // SAFETY: the caller's promise.
    let call = unsafe { Call::new(fcinfo) };
    let relid = reader_table(call, name);
    let a = snapshot_argument(call, 1, &format!("the first snapshot of {name}"), Bound::At);
    let b = snapshot_argument(
        call,
        2,
        &format!("the second snapshot of {name}"),
        Bound::At,
    );
    (call, relid, a, b)
}

/// A call of `name`: the rows of the diff into the call's result set, `(change, rec)` and,
/// `with_tid`, the row's TID at its snapshot.
///
/// # Safety
/// `fcinfo` is the call info of `name`, whose result columns are those.
unsafe fn diff(fcinfo: pg_sys::FunctionCallInfo, name: &str, with_tid: bool) -> pg_sys::Datum {
    // SAFETY: the caller's promise.
    let (call, relid, a, b) = unsafe { diff_call(fcinfo, name) };
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

v1_function_info!(pg_finfo_gsnap_diff_by_key);

/// `gsnap_diff_by_key(anyelement, a bigint, b bigint)`: the diff matched by primary key.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_diff_by_key(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    let name = "gsnap_diff_by_key";
    // SAFETY: PostgreSQL calls this with the call info of this function.
    let (call, relid, a, b) = unsafe { diff_call(fcinfo, name) };
    let rel = OpenRelation::open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        .expect("reader_table locked the table");
    let key = require_key(&rel, name);
    let result = call.materialize();
    let label = |text: &str| text.into_datum().expect("text is not NULL");
    let labels = [label("updated"), label("removed"), label("added")];
    let none = pg_sys::Datum::from(0usize);
    let mut put = |change: KeyedChange| {
        let (i, (block, lp), old, new) = match change {
            KeyedChange::Updated { old, new, at } => (0, at, Some(old), Some(new)),
            KeyedChange::Removed { old, at } => (1, at, Some(old), None),
            KeyedChange::Added { new, at } => (2, at, None, Some(new)),
        };
        let mut tid = item_pointer(block, lp);
        let at = pg_sys::Datum::from(std::ptr::addr_of_mut!(tid));
        let values = [labels[i], at, old.unwrap_or(none), new.unwrap_or(none)];
        let nulls = [false, false, old.is_none(), new.is_none()];
        // SAFETY: a row of the result's type: a text, a tid (copied by the put), then the
        // rows at a and b, formed by diff_rows with the descriptor of the `old` column.
        unsafe { result.put_values(&values, &nulls) };
    };
    // SAFETY: the result's columns are (change text, at tid, old, new of the row type).
    let rec_desc = unsafe { rec_descriptor(result.desc, 2) };
    // SAFETY: the table's current row type, copied for this call, and its primary key.
    unsafe { diff_by_key(relid, (a, b), rec_desc, &key, &mut put) };
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
CREATE FUNCTION gsnap_diff_by_key(rel anyelement, a bigint, b bigint)
    RETURNS TABLE (change text, at tid, old anyelement, new anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff_by_key' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff_by_key(anyelement, bigint, bigint) IS
    'rows that differ between two snapshots matched by primary key: updated (old and new), removed (old), added (new); at is the TID at b (at a for removed)';
COMMENT ON FUNCTION gsnap_diff_at(anyelement, bigint, bigint) IS
    'gsnap_diff with each row''s TID at its snapshot (b for an added row, a for a removed one)';
CREATE FUNCTION gsnap_diff(rel anyelement, a text, b text)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_at(rel anyelement, a text, b text)
    RETURNS TABLE (change text, rec anyelement, at tid)
    AS 'MODULE_PATHNAME', 'gsnap_diff_at' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_by_key(rel anyelement, a text, b text)
    RETURNS TABLE (change text, at tid, old anyelement, new anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff_by_key' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff(anyelement, text, text) IS
    'gsnap_diff with its snapshots written as ids, labels or times';
CREATE FUNCTION gsnap_diff(rel anyelement, a timestamptz, b timestamptz)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_at(rel anyelement, a timestamptz, b timestamptz)
    RETURNS TABLE (change text, rec anyelement, at tid)
    AS 'MODULE_PATHNAME', 'gsnap_diff_at' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_by_key(rel anyelement, a timestamptz, b timestamptz)
    RETURNS TABLE (change text, at tid, old anyelement, new anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff_by_key' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff(rel anyelement, a bigint, b text)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_at(rel anyelement, a bigint, b text)
    RETURNS TABLE (change text, rec anyelement, at tid)
    AS 'MODULE_PATHNAME', 'gsnap_diff_at' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_by_key(rel anyelement, a bigint, b text)
    RETURNS TABLE (change text, at tid, old anyelement, new anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff_by_key' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff(rel anyelement, a text, b bigint)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_at(rel anyelement, a text, b bigint)
    RETURNS TABLE (change text, rec anyelement, at tid)
    AS 'MODULE_PATHNAME', 'gsnap_diff_at' LANGUAGE C STABLE PARALLEL RESTRICTED;
CREATE FUNCTION gsnap_diff_by_key(rel anyelement, a text, b bigint)
    RETURNS TABLE (change text, at tid, old anyelement, new anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff_by_key' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff(anyelement, timestamptz, timestamptz) IS
    'gsnap_diff between the latest snapshots taken at or before two times';
"#,
    name = "gsnap_diff",
    requires = ["gsnap_preload_check_call"],
);
