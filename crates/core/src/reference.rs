//! The reference model: a `BTreeMap` of complete page tables, obviously correct, used by the
//! tests as the oracle every other index must agree with. Memory is not its concern.
//!
//! Invariant: `tables[v]` is SPT(v) for every snapshot ever added (deleted ones included, so
//! later snapshots and `page_table_at` of a deleted snapshot stay exact); `deleted` marks the
//! snapshots that are no longer queryable.

use crate::error::IndexError;
use crate::index::SnapshotIndex;
use crate::types::{validate_batch, ImageId, ImageRun, Mapping, PageDiff, PageKey, RelId, SnapId};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// One complete page table.
pub type PageTable = BTreeMap<PageKey, ImageId>;

#[derive(Default, Debug, Clone)]
pub struct ReferenceIndex {
    tables: BTreeMap<SnapId, PageTable>,
    deleted: BTreeSet<SnapId>,
}

impl ReferenceIndex {
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self, snap: SnapId) -> Result<&PageTable, IndexError> {
        if self.deleted.contains(&snap) {
            return Err(IndexError::DeletedSnapshot(snap));
        }
        self.tables
            .get(&snap)
            .ok_or(IndexError::UnknownSnapshot(snap))
    }

    /// SPT(`snap`) whether or not `snap` was deleted.
    pub fn page_table_at(&self, snap: SnapId) -> Option<&PageTable> {
        self.tables.get(&snap)
    }

    /// The blocks of `rel` whose image differs between SPT(a) and SPT(b), in block order.
    pub fn diff(&self, a: SnapId, b: SnapId, rel: RelId) -> Result<Vec<PageDiff>, IndexError> {
        let (ta, tb) = (self.table(a)?, self.table(b)?);
        let lo = PageKey { rel, block: 0 };
        let hi = PageKey {
            rel,
            block: u32::MAX,
        };
        let blocks: BTreeSet<u32> = ta
            .range(lo..=hi)
            .chain(tb.range(lo..=hi))
            .map(|(k, _)| k.block)
            .collect();
        let mut out = Vec::new();
        for block in blocks {
            let key = PageKey { rel, block };
            let (before, after) = (ta.get(&key).copied(), tb.get(&key).copied());
            if before != after {
                out.push(PageDiff {
                    block,
                    before,
                    after,
                });
            }
        }
        Ok(out)
    }

    /// Per block, the maximal runs of retained snapshots in [first, last] with one image, in
    /// (block, first) order.
    pub fn range(&self, first: SnapId, last: SnapId, rel: RelId) -> Vec<ImageRun> {
        let snaps: Vec<SnapId> = self
            .snapshots()
            .into_iter()
            .filter(|s| *s >= first && *s <= last)
            .collect();
        let mut open: BTreeMap<u32, ImageRun> = BTreeMap::new();
        let mut done = Vec::new();
        for s in snaps {
            let table = &self.tables[&s];
            let lo = PageKey { rel, block: 0 };
            let hi = PageKey {
                rel,
                block: u32::MAX,
            };
            let now: BTreeMap<u32, ImageId> =
                table.range(lo..=hi).map(|(k, v)| (k.block, *v)).collect();
            let closed: Vec<u32> = open
                .iter()
                .filter(|(b, run)| now.get(b) != Some(&run.image))
                .map(|(b, _)| *b)
                .collect();
            for b in closed {
                done.push(open.remove(&b).expect("open run"));
            }
            for (block, image) in now {
                open.entry(block)
                    .and_modify(|run| run.last = s)
                    .or_insert(ImageRun {
                        block,
                        image,
                        first: s,
                        last: s,
                    });
            }
        }
        done.extend(open.into_values());
        done.sort_by_key(|r| (r.block, r.first));
        done
    }
}

impl SnapshotIndex for ReferenceIndex {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        let last = self.tables.keys().next_back().copied();
        validate_batch(last, snap, mappings)?;
        let mut table = last.map(|l| self.tables[&l].clone()).unwrap_or_default();
        for m in mappings {
            table.insert(m.page, m.image);
        }
        self.tables.insert(snap, table);
        Ok(())
    }

    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        Ok(self.table(snap)?.get(&page).copied())
    }

    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        let table = self.table(snap)?;
        if blocks.is_empty() {
            return Ok(());
        }
        let lo = PageKey {
            rel,
            block: blocks.start,
        };
        let hi = PageKey {
            rel,
            block: blocks.end - 1,
        };
        for (k, v) in table.range(lo..=hi) {
            f(k.block, *v);
        }
        Ok(())
    }

    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError> {
        self.table(snap)?;
        self.deleted.insert(snap);
        Ok(())
    }

    fn snapshots(&self) -> Vec<SnapId> {
        self.tables
            .keys()
            .filter(|s| !self.deleted.contains(s))
            .copied()
            .collect()
    }

    fn memory_bytes(&self) -> usize {
        self.tables.values().map(|t| t.len() * 24).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(1, block), SnapId(snap), ImageId(image))
    }

    #[test]
    fn later_snapshots_see_mappings_of_deleted_ones() {
        let mut r = ReferenceIndex::new();
        r.add_snapshot(SnapId(1), &[m(0, 1, 10), m(1, 1, 11)])
            .unwrap();
        r.add_snapshot(SnapId(2), &[m(1, 2, 21)]).unwrap();
        r.add_snapshot(SnapId(3), &[]).unwrap();
        r.delete_snapshot(SnapId(2)).unwrap();
        assert_eq!(
            r.lookup(SnapId(3), PageKey::new(1, 1)),
            Ok(Some(ImageId(21)))
        );
        assert_eq!(
            r.lookup(SnapId(2), PageKey::new(1, 1)),
            Err(IndexError::DeletedSnapshot(SnapId(2)))
        );
        assert_eq!(
            r.lookup(SnapId(9), PageKey::new(1, 1)),
            Err(IndexError::UnknownSnapshot(SnapId(9)))
        );
        assert_eq!(r.snapshots(), vec![SnapId(1), SnapId(3)]);
    }

    #[test]
    fn range_merges_runs_across_deleted_snapshots() {
        let mut r = ReferenceIndex::new();
        r.add_snapshot(SnapId(1), &[m(0, 1, 10)]).unwrap();
        r.add_snapshot(SnapId(2), &[m(0, 2, 20)]).unwrap();
        r.add_snapshot(SnapId(3), &[m(0, 3, 10)]).unwrap();
        r.add_snapshot(SnapId(4), &[]).unwrap();
        let runs = r.range(SnapId(1), SnapId(4), RelId(1));
        assert_eq!(runs.len(), 3);
        r.delete_snapshot(SnapId(2)).unwrap();
        let runs = r.range(SnapId(1), SnapId(4), RelId(1));
        assert_eq!(
            runs,
            vec![ImageRun {
                block: 0,
                image: ImageId(10),
                first: SnapId(1),
                last: SnapId(4)
            }]
        );
        let d = r.diff(SnapId(1), SnapId(3), RelId(1)).unwrap();
        assert!(d.is_empty());
    }
}
