//! `gsnap_asof(NULL::table, snapshot)` and `gsnap_asof(NULL::table, time)` as set-returning
//! functions: a table's rows as they were at a snapshot, in the table's current row type. (In
//! FROM they are planned as the "gsnap AS OF" custom scan instead, `exec::asof_scan`.)
//!
//! These are plain V1 C functions (the table is named by the row type of the first argument,
//! which is NULL, so they are `CALLED ON NULL INPUT` and check the snapshot argument
//! themselves) returning their rows in materialize mode.

use super::{reader_table, snapshot_argument};
use crate::error::{error, null_argument};
use crate::ffi::fcinfo::Call;
use crate::ffi::relation::relation_kind;
use crate::ipc;
use crate::read::asof::{AsofRows, Row};
use crate::read::partitioned::PartitionedRows;
use crate::v1_function_info;
use crate::worker::UNIX_TO_PG_EPOCH_US;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

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

/// `gsnap_asof(anyelement, bigint)`, and `(anyelement, text)`: an id, a label or a time
/// ([`resolve_text`]).
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_id(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let snapshot = |call| snapshot_argument(call, 1, "the snapshot of gsnap_asof", Bound::At);
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
    once_per_statement(t, Bound::At, || {
        ipc::resolve_time(t.saturating_add(UNIX_TO_PG_EPOCH_US)).0
    })
}

/// The times resolved during one statement (its transaction's and its own start times), and
/// the snapshot each named.
struct Resolved {
    statement: (i64, i64),
    times: Vec<((i64, Bound), u64)>,
}

thread_local! {
    static RESOLVED: std::cell::RefCell<Resolved> = const {
        std::cell::RefCell::new(Resolved { statement: (0, 0), times: Vec::new() })
    };
}

/// The snapshot time `t` names as `bound` says, resolved once per statement: every scan of
/// a statement (every table of a session's `gsnap.as_of`, or two calls naming the same
/// time) reads the same snapshot, though one committed between their starts would be the
/// latest for the second ('tomorrow', 'infinity', a time to come).
fn once_per_statement(t: pg_sys::TimestampTz, bound: Bound, resolve: impl FnOnce() -> u64) -> u64 {
    // SAFETY: reads of the current transaction's and statement's start times.
    let stamp = unsafe {
        (
            pg_sys::GetCurrentTransactionStartTimestamp(),
            pg_sys::GetCurrentStatementStartTimestamp(),
        )
    };
    let known = RESOLVED.with_borrow(|r| {
        (r.statement == stamp)
            .then(|| {
                r.times
                    .iter()
                    .find(|(k, _)| *k == (t, bound))
                    .map(|(_, s)| *s)
            })
            .flatten()
    });
    if let Some(snap) = known {
        return snap;
    }
    let snap = resolve();
    RESOLVED.with_borrow_mut(|r| {
        if r.statement != stamp {
            r.statement = stamp;
            r.times.clear();
        }
        r.times.push(((t, bound), snap));
    });
    snap
}

/// The words PostgreSQL's timestamptz input takes without a digit (`'yesterday'`).
const TIME_WORDS: [&str; 7] = [
    "now",
    "today",
    "tomorrow",
    "yesterday",
    "epoch",
    "infinity",
    "-infinity",
];

/// Which snapshot a time names: the one a reader reads at (the latest taken at or before
/// it), or a bound of a range of snapshots (from: the earliest taken at or after it; to: the
/// latest at or before it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bound {
    At,
    From,
    To,
}

/// A snapshot written as text, as a DBA would name it: an id (`'42'`), a label given by
/// `gsnap_snapshot(label => ...)` (`'before the deploy'`), or a time (`'2026-11-17 14:00'`,
/// `'yesterday'`, read as a `timestamptz` in the session's zone, resolved as `bound` says),
/// tried in that order. A label several readable snapshots share, or text that is none of
/// these, is an ERROR saying so.
pub fn resolve_text(text: &str, bound: Bound) -> u64 {
    let trimmed = text.trim();
    if let Ok(id) = trimmed.parse::<i64>() {
        if id <= 0 {
            crate::error::no_such_snapshot(id);
        }
        return id as u64;
    }
    let listed = ipc::snapshots();
    let labelled: Vec<u64> = listed
        .iter()
        .filter(|s| s.state.is_readable() && s.label.as_deref() == Some(text))
        .map(|s| s.id.0)
        .collect();
    match labelled.as_slice() {
        [one] => return *one,
        [] => {}
        many => {
            let ids: Vec<String> = many.iter().map(u64::to_string).collect();
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "label '{text}' names {} snapshots: {}",
                    many.len(),
                    ids.join(", ")
                ),
            )
            .hint("Give the snapshot's id.")
            .raise()
        }
    }
    let word = TIME_WORDS.contains(&trimmed.to_ascii_lowercase().as_str());
    if !word && !trimmed.bytes().any(|b| b.is_ascii_digit()) {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("no readable snapshot is labelled '{text}'"),
        )
        .hint(
            "A snapshot is given by its id, its label (gsnap_snapshots() lists both), or a \
             time ('2026-11-17 14:00').",
        )
        .raise();
    }
    // PostgreSQL's own timestamptz input (its ERROR for text it cannot read).
    let c = std::ffi::CString::new(trimmed).unwrap_or_default();
    let (input, ioparam) = crate::ffi::catalog::input_function(pg_sys::TIMESTAMPTZOID);
    // SAFETY: timestamptz's input function on a C string, with no type modifier; it returns
    // a timestamptz by value or raises an ERROR.
    let t = unsafe { pg_sys::OidInputFunctionCall(input, c.as_ptr().cast_mut(), ioparam, -1) };
    resolve_time_as(t.value() as i64, bound)
}

/// The snapshot time `t` names as `bound` says: the latest taken at or before it, or, for
/// the start of a range, the earliest taken at or after it.
pub fn resolve_time_as(t: pg_sys::TimestampTz, bound: Bound) -> u64 {
    if bound != Bound::From {
        return resolve_time(t);
    }
    once_per_statement(t, bound, || {
        let unix_us = t.saturating_add(UNIX_TO_PG_EPOCH_US);
        ipc::snapshots()
            .iter()
            .filter(|s| s.state.is_readable() && s.taken_at_us >= unix_us)
            .map(|s| s.id.0)
            .min()
            .unwrap_or_else(|| {
                error(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "no snapshot was taken at or after that time",
                )
                .hint("gsnap_snapshots() lists the snapshots and when each was taken.")
                .raise()
            })
    })
}

/// The snapshot the session's `gsnap.as_of` names now, as its queries resolve it; NULL when
/// the setting is empty (they read the live tables).
#[pg_extern(stable, parallel_safe)]
fn gsnap_as_of() -> Option<i64> {
    crate::sql::access::require_gsnap_database();
    let text = crate::plan::as_of::setting()?;
    Some(resolve_text(&text, Bound::At) as i64)
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
CREATE FUNCTION gsnap_asof(rel anyelement, snapshot text) RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'gsnap_asof_id' LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION gsnap_asof(anyelement, text) IS
    'rows of a table as of a snapshot written as text: its id, its label or a time';
"#,
    name = "gsnap_asof",
    requires = ["gsnap_preload_check_call"],
);
