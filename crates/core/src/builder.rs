//! `GroupBuilder`: the active group. Each added snapshot appends its tree to the group's
//! append-only node area and one record to its root table; nothing already written ever moves
//! or changes (except a root record's deleted flag), so a reader may walk the published prefix
//! while the writer appends.
//!
//! The group's first snapshot gets a complete tree (its base, SPT(v-1), comes from the previous
//! group or the mapping log, and is copied); every later snapshot gets a partial tree built by
//! path copying from its predecessor in the group, so it costs only the paths to the pages its
//! mappings change. No node points outside the group.

use crate::error::IndexError;
use crate::format::{self, RootRecord, ROOT_RECORD_LEN};
use crate::index::SnapshotIndex;
use crate::radix::{self, Arena, Subtree};
use crate::reader::GroupReader;
use crate::types::{validate_batch, ImageId, Mapping, PageKey, RelId, SnapId};

/// How much of the active group is published: readers may use `node_area()[..node_bytes]`
/// and `root_table()[..roots * ROOT_RECORD_LEN]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub node_bytes: usize,
    pub roots: usize,
}

#[derive(Debug, Clone)]
pub struct GroupBuilder {
    arena: Arena,
    roots: Vec<u8>,
    last: Option<RootRecord>,
    pages_changed: u64,
}

impl Default for GroupBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GroupBuilder {
    /// An empty group. Its first snapshot is a complete tree.
    pub fn new() -> Self {
        GroupBuilder {
            arena: Arena::new(),
            roots: Vec::new(),
            last: None,
            pages_changed: 0,
        }
    }

    /// The number of snapshots in the group (L_n of Algorithm 1).
    pub fn len(&self) -> usize {
        self.roots.len() / ROOT_RECORD_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }

    /// The number of mappings added to the group, its page counter (O_n of Algorithm 1).
    pub fn pages_changed(&self) -> u64 {
        self.pages_changed
    }

    pub fn first_snap(&self) -> Option<SnapId> {
        self.view().first_snap().ok()
    }

    pub fn last_snap(&self) -> Option<SnapId> {
        self.last.map(|r| r.snap)
    }

    /// The node area written so far (append-only).
    pub fn node_area(&self) -> &[u8] {
        &self.arena.bytes
    }

    /// The root table written so far (append-only, `ROOT_RECORD_LEN` bytes per snapshot).
    pub fn root_table(&self) -> &[u8] {
        &self.roots
    }

    /// What a reader may use now: every byte and record written so far.
    pub fn published(&self) -> Published {
        Published {
            node_bytes: self.arena.bytes.len(),
            roots: self.len(),
        }
    }

    pub fn view(&self) -> GroupReader<'_> {
        GroupReader::trusted(&self.arena.bytes, &self.roots)
    }

    /// Allocated bytes of the node area and the root table.
    pub fn memory_bytes(&self) -> usize {
        self.arena.bytes.capacity() + self.roots.capacity()
    }

    /// Adds the group's first snapshot: a complete tree of `base` (SPT of the snapshot before,
    /// sorted by page) overridden by `mappings`.
    pub fn add_first_snapshot(
        &mut self,
        snap: SnapId,
        base: &mut dyn Iterator<Item = (PageKey, ImageId)>,
        mappings: &[Mapping],
    ) -> Result<(), IndexError> {
        if !self.is_empty() {
            return Err(IndexError::InvalidArgument(
                "the group already has its first snapshot",
            ));
        }
        validate_batch(None, snap, mappings)?;
        let mut merged: Vec<(PageKey, u64)> = Vec::new();
        let mut maps = mappings.iter().peekable();
        let mut prev: Option<PageKey> = None;
        for (page, image) in base {
            if prev.is_some_and(|p| p >= page) {
                return Err(IndexError::InvalidArgument(
                    "base page table is not sorted by page",
                ));
            }
            prev = Some(page);
            while let Some(m) = maps.next_if(|m| m.page < page) {
                merged.push((m.page, m.image.0));
            }
            match maps.next_if(|m| m.page == page) {
                Some(m) => merged.push((m.page, m.image.0)),
                None => merged.push((page, image.0)),
            }
        }
        merged.extend(maps.map(|m| (m.page, m.image.0)));
        let mut dir = Vec::new();
        for run in merged.chunk_by(|a, b| a.0.rel == b.0.rel) {
            let entries: Vec<(u32, u64)> = run.iter().map(|(p, v)| (p.block, *v)).collect();
            let height = radix::height_for(entries[entries.len() - 1].0);
            let root = radix::merge(&mut self.arena, None, height, &entries)?;
            dir.push((run[0].0.rel.0, radix::pack_rel(root, height)));
        }
        self.finish_snapshot(snap, None, &dir, mappings.len())
    }

    /// Adds a snapshot: its predecessor's tree overridden by `mappings`, by path copying. On
    /// an empty group this is the first, complete tree over an empty base.
    pub fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        let Some(prev) = self.last else {
            return self.add_first_snapshot(snap, &mut std::iter::empty(), mappings);
        };
        validate_batch(Some(prev.snap), snap, mappings)?;
        // Read the old roots first (an immutable view), then append the new paths.
        let mut runs: Vec<(RelId, Option<Subtree>, &[Mapping])> = Vec::new();
        {
            let view = self.view();
            for run in mappings.chunk_by(|a, b| a.page.rel == b.page.rel) {
                let rel = run[0].page.rel;
                runs.push((rel, view.rel_root(&prev, rel)?, run));
            }
        }
        let mut dir = Vec::with_capacity(runs.len());
        let mut entries = Vec::new();
        for (rel, old, run) in runs {
            entries.clear();
            entries.extend(run.iter().map(|m| (m.page.block, m.image.0)));
            let need = radix::height_for(entries[entries.len() - 1].0);
            let height = old.map_or(need, |o| o.level.max(need));
            let root = radix::merge(&mut self.arena, old, height, &entries)?;
            dir.push((rel.0, radix::pack_rel(root, height)));
        }
        let old_dir = (prev.dir_height > 0).then_some(Subtree {
            off: prev.dir_root,
            level: prev.dir_height,
        });
        self.finish_snapshot(snap, old_dir, &dir, mappings.len())
    }

    /// Writes the directory (path-copied from `old_dir`) and the root record.
    fn finish_snapshot(
        &mut self,
        snap: SnapId,
        old_dir: Option<Subtree>,
        dir: &[(u32, u64)],
        mappings: usize,
    ) -> Result<(), IndexError> {
        let (dir_root, dir_height) = match (dir.last(), old_dir) {
            (None, None) => (0, 0),
            (None, Some(o)) => (o.off, o.level),
            (Some(&(max_rel, _)), old) => {
                let need = radix::height_for(max_rel);
                let height = old.map_or(need, |o| o.level.max(need));
                (radix::merge(&mut self.arena, old, height, dir)?, height)
            }
        };
        let rec = RootRecord {
            snap,
            dir_root,
            node_end: self.arena.bytes.len() as u32,
            dir_height,
            flags: 0,
        };
        self.roots.extend_from_slice(&rec.encode());
        self.last = Some(rec);
        self.pages_changed += mappings as u64;
        Ok(())
    }

    /// Marks `snap` deleted (its tree stays: later snapshots may share it).
    pub fn mark_deleted(&mut self, snap: SnapId) -> Result<(), IndexError> {
        let i = self.view().position(snap)?;
        format::set_deleted(&mut self.roots, i, true)?;
        if let Some(last) = self.last.as_mut().filter(|l| l.snap == snap) {
            last.flags |= format::FLAG_DELETED;
        }
        Ok(())
    }

    /// The sealed bytes of the group: one unit to store (see `format`).
    pub fn seal(&self) -> Vec<u8> {
        format::seal(&self.arena.bytes, &self.roots)
    }
}

/// Builds a new group from existing trees: `sources` lists (view, snapshot) in snapshot order,
/// possibly from several groups. The first becomes a complete tree, each next one a partial
/// tree holding its diff to the previous source; snapshots for which `deleted` holds are
/// flagged deleted. Used to merge groups and to drop deleted snapshots' trees.
pub fn rebuild_group(
    sources: &[(GroupReader<'_>, SnapId)],
    deleted: &dyn Fn(SnapId) -> bool,
) -> Result<GroupBuilder, IndexError> {
    let mut b = GroupBuilder::new();
    let mut prev: Option<(GroupReader<'_>, SnapId)> = None;
    for &(view, snap) in sources {
        match prev {
            None => {
                let mut pages = Vec::new();
                view.scan_all(snap, &mut |p, i| pages.push((p, i)))?;
                b.add_first_snapshot(snap, &mut pages.into_iter(), &[])?;
            }
            Some((pv, ps)) => {
                let mut mappings = Vec::new();
                let rels_before = pv.relations(ps)?;
                let mut rels = view.relations(snap)?;
                rels.extend(rels_before);
                rels.sort();
                rels.dedup();
                for rel in rels {
                    crate::walk::diff_any(pv, ps, view, snap, rel, &mut |d| {
                        if let Some(image) = d.after {
                            mappings.push(Mapping::new(
                                PageKey {
                                    rel,
                                    block: d.block,
                                },
                                snap,
                                image,
                            ));
                        }
                    })?;
                }
                b.add_snapshot(snap, &mappings)?;
            }
        }
        if deleted(snap) {
            b.mark_deleted(snap)?;
        }
        prev = Some((view, snap));
    }
    Ok(b)
}

/// The page table of the last snapshot of `view`, as the base of the next group.
pub fn last_page_table(view: &GroupReader<'_>) -> Result<Vec<(PageKey, ImageId)>, IndexError> {
    let mut pages = Vec::new();
    if !view.is_empty() {
        view.scan_all(view.last_snap()?, &mut |p, i| pages.push((p, i)))?;
    }
    Ok(pages)
}

/// A single group used as an index (every snapshot in one group): handy in tests.
impl SnapshotIndex for GroupBuilder {
    fn name(&self) -> &'static str {
        "group"
    }

    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        GroupBuilder::add_snapshot(self, snap, mappings)
    }

    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        self.view().lookup(snap, page)
    }

    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: std::ops::Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        self.view().scan(snap, rel, blocks, f)
    }

    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError> {
        self.view().live_record(snap)?;
        self.mark_deleted(snap)
    }

    fn snapshots(&self) -> Vec<SnapId> {
        let snaps = self.view().snapshots().unwrap_or_default();
        snaps
            .into_iter()
            .filter(|s| !s.deleted)
            .map(|s| s.snap)
            .collect()
    }

    fn memory_bytes(&self) -> usize {
        GroupBuilder::memory_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rel: u32, block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(rel, block), SnapId(snap), ImageId(image))
    }

    fn dense(snap: u64, rel: u32, blocks: u32) -> Vec<Mapping> {
        (0..blocks)
            .map(|b| m(rel, b, snap, u64::from(b) + 1))
            .collect()
    }

    #[test]
    fn partial_trees_cost_only_the_changed_paths() {
        let mut g = GroupBuilder::new();
        g.add_snapshot(SnapId(1), &dense(1, 1, 4096)).unwrap();
        let full = g.node_area().len();
        g.add_snapshot(SnapId(2), &[m(1, 100, 2, 7)]).unwrap();
        let partial = g.node_area().len() - full;
        // leaf 36 + two full internal nodes 68 + a root of 4 children 20 + directory leaf 12
        assert_eq!(partial, 36 + 2 * 68 + 20 + 12);
        assert_eq!(
            g.view().lookup(SnapId(2), PageKey::new(1, 100)),
            Ok(Some(ImageId(7)))
        );
        assert_eq!(
            g.view().lookup(SnapId(1), PageKey::new(1, 100)),
            Ok(Some(ImageId(101)))
        );
        assert_eq!(
            g.view().lookup(SnapId(2), PageKey::new(1, 99)),
            Ok(Some(ImageId(100)))
        );
        assert_eq!(g.pages_changed(), 4097);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn empty_snapshots_and_new_relations() {
        let mut g = GroupBuilder::new();
        g.add_snapshot(SnapId(1), &[]).unwrap();
        assert_eq!(g.view().lookup(SnapId(1), PageKey::new(1, 0)), Ok(None));
        g.add_snapshot(SnapId(3), &[m(40, 5, 3, 1)]).unwrap();
        g.add_snapshot(SnapId(4), &[]).unwrap();
        g.add_snapshot(SnapId(5), &[m(2, 70000, 5, 2), m(40, 5, 5, 3)])
            .unwrap();
        let v = g.view();
        assert_eq!(
            v.lookup(SnapId(4), PageKey::new(40, 5)),
            Ok(Some(ImageId(1)))
        );
        assert_eq!(
            v.lookup(SnapId(5), PageKey::new(40, 5)),
            Ok(Some(ImageId(3)))
        );
        assert_eq!(
            v.lookup(SnapId(5), PageKey::new(2, 70000)),
            Ok(Some(ImageId(2)))
        );
        assert_eq!(v.lookup(SnapId(4), PageKey::new(2, 70000)), Ok(None));
        assert_eq!(v.relations(SnapId(5)).unwrap(), vec![RelId(2), RelId(40)]);
        assert_eq!(
            v.lookup(SnapId(2), PageKey::new(40, 5)),
            Err(IndexError::UnknownSnapshot(SnapId(2)))
        );
    }

    #[test]
    fn first_snapshot_merges_base_and_mappings() {
        let base = vec![
            (PageKey::new(1, 0), ImageId(1)),
            (PageKey::new(1, 2), ImageId(2)),
            (PageKey::new(3, 0), ImageId(3)),
        ];
        let mut g = GroupBuilder::new();
        let maps = [m(1, 1, 9, 11), m(1, 2, 9, 12), m(2, 0, 9, 13)];
        g.add_first_snapshot(SnapId(9), &mut base.into_iter(), &maps)
            .unwrap();
        let mut all = Vec::new();
        g.view()
            .scan_all(SnapId(9), &mut |p, i| all.push((p.rel.0, p.block, i.0)))
            .unwrap();
        assert_eq!(
            all,
            vec![(1, 0, 1), (1, 1, 11), (1, 2, 12), (2, 0, 13), (3, 0, 3)]
        );
        assert!(g
            .add_first_snapshot(SnapId(10), &mut std::iter::empty(), &[])
            .is_err());
    }

    #[test]
    fn published_prefix_is_readable_while_appending() {
        let mut g = GroupBuilder::new();
        g.add_snapshot(SnapId(1), &dense(1, 1, 300)).unwrap();
        let p = g.published();
        let prefix_nodes = g.node_area()[..p.node_bytes].to_vec();
        let prefix_roots = g.root_table()[..p.roots * ROOT_RECORD_LEN].to_vec();
        g.add_snapshot(SnapId(2), &[m(1, 5, 2, 99)]).unwrap();
        assert_eq!(
            &g.node_area()[..p.node_bytes],
            &prefix_nodes[..],
            "prefix never changes"
        );
        let old = GroupReader::from_parts(&prefix_nodes, &prefix_roots).unwrap();
        assert_eq!(
            old.lookup(SnapId(1), PageKey::new(1, 5)),
            Ok(Some(ImageId(6)))
        );
        assert_eq!(
            old.lookup(SnapId(2), PageKey::new(1, 5)),
            Err(IndexError::UnknownSnapshot(SnapId(2)))
        );
        let sealed = g.seal();
        let v = GroupReader::new_verified(&sealed).unwrap();
        assert_eq!(
            v.lookup(SnapId(2), PageKey::new(1, 5)),
            Ok(Some(ImageId(99)))
        );
    }
}
