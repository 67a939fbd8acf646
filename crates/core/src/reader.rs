//! `GroupReader`: read-only queries over a group's bytes, in place, from any address.
//!
//! A reader is two slices, the node area and the root table, taken from sealed bytes
//! (`GroupReader::new`) or from the published prefix of an active group (`from_parts`). Building
//! a reader validates the header and every root record (O(snapshots)); every node read after
//! that is bounds- and level-checked, so corrupt bytes give `IndexError`, never a panic.
//! Locating a page of any snapshot is one root-to-leaf walk: the snapshot's relation
//! directory, then the relation's block tree.

use crate::error::IndexError;
use crate::format::{self, RootRecord, ROOT_RECORD_LEN};
use crate::radix::{self, Node, Subtree};
use crate::types::{ImageId, PageKey, RelId, SnapId};
use std::ops::Range;

/// A group's bytes, ready to query.
#[derive(Clone, Copy, Debug)]
pub struct GroupReader<'a> {
    pub(crate) nodes: &'a [u8],
    pub(crate) roots: &'a [u8],
}

/// One snapshot of a group as its root table lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSnapshot {
    pub snap: SnapId,
    pub deleted: bool,
}

impl<'a> GroupReader<'a> {
    /// A view over sealed group bytes; checks the header and the root table.
    pub fn new(sealed: &'a [u8]) -> Result<Self, IndexError> {
        let layout = format::parse_header(sealed)?;
        let view = Self::from_parts(
            &sealed[layout.nodes.0..layout.nodes.1],
            &sealed[layout.roots.0..layout.roots.1],
        )?;
        let first = crate::bytes::read_u64(sealed, 32, "first snap")?;
        let last = crate::bytes::read_u64(sealed, 40, "last snap")?;
        if !view.is_empty() && (view.first_snap()?.0 != first || view.last_snap()?.0 != last) {
            return Err(IndexError::corrupt("group header snapshot bounds", 32));
        }
        Ok(view)
    }

    /// Like `new`, and also verifies the checksum (O(bytes)); use when loading from storage.
    pub fn new_verified(sealed: &'a [u8]) -> Result<Self, IndexError> {
        let layout = format::parse_header(sealed)?;
        let view = Self::new(sealed)?;
        if format::checksum(view.nodes, view.roots) != layout.checksum {
            return Err(IndexError::corrupt("group checksum", 48));
        }
        Ok(view)
    }

    /// A view over a published prefix of an active group: its node area and root table.
    pub fn from_parts(nodes: &'a [u8], roots: &'a [u8]) -> Result<Self, IndexError> {
        format::validate_node_area(nodes)?;
        format::validate_roots(roots, nodes.len())?;
        Ok(GroupReader { nodes, roots })
    }

    /// A view over parts this crate produced and validated already.
    pub(crate) fn trusted(nodes: &'a [u8], roots: &'a [u8]) -> Self {
        GroupReader { nodes, roots }
    }

    /// The number of snapshots (deleted ones included).
    pub fn len(&self) -> usize {
        self.roots.len() / ROOT_RECORD_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the node area.
    pub fn node_bytes(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn record(&self, i: usize) -> Result<RootRecord, IndexError> {
        RootRecord::decode(self.roots, i, self.nodes.len())
    }

    /// The snapshots of the group, ascending, deleted ones flagged.
    pub fn snapshots(&self) -> Result<Vec<GroupSnapshot>, IndexError> {
        (0..self.len())
            .map(|i| {
                self.record(i).map(|r| GroupSnapshot {
                    snap: r.snap,
                    deleted: r.deleted(),
                })
            })
            .collect()
    }

    pub fn first_snap(&self) -> Result<SnapId, IndexError> {
        Ok(self.record(0)?.snap)
    }

    pub fn last_snap(&self) -> Result<SnapId, IndexError> {
        Ok(self.record(self.len().wrapping_sub(1))?.snap)
    }

    /// The position of `snap` in the root table, deleted or not.
    pub(crate) fn position(&self, snap: SnapId) -> Result<usize, IndexError> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let s = crate::bytes::read_u64(self.roots, mid * ROOT_RECORD_LEN, "root snap")?;
            if s < snap.0 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        match self.record(lo) {
            Ok(r) if r.snap == snap => Ok(lo),
            _ => Err(IndexError::UnknownSnapshot(snap)),
        }
    }

    /// The root record of a retained snapshot (`DeletedSnapshot` if deleted).
    pub(crate) fn live_record(&self, snap: SnapId) -> Result<RootRecord, IndexError> {
        let r = self.record(self.position(snap)?)?;
        if r.deleted() {
            return Err(IndexError::DeletedSnapshot(snap));
        }
        Ok(r)
    }

    /// Whether the group holds `snap` (deleted or not).
    pub fn contains(&self, snap: SnapId) -> bool {
        self.position(snap).is_ok()
    }

    /// The block-tree root of `rel` in the snapshot of record `r`, if the relation has pages.
    pub(crate) fn rel_root(
        &self,
        r: &RootRecord,
        rel: RelId,
    ) -> Result<Option<Subtree>, IndexError> {
        if r.dir_height == 0 {
            return Ok(None);
        }
        match radix::lookup(self.nodes, r.dir_root, r.dir_height, rel.0)? {
            Some(v) => {
                let (off, level) = radix::unpack_rel(v)?;
                Ok(Some(Subtree { off, level }))
            }
            None => Ok(None),
        }
    }

    /// The image of `page` in SPT(`snap`).
    pub fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        self.tree(snap)?.lookup(page)
    }

    /// The page table of a retained snapshot, resolved once for many lookups or scans (what an
    /// AS OF query holds on to).
    pub fn tree(&self, snap: SnapId) -> Result<SnapshotTree<'a>, IndexError> {
        Ok(SnapshotTree {
            view: *self,
            record: self.live_record(snap)?,
        })
    }

    /// The page table of the snapshot at `pos` in the root table (deleted ones refused).
    pub(crate) fn tree_at(&self, pos: usize) -> Result<SnapshotTree<'a>, IndexError> {
        let record = self.record(pos)?;
        if record.deleted() {
            return Err(IndexError::DeletedSnapshot(record.snap));
        }
        Ok(SnapshotTree {
            view: *self,
            record,
        })
    }

    /// Calls `f(block, image)` for every mapped block of `rel` in `blocks` at `snap`.
    pub fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        let r = self.live_record(snap)?;
        self.scan_record(&r, rel, u64::from(blocks.start), u64::from(blocks.end), f)
    }

    pub(crate) fn scan_record(
        &self,
        r: &RootRecord,
        rel: RelId,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        if let Some(t) = self.rel_root(r, rel)? {
            radix::scan(self.nodes, t.off, t.level, lo, hi, &mut |k, v| {
                f(k, ImageId(v))
            })?;
        }
        Ok(())
    }

    /// The relations with pages in SPT(`snap`), ascending (deleted snapshots allowed).
    pub fn relations(&self, snap: SnapId) -> Result<Vec<RelId>, IndexError> {
        let r = self.record(self.position(snap)?)?;
        let mut rels = Vec::new();
        if r.dir_height > 0 {
            radix::scan(
                self.nodes,
                r.dir_root,
                r.dir_height,
                0,
                1 << 32,
                &mut |k, _| rels.push(RelId(k)),
            )?;
        }
        Ok(rels)
    }

    /// Calls `f(page, image)` for every page of SPT(`snap`) in page order. Works for deleted
    /// snapshots too (a group's last tree is the base of the next group's first tree).
    pub fn scan_all(
        &self,
        snap: SnapId,
        f: &mut dyn FnMut(PageKey, ImageId),
    ) -> Result<(), IndexError> {
        let r = self.record(self.position(snap)?)?;
        for rel in self.relations(snap)? {
            self.scan_record(&r, rel, 0, 1 << 32, &mut |block, image| {
                f(PageKey { rel, block }, image)
            })?;
        }
        Ok(())
    }

    /// The node bytes each snapshot appended, in root-table order: its own tree's cost (a
    /// complete tree for the first snapshot, the path copies for the others).
    pub fn snapshot_bytes(&self) -> Result<Vec<usize>, IndexError> {
        let mut prev = radix::NODE_AREA_START;
        let mut out = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let end = self.record(i)?.node_end as usize;
            out.push(end.saturating_sub(prev));
            prev = end.max(prev);
        }
        Ok(out)
    }

    /// Counts the nodes reachable from `snap`'s root (for tests and reports).
    pub fn reachable_nodes(&self, snap: SnapId) -> Result<usize, IndexError> {
        let r = self.record(self.position(snap)?)?;
        if r.dir_height == 0 {
            return Ok(0);
        }
        let mut count = 0;
        count_nodes(
            self.nodes,
            Node::read(self.nodes, r.dir_root, r.dir_height)?,
            &mut count,
        )?;
        for rel in self.relations(snap)? {
            if let Some(t) = self.rel_root(&r, rel)? {
                count_nodes(
                    self.nodes,
                    Node::read(self.nodes, t.off, t.level)?,
                    &mut count,
                )?;
            }
        }
        Ok(count)
    }
}

/// One snapshot's page table inside a group view.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotTree<'a> {
    view: GroupReader<'a>,
    record: RootRecord,
}

impl<'a> SnapshotTree<'a> {
    pub fn snap(&self) -> SnapId {
        self.record.snap
    }

    /// The image of `page`.
    pub fn lookup(&self, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        match self.view.rel_root(&self.record, page.rel)? {
            Some(t) => Ok(radix::lookup(self.view.nodes, t.off, t.level, page.block)?.map(ImageId)),
            None => Ok(None),
        }
    }

    /// One relation's block tree, resolved once (`None`: no page of `rel` is mapped).
    pub fn relation(&self, rel: RelId) -> Result<Option<RelationTree<'a>>, IndexError> {
        Ok(self
            .view
            .rel_root(&self.record, rel)?
            .map(|root| RelationTree {
                nodes: self.view.nodes,
                root,
            }))
    }

    /// Calls `f(block, image)` for every mapped block of `rel` in `blocks`.
    pub fn scan(
        &self,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        self.view.scan_record(
            &self.record,
            rel,
            u64::from(blocks.start),
            u64::from(blocks.end),
            f,
        )
    }
}

/// One relation's block tree in one snapshot: a lookup is one walk of the block tree.
#[derive(Clone, Copy, Debug)]
pub struct RelationTree<'a> {
    nodes: &'a [u8],
    root: Subtree,
}

impl RelationTree<'_> {
    pub fn lookup(&self, block: u32) -> Result<Option<ImageId>, IndexError> {
        Ok(radix::lookup(self.nodes, self.root.off, self.root.level, block)?.map(ImageId))
    }

    pub fn scan(
        &self,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        radix::scan(
            self.nodes,
            self.root.off,
            self.root.level,
            u64::from(blocks.start),
            u64::from(blocks.end),
            &mut |k, v| f(k, ImageId(v)),
        )
    }
}

fn count_nodes(nodes: &[u8], node: Node, count: &mut usize) -> Result<(), IndexError> {
    *count += 1;
    if node.level > 1 {
        for d in 0..radix::FANOUT {
            if let Some(c) = node.child(nodes, d)? {
                count_nodes(nodes, Node::read(nodes, c, node.level - 1)?, count)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::GroupBuilder;
    use crate::types::Mapping;

    fn m(rel: u32, block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(rel, block), SnapId(snap), ImageId(image))
    }

    fn group() -> GroupBuilder {
        let mut g = GroupBuilder::new();
        let all: Vec<_> = (0..64)
            .map(|b| m(1, b, 1, u64::from(b)))
            .chain((0..3).map(|b| m(2, b, 1, 100 + u64::from(b))))
            .collect();
        g.add_snapshot(SnapId(1), &all).unwrap();
        g.add_snapshot(SnapId(2), &[m(1, 5, 2, 55)]).unwrap();
        g.add_snapshot(SnapId(4), &[m(2, 9, 4, 99)]).unwrap();
        g
    }

    #[test]
    fn resolved_trees_answer_like_the_view() {
        let g = group();
        let v = g.view();
        for s in [1, 2, 4] {
            let t = v.tree(SnapId(s)).unwrap();
            assert_eq!(t.snap(), SnapId(s));
            let rel1 = t.relation(RelId(1)).unwrap().unwrap();
            for b in 0..70 {
                let want = v.lookup(SnapId(s), PageKey::new(1, b)).unwrap();
                assert_eq!(t.lookup(PageKey::new(1, b)).unwrap(), want);
                assert_eq!(rel1.lookup(b).unwrap(), want);
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            t.scan(RelId(2), 0..100, &mut |k, i| a.push((k, i)))
                .unwrap();
            v.scan(SnapId(s), RelId(2), 0..100, &mut |k, i| b.push((k, i)))
                .unwrap();
            assert_eq!(a, b);
            assert!(t.relation(RelId(3)).unwrap().is_none());
        }
        assert_eq!(
            v.tree(SnapId(3)).unwrap_err(),
            IndexError::UnknownSnapshot(SnapId(3))
        );
    }

    #[test]
    fn snapshot_bytes_and_reachable_nodes() {
        let mut g = group();
        let v = g.view();
        let bytes = v.snapshot_bytes().unwrap();
        assert_eq!(
            bytes.iter().sum::<usize>() + radix::NODE_AREA_START,
            v.node_bytes()
        );
        assert!(
            bytes[1] < bytes[0] / 4,
            "a partial tree is a few paths: {bytes:?}"
        );
        // 64 blocks: 16 leaves + 1 root; 3 blocks: 1 leaf; directory: 1 leaf
        assert_eq!(v.reachable_nodes(SnapId(1)).unwrap(), 17 + 1 + 1);
        assert_eq!(v.relations(SnapId(4)).unwrap(), vec![RelId(1), RelId(2)]);
        g.mark_deleted(SnapId(2)).unwrap();
        let v = g.view();
        assert_eq!(
            v.tree(SnapId(2)).unwrap_err(),
            IndexError::DeletedSnapshot(SnapId(2))
        );
        assert!(
            v.relations(SnapId(2)).is_ok(),
            "deleted trees stay readable internally"
        );
        assert_eq!(
            v.snapshots().unwrap()[1],
            GroupSnapshot {
                snap: SnapId(2),
                deleted: true
            }
        );
    }
}
