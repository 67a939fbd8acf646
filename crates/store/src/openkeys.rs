//! The open key entries of recently recorded blocks, kept in memory from one capture to the
//! next (`keymap.rs` says what they are). A capture compares every page it stores with the
//! keys its block held at its last recording; reading those from the store is a cursor walk
//! over one entry per row of the block, through every sorted run of the `keys` family, and
//! was a fifth of phase two's time under pgbench. A capture that commits leaves here what it
//! recorded, and the next one takes it instead of reading the store.
//!
//! What the cache holds is always what the store holds: an entry is removed when a capture
//! takes it (so a capture that fails, whose writes may be partly on disk, leaves nothing
//! behind for the blocks it recorded), and put back, as the capture left it, only once the
//! capture's commit is written. Entries of a map that ends or starts again go with that
//! commit. The cache is bounded (`StoreOptions::open_key_cache_bytes`); past the bound, blocks
//! are dropped in no particular order and read from the store when next needed.

use crate::ids::{PageKey, RelId, SnapId};
use std::collections::HashMap;

/// The open entries (hash, from) of one block, ascending by hash.
pub(crate) type OpenEntries = Vec<(u64, u64)>;

/// Blocks' open key entries, by (page, key map).
#[derive(Debug, Default)]
pub(crate) struct OpenKeyCache {
    budget: usize,
    used: usize,
    blocks: HashMap<(PageKey, SnapId), OpenEntries>,
    /// Blocks taken from the cache (for tests and statistics).
    hits: u64,
}

/// What a block costs the cache: its entries and about as much again for the map's slot.
pub(crate) fn cost(entries: &OpenEntries) -> usize {
    64 + 16 * entries.len()
}

impl OpenKeyCache {
    pub fn new(budget: usize) -> Self {
        OpenKeyCache {
            budget,
            ..OpenKeyCache::default()
        }
    }

    /// Takes the open entries of `page` under key map `map`, if they are cached.
    pub fn take(&mut self, page: PageKey, map: SnapId) -> Option<OpenEntries> {
        let entries = self.blocks.remove(&(page, map))?;
        self.used -= cost(&entries);
        self.hits += 1;
        Some(entries)
    }

    /// Forgets every block of relation incarnation `rel` (its map ended or started again).
    pub fn forget_rel(&mut self, rel: RelId) {
        let mut freed = 0;
        self.blocks.retain(|(page, _), entries| {
            let keep = page.rel != rel;
            if !keep {
                freed += cost(entries);
            }
            keep
        });
        self.used -= freed;
    }

    /// Keeps what a committed capture left on its blocks, then drops blocks until the cache
    /// is within its bound again.
    pub fn put_all(&mut self, blocks: impl IntoIterator<Item = ((PageKey, SnapId), OpenEntries)>) {
        if self.budget == 0 {
            return;
        }
        for (key, entries) in blocks {
            self.used += cost(&entries);
            if let Some(old) = self.blocks.insert(key, entries) {
                self.used -= cost(&old);
            }
        }
        if self.used > self.budget {
            // Down to seven eighths, so that the next commits do not all have to evict.
            let mut excess = self.used - self.budget / 8 * 7;
            let mut freed = 0;
            self.blocks.retain(|_, entries| {
                if excess == 0 {
                    return true;
                }
                let c = cost(entries);
                excess = excess.saturating_sub(c);
                freed += c;
                false
            });
            self.used -= freed;
        }
    }

    /// (blocks, bytes counted, blocks taken so far).
    pub fn stats(&self) -> (usize, usize, u64) {
        (self.blocks.len(), self.used, self.hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(rel: u32, block: u32) -> PageKey {
        PageKey {
            rel: RelId(rel),
            block,
        }
    }

    #[test]
    fn take_removes_and_put_all_keeps_within_the_bound() {
        let mut c = OpenKeyCache::new(10_000);
        c.put_all([((page(1, 0), SnapId(5)), vec![(1, 5), (2, 5)])]);
        assert_eq!(c.take(page(1, 0), SnapId(4)), None, "another map");
        assert_eq!(c.take(page(1, 0), SnapId(5)), Some(vec![(1, 5), (2, 5)]));
        assert_eq!(c.take(page(1, 0), SnapId(5)), None, "taken once");
        assert_eq!(c.stats(), (0, 0, 1));
        // 100 blocks of 10 entries (224 bytes each) in 10,000 bytes: about 39 stay.
        c.put_all((0..100).map(|b| ((page(1, b), SnapId(5)), vec![(7, 5); 10])));
        let (blocks, used, _) = c.stats();
        assert!((10_000 / 8 * 7 - 224..=10_000).contains(&used), "{used}");
        assert_eq!(used, blocks * 224);
        // Replacing a block counts it once.
        let kept = (0..100).find(|&b| c.blocks.contains_key(&(page(1, b), SnapId(5))));
        let kept = kept.expect("some block stayed");
        c.put_all([((page(1, kept), SnapId(5)), vec![])]);
        assert_eq!(c.stats().1, used - 224 + 64);
    }

    #[test]
    fn forget_rel_drops_only_that_relation() {
        let mut c = OpenKeyCache::new(1 << 20);
        c.put_all([
            ((page(1, 0), SnapId(5)), vec![(1, 5)]),
            ((page(1, 1), SnapId(5)), vec![(1, 5)]),
            ((page(2, 0), SnapId(5)), vec![(1, 5)]),
        ]);
        c.forget_rel(RelId(1));
        assert_eq!(c.stats().0, 1);
        assert_eq!(c.stats().1, 80);
        assert!(c.take(page(2, 0), SnapId(5)).is_some());
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut c = OpenKeyCache::new(0);
        c.put_all([((page(1, 0), SnapId(5)), vec![(1, 5)])]);
        assert_eq!(c.stats(), (0, 0, 0));
    }
}
