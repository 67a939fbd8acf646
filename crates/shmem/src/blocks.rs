//! The block cursor the participants of a parallel scan share, in the parallel query's
//! dynamic shared memory: each participant takes the next step of blocks from it, as a
//! parallel sequential scan hands out blocks, so every block is read by exactly one of them.
//!
//! Of a table, the cursor is a block number. Of a partitioned table, it is a partition (its
//! place in the list of partitions every participant makes alike) and a block of it: the
//! participants read one partition together, then move on together to the next. A
//! participant reads the partition the cursor is at ([`BlockCursor::leaf`]), takes steps of
//! its blocks ([`BlockCursor::take_in_leaf`]) until there are none, and then says it is done
//! with it ([`BlockCursor::finish_leaf`]: a partition of no blocks, or one of which nobody
//! found a block to read, must not hold the cursor). The cursor only moves forward, so a
//! participant opens each partition once at most.

use std::sync::atomic::{AtomicU64, Ordering};

/// A block cursor (plain data and an atomic: it may live in shared memory).
#[repr(C)]
pub struct BlockCursor {
    /// Of a table, the first block not taken; of a partitioned table, the partition read in
    /// the high 32 bits and its first block not taken in the low 32.
    next: AtomicU64,
}

/// The cursor's value at block `block` of partition `leaf`.
fn at_leaf(leaf: u32, block: u32) -> u64 {
    (u64::from(leaf) << 32) | u64::from(block)
}

impl Default for BlockCursor {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockCursor {
    /// A cursor at block 0 (of the first partition).
    pub const fn new() -> BlockCursor {
        BlockCursor {
            next: AtomicU64::new(0),
        }
    }

    /// Of a table of `nblocks` blocks: takes the next `n` blocks, the first of them (None
    /// once every block is taken).
    pub fn take(&self, nblocks: u32, n: u32) -> Option<u32> {
        let first = self.next.fetch_add(u64::from(n), Ordering::Relaxed);
        u32::try_from(first).ok().filter(|&b| b < nblocks)
    }

    /// Of a partitioned table: the partition the participants read now (past the list's end
    /// once every partition is read).
    pub fn leaf(&self) -> u32 {
        (self.next.load(Ordering::Relaxed) >> 32) as u32
    }

    /// Takes the next `n` blocks of partition `leaf` (of `nblocks` blocks): the first of
    /// them, or None once the participants have taken all of them (the cursor then moves on
    /// to the next partition) or moved past it.
    pub fn take_in_leaf(&self, leaf: u32, nblocks: u32, n: u32) -> Option<u32> {
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let (at, block) = ((cur >> 32) as u32, cur as u32);
            if at != leaf {
                return None;
            }
            if block >= nblocks {
                self.finish_leaf(leaf);
                return None;
            }
            let to = at_leaf(leaf, block.saturating_add(n.max(1)).min(nblocks));
            match self
                .next
                .compare_exchange_weak(cur, to, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(block),
                Err(now) => cur = now,
            }
        }
    }

    /// Moves the cursor past partition `leaf` if it is still there: a participant has nothing
    /// left to read in it (every block taken, or none the snapshot maps).
    pub fn finish_leaf(&self, leaf: u32) {
        let past = at_leaf(leaf.saturating_add(1), 0);
        let mut cur = self.next.load(Ordering::Relaxed);
        while (cur >> 32) as u32 == leaf {
            match self
                .next
                .compare_exchange_weak(cur, past, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_table_hands_out_each_block_once() {
        let c = BlockCursor::new();
        let mut got = Vec::new();
        while let Some(b) = c.take(10, 4) {
            got.push(b);
        }
        assert_eq!(got, vec![0, 4, 8]);
        assert_eq!(c.take(10, 4), None, "stays past the end");
        assert_eq!(BlockCursor::new().take(0, 4), None, "a table of no blocks");
    }

    #[test]
    fn partitions_are_read_one_after_another() {
        let c = BlockCursor::new();
        assert_eq!(c.leaf(), 0);
        assert_eq!(c.take_in_leaf(0, 5, 4), Some(0));
        assert_eq!(c.take_in_leaf(0, 5, 4), Some(4));
        // a participant still at partition 0 finds nothing left: the cursor moves on
        assert_eq!(c.take_in_leaf(0, 5, 4), None);
        assert_eq!(c.leaf(), 1);
        // one that opened partition 0 late finds the cursor past it
        assert_eq!(c.take_in_leaf(0, 5, 4), None);
        assert_eq!(c.leaf(), 1, "a late participant does not move it");
        // a partition of no blocks: the first look moves past it
        assert_eq!(c.take_in_leaf(1, 0, 4), None);
        assert_eq!(c.leaf(), 2);
        // a participant done with partition 2 before anyone took from it (the snapshot maps
        // none of its pages) moves the cursor on; finishing it again changes nothing
        c.finish_leaf(2);
        assert_eq!(c.leaf(), 3);
        c.finish_leaf(2);
        assert_eq!(c.leaf(), 3);
        assert_eq!(
            c.take_in_leaf(3, 3, 8),
            Some(0),
            "a step larger than the partition"
        );
        assert_eq!(c.take_in_leaf(3, 3, 8), None);
        assert_eq!(c.leaf(), 4);
    }

    /// Participants following the protocol of the module comment over partitions of
    /// assorted sizes (empty ones first, between and last): every block of every partition
    /// is read by exactly one of them, and each opens a partition once at most.
    #[test]
    fn concurrent_participants_read_every_block_once() {
        let sizes: Arc<Vec<u32>> = Arc::new(vec![0, 37, 0, 0, 1, 500, 3, 0, 1000, 17, 0]);
        for round in 0..50 {
            let cursor = Arc::new(BlockCursor::new());
            let participants = 2 + round % 4;
            let start = Arc::new(Barrier::new(participants));
            let handles: Vec<_> = (0..participants)
                .map(|p| {
                    let (cursor, sizes, start) = (cursor.clone(), sizes.clone(), start.clone());
                    std::thread::spawn(move || {
                        let step = 1 + ((p as u32 * 7 + round as u32) % 16);
                        let mut read: Vec<(u32, u32)> = Vec::new();
                        let mut opened: Vec<u32> = Vec::new();
                        let mut next = 0u32;
                        start.wait();
                        loop {
                            let leaf = next.max(cursor.leaf());
                            let Some(&nblocks) = sizes.get(leaf as usize) else {
                                break;
                            };
                            opened.push(leaf);
                            next = leaf + 1;
                            while let Some(first) = cursor.take_in_leaf(leaf, nblocks, step) {
                                let end = (first + step).min(nblocks);
                                read.extend((first..end).map(|b| (leaf, b)));
                                if p % 2 == 0 {
                                    std::thread::yield_now();
                                }
                            }
                            cursor.finish_leaf(leaf);
                        }
                        (read, opened)
                    })
                })
                .collect();
            let mut all: Vec<(u32, u32)> = Vec::new();
            for h in handles {
                let (read, opened) = h.join().expect("a participant");
                assert!(
                    opened.windows(2).all(|w| w[0] < w[1]),
                    "each partition opened once, in order: {opened:?}"
                );
                all.extend(read);
            }
            all.sort_unstable();
            let expected: Vec<(u32, u32)> = sizes
                .iter()
                .enumerate()
                .flat_map(|(leaf, &n)| (0..n).map(move |b| (leaf as u32, b)))
                .collect();
            assert_eq!(all, expected, "round {round}: every block once");
            assert_eq!(cursor.leaf() as usize, sizes.len());
        }
    }
}
