//! T-index: one partial tree per snapshot holding only that snapshot's mappings; SPT(v) is
//! found by walking the chain v, v-1, ... until a tree maps the page.
//!
//! Invariant: `trees[i]` holds exactly the mappings of snapshot `trees[i].snap`; deleted
//! snapshots keep their tree (later snapshots depend on it through the chain).

use crate::builder::GroupBuilder;
use crate::error::IndexError;
use crate::index::SnapshotIndex;
use crate::types::{validate_batch, ImageId, Mapping, PageKey, RelId, SnapId};
use std::collections::BTreeMap;
use std::ops::Range;

#[derive(Debug, Default, Clone)]
pub struct TIndex {
    trees: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    snap: SnapId,
    tree: GroupBuilder,
    deleted: bool,
}

impl TIndex {
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, snap: SnapId) -> Result<usize, IndexError> {
        let i = self
            .trees
            .binary_search_by_key(&snap, |e| e.snap)
            .map_err(|_| IndexError::UnknownSnapshot(snap))?;
        if self.trees[i].deleted {
            return Err(IndexError::DeletedSnapshot(snap));
        }
        Ok(i)
    }

    /// How many trees a lookup of `page` at `snap` visits (the chain length it walks).
    pub fn hops(&self, snap: SnapId, page: PageKey) -> Result<usize, IndexError> {
        let i = self.position(snap)?;
        for (hops, e) in self.trees[..=i].iter().rev().enumerate() {
            if e.tree.view().lookup(e.snap, page)?.is_some() {
                return Ok(hops + 1);
            }
        }
        Ok(i + 1)
    }
}

impl SnapshotIndex for TIndex {
    fn name(&self) -> &'static str {
        "t-index"
    }

    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        validate_batch(self.trees.last().map(|e| e.snap), snap, mappings)?;
        let mut tree = GroupBuilder::new();
        tree.add_first_snapshot(snap, &mut std::iter::empty(), mappings)?;
        self.trees.push(Entry {
            snap,
            tree,
            deleted: false,
        });
        Ok(())
    }

    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        let i = self.position(snap)?;
        for e in self.trees[..=i].iter().rev() {
            if let Some(image) = e.tree.view().lookup(e.snap, page)? {
                return Ok(Some(image));
            }
        }
        Ok(None)
    }

    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        let i = self.position(snap)?;
        let mut found: BTreeMap<u32, ImageId> = BTreeMap::new();
        for e in self.trees[..=i].iter().rev() {
            e.tree
                .view()
                .scan(e.snap, rel, blocks.clone(), &mut |b, image| {
                    found.entry(b).or_insert(image);
                })?;
        }
        for (b, image) in found {
            f(b, image);
        }
        Ok(())
    }

    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError> {
        let i = self.position(snap)?;
        self.trees[i].deleted = true;
        Ok(())
    }

    fn snapshots(&self) -> Vec<SnapId> {
        self.trees
            .iter()
            .filter(|e| !e.deleted)
            .map(|e| e.snap)
            .collect()
    }

    fn memory_bytes(&self) -> usize {
        self.trees
            .iter()
            .map(|e| e.tree.node_area().len() + e.tree.root_table().len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_walk_the_chain() {
        let mut t = TIndex::new();
        let p = |b| PageKey::new(1, b);
        t.add_snapshot(
            SnapId(1),
            &[
                Mapping::new(p(0), SnapId(1), ImageId(1)),
                Mapping::new(p(1), SnapId(1), ImageId(2)),
            ],
        )
        .unwrap();
        for s in 2..10 {
            t.add_snapshot(SnapId(s), &[Mapping::new(p(1), SnapId(s), ImageId(s * 10))])
                .unwrap();
        }
        assert_eq!(t.lookup(SnapId(9), p(0)), Ok(Some(ImageId(1))));
        assert_eq!(t.hops(SnapId(9), p(0)), Ok(9));
        assert_eq!(t.hops(SnapId(9), p(1)), Ok(1));
        t.delete_snapshot(SnapId(1)).unwrap();
        assert_eq!(t.lookup(SnapId(5), p(0)), Ok(Some(ImageId(1))));
        let mut seen = Vec::new();
        t.scan(SnapId(5), RelId(1), 0..10, &mut |b, i| seen.push((b, i.0)))
            .unwrap();
        assert_eq!(seen, vec![(0, 1), (1, 50)]);
    }
}
