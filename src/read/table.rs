//! What snapshots hold of a table: its incarnation (the relation whose pages the snapshot
//! maps), its size in blocks and its row type at the time, asked of the worker.
//!
//! The rule every reader follows (README, "Snapshots that do not hold a table"): a snapshot
//! that does not hold the table has no rows of it, and reading a table from snapshots none of
//! which holds it is an ERROR.

use crate::error::{self, error, not_in_snapshot};
use crate::ffi::relation::{qualified_name, relation_name};
use crate::ipc;
use gsnap_format::rowtype::RowType;
use gsnap_protocol::{ErrorCode, SnapId};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::time::Duration;

/// What a snapshot holds of a table.
pub struct TableAtSnapshot {
    /// The relation incarnation whose pages the snapshot maps.
    pub rel: u32,
    /// The table's size in blocks at the snapshot.
    pub nblocks: u32,
    pub row_type: RowType,
    /// The row type's stored bytes (equal bytes: equal row types).
    pub row_type_bytes: Vec<u8>,
    /// The reclamation generation before the snapshot was found readable (see
    /// [`confirm_readable`]).
    pub lease: u64,
}

/// What snapshot `snap` holds of `relid` (None: the table is not in the snapshot). A
/// snapshot whose capture is still running is waited for (the wait can be cancelled); one
/// that does not exist or cannot be read is an ERROR.
pub fn held_by(snap: u64, relid: pg_sys::Oid) -> Option<TableAtSnapshot> {
    let lease = crate::shmem::progress().reclaim_generation();
    let mut told = false;
    let begin = loop {
        match ipc::scan_begin(SnapId(snap), relid.to_u32()) {
            Ok(begin) => break begin,
            Err(e) if e.code == ErrorCode::Capturing => {
                if !told {
                    pgrx::notice!(
                        "snapshot {snap} is still being captured; waiting for its capture to \
                         end (see gsnap_progress())"
                    );
                    told = true;
                }
                ipc::wait_latch(Duration::from_millis(20))
            }
            Err(e) => ipc::raise(e),
        }
    };
    let (header, row_type) = begin?;
    let decoded = RowType::decode(&row_type)
        .unwrap_or_else(|e| error::corrupt(format_args!("snapshot {snap}: {e}")));
    Some(TableAtSnapshot {
        rel: header.rel.0,
        nblocks: header.nblocks,
        row_type: decoded,
        row_type_bytes: row_type,
        lease,
    })
}

/// Confirms, once a reader pinned the index groups of `snaps` (which holds off the
/// reclamation of their snapshots), that they are still readable. They were when the reader
/// looked them up, at reclamation generation `lease`; if a reclamation started since, the
/// reader may have pinned too late for it, and a snapshot deleted meanwhile is an ERROR
/// instead of images gone missing under the reader.
pub fn confirm_readable(snaps: &[u64], lease: u64) {
    if crate::shmem::progress().reclaim_generation() == lease {
        return;
    }
    let listed = ipc::snapshots();
    for &snap in snaps {
        if !listed
            .iter()
            .any(|r| r.id.0 == snap && r.state.is_readable())
        {
            error(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("snapshot {snap} was deleted while this query started to read it"),
            )
            .hint("gsnap_snapshots() lists the snapshots and their states.")
            .raise();
        }
    }
}

/// What snapshot `snap` holds of `relid`, or the ERROR that it does not hold the table.
pub fn at(snap: u64, relid: pg_sys::Oid) -> TableAtSnapshot {
    held_by(snap, relid).unwrap_or_else(|| not_held(snap, relid))
}

/// The ERROR that snapshot `snap` does not hold table `relid`. When the snapshot holds
/// another table that had the same name then (the table was dropped and created again, or
/// renamed and another made in its place), the ERROR says which and how to read it: the
/// snapshot follows tables, not names.
fn not_held(snap: u64, relid: pg_sys::Oid) -> ! {
    let name = qualified_name(relid);
    let earlier = name.as_ref().and_then(|n| {
        ipc::snapshot_tables(SnapId(snap))
            .into_iter()
            .find(|t| &t.name == n && t.relid != relid.to_u32())
    });
    let (Some(name), Some(earlier)) = (name, earlier) else {
        not_in_snapshot(&relation_name(relid), snap)
    };
    let e = error(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        format!("table {name} is not in snapshot {snap}"),
    );
    let literal = name.replace('\'', "''");
    match qualified_name(pg_sys::Oid::from(earlier.relid)) {
        Some(now) => e
            .detail(format!(
                "Snapshot {snap} holds another table that was named {name} then and is \
                 named {now} now."
            ))
            .hint(format!(
                "Read it as gsnap_asof(NULL::{now}, {snap}), or restore it by that name."
            )),
        None => e
            .detail(format!(
                "Snapshot {snap} holds an earlier table named {name}, dropped since (OID {}).",
                earlier.relid
            ))
            .hint(format!(
                "Read its rows with gsnap_asof_dropped('{literal}', {snap}) AS t(...), or \
                 recreate it with gsnap_undrop('{literal}', {snap}, 'new_name')."
            )),
    }
    .raise()
}

/// The readable snapshots in `from..=to`, ascending; none is an ERROR.
pub fn readable_in_range(from: u64, to: u64) -> Vec<u64> {
    let readable: Vec<u64> = ipc::snapshots()
        .into_iter()
        .filter(|s| s.state.is_readable() && (from..=to).contains(&s.id.0))
        .map(|s| s.id.0)
        .collect();
    if readable.is_empty() {
        no_readable_snapshot(from, to);
    }
    readable
}

/// The ERROR of a range without a readable snapshot.
fn no_readable_snapshot(from: u64, to: u64) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("no readable snapshot from snapshot {from} to snapshot {to}"),
    )
    .hint("gsnap_snapshots() lists the snapshots and their states.")
    .raise()
}

/// The readable snapshots in `from..=to` that hold `relid`, with the table as each holds it,
/// oldest first. A range with no readable snapshot, or none holding the table, is an ERROR.
pub fn in_range(relid: pg_sys::Oid, from: u64, to: u64) -> Vec<(u64, TableAtSnapshot)> {
    let lease = crate::shmem::progress().reclaim_generation();
    // One request for the whole range (a range of 1,000 snapshots is not 1,000 requests).
    let range = ipc::scan_range(relid.to_u32(), SnapId(from), SnapId(to));
    if range.readable == 0 {
        no_readable_snapshot(from, to);
    }
    let row_types: Vec<RowType> = range
        .row_types
        .iter()
        .map(|b| {
            RowType::decode(b)
                .unwrap_or_else(|e| error::corrupt(format_args!("snapshots {from} to {to}: {e}")))
        })
        .collect();
    let holding: Vec<(u64, TableAtSnapshot)> = range
        .snapshots
        .into_iter()
        .map(|(snap, header, t)| {
            let t = t as usize;
            let table = TableAtSnapshot {
                rel: header.rel.0,
                nblocks: header.nblocks,
                row_type: row_types[t].clone(),
                row_type_bytes: range.row_types[t].clone(),
                lease,
            };
            (snap.0, table)
        })
        .collect();
    if holding.is_empty() {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!(
                "table {} is in no snapshot from snapshot {from} to snapshot {to}",
                relation_name(relid)
            ),
        )
        .hint(error::HINT_TABLES_OF_SNAPSHOT)
        .raise();
    }
    holding
}
