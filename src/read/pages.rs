//! The pages of one table at one snapshot, in block order: the snapshot's page table is
//! walked in the shared group cache (the GSnap index), a step of blocks at a time, and the
//! images are read through [`ImageBatches`].

use super::pins::{images_per_batch, GroupPins, ImageBatches, PinnedBatch};
use super::table::TableAtSnapshot;
use crate::error::{corrupt, corrupt_index};
use gsnap_core::{RelId, SnapId};
use gsnap_format::view;

/// Blocks looked up in the index per step.
const BLOCKS_PER_STEP: u32 = 4096;

/// Reads the page images of one table at one snapshot.
pub struct PageReader {
    groups: GroupPins,
    snap: u64,
    /// The relation incarnation the snapshot maps.
    rel: u32,
    nblocks: u32,
    /// The next block to look up in the index.
    next_block: u32,
    images: ImageBatches<u32>,
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
            images: ImageBatches::default(),
            batch: None,
            at: 0,
        }
    }

    /// Looks up the images of the next step of blocks (blocks without one read as empty
    /// pages and are left out).
    fn look_up_next_step(&mut self) {
        let end = self
            .next_block
            .saturating_add(BLOCKS_PER_STEP)
            .min(self.nblocks);
        let view = self.groups.view_of(self.snap);
        let tree = view
            .tree(SnapId(self.snap))
            .unwrap_or_else(|e| corrupt_index(e));
        let relation = tree
            .relation(RelId(self.rel))
            .unwrap_or_else(|e| corrupt_index(e));
        match relation {
            Some(relation) => {
                let images = &mut self.images;
                relation
                    .scan(self.next_block..end, &mut |block, image| {
                        images.push(block, image.0)
                    })
                    .unwrap_or_else(|e| corrupt_index(e));
                self.next_block = end;
            }
            // The snapshot maps no page of the table: every block is empty.
            None => self.next_block = self.nblocks,
        }
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
            self.batch = None; // unpins
                               // Keep the next batch and the one after it queued, so the latter is prefetched.
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
