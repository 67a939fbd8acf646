//! Reading one table at one snapshot, page by page: the snapshot's page table is walked in
//! the shared group cache (the GSnap index), the images are read from the shared image cache
//! (loaded by the worker when missing). Used by `gsnap_asof`.

use super::access::relation_name;
use super::decode::Decoder;
use super::index::{images_per_batch, index_error, pin_images, prefetch_images, GroupPins};
use crate::error::error;
use crate::ipc::protocol::{ErrorCode, Kind, ScanHeader};
use crate::ipc::{self, Pinned};
use gsnap_core::{RelId, RelationTree, SnapId};
use gsnap_format::rowtype::RowType;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::collections::VecDeque;
use std::time::Duration;

/// Blocks looked up in the index per step.
const BLOCKS_PER_STEP: usize = 4096;

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
    let mut told = false;
    let begin = loop {
        let args = [snap as i64, i64::from(relid.to_u32()), 0];
        match ipc::call_paged_checked(Kind::ScanBegin, &args, 2) {
            Ok(a) => break a,
            Err((code, _)) if code == ErrorCode::Capturing as u32 => {
                if !told {
                    pgrx::notice!(
                        "snapshot {snap} is still being captured; waiting for its capture to \
                         end (see gsnap_progress())"
                    );
                    told = true;
                }
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

/// The page images of one table at one snapshot, in block order: the page table is walked
/// in the shared group cache, the images are pinned in the image cache a batch at a time.
pub struct PageReader {
    /// Keeps the groups `rel` points into pinned; `rel` must not outlive it.
    _groups: GroupPins,
    rel: Option<RelationTree<'static>>,
    nblocks: u32,
    /// Next block to look up in the index.
    next_block: u32,
    /// Blocks looked up (block, image), not pinned yet.
    looked_up: VecDeque<(u32, u64)>,
    /// The batch being read: its pins and its blocks.
    batch: Option<(Pinned, Vec<u32>)>,
    at: usize,
}

impl PageReader {
    /// Starts reading `table` (as held by snapshot `snap`).
    pub fn open(snap: u64, table: &TableAtSnapshot) -> PageReader {
        let groups = GroupPins::pin(snap, snap, true);
        let tree = groups
            .view_of(snap)
            .tree(SnapId(snap))
            .unwrap_or_else(|e| index_error(e));
        let rel = tree
            .relation(RelId(table.rel))
            .unwrap_or_else(|e| index_error(e));
        PageReader {
            _groups: groups,
            rel,
            nblocks: table.nblocks,
            next_block: 0,
            looked_up: VecDeque::new(),
            batch: None,
            at: 0,
        }
    }

    /// Looks up the blocks of the next index step.
    fn look_up_next_step(&mut self) {
        let Some(rel) = self.rel else { return };
        let end = self
            .next_block
            .saturating_add(BLOCKS_PER_STEP as u32)
            .min(self.nblocks);
        let looked_up = &mut self.looked_up;
        rel.scan(self.next_block..end, &mut |b, image| {
            looked_up.push_back((b, image.0))
        })
        .unwrap_or_else(|e| index_error(e));
        self.next_block = end;
    }

    /// Asks the worker to load the next batch's images while this one is read.
    fn prefetch_next_batch(&mut self) {
        let n = images_per_batch();
        if self.looked_up.len() < n && self.next_block < self.nblocks {
            self.look_up_next_step();
        }
        let ids: Vec<u64> = self.looked_up.iter().take(n).map(|&(_, id)| id).collect();
        prefetch_images(&ids);
    }

    /// The next page (block, view bytes); the bytes stay valid until the next call.
    pub fn next_page(&mut self) -> Option<(u32, &[u8])> {
        loop {
            if let Some((pinned, blocks)) = &self.batch {
                if self.at < pinned.entries.len() {
                    self.at += 1;
                    let (pinned, blocks) = self.batch.as_ref().expect("checked");
                    let e = &pinned.entries[self.at - 1];
                    return Some((blocks[e.key as usize], pinned.bytes(e)));
                }
                let _ = blocks;
                self.batch = None; // unpins
            }
            if self.looked_up.is_empty() {
                self.rel?;
                if self.next_block >= self.nblocks {
                    return None;
                }
                self.look_up_next_step();
                continue;
            }
            let n = self.looked_up.len().min(images_per_batch());
            let chunk: Vec<(u32, u64)> = self.looked_up.drain(..n).collect();
            let ids: Vec<u64> = chunk.iter().map(|&(_, id)| id).collect();
            let pinned = pin_images(&ids);
            self.prefetch_next_batch();
            self.batch = Some((pinned, chunk.iter().map(|&(b, _)| b).collect()));
            self.at = 0;
        }
    }
}

/// What a snapshot holds of `relid`, or the ERROR that it does not hold the table.
pub fn table_at(snap: u64, relid: pg_sys::Oid) -> TableAtSnapshot {
    scan_begin_if_present(snap, relid).unwrap_or_else(|| {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("table {} is not in snapshot {snap}", relation_name(relid)),
        )
        .hint("A snapshot holds the tables that used the gsnap access method when it was taken; see gsnap_snapshot_tables().")
        .raise()
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
    let table = table_at(snap, relid);
    // SAFETY: per this function's contract.
    let mut decoder = unsafe { Decoder::new(snap, relid, table.row_type.clone(), out_desc) };
    let mut pages = PageReader::open(snap, &table);
    let scratch = pgrx::PgMemoryContexts::new("gsnap scan");
    while let Some((block, bytes)) = pages.next_page() {
        // SAFETY: switching to our scratch context for the rows' temporary allocations.
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(scratch.value());
            decoder.decode_page(block, bytes, emit);
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::MemoryContextReset(scratch.value());
        }
    }
}
