//! Reading one table at one snapshot, page by page: the snapshot's page table is walked in
//! the shared group cache (the GSnap index), the images are read from the shared image cache
//! (loaded by the worker when missing). Used by `gsnap_asof`.

use super::access::relation_name;
use super::decode::Decoder;
use super::index::{index_error, pin_images, GroupPins};
use crate::error::error;
use crate::ipc;
use crate::ipc::protocol::{ErrorCode, Kind, ScanHeader};
use gsnap_core::{RelId, SnapId};
use gsnap_format::rowtype::RowType;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::time::Duration;

/// Blocks looked up in the index per step.
const BLOCKS_PER_STEP: usize = 4096;
/// Images pinned at once.
const IMAGES_PER_BATCH: usize = 256;

/// What a snapshot holds of a table.
pub struct TableAtSnapshot {
    /// The relation incarnation whose pages the snapshot maps.
    pub rel: u32,
    /// The table's size in blocks at the snapshot.
    pub nblocks: u32,
    pub row_type: RowType,
    pub row_type_bytes: Vec<u8>,
}

/// Begins reading `relid` at `snap` (None: the table is not in the snapshot); a snapshot
/// whose capture is still running is waited for (the wait can be cancelled).
pub fn scan_begin_if_present(snap: u64, relid: pg_sys::Oid) -> Option<TableAtSnapshot> {
    let begin = loop {
        let args = [snap as i64, i64::from(relid.to_u32()), 0];
        match ipc::call_paged_checked(Kind::ScanBegin, &args, 2) {
            Ok(a) => break a,
            Err((code, _)) if code == ErrorCode::Capturing as u32 => {
                ipc::wait_latch(Duration::from_millis(20))
            }
            Err((code, reply)) => ipc::raise_worker_error(code, &reply),
        }
    };
    if begin.result == 1 {
        return None;
    }
    let Some((header, row_type)) = ScanHeader::decode(&begin.reply) else {
        error(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "short answer from the gsnap worker",
        )
        .raise()
    };
    let decoded = RowType::decode(row_type).unwrap_or_else(|e| {
        error(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("snapshot {snap}: {e}"),
        )
        .raise()
    });
    Some(TableAtSnapshot {
        rel: header.rel,
        nblocks: header.nblocks,
        row_type: decoded,
        row_type_bytes: row_type.to_vec(),
    })
}

/// Hands every row of table `relid` at snapshot `snap`, in `out_desc`'s row type, to `emit`.
///
/// # Safety
/// `out_desc` must be the table's current row type; call in a transaction.
pub unsafe fn read_table(
    snap: u64,
    relid: pg_sys::Oid,
    out_desc: pg_sys::TupleDesc,
    emit: &mut dyn FnMut(&[pg_sys::Datum], &[bool]),
) {
    let Some(table) = scan_begin_if_present(snap, relid) else {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("table {} is not in snapshot {snap}", relation_name(relid)),
        )
        .hint("A snapshot holds the tables that used the gsnap access method when it was taken; see gsnap_snapshot_tables().")
        .raise();
    };
    let header = ScanHeader {
        rel: table.rel,
        nblocks: table.nblocks,
    };
    let row_type = table.row_type;
    // SAFETY: per this function's contract.
    let mut decoder = unsafe { Decoder::new(snap, relid, row_type, out_desc) };
    let groups = GroupPins::pin(snap, snap, true);
    let view = groups.view_of(snap);
    let tree = view.tree(SnapId(snap)).unwrap_or_else(|e| index_error(e));
    let Some(rel) = tree
        .relation(RelId(header.rel))
        .unwrap_or_else(|e| index_error(e))
    else {
        return; // no page of the table holds a row at this snapshot
    };
    let scratch = pgrx::PgMemoryContexts::new("gsnap scan");
    let mut blocks: Vec<(u32, u64)> = Vec::with_capacity(BLOCKS_PER_STEP);
    let mut start = 0u32;
    while start < header.nblocks {
        let end = start
            .saturating_add(BLOCKS_PER_STEP as u32)
            .min(header.nblocks);
        blocks.clear();
        rel.scan(start..end, &mut |b, image| blocks.push((b, image.0)))
            .unwrap_or_else(|e| index_error(e));
        for chunk in blocks.chunks(IMAGES_PER_BATCH) {
            let ids: Vec<u64> = chunk.iter().map(|&(_, id)| id).collect();
            let pinned = pin_images(&ids);
            // SAFETY: switching to our scratch context for the rows' temporary allocations.
            unsafe {
                let old = pg_sys::MemoryContextSwitchTo(scratch.value());
                for e in &pinned.entries {
                    decoder.decode_page(chunk[e.key as usize].0, pinned.bytes(e), emit);
                }
                pg_sys::MemoryContextSwitchTo(old);
                pg_sys::MemoryContextReset(scratch.value());
            }
        }
        start = end;
    }
}
