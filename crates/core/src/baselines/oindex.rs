//! O-index: a complete tree per snapshot, copied from its predecessor and then updated, so a
//! lookup is one walk in one tree but every snapshot pays for the whole page table.
//!
//! Invariant: every retained snapshot, and the newest snapshot even if deleted (it is the
//! base of the next copy), owns a complete tree; a deleted snapshot's tree is freed as soon
//! as a newer snapshot exists.

use crate::builder::{last_page_table, GroupBuilder};
use crate::error::IndexError;
use crate::index::SnapshotIndex;
use crate::types::{validate_batch, ImageId, Mapping, PageKey, RelId, SnapId};
use std::ops::Range;

#[derive(Debug, Default, Clone)]
pub struct OIndex {
    trees: Vec<(SnapId, Option<GroupBuilder>)>,
    newest_deleted: bool,
}

impl OIndex {
    pub fn new() -> Self {
        Self::default()
    }

    fn tree(&self, snap: SnapId) -> Result<&GroupBuilder, IndexError> {
        let i = self
            .trees
            .binary_search_by_key(&snap, |e| e.0)
            .map_err(|_| IndexError::UnknownSnapshot(snap))?;
        let deleted = i + 1 == self.trees.len() && self.newest_deleted;
        match &self.trees[i].1 {
            Some(t) if !deleted => Ok(t),
            _ => Err(IndexError::DeletedSnapshot(snap)),
        }
    }
}

impl SnapshotIndex for OIndex {
    fn name(&self) -> &'static str {
        "o-index"
    }

    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        validate_batch(self.trees.last().map(|e| e.0), snap, mappings)?;
        let base = match self.trees.last() {
            Some((_, Some(prev))) => last_page_table(&prev.view())?,
            _ => Vec::new(),
        };
        let mut tree = GroupBuilder::new();
        tree.add_first_snapshot(snap, &mut base.into_iter(), mappings)?;
        if self.newest_deleted {
            if let Some(last) = self.trees.last_mut() {
                last.1 = None;
            }
        }
        self.trees.push((snap, Some(tree)));
        self.newest_deleted = false;
        Ok(())
    }

    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        self.tree(snap)?.view().lookup(snap, page)
    }

    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        self.tree(snap)?.view().scan(snap, rel, blocks, f)
    }

    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError> {
        self.tree(snap)?;
        let i = self
            .trees
            .binary_search_by_key(&snap, |e| e.0)
            .map_err(|_| IndexError::UnknownSnapshot(snap))?;
        if i + 1 == self.trees.len() {
            self.newest_deleted = true;
        } else {
            self.trees[i].1 = None;
        }
        Ok(())
    }

    fn snapshots(&self) -> Vec<SnapId> {
        let n = self.trees.len();
        self.trees
            .iter()
            .enumerate()
            .filter(|(i, e)| e.1.is_some() && !(i + 1 == n && self.newest_deleted))
            .map(|(_, e)| e.0)
            .collect()
    }

    fn memory_bytes(&self) -> usize {
        self.trees
            .iter()
            .flat_map(|e| &e.1)
            .map(|t| t.node_area().len() + t.root_table().len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_snapshot_owns_a_complete_tree() {
        let mut o = OIndex::new();
        let p = |b| PageKey::new(1, b);
        let all: Vec<_> = (0..256)
            .map(|b| Mapping::new(p(b), SnapId(1), ImageId(u64::from(b))))
            .collect();
        o.add_snapshot(SnapId(1), &all).unwrap();
        let one = o.memory_bytes();
        o.add_snapshot(SnapId(2), &[Mapping::new(p(3), SnapId(2), ImageId(99))])
            .unwrap();
        assert_eq!(
            o.memory_bytes(),
            2 * one,
            "a second complete tree of the same shape"
        );
        assert_eq!(o.lookup(SnapId(2), p(3)), Ok(Some(ImageId(99))));
        assert_eq!(o.lookup(SnapId(1), p(3)), Ok(Some(ImageId(3))));
        o.delete_snapshot(SnapId(2)).unwrap();
        assert_eq!(
            o.memory_bytes(),
            2 * one,
            "the newest tree stays as the next base"
        );
        o.add_snapshot(SnapId(3), &[]).unwrap();
        assert_eq!(o.memory_bytes(), 2 * one);
        assert_eq!(o.lookup(SnapId(3), p(3)), Ok(Some(ImageId(99))));
        assert_eq!(o.snapshots(), vec![SnapId(1), SnapId(3)]);
    }
}
