//! The pages of one table at one snapshot, in block order: the snapshot's page table is
//! walked in the shared group cache (the GSnap index), a step of blocks at a time, and the
//! images are read through [`ImageBatches`].
//!
//! A parallel scan's participants share one [`SharedBlocks`] in the parallel query's dynamic
//! shared memory: each takes the next step of blocks from it (as a parallel sequential scan
//! hands out blocks), so every block is read by exactly one of them; of a partitioned table,
//! they read its partitions one after another, together (`gsnap_shmem::blocks`).

use super::pins::{images_per_batch, GroupPins, ImageBatches, PinnedBatch};
use super::table::TableAtSnapshot;
use crate::error::{corrupt, corrupt_index};
use gsnap_core::{RelId, SnapId};
use gsnap_format::view;
use gsnap_shmem::blocks::BlockCursor;

/// Blocks looked up in the index per step.
const BLOCKS_PER_STEP: u32 = 4096;

/// Blocks one participant of a parallel scan takes at a time: a 64th of the table, between
/// 16 and 512 blocks, so that the last steps balance the participants' work and each step's
/// index walk stays cheap.
pub(super) fn parallel_step(nblocks: u32) -> u32 {
    (nblocks / 64).clamp(16, 512)
}

/// What the participants of a parallel scan share (in dynamic shared memory): the snapshot
/// and the block cursor ([`BlockCursor`]: of a partitioned table, over its partitions one
/// after another).
#[repr(C)]
pub struct SharedBlocks {
    /// The snapshot every participant reads (the leader resolves the query's argument).
    pub snap: u64,
    /// Where the participants take their blocks from.
    pub blocks: BlockCursor,
}

impl SharedBlocks {
    /// A cursor at block 0 (of the first partition) over snapshot `snap`.
    pub fn new(snap: u64) -> SharedBlocks {
        SharedBlocks {
            snap,
            blocks: BlockCursor::new(),
        }
    }
}

/// Reads the page images of one table at one snapshot.
pub struct PageReader {
    groups: GroupPins,
    snap: u64,
    /// The relation incarnation the snapshot maps.
    rel: u32,
    nblocks: u32,
    /// The next block to look up in the index (past the end once a parallel scan's shared
    /// cursor has none left).
    next_block: u32,
    /// Of a participant in a parallel scan: where the blocks are taken from, and of a
    /// partition read in a parallel scan of its partitioned table, its place in the list.
    shared: Option<(&'static SharedBlocks, Option<u32>)>,
    images: ImageBatches<u32>,
    /// Of a lookup by key: the only blocks to read, ascending (`keymap.rs`); once looked
    /// up, those the snapshot maps.
    only: Option<Vec<u32>>,
    /// The batch being read and the position in it.
    batch: Option<PinnedBatch<u32>>,
    at: usize,
}

impl PageReader {
    /// Starts reading `table` as snapshot `snap` holds it.
    pub fn open(snap: u64, table: &TableAtSnapshot) -> PageReader {
        let groups = GroupPins::pin(snap, snap, true);
        super::table::confirm_readable(&[snap], table.lease);
        PageReader {
            groups,
            snap,
            rel: table.rel,
            nblocks: table.nblocks,
            next_block: 0,
            shared: None,
            images: ImageBatches::default(),
            only: None,
            batch: None,
            at: 0,
        }
    }

    /// Reads only `blocks` (call before the first page is read): the pages a key map says
    /// may hold a key.
    pub fn only(&mut self, mut blocks: Vec<u32>) {
        debug_assert!(self.batch.is_none() && self.images.queued() == 0);
        blocks.sort_unstable();
        blocks.dedup();
        self.only = Some(blocks);
    }

    /// The number of pages a reader restricted by [`PageReader::only`] reads (known once the
    /// first page was asked for).
    pub fn restricted_to(&self) -> Option<usize> {
        self.only.as_ref().map(Vec::len)
    }

    /// The snapshot read.
    pub fn snap(&self) -> u64 {
        self.snap
    }

    /// The relation incarnation read.
    pub fn rel(&self) -> u32 {
        self.rel
    }

    /// The table's size in blocks at the snapshot read.
    pub fn nblocks(&self) -> u32 {
        self.nblocks
    }

    /// Reads only the blocks this participant of a parallel scan takes from `shared` (call
    /// before the first page is read); `leaf`: the table is that partition of the
    /// partitioned table the scan reads.
    pub fn share(&mut self, shared: &'static SharedBlocks, leaf: Option<u32>) {
        debug_assert!(self.batch.is_none() && self.images.queued() == 0);
        self.shared = Some((shared, leaf));
    }

    /// Looks up the images of the next step of blocks (blocks without one read as empty
    /// pages and are left out).
    fn look_up_next_step(&mut self) {
        if self.only.is_some() {
            self.look_up_only();
            return;
        }
        let step = match self.shared {
            None => BLOCKS_PER_STEP,
            Some((shared, leaf)) => {
                let step = parallel_step(self.nblocks);
                let first = match leaf {
                    None => shared.blocks.take(self.nblocks, step),
                    Some(leaf) => shared.blocks.take_in_leaf(leaf, self.nblocks, step),
                };
                let Some(first) = first else {
                    self.next_block = self.nblocks;
                    return;
                };
                self.next_block = first;
                step
            }
        };
        let end = self.next_block.saturating_add(step).min(self.nblocks);
        let (first, images) = (self.next_block, &mut self.images);
        let mapped = Self::in_relation(&self.groups, self.snap, self.rel, |relation| {
            relation
                .scan(first..end, &mut |block, image| images.push(block, image.0))
                .unwrap_or_else(|e| corrupt_index(e))
        });
        // None: the snapshot maps no page of the table: every block is empty.
        self.next_block = if mapped.is_some() { end } else { self.nblocks };
    }

    /// `f` of the page table of incarnation `rel` at snapshot `snap` (None: the snapshot maps
    /// no page of it).
    fn in_relation<R>(
        groups: &GroupPins,
        snap: u64,
        rel: u32,
        f: impl FnOnce(gsnap_core::RelationTree<'_>) -> R,
    ) -> Option<R> {
        let view = groups.view_of(snap);
        let tree = view.tree(SnapId(snap)).unwrap_or_else(|e| corrupt_index(e));
        let relation = tree
            .relation(RelId(rel))
            .unwrap_or_else(|e| corrupt_index(e));
        relation.map(f)
    }

    /// Looks up the blocks of [`PageReader::only`] at once; the list then holds those the
    /// snapshot maps (the pages read).
    fn look_up_only(&mut self) {
        self.next_block = self.nblocks;
        let blocks = self.only.take().unwrap_or_default();
        let (nblocks, images) = (self.nblocks, &mut self.images);
        let mut read = Vec::new();
        Self::in_relation(&self.groups, self.snap, self.rel, |relation| {
            for block in blocks.into_iter().filter(|&b| b < nblocks) {
                if let Some(image) = relation.lookup(block).unwrap_or_else(|e| corrupt_index(e)) {
                    images.push(block, image.0);
                    read.push(block);
                }
            }
        });
        self.only = Some(read);
    }

    /// The page the last [`PageReader::next_page`] returned.
    pub fn current(&self) -> Option<(u32, &[u8])> {
        let batch = self.batch.as_ref()?;
        (self.at > 0).then(|| batch.get(self.at - 1))
    }

    /// The next page (block, view bytes); the bytes stay valid until the next call.
    pub fn next_page(&mut self) -> Option<(u32, &[u8])> {
        loop {
            let in_batch = matches!(&self.batch, Some(b) if self.at < b.len());
            if in_batch {
                self.at += 1;
                let batch = self.batch.as_ref().expect("checked above");
                return Some(batch.get(self.at - 1));
            }
            // Unpin the batch read; keep the next batch and the one after it queued, so the
            // latter is prefetched.
            self.batch = None;
            while self.images.queued() < 2 * images_per_batch() && self.next_block < self.nblocks {
                self.look_up_next_step();
            }
            self.batch = Some(self.images.next_batch()?);
            self.at = 0;
        }
    }
}

/// The tuples of a page view (`bytes`, the image of `block`) as (line pointer, offset,
/// length) into `bytes`, in line pointer order, replacing the contents of `into`. A view that
/// does not decode is corruption.
pub fn view_tuples(bytes: &[u8], block: u32, into: &mut Vec<(u16, usize, usize)>) {
    let tuples = view::decode(bytes).unwrap_or_else(|e| {
        corrupt(format_args!(
            "a stored page view of block {block} is corrupt: {e}"
        ))
    });
    let base = bytes.as_ptr() as usize;
    into.clear();
    into.extend(
        tuples
            .iter()
            .map(|t| (t.lp, t.bytes.as_ptr() as usize - base, t.bytes.len())),
    );
}
