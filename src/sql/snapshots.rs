//! Declaring snapshots and listing them: `gsnap_snapshot()`, `gsnap_snapshots()`,
//! `gsnap_snapshot_tables()`, `gsnap_progress()` (captures, and the reclamation of deleted
//! snapshots' space).

use super::access::require_gsnap_database;
use crate::error::{error, notice};
use crate::ffi::relation::relation_name;
use crate::ipc;
use crate::shmem::{self, WorkerState};
use crate::worker::UNIX_TO_PG_EPOCH_US;
use gsnap_protocol::{Kind, Reply, Request, SnapId};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

fn timestamptz(unix_us: i64) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(unix_us - UNIX_TO_PG_EPOCH_US).ok()
}

fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// Declares a snapshot of every gsnap table and returns its id. With `wait` (the default)
/// it returns once the snapshot's capture is durable; without, right after declaration (a
/// crash before the capture is durable then loses the snapshot; its id is not reused).
/// `label` names it (`gsnap_snapshots()` shows it); `rank` raises its rank at once, so the
/// retention policy keeps it as a member of its periods up to that rank (`daily`: as long
/// as the day it was taken is kept).
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_snapshot(
    wait: default!(Option<bool>, true),
    label: default!(Option<&str>, "NULL"),
    rank: default!(Option<&str>, "NULL"),
) -> i64 {
    require_gsnap_database();
    let wait =
        wait.unwrap_or_else(|| crate::error::null_argument("the wait argument of gsnap_snapshot"));
    let label = label.map(|l| super::lifetimes::check_name(l, "label"));
    let rank = rank.map(super::lifetimes::parse_rank);
    let (snap, _) = declare(wait, false, label, rank);
    snap.0 as i64
}

/// Asks the worker for a declaration. The worker takes ACCESS SHARE on every gsnap table
/// first and postpones the declaration while one is locked by a TRUNCATE, DROP, ALTER TABLE
/// or LOCK TABLE in progress; if that lock is held by the calling transaction itself, the
/// wait could only end with the transaction, so it is refused at once. A declaration also
/// waits while `gsnap.max_queued_snapshots` snapshots wait for their capture. Either wait,
/// once it has lasted a second, is told to the session in a NOTICE (once per table, once
/// for the queue), as PostgreSQL tells what `pg_backup_stop()` waits for. Returns the
/// snapshot and, with `export`, the name of its exported MVCC snapshot.
pub(super) fn declare(
    wait: bool,
    export: bool,
    label: Option<String>,
    rank: Option<u8>,
) -> (SnapId, Option<String>) {
    let request = Request::Declare {
        wait,
        export,
        label,
        rank,
    };
    let asked = std::time::Instant::now();
    let mut told_table = 0;
    let mut told_queue = false;
    let reply = ipc::call_watching(request, &mut || {
        let progress = shmem::progress().read();
        let relid = progress.waiting_for;
        let blocked_by_us = relid != 0 && crate::locks::holds_any(relid);
        if blocked_by_us {
            // This request gives up: the worker sets the table again if a declaration still
            // waits for it (a value left behind would make another session give up too).
            shmem::progress().set_waiting_for(0);
        }
        if blocked_by_us && crate::locks::holds_access_exclusive(relid) {
            let table = relation_name(pg_sys::Oid::from(relid));
            error(
                PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                format!(
                    "a snapshot cannot be declared while this transaction holds an ACCESS \
                     EXCLUSIVE lock on table {table}"
                ),
            )
            .detail(format!(
                "Declaring a snapshot takes an ACCESS SHARE lock on every gsnap table, and a \
                 TRUNCATE, DROP TABLE, ALTER TABLE or LOCK TABLE of {table} earlier in this \
                 transaction holds a conflicting lock until the transaction ends."
            ))
            .hint(
                "Call gsnap_snapshot() before that command, or in another transaction \
                 (after this one commits).",
            )
            .raise();
        }
        if blocked_by_us {
            let table = relation_name(pg_sys::Oid::from(relid));
            error(
                PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                format!(
                    "a snapshot cannot be declared while another session waits for an ACCESS \
                     EXCLUSIVE lock on table {table} behind a lock this transaction holds"
                ),
            )
            .detail(
                "Declaring a snapshot takes an ACCESS SHARE lock on every gsnap table; it waits \
                 for the session queued for that table, which waits for this transaction.",
            )
            .hint("Retry once that session's command (TRUNCATE, ALTER TABLE, ...) is done.")
            .raise();
        }
        if asked.elapsed() >= TELL_WAITS_AFTER {
            tell_wait(&progress, &mut told_table, &mut told_queue);
        }
    });
    match reply {
        Reply::Declared { snap, exported } => (snap, exported),
        reply => ipc::unexpected(Kind::Declare, reply),
    }
}

/// How long a declaration waits before the session is told why.
const TELL_WAITS_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Tells the session what its declaration waits for, if the worker's progress `p` says it
/// waits, and it was not told yet: a table's lock (`told_table`), or room in the capture
/// queue. (A wait this session's own locks cause is an ERROR instead, raised before this.)
fn tell_wait(p: &shmem::Progress, told_table: &mut u32, told_queue: &mut bool) {
    if p.waiting_for != 0 && p.waiting_for != *told_table {
        *told_table = p.waiting_for;
        let table = relation_name(pg_sys::Oid::from(p.waiting_for));
        notice(format!(
            "gsnap: waiting for a lock on table {table} to declare the snapshot"
        ))
        .detail(format!(
            "Declaring a snapshot takes an ACCESS SHARE lock on every gsnap table; a TRUNCATE, \
             DROP TABLE, ALTER TABLE, VACUUM FULL, CLUSTER or LOCK TABLE of {table} holds a \
             conflicting lock until its transaction ends."
        ))
        .hint("pg_locks shows which session holds it; the declaration goes on once it is released.")
        .send();
    }
    if p.held_for_room > 0 && !*told_queue {
        *told_queue = true;
        let limit = crate::gucs::MAX_QUEUED_SNAPSHOTS.get();
        notice(format!(
            "gsnap: waiting for room in the capture queue (gsnap.max_queued_snapshots = {limit})"
        ))
        .detail(
            "That many declared snapshots wait for their capture. Captures run one at a time, \
             oldest first; each queued snapshot holds back VACUUM until its capture has read \
             its pages.",
        )
        .hint("gsnap_progress() shows the capture in flight and how many declarations wait.")
        .send();
    }
}

/// Test support: declares a snapshot, exports its MVCC snapshot (for `SET TRANSACTION
/// SNAPSHOT`) and keeps it until `gsnap_debug_release()`. Superuser only.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_debug_snapshot() -> TableIterator<'static, (name!(snap_id, i64), name!(exported, String))>
{
    require_gsnap_database();
    let (snap, exported) = declare(false, true, None, None);
    TableIterator::once((snap.0 as i64, exported.unwrap_or_default()))
}

/// Test support: releases a snapshot exported by `gsnap_debug_snapshot()`.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_debug_release(snap_id: i64) {
    ipc::request(Request::ReleaseExport {
        snap: SnapId(snap_id as u64),
    });
}

/// Every snapshot the store knows, oldest first (the raw listing behind
/// `gsnap_snapshots()`).
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_snapshots_raw() -> TableIterator<
    'static,
    (
        name!(snap_id, i64),
        name!(taken_at, Option<TimestampWithTimeZone>),
        name!(lsn, String),
        name!(state, String),
        name!(tables, i32),
        name!(pages_captured, i64),
        name!(new_images, i64),
        name!(bytes_stored, i64),
        name!(carried_pages, i64),
        name!(frees_bytes, Option<i64>),
        name!(failure, Option<String>),
        name!(rank, String),
        name!(label, Option<String>),
        name!(pinned_by, Option<Vec<String>>),
        name!(deleted_at, Option<TimestampWithTimeZone>),
    ),
> {
    require_gsnap_database();
    TableIterator::new(ipc::snapshots().into_iter().map(|r| {
        let now = crate::worker::now_unix_us();
        let pins: Vec<String> = r
            .pins
            .iter()
            .filter(|(_, until)| *until > now)
            .map(|(tag, _)| tag.clone())
            .collect();
        (
            r.id.0 as i64,
            timestamptz(r.taken_at_us),
            lsn_text(r.lsn),
            r.state.as_str().to_string(),
            r.tables as i32,
            r.pages_captured as i64,
            r.new_images as i64,
            r.bytes_stored as i64,
            r.carried_pages as i64,
            r.frees_bytes.map(|b| b as i64),
            r.failure,
            super::lifetimes::rank_name(r.rank.max(r.explicit_rank)),
            r.label,
            (!pins.is_empty()).then_some(pins),
            r.deleted_at_us.and_then(timestamptz),
        )
    }))
}

/// Every pin of every snapshot, with the time it ends (NULL: never); expired pins are listed
/// until the snapshot is deleted, with `active` false.
#[pg_extern(stable, parallel_safe)]
fn gsnap_pins() -> TableIterator<
    'static,
    (
        name!(snap_id, i64),
        name!(tag, String),
        name!(pinned_until, Option<TimestampWithTimeZone>),
        name!(active, bool),
    ),
> {
    require_gsnap_database();
    let now = crate::worker::now_unix_us();
    let rows: Vec<_> = ipc::snapshots()
        .into_iter()
        .flat_map(|r| {
            let id = r.id.0 as i64;
            r.pins.into_iter().map(move |(tag, until)| {
                let ends = (until != i64::MAX).then(|| timestamptz(until)).flatten();
                (id, tag, ends, until > now)
            })
        })
        .collect();
    TableIterator::new(rows)
}

/// The tables of snapshot `snap_id`, with their size and storage at the time, and whether
/// each was dropped since (no relation has its OID now: read it with `gsnap_asof_dropped`),
/// and the partitioned table it was a partition of then (its OID).
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_snapshot_tables(
    snap_id: i64,
) -> TableIterator<
    'static,
    (
        name!(table_oid, pg_sys::Oid),
        name!(table_name, String),
        name!(blocks, i64),
        name!(relfilenode, pg_sys::Oid),
        name!(incarnation, i64),
        name!(dropped, bool),
        name!(partition_of, Option<pg_sys::Oid>),
    ),
> {
    require_gsnap_database();
    let rows = ipc::snapshot_tables(SnapId(snap_id as u64));
    TableIterator::new(rows.into_iter().map(|r| {
        let oid = pg_sys::Oid::from(r.relid);
        (
            oid,
            r.name,
            i64::from(r.nblocks),
            pg_sys::Oid::from(r.relfilenode),
            i64::from(r.rel.0),
            crate::ffi::relation::relation_kind(oid).is_none(),
            r.ancestors.first().map(|&a| pg_sys::Oid::from(a)),
        )
    }))
}

/// What the worker is doing: one row.
#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_progress() -> TableIterator<
    'static,
    (
        name!(worker, String),
        name!(worker_pid, Option<i32>),
        name!(phase, String),
        name!(snap_id, Option<i64>),
        name!(declared_at, Option<TimestampWithTimeZone>),
        name!(tables_total, i32),
        name!(tables_done, i32),
        name!(pages_total, i64),
        name!(pages_done, i64),
        name!(bytes_stored, i64),
        name!(new_images, i64),
        name!(queued, i32),
        name!(waiting_for_table, Option<pg_sys::Oid>),
        name!(last_durable, Option<i64>),
        name!(last_durable_at, Option<TimestampWithTimeZone>),
        name!(reclaiming_snap, Option<i64>),
        name!(reclaim_done, i64),
        name!(reclaim_total, i64),
        name!(reclaimed_bytes, i64),
        name!(horizon_held_ms, Option<f64>),
        name!(pages_beyond_memory, i64),
        name!(pages_to_store, i64),
        name!(worst_second, Option<f64>),
        name!(pages_copied_ahead, i64),
        name!(copies_ahead, i64),
        name!(declarations_held, i32),
    ),
> {
    crate::require_preloaded();
    let w = shmem::worker();
    let p = shmem::progress().read();
    let phase = p.phase.map(|p| p.as_str()).unwrap_or("idle");
    let state = match w.state() {
        WorkerState::Down if ipc::in_recovery() => "in recovery",
        s => s.as_str(),
    };
    TableIterator::once((
        state.to_string(),
        Some(w.pid()).filter(|&p| p != 0),
        phase.to_string(),
        (p.snapshot > 0).then_some(p.snapshot),
        (p.started_at_us > 0)
            .then(|| timestamptz(p.started_at_us))
            .flatten(),
        p.relations_total as i32,
        p.relations_done as i32,
        p.pages_total as i64,
        p.pages_done as i64,
        p.bytes_stored as i64,
        p.new_images as i64,
        p.queued as i32,
        (p.waiting_for != 0).then(|| pg_sys::Oid::from(p.waiting_for)),
        (p.last_durable > 0).then_some(p.last_durable),
        (p.last_durable_at_us > 0)
            .then(|| timestamptz(p.last_durable_at_us))
            .flatten(),
        (p.reclaim_snapshot > 0).then_some(p.reclaim_snapshot),
        p.reclaim_done as i64,
        p.reclaim_total as i64,
        p.reclaimed_bytes as i64,
        (p.last_horizon_held_us > 0).then(|| p.last_horizon_held_us as f64 / 1000.0),
        p.pages_beyond_memory as i64,
        p.pages_to_store as i64,
        (p.last_worst_second_ppm > 0).then(|| p.last_worst_second_ppm as f64 / 1e6),
        p.pages_copied_ahead as i64,
        p.copies_ahead as i64,
        p.held_for_room as i32,
    ))
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_snapshots()
RETURNS TABLE (snap_id bigint, taken_at timestamptz, lsn pg_lsn, state text, tables int,
               pages_captured bigint, new_images bigint, bytes_stored bigint,
               carried_pages bigint, failure text, rank text, label text,
               pinned_by text[], deleted_at timestamptz, frees_bytes bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT snap_id, taken_at, lsn::pg_lsn, state, tables, pages_captured, new_images,
           bytes_stored, carried_pages, failure, rank, label, pinned_by, deleted_at, frees_bytes
    FROM gsnap_snapshots_raw()
$$;
COMMENT ON FUNCTION gsnap_snapshots() IS 'every snapshot: when, at which WAL position, its state, size, rank, label, pins';

-- Administration is restricted: superusers and members of gsnap_admin.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gsnap_admin') THEN
        CREATE ROLE gsnap_admin NOLOGIN;
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION gsnap_snapshot(boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gsnap_snapshot(boolean, text, text) TO gsnap_admin;
REVOKE EXECUTE ON FUNCTION gsnap_debug_snapshot() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION gsnap_debug_release(bigint) FROM PUBLIC;
"#,
    name = "gsnap_snapshot_listing",
    requires = [
        gsnap_snapshots_raw,
        gsnap_snapshot,
        gsnap_debug_snapshot,
        gsnap_debug_release
    ],
);

/// The GSnap index groups: each group's snapshots, state, size and the budgets GSnap's
/// Algorithm 1 gave it.
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_groups() -> TableIterator<
    'static,
    (
        name!(group_id, i64),
        name!(state, String),
        name!(first_snap, i64),
        name!(last_snap, i64),
        name!(snapshots, i64),
        name!(pages_changed, i64),
        name!(bytes, i64),
        name!(loaded, bool),
        name!(length_budget, i64),
        name!(page_budget, Option<i64>),
    ),
> {
    require_gsnap_database();
    TableIterator::new(ipc::groups().into_iter().map(|r| {
        (
            r.id as i64,
            r.state.as_str().to_string(),
            r.first.0 as i64,
            r.last.0 as i64,
            r.snapshots as i64,
            r.pages as i64,
            r.bytes as i64,
            r.loaded,
            r.length_budget as i64,
            r.page_budget.and_then(|b| i64::try_from(b).ok()),
        )
    }))
}

/// The shared caches: the group cache (index groups) and the image cache (page images and
/// TOAST chunks), how many images the backends reading them decompressed themselves (scans
/// in parallel queries; the worker decompresses the others), and the pins held in each cache
/// now (by running reads; zero when none runs). One row.
#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)] // pgrx needs the columns spelled out here
fn gsnap_index_stats() -> TableIterator<
    'static,
    (
        name!(group_cache_bytes, i64),
        name!(group_cache_used, i64),
        name!(groups_loaded, i64),
        name!(group_hits, i64),
        name!(group_misses, i64),
        name!(group_loads, i64),
        name!(group_evictions, i64),
        name!(image_cache_slots, i64),
        name!(image_cache_used, i64),
        name!(image_hits, i64),
        name!(image_misses, i64),
        name!(image_loads, i64),
        name!(image_evictions, i64),
        name!(images_decompressed_by_readers, i64),
        name!(group_pins, i64),
        name!(image_pins, i64),
    ),
> {
    crate::require_preloaded();
    let g = shmem::groups::with_groups(|c| c.stats()).unwrap_or_default();
    let (capacity, used, i, image_pins) = shmem::with_cache(|c| {
        (
            c.capacity() as i64,
            c.used() as i64,
            c.stats(),
            c.total_pins() as i64,
        )
    });
    TableIterator::once((
        g.data_size as i64,
        g.used_bytes as i64,
        g.groups as i64,
        g.hits as i64,
        g.misses as i64,
        g.loads as i64,
        g.evictions as i64,
        capacity,
        used,
        i.hits as i64,
        i.misses as i64,
        i.inserts as i64,
        i.evictions as i64,
        shmem::reader_decodes() as i64,
        g.pins as i64,
        image_pins,
    ))
}
