//! Snapshot-set queries: `diff` (pages whose image differs between two page tables) and
//! `range` (per block, the maximal runs of retained snapshots sharing one image).
//!
//! Both walk several block trees of one relation together, top-down, in block order. At each
//! node position the participating snapshots (in snapshot order) are split into *segments*:
//! maximal runs of consecutive snapshots whose subtree there is the very same node. Inside a
//! group path copying shares every unchanged subtree, so a segment usually spans many
//! snapshots and the walk does one step for all of them; `diff` skips any subtree that is one
//! node in both trees, so its cost follows the change, not the table size. Trees of different
//! groups never share a node (they live in different byte areas), so across groups the walk
//! degrades to comparing the trees, as it must. Trees of different heights are aligned by
//! treating a lower root as the leftmost descendant of the taller ones.

use crate::error::IndexError;
use crate::radix::{self, Node, Subtree, FANOUT};
use crate::reader::GroupReader;
use crate::types::{ImageId, ImageRun, PageDiff, RelId, SnapId};

/// A subtree in one of the walked node areas, at its own level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tree {
    area: usize,
    off: u32,
    level: u8,
}

/// Consecutive participants `first..=last` sharing one subtree (or one leaf value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg<T> {
    first: usize,
    last: usize,
    item: Option<T>,
}

/// At one block, the participants split into runs of equal image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeafSeg {
    pub first: usize,
    pub last: usize,
    pub image: Option<ImageId>,
}

/// What a walk cost: the number of tree nodes it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    pub nodes_visited: usize,
}

fn push_merged<T: PartialEq + Copy>(out: &mut Vec<Seg<T>>, seg: Seg<T>) {
    if let Some(last) = out.last_mut() {
        if last.item == seg.item && last.last + 1 == seg.first {
            last.last = seg.last;
            return;
        }
    }
    out.push(seg);
}

struct Walk<'w, 'a> {
    areas: &'w [&'a [u8]],
    lo: u64,
    hi: u64,
    skip_shared: bool,
    stats: WalkStats,
    emit: &'w mut dyn FnMut(u32, &[LeafSeg]),
}

impl Walk<'_, '_> {
    fn node(&mut self, t: Tree) -> Result<Node, IndexError> {
        self.stats.nodes_visited += 1;
        Node::read(self.areas[t.area], t.off, t.level)
    }

    fn visit(&mut self, level: u8, base: u64, segs: &[Seg<Tree>]) -> Result<(), IndexError> {
        // Read each segment's node at this level once (lower trees are lifted: child 0 only).
        let mut nodes: Vec<Option<Node>> = Vec::with_capacity(segs.len());
        let mut digits = 0u16;
        for s in segs {
            match s.item {
                Some(t) if t.level == level => {
                    let n = self.node(t)?;
                    digits |= n.bitmap;
                    nodes.push(Some(n));
                }
                Some(_) => {
                    digits |= 1;
                    nodes.push(None);
                }
                None => nodes.push(None),
            }
        }
        let span = radix::child_span(level);
        let mut children: Vec<Seg<Tree>> = Vec::new();
        let mut leaves: Vec<Seg<u64>> = Vec::new();
        let mut out: Vec<LeafSeg> = Vec::new();
        for d in 0..FANOUT {
            let start = base + d as u64 * span;
            if digits & (1 << d) == 0 || start + span <= self.lo || start >= self.hi {
                continue;
            }
            if level == 1 {
                leaves.clear();
                for (s, n) in segs.iter().zip(&nodes) {
                    let value = match n {
                        Some(n) => n.value(self.areas[s.item.map_or(0, |t| t.area)], d)?,
                        None => None,
                    };
                    push_merged(
                        &mut leaves,
                        Seg {
                            first: s.first,
                            last: s.last,
                            item: value,
                        },
                    );
                }
                if self.skip_shared && leaves.len() == 1 {
                    continue;
                }
                out.clear();
                out.extend(leaves.iter().map(|l| LeafSeg {
                    first: l.first,
                    last: l.last,
                    image: l.item.map(ImageId),
                }));
                (self.emit)(start as u32, &out);
                continue;
            }
            children.clear();
            for (s, n) in segs.iter().zip(&nodes) {
                let child = match (s.item, n) {
                    (Some(t), Some(n)) => n.child(self.areas[t.area], d)?.map(|off| Tree {
                        area: t.area,
                        off,
                        level: level - 1,
                    }),
                    (Some(t), None) if d == 0 => Some(t),
                    _ => None,
                };
                push_merged(
                    &mut children,
                    Seg {
                        first: s.first,
                        last: s.last,
                        item: child,
                    },
                );
            }
            if children.iter().all(|c| c.item.is_none())
                || (self.skip_shared && children.len() == 1)
            {
                continue;
            }
            let next = std::mem::take(&mut children);
            self.visit(level - 1, start, &next)?;
            children = next;
        }
        Ok(())
    }
}

/// One participant of a walk: the relation's block tree in one snapshot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Participant {
    pub area: usize,
    pub root: Option<Subtree>,
}

/// Walks the participants' trees together over blocks `lo..hi` and calls `emit` per block
/// with the participants split into runs of equal image. With `skip_shared`, subtrees (and
/// blocks) that are the same for all participants are skipped.
pub(crate) fn walk(
    areas: &[&[u8]],
    parts: &[Participant],
    lo: u64,
    hi: u64,
    skip_shared: bool,
    emit: &mut dyn FnMut(u32, &[LeafSeg]),
) -> Result<WalkStats, IndexError> {
    let mut segs: Vec<Seg<Tree>> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let item = p.root.map(|r| Tree {
            area: p.area,
            off: r.off,
            level: r.level,
        });
        push_merged(
            &mut segs,
            Seg {
                first: i,
                last: i,
                item,
            },
        );
    }
    let height = segs.iter().filter_map(|s| s.item.map(|t| t.level)).max();
    let Some(height) = height else {
        return Ok(WalkStats::default());
    };
    if skip_shared && segs.len() == 1 {
        return Ok(WalkStats::default());
    }
    let mut w = Walk {
        areas,
        lo,
        hi,
        skip_shared,
        stats: WalkStats::default(),
        emit,
    };
    w.visit(height, 0, &segs)?;
    Ok(w.stats)
}

/// Whether two views are the same group bytes (so their trees may share nodes).
fn same_area(a: &GroupReader<'_>, b: &GroupReader<'_>) -> bool {
    std::ptr::eq(a.nodes, b.nodes)
}

/// Diff of `rel` between SPT(a) in `va` and SPT(b) in `vb`, deleted snapshots allowed.
pub(crate) fn diff_any(
    va: GroupReader<'_>,
    a: SnapId,
    vb: GroupReader<'_>,
    b: SnapId,
    rel: RelId,
    f: &mut dyn FnMut(PageDiff),
) -> Result<WalkStats, IndexError> {
    let ra = va.record(va.position(a)?)?;
    let rb = vb.record(vb.position(b)?)?;
    diff_records(va, &ra, vb, &rb, rel, f)
}

fn diff_records(
    va: GroupReader<'_>,
    ra: &crate::format::RootRecord,
    vb: GroupReader<'_>,
    rb: &crate::format::RootRecord,
    rel: RelId,
    f: &mut dyn FnMut(PageDiff),
) -> Result<WalkStats, IndexError> {
    let same = same_area(&va, &vb);
    let areas = [va.nodes, vb.nodes];
    let parts = [
        Participant {
            area: 0,
            root: va.rel_root(ra, rel)?,
        },
        Participant {
            area: if same { 0 } else { 1 },
            root: vb.rel_root(rb, rel)?,
        },
    ];
    walk(&areas, &parts, 0, 1 << 32, true, &mut |block, segs| {
        let value_of = |i: usize| {
            segs.iter()
                .find(|s| s.first <= i && i <= s.last)
                .and_then(|s| s.image)
        };
        f(PageDiff {
            block,
            before: value_of(0),
            after: value_of(1),
        })
    })
}

/// The blocks of `rel` whose image differs between SPT(a) (in `va`) and SPT(b) (in `vb`), in
/// block order. Within one group, subtrees shared by both trees are skipped.
pub fn diff(
    va: GroupReader<'_>,
    a: SnapId,
    vb: GroupReader<'_>,
    b: SnapId,
    rel: RelId,
    f: &mut dyn FnMut(PageDiff),
) -> Result<WalkStats, IndexError> {
    let ra = va.live_record(a)?;
    let rb = vb.live_record(b)?;
    diff_records(va, &ra, vb, &rb, rel, f)
}

/// For each block of `rel`, the maximal runs of retained snapshots in `first..=last` that share
/// one image, in (block, first snapshot) order. `views` are consecutive groups in snapshot
/// order (any that do not overlap the range are ignored).
pub fn range(
    views: &[GroupReader<'_>],
    first: SnapId,
    last: SnapId,
    rel: RelId,
    f: &mut dyn FnMut(ImageRun),
) -> Result<WalkStats, IndexError> {
    let mut areas: Vec<&[u8]> = Vec::with_capacity(views.len());
    let mut parts = Vec::new();
    let mut snaps = Vec::new();
    let mut prev_last: Option<SnapId> = None;
    for v in views {
        if v.is_empty() {
            continue;
        }
        if prev_last.is_some_and(|p| v.first_snap().is_ok_and(|f| f <= p)) {
            return Err(IndexError::InvalidArgument(
                "group views are not in snapshot order",
            ));
        }
        prev_last = Some(v.last_snap()?);
        let area = areas.len();
        areas.push(v.nodes);
        for i in 0..v.len() {
            let r = v.record(i)?;
            if r.deleted() || r.snap < first || r.snap > last {
                continue;
            }
            parts.push(Participant {
                area,
                root: v.rel_root(&r, rel)?,
            });
            snaps.push(r.snap);
        }
    }
    walk(&areas, &parts, 0, 1 << 32, false, &mut |block, segs| {
        for s in segs {
            if let Some(image) = s.image {
                f(ImageRun {
                    block,
                    image,
                    first: snaps[s.first],
                    last: snaps[s.last],
                });
            }
        }
    })
}

impl GroupReader<'_> {
    /// `diff` within this group.
    pub fn diff(
        &self,
        a: SnapId,
        b: SnapId,
        rel: RelId,
        f: &mut dyn FnMut(PageDiff),
    ) -> Result<WalkStats, IndexError> {
        diff(*self, a, *self, b, rel, f)
    }

    /// `range` within this group.
    pub fn range(
        &self,
        first: SnapId,
        last: SnapId,
        rel: RelId,
        f: &mut dyn FnMut(ImageRun),
    ) -> Result<WalkStats, IndexError> {
        range(std::slice::from_ref(self), first, last, rel, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::GroupBuilder;
    use crate::types::{Mapping, PageKey};

    fn m(block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(1, block), SnapId(snap), ImageId(image))
    }

    fn group(blocks: u32, snaps: u64) -> GroupBuilder {
        let mut g = GroupBuilder::new();
        let all: Vec<_> = (0..blocks)
            .map(|b| m(b, 1, 1_000_000 + u64::from(b)))
            .collect();
        g.add_snapshot(SnapId(1), &all).unwrap();
        for s in 2..=snaps {
            let b = ((s * 7919) % u64::from(blocks)) as u32;
            g.add_snapshot(SnapId(s), &[m(b, s, s)]).unwrap();
        }
        g
    }

    #[test]
    fn diff_cost_follows_the_change_not_the_table() {
        let g = group(65536, 10);
        let v = g.view();
        let mut found = Vec::new();
        let stats = v
            .diff(SnapId(4), SnapId(5), RelId(1), &mut |d| found.push(d))
            .unwrap();
        let b = 5 * 7919u32;
        assert_eq!(
            found,
            vec![PageDiff {
                block: b,
                before: Some(ImageId(1_000_000 + u64::from(b))),
                after: Some(ImageId(5))
            }]
        );
        // two root-to-leaf paths of height 5, not the ~17,500 nodes of one tree
        assert!(stats.nodes_visited <= 10, "{stats:?}");
        let mut none = 0;
        v.diff(SnapId(5), SnapId(5), RelId(1), &mut |_| none += 1)
            .unwrap();
        assert_eq!(none, 0);
    }

    #[test]
    fn diff_across_groups_compares_trees() {
        let g1 = group(300, 3);
        let mut g2 = GroupBuilder::new();
        let mut base = Vec::new();
        g1.view()
            .scan_all(SnapId(3), &mut |p, i| base.push((p, i)))
            .unwrap();
        g2.add_first_snapshot(
            SnapId(4),
            &mut base.into_iter(),
            &[m(299, 4, 44), m(300, 4, 45)],
        )
        .unwrap();
        let mut found = Vec::new();
        diff(
            g1.view(),
            SnapId(3),
            g2.view(),
            SnapId(4),
            RelId(1),
            &mut |d| found.push(d),
        )
        .unwrap();
        assert_eq!(
            found,
            vec![
                PageDiff {
                    block: 299,
                    before: Some(ImageId(1_000_299)),
                    after: Some(ImageId(44))
                },
                PageDiff {
                    block: 300,
                    before: None,
                    after: Some(ImageId(45))
                },
            ]
        );
    }

    #[test]
    fn range_splits_runs_where_the_image_changes() {
        let mut g = GroupBuilder::new();
        g.add_snapshot(SnapId(1), &[m(0, 1, 10), m(1, 1, 11)])
            .unwrap();
        g.add_snapshot(SnapId(2), &[m(1, 2, 21)]).unwrap();
        g.add_snapshot(SnapId(3), &[m(2, 3, 32)]).unwrap();
        g.mark_deleted(SnapId(2)).unwrap();
        let mut runs = Vec::new();
        g.view()
            .range(SnapId(1), SnapId(3), RelId(1), &mut |r| runs.push(r))
            .unwrap();
        let r = |block, image, first, last| ImageRun {
            block,
            image: ImageId(image),
            first: SnapId(first),
            last: SnapId(last),
        };
        assert_eq!(
            runs,
            vec![
                r(0, 10, 1, 3),
                r(1, 11, 1, 1),
                r(1, 21, 3, 3),
                r(2, 32, 3, 3)
            ]
        );
    }
}
