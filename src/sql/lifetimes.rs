//! Lifetimes from SQL (docs/design.md, "Lifetimes"): deleting snapshots, pinning them, ranking
//! them, previewing the retention policy, checking the store's references and space, and
//! copying the store for a backup.
//!
//! Every function here asks the worker, which owns the store: a deletion is durable when the
//! call returns, its space is reclaimed later in the background (`gsnap_progress()` shows
//! it). Administrative functions are for superusers and members of `gsnap_admin` (copying
//! the store also needs `pg_write_server_files`: it writes where the caller says); the
//! preview and the space report are readable by all (they show what `gsnap_snapshots()`
//! shows).

use super::access::require_gsnap_database;
use crate::error::{error, no_such_snapshot, null_argument};
use crate::ipc;
use crate::worker::UNIX_TO_PG_EPOCH_US;
use gsnap_lifetimes::Rank;
use gsnap_protocol::listing::ReportRow;
use gsnap_protocol::{Kind, Reply, Request, SnapId, SnapshotState};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Longest label or pin tag, in bytes.
const MAX_NAME_BYTES: usize = 200;

fn timestamptz(unix_us: i64) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(unix_us - UNIX_TO_PG_EPOCH_US).ok()
}

/// A snapshot id argument: not NULL, positive.
fn snapshot(snap_id: Option<i64>, what: &str) -> SnapId {
    let snap = snap_id.unwrap_or_else(|| null_argument(what));
    if snap <= 0 {
        no_such_snapshot(snap);
    }
    SnapId(snap as u64)
}

/// A rank as a user writes it (`none`, `minutely` ... `yearly`, or 0..6).
pub fn parse_rank(text: &str) -> u8 {
    match Rank::parse(text) {
        Ok(rank) => rank.value(),
        Err(_) => error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"{text}\" is not a snapshot rank"),
        )
        .hint("Ranks are none, minutely, hourly, daily, weekly, monthly and yearly (or 0 to 6).")
        .raise(),
    }
}

/// A label or pin tag: not empty, at most [`MAX_NAME_BYTES`], no control characters.
pub fn check_name(text: &str, what: &str) -> String {
    let bad = if text.trim().is_empty() {
        Some("must not be empty".to_string())
    } else if text.len() > MAX_NAME_BYTES {
        Some(format!("is longer than {MAX_NAME_BYTES} bytes"))
    } else if text.chars().any(char::is_control) {
        Some("must not contain control characters".to_string())
    } else {
        None
    };
    if let Some(problem) = bad {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("a snapshot {what} {problem}"),
        )
        .raise();
    }
    text.to_string()
}

/// Gives snapshot `snap_id` a rank later (lazy ranking): it is then kept as a member of its
/// minute, hour, ... up to that rank, in addition to the snapshots first in those periods.
/// Its rank is the higher of this one and the one it got when it was taken; `none` takes an
/// explicit rank back.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_set_rank(snap_id: Option<i64>, rank: Option<&str>) {
    require_gsnap_database();
    let snap = snapshot(snap_id, "the snapshot id of gsnap_set_rank");
    let rank = parse_rank(rank.unwrap_or_else(|| null_argument("the rank of gsnap_set_rank")));
    ipc::done(Request::SetRank { snap, rank });
}

/// Pins snapshot `snap_id` under `tag` until `until` (for ever by default): neither the
/// retention policy nor `gsnap_delete` deletes a pinned snapshot. Pinning again under the same
/// tag moves the time.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_pin(
    snap_id: Option<i64>,
    tag: Option<&str>,
    until: default!(Option<TimestampWithTimeZone>, "'infinity'"),
) {
    require_gsnap_database();
    let snap = snapshot(snap_id, "the snapshot id of gsnap_pin");
    let tag = check_name(
        tag.unwrap_or_else(|| null_argument("the tag of gsnap_pin")),
        "pin tag",
    );
    let until_us = match until {
        None => null_argument("the time of gsnap_pin (use 'infinity' to pin for ever)"),
        Some(t) if t.is_infinity() => i64::MAX,
        Some(t) if t.is_neg_infinity() => error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "a pin cannot end at -infinity",
        )
        .raise(),
        Some(t) => pg_sys::TimestampTz::from(t).saturating_add(UNIX_TO_PG_EPOCH_US),
    };
    ipc::done(Request::Pin {
        snap,
        tag,
        until_us,
    });
}

/// Removes the pin `tag` of snapshot `snap_id`.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_unpin(snap_id: Option<i64>, tag: Option<&str>) {
    require_gsnap_database();
    let snap = snapshot(snap_id, "the snapshot id of gsnap_unpin");
    let tag = tag
        .unwrap_or_else(|| null_argument("the tag of gsnap_unpin"))
        .to_string();
    ipc::done(Request::Unpin { snap, tag });
}

/// Deletes snapshots, all or none: they are unreadable when this returns (durably), and
/// their space is reclaimed in the background. Pinned snapshots are refused; the newest
/// snapshot, or every readable one, only with `force`. Returns how many snapshots this call
/// deleted (snapshots deleted before are skipped with a NOTICE).
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_delete(snap_ids: Option<Vec<Option<i64>>>, force: default!(bool, false)) -> i64 {
    require_gsnap_database();
    let ids = snap_ids.unwrap_or_else(|| null_argument("the snapshot ids of gsnap_delete"));
    let snaps: Vec<SnapId> = ids
        .into_iter()
        .map(|id| snapshot(id, "a snapshot id of gsnap_delete"))
        .collect();
    delete(snaps, force)
}

/// Deletes one snapshot (see `gsnap_delete(bigint[], boolean)`).
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_delete")]
fn gsnap_delete_one(snap_id: Option<i64>, force: default!(bool, false)) -> i64 {
    require_gsnap_database();
    delete(
        vec![snapshot(snap_id, "the snapshot id of gsnap_delete")],
        force,
    )
}

fn delete(mut snaps: Vec<SnapId>, force: bool) -> i64 {
    snaps.sort_unstable();
    snaps.dedup();
    let listed = ipc::snapshots();
    let mut deleting = 0;
    let mut firsts = Vec::new();
    for s in &snaps {
        match listed.iter().find(|r| r.id == *s) {
            Some(r) if matches!(r.state, SnapshotState::Deleted | SnapshotState::Reclaimed) => {
                pgrx::notice!("snapshot {} is already deleted, skipping", s.0)
            }
            Some(r) => {
                deleting += 1;
                if r.state == SnapshotState::Committed && r.rank > 0 {
                    firsts.push((s.0, r.rank));
                }
            }
            None => deleting += 1,
        }
    }
    ipc::done(Request::Delete { snaps, force });
    // Ranks are given at declaration: a period whose first snapshot is deleted by hand keeps
    // no member at that level (crates/lifetimes/README.md). Say so when a policy counts them.
    if !crate::gucs::retention().trim().is_empty() {
        for (snap, rank) in firsts {
            pgrx::notice!(
                "snapshot {snap} was the first of its {} period; gsnap.retention keeps no \
                 snapshot for that period at that level now unless another one is given the \
                 rank (gsnap_set_rank)",
                rank_name(rank)
            );
        }
    }
    deleting
}

/// What a retention policy keeps and deletes, and the rule that decided for each snapshot:
/// the configured `gsnap.retention` by default, or `policy`. The worker applies the
/// configured policy with the very same function.
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_retention_preview(
    policy: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(snap_id, i64),
        name!(taken_at, Option<TimestampWithTimeZone>),
        name!(rank, String),
        name!(label, Option<String>),
        name!(pinned, bool),
        name!(action, String),
        name!(rule, String),
    ),
> {
    require_gsnap_database();
    let rows = ipc::retention_preview(policy.map(str::to_string));
    TableIterator::new(rows.into_iter().map(|d| {
        (
            d.snap.0 as i64,
            timestamptz(d.taken_at_us),
            rank_name(d.rank),
            d.label,
            d.pinned,
            if d.keep { "keep" } else { "delete" }.to_string(),
            d.rule,
        )
    }))
}

/// A stored rank's name.
pub fn rank_name(rank: u8) -> String {
    Rank::new(rank).map_or_else(|| rank.to_string(), |r| r.to_string())
}

/// The value of report line `name` (0 if the worker did not report it).
fn value(report: &[ReportRow], name: &str) -> i64 {
    report
        .iter()
        .find(|r| r.name == name)
        .map_or(0, |r| r.value)
}

/// Recounts every reference in the store (mapping log, images, TOAST values) and reports
/// the bytes of the content the retained (and not yet reclaimed) snapshots need, leaked
/// content (stored, referenced by nothing) and missing content (referenced, not stored:
/// damage). With `repair`, leaked content is freed and wrong counts are fixed.
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_verify(
    repair: default!(bool, false),
) -> TableIterator<
    'static,
    (
        name!(images, i64),
        name!(toast_values, i64),
        name!(live_mappings, i64),
        name!(content_bytes, i64),
        name!(leaked_images, i64),
        name!(leaked_toast_values, i64),
        name!(leaked_deltas, i64),
        name!(leaked_bytes, i64),
        name!(missing_images, i64),
        name!(missing_toast_values, i64),
        name!(wrong_counts, i64),
        name!(repaired, bool),
    ),
> {
    require_gsnap_database();
    let r = ipc::verify(repair);
    TableIterator::once((
        value(&r, "images"),
        value(&r, "toast_values"),
        value(&r, "live_mappings"),
        value(&r, "content_bytes"),
        value(&r, "leaked_images"),
        value(&r, "leaked_toast_values"),
        value(&r, "leaked_deltas"),
        value(&r, "leaked_bytes"),
        value(&r, "missing_images"),
        value(&r, "missing_toast_values"),
        value(&r, "wrong_counts"),
        value(&r, "repaired") != 0,
    ))
}

/// The store's space: the bytes its content takes and the images it holds (RocksDB's
/// estimates, read without touching the content: exact once compaction has dropped what was
/// freed; `gsnap_verify()` counts exactly), its whole size on disk (write-ahead log
/// included), the deleted snapshots still waiting for reclamation and (at least) what
/// reclaiming them frees, and what reclamation freed since the worker started.
#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_store_stats() -> TableIterator<
    'static,
    (
        name!(content_bytes, i64),
        name!(disk_bytes, i64),
        name!(images, i64),
        name!(deleted_unreclaimed, i64),
        name!(deleted_bytes, i64),
        name!(reclaimed_bytes, i64),
        name!(reclaimed_images, i64),
        name!(key_map_entries, i64),
        name!(key_map_bytes, i64),
        name!(delta_entries, i64),
        name!(delta_bytes, i64),
    ),
> {
    require_gsnap_database();
    let r = ipc::store_stats();
    TableIterator::once((
        value(&r, "content_bytes"),
        value(&r, "disk_bytes"),
        value(&r, "images"),
        value(&r, "deleted_unreclaimed"),
        value(&r, "deleted_bytes"),
        value(&r, "reclaimed_bytes"),
        value(&r, "reclaimed_images"),
        value(&r, "key_map_entries"),
        value(&r, "key_map_bytes"),
        value(&r, "delta_entries"),
        value(&r, "delta_bytes"),
    ))
}

/// Writes a consistent copy of the snapshot store into `directory` (new; relative to the data
/// directory), taken at one moment while captures and reads go on: a backup that keeps the
/// snapshots. Returns the newest snapshot in the copy (NULL: none). The copy's files are
/// hard links to the store's where they share a file system, so it costs little space until
/// the store moves on.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_copy_store(directory: Option<&str>) -> Option<i64> {
    require_gsnap_database();
    // SAFETY: privilege lookups of the current user.
    let allowed = unsafe {
        pg_sys::has_privs_of_role(
            pg_sys::GetUserId(),
            pg_sys::Oid::from(pg_sys::ROLE_PG_WRITE_SERVER_FILES),
        )
    };
    if !allowed {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "permission denied to copy the gsnap store",
        )
        .detail(
            "The copy is written by the server's OS user, as COPY TO a file is: only \
             superusers and members of pg_write_server_files may choose where.",
        )
        .raise();
    }
    let given = directory.unwrap_or_else(|| null_argument("directory"));
    match ipc::request(Request::CopyStore {
        directory: copy_directory(given),
    }) {
        Reply::Resolved { snap } => (snap.0 > 0).then_some(snap.0 as i64),
        reply => ipc::unexpected(Kind::CopyStore, reply),
    }
}

/// The directory a copy of the store goes to, resolved and checked: it must not exist, its
/// parent must, and it must not be inside the store.
fn copy_directory(given: &str) -> String {
    let bad = |message: String, hint: &str| -> ! {
        error(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message)
            .hint(hint)
            .raise()
    };
    if given.trim().is_empty() {
        bad(
            "the directory to copy the gsnap store to must not be empty".into(),
            "Name a new directory, e.g. gsnap_backup (relative to the data directory).",
        );
    }
    let dir = crate::worker::in_data_directory(given.trim_end_matches('/'));
    let path = std::path::Path::new(&dir);
    if path.symlink_metadata().is_ok() {
        error(
            PgSqlErrorCode::ERRCODE_DUPLICATE_FILE,
            format!("directory \"{dir}\" already exists"),
        )
        .hint("Name a directory that does not exist yet; the copy creates it.")
        .raise();
    }
    // Where it really goes: the parent with symbolic links and ".." resolved.
    let (Some(parent), Some(name)) = (
        path.parent().and_then(|p| p.canonicalize().ok()),
        path.file_name(),
    ) else {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
            format!("the parent directory of \"{dir}\" does not exist"),
        )
        .raise();
    };
    let store = crate::worker::store_directory();
    let store_real = std::path::Path::new(&store).canonicalize();
    if parent
        .join(name)
        .starts_with(store_real.as_deref().unwrap_or(store.as_ref()))
    {
        bad(
            format!("directory \"{dir}\" is inside the gsnap store \"{store}\""),
            "Copy the store to a directory outside it.",
        );
    }
    dir
}

extension_sql!(
    r#"
REVOKE EXECUTE ON FUNCTION gsnap_copy_store(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_copy_store(text) TO gsnap_admin;
COMMENT ON FUNCTION gsnap_copy_store(text) IS
    'write a consistent copy of the snapshot store into a new directory (for backups); returns the newest snapshot in it';
REVOKE EXECUTE ON FUNCTION gsnap_set_rank(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_set_rank(bigint, text) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_pin(bigint, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_pin(bigint, text, timestamptz) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_unpin(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_unpin(bigint, text) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_delete(bigint[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_delete(bigint[], boolean) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_delete(bigint, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_delete(bigint, boolean) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_verify(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_verify(boolean) TO gsnap_admin;
COMMENT ON FUNCTION gsnap_delete(bigint[], boolean) IS
    'delete snapshots (all or none; pinned ones never, the newest only with force); space is reclaimed in the background';
COMMENT ON FUNCTION gsnap_retention_preview(text) IS
    'what the retention policy (gsnap.retention, or the one given) keeps and deletes, and why';
"#,
    name = "gsnap_lifetimes_privileges",
    requires = [
        "gsnap_snapshot_listing",
        gsnap_set_rank,
        gsnap_pin,
        gsnap_unpin,
        gsnap_delete,
        gsnap_delete_one,
        gsnap_verify,
        gsnap_retention_preview,
        gsnap_copy_store
    ],
);
