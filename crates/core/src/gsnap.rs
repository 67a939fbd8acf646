//! `GsnapIndex`: the GSnap index, a sequence of groups (sealed byte strings plus the active
//! `GroupBuilder`), divided by Algorithm 1, with sparse deletion and group merging (GSnap
//! sections 4.5-4.6).
//!
//! Invariants:
//! - groups are in snapshot order and do not overlap; every snapshot ever added (deleted ones
//!   included) is in exactly one group, until a merge or a removal drops deleted ones;
//! - each group's first tree is complete, so no group depends on another: a lookup, scan or
//!   diff of any snapshot touches only its own group;
//! - the newest group is never removed: its last tree (deleted or not) is the base of the next
//!   group's first tree, because mappings of deleted snapshots still count for later ones;
//! - a deleted snapshot's tree stays in its group (later trees may share its nodes) until the
//!   group is merged or rebuilt, which keeps only retained trees (and the group's last tree).
//!
//! This in-memory index is what the tests and benchmarks drive; the PostgreSQL side uses the
//! same parts (`GroupBuilder`, `GroupReader`, `GroupDividing`) with groups in shared memory.

use crate::builder::{last_page_table, rebuild_group, GroupBuilder};
use crate::dividing::{Decision, DividingConfig, GroupDividing, GroupOutcome};
use crate::error::IndexError;
use crate::format;
use crate::index::SnapshotIndex;
use crate::reader::GroupReader;
use crate::types::{validate_batch, ImageId, ImageRun, Mapping, PageDiff, PageKey, RelId, SnapId};
use crate::walk::{self, WalkStats};
use std::ops::Range;

/// When to merge a group into its predecessor after deletions (GSnap 4.5-4.6).
#[derive(Clone, Debug, PartialEq)]
pub struct MergeConfig {
    /// Merge only if the latter group keeps at most `k_fraction` x (former's length)
    /// snapshots (the paper's k <= L_c / 5); `0.0` disables merging.
    pub k_fraction: f64,
}

impl Default for MergeConfig {
    fn default() -> Self {
        MergeConfig { k_fraction: 0.2 }
    }
}

/// A sealed group held in memory.
#[derive(Debug, Clone)]
struct SealedGroup {
    bytes: Box<[u8]>,
    nodes: (usize, usize),
    roots: (usize, usize),
    first: SnapId,
    last: SnapId,
    live: usize,
    /// O_n*: the page budget the group was built under (its allotted space, for merging).
    page_budget: u64,
    outcome: Option<GroupOutcome>,
}

impl SealedGroup {
    fn from_bytes(
        bytes: Vec<u8>,
        page_budget: u64,
        outcome: Option<GroupOutcome>,
    ) -> Result<Self, IndexError> {
        let layout = format::parse_header(&bytes)?;
        let view = GroupReader::new(&bytes)?;
        let snaps = view.snapshots()?;
        let live = snaps.iter().filter(|s| !s.deleted).count();
        let (first, last) = (view.first_snap()?, view.last_snap()?);
        Ok(SealedGroup {
            bytes: bytes.into_boxed_slice(),
            nodes: layout.nodes,
            roots: layout.roots,
            first,
            last,
            live,
            page_budget,
            outcome,
        })
    }

    fn view(&self) -> GroupReader<'_> {
        GroupReader::trusted(
            &self.bytes[self.nodes.0..self.nodes.1],
            &self.bytes[self.roots.0..self.roots.1],
        )
    }
}

/// A description of one group, for reports and for the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupInfo {
    pub first: SnapId,
    pub last: SnapId,
    pub snapshots: usize,
    pub live: usize,
    pub bytes: usize,
    pub sealed: bool,
}

#[derive(Debug, Clone)]
pub struct GsnapIndex {
    sealed: Vec<SealedGroup>,
    active: GroupBuilder,
    policy: GroupDividing,
    merge: MergeConfig,
    last_snap: Option<SnapId>,
    /// Every snapshot in the groups (deleted ones included), ascending, with its group (the
    /// active group is number `sealed.len()`) and its position in that group's root table:
    /// one small binary search finds any snapshot's root. Rebuilt when groups are merged or
    /// removed.
    directory: Vec<(SnapId, u32, u32)>,
}

impl Default for GsnapIndex {
    fn default() -> Self {
        Self::new(DividingConfig::default())
    }
}

enum Loc {
    Sealed(usize),
    Active,
}

impl GsnapIndex {
    pub fn new(config: DividingConfig) -> Self {
        Self::with_merge(config, MergeConfig::default())
    }

    pub fn with_merge(config: DividingConfig, merge: MergeConfig) -> Self {
        GsnapIndex {
            sealed: Vec::new(),
            active: GroupBuilder::new(),
            policy: GroupDividing::new(config),
            merge,
            last_snap: None,
            directory: Vec::new(),
        }
    }

    /// Groups of exactly `length` snapshots (no page budget): the setting of the paper's
    /// memory experiments.
    pub fn fixed_length(length: u32) -> Self {
        let config = DividingConfig {
            initial_length: length,
            min_length: length,
            max_length: length,
            max_group_bytes: usize::MAX,
            ..Default::default()
        };
        let mut index = Self::new(config);
        index.merge.k_fraction = 0.0;
        index
    }

    pub fn policy(&self) -> &GroupDividing {
        &self.policy
    }

    pub fn active(&self) -> &GroupBuilder {
        &self.active
    }

    /// The outcome of Algorithm 1 for each sealed group (oldest first).
    pub fn outcomes(&self) -> Vec<Option<GroupOutcome>> {
        self.sealed.iter().map(|g| g.outcome).collect()
    }

    /// The sealed bytes of sealed group `i` (what the store keeps as one unit).
    pub fn sealed_bytes(&self, i: usize) -> Option<&[u8]> {
        self.sealed.get(i).map(|g| &g.bytes[..])
    }

    pub fn groups(&self) -> Vec<GroupInfo> {
        let mut out: Vec<GroupInfo> = self
            .sealed
            .iter()
            .map(|g| GroupInfo {
                first: g.first,
                last: g.last,
                snapshots: g.view().len(),
                live: g.live,
                bytes: g.bytes.len(),
                sealed: true,
            })
            .collect();
        if let (Some(first), Some(last)) = (self.active.first_snap(), self.active.last_snap()) {
            let snaps = self.active.view().snapshots().unwrap_or_default();
            out.push(GroupInfo {
                first,
                last,
                snapshots: snaps.len(),
                live: snaps.iter().filter(|s| !s.deleted).count(),
                bytes: self.active.node_area().len() + self.active.root_table().len(),
                sealed: false,
            });
        }
        out
    }

    /// Views of all groups, oldest first (the active one last if it has snapshots).
    pub fn views(&self) -> Vec<GroupReader<'_>> {
        let mut v: Vec<_> = self.sealed.iter().map(|g| g.view()).collect();
        if !self.active.is_empty() {
            v.push(self.active.view());
        }
        v
    }

    fn locate(&self, snap: SnapId) -> Result<Loc, IndexError> {
        let i = self.sealed.partition_point(|g| g.last < snap);
        if let Some(g) = self.sealed.get(i) {
            if g.first <= snap {
                return Ok(Loc::Sealed(i));
            }
        }
        if self.active.first_snap().is_some_and(|f| f <= snap) {
            return Ok(Loc::Active);
        }
        Err(IndexError::UnknownSnapshot(snap))
    }

    fn rebuild_directory(&mut self) {
        let mut dir = Vec::with_capacity(self.directory.len());
        for (g, v) in self.views().into_iter().enumerate() {
            for (pos, s) in v.snapshots().unwrap_or_default().into_iter().enumerate() {
                dir.push((s.snap, g as u32, pos as u32));
            }
        }
        self.directory = dir;
    }

    /// The page table of a retained snapshot, resolved once for many lookups or scans.
    pub fn tree(&self, snap: SnapId) -> Result<crate::reader::SnapshotTree<'_>, IndexError> {
        let i = self
            .directory
            .binary_search_by_key(&snap, |e| e.0)
            .map_err(|_| IndexError::UnknownSnapshot(snap))?;
        let (_, g, pos) = self.directory[i];
        let view = match self.sealed.get(g as usize) {
            Some(group) => group.view(),
            None => self.active.view(),
        };
        view.tree_at(pos as usize)
    }

    fn view_of(&self, snap: SnapId) -> Result<GroupReader<'_>, IndexError> {
        Ok(match self.locate(snap)? {
            Loc::Sealed(i) => self.sealed[i].view(),
            Loc::Active => self.active.view(),
        })
    }

    /// Seals the active group now (Algorithm 1's split), if it has snapshots.
    pub fn seal_active(&mut self) -> Result<(), IndexError> {
        if self.active.is_empty() {
            return Ok(());
        }
        let (_, page_budget) = self.policy.budgets();
        let outcome = self
            .policy
            .split(self.active.len() as u32, self.active.pages_changed());
        let bytes = self.active.seal();
        self.sealed
            .push(SealedGroup::from_bytes(bytes, page_budget, Some(outcome))?);
        self.active = GroupBuilder::new();
        Ok(())
    }

    /// Records a query over `first..=last` for C, counting the snapshots the index holds in
    /// that span (deleted ones included: they still occupy their group).
    pub fn record_access(&mut self, first: SnapId, last: SnapId) {
        let (lo, hi) = if first <= last {
            (first, last)
        } else {
            (last, first)
        };
        let mut n = 0u64;
        for v in self.views() {
            for s in v.snapshots().unwrap_or_default() {
                n += u64::from(s.snap >= lo && s.snap <= hi);
            }
        }
        self.policy.record_access_len(n);
    }

    /// The pages of `rel` whose image differs between SPT(a) and SPT(b), in block order.
    pub fn diff(
        &self,
        a: SnapId,
        b: SnapId,
        rel: RelId,
        f: &mut dyn FnMut(PageDiff),
    ) -> Result<WalkStats, IndexError> {
        walk::diff(self.view_of(a)?, a, self.view_of(b)?, b, rel, f)
    }

    /// For each block of `rel`, the maximal runs of retained snapshots in `first..=last` that
    /// share one image, in (block, first) order.
    pub fn range(
        &self,
        first: SnapId,
        last: SnapId,
        rel: RelId,
        f: &mut dyn FnMut(ImageRun),
    ) -> Result<WalkStats, IndexError> {
        let views: Vec<GroupReader<'_>> = self
            .views()
            .into_iter()
            .filter(|v| {
                v.first_snap().is_ok_and(|s| s <= last) && v.last_snap().is_ok_and(|s| s >= first)
            })
            .collect();
        walk::range(&views, first, last, rel, f)
    }

    /// Rebuilds sealed groups `i..=j` into one group holding only their retained snapshots
    /// (plus the last one, as a possible base), if its partial trees change at most
    /// `page_limit` pages and its bytes stay under the policy's `max_group_bytes`.
    fn rebuild(
        &self,
        i: usize,
        j: usize,
        page_limit: u64,
    ) -> Result<Option<SealedGroup>, IndexError> {
        let mut sources = Vec::new();
        let mut deleted = Vec::new();
        for g in &self.sealed[i..=j] {
            let v = g.view();
            for s in v.snapshots()? {
                if !s.deleted || s.snap == self.sealed[j].last {
                    sources.push((v, s.snap));
                }
                if s.deleted {
                    deleted.push(s.snap);
                }
            }
        }
        let b = rebuild_group(&sources, &|s| deleted.contains(&s))?;
        if b.pages_changed() > page_limit
            || b.node_area().len() >= self.policy.config().max_group_bytes
        {
            return Ok(None);
        }
        let (budget, outcome) = (self.sealed[i].page_budget, self.sealed[i].outcome);
        Ok(Some(SealedGroup::from_bytes(b.seal(), budget, outcome)?))
    }

    /// Merges sealed group `i + 1` into group `i` when the paper's condition holds (section
    /// 4.5-4.6): the latter keeps few snapshots (k <= k_fraction x former length, the paper's
    /// k <= L_c / 5) and the former's space can contain it. We read "space" as the former's
    /// page budget O*: the merged group's partial trees (the former's retained snapshots and
    /// the latter's, each a diff to its retained predecessor) may change at most O* pages.
    /// Returns whether it merged.
    pub fn try_merge(&mut self, i: usize) -> Result<bool, IndexError> {
        if i + 1 >= self.sealed.len() || self.merge.k_fraction <= 0.0 {
            return Ok(false);
        }
        let (former, latter) = (&self.sealed[i], &self.sealed[i + 1]);
        let k_max = (self.merge.k_fraction * former.view().len() as f64)
            .floor()
            .max(1.0) as usize;
        if latter.live > k_max {
            return Ok(false);
        }
        match self.rebuild(i, i + 1, former.page_budget)? {
            Some(merged) => {
                self.sealed.splice(i..=i + 1, [merged]);
                self.rebuild_directory();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Rebuilds sealed group `i` without its deleted snapshots' trees (keeping its last tree).
    pub fn compact_group(&mut self, i: usize) -> Result<(), IndexError> {
        if i < self.sealed.len() {
            if let Some(g) = self.rebuild(i, i, u64::MAX)? {
                self.sealed[i] = g;
                self.rebuild_directory();
            }
        }
        Ok(())
    }

    fn is_newest_sealed(&self, i: usize) -> bool {
        i + 1 == self.sealed.len() && self.active.is_empty()
    }
}

impl SnapshotIndex for GsnapIndex {
    fn name(&self) -> &'static str {
        "gsnap"
    }

    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError> {
        validate_batch(self.last_snap, snap, mappings)?;
        if self.active.is_empty() {
            let base = match self.sealed.last() {
                Some(g) => last_page_table(&g.view())?,
                None => Vec::new(),
            };
            self.active
                .add_first_snapshot(snap, &mut base.into_iter(), mappings)?;
        } else {
            self.active.add_snapshot(snap, mappings)?;
        }
        self.last_snap = Some(snap);
        self.directory.push((
            snap,
            self.sealed.len() as u32,
            (self.active.len() - 1) as u32,
        ));
        let decision = self.policy.after_snapshot(
            self.active.len() as u32,
            self.active.pages_changed(),
            self.active.node_area().len(),
        );
        if decision == Decision::Seal {
            self.seal_active()?;
        }
        Ok(())
    }

    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        self.tree(snap)?.lookup(page)
    }

    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError> {
        self.tree(snap)?.scan(rel, blocks, f)
    }

    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError> {
        match self.locate(snap)? {
            Loc::Active => {
                self.active.view().live_record(snap)?;
                self.active.mark_deleted(snap)
            }
            Loc::Sealed(i) => {
                let pos = {
                    let v = self.sealed[i].view();
                    v.live_record(snap)?;
                    v.position(snap)?
                };
                let g = &mut self.sealed[i];
                format::set_deleted(&mut g.bytes[g.roots.0..g.roots.1], pos, true)?;
                g.live -= 1;
                if g.live == 0 && !self.is_newest_sealed(i) {
                    self.sealed.remove(i);
                    self.rebuild_directory();
                    return Ok(());
                }
                if i > 0 && !self.try_merge(i - 1)? {
                    self.try_merge(i)?;
                } else if i == 0 {
                    self.try_merge(0)?;
                }
                Ok(())
            }
        }
    }

    fn snapshots(&self) -> Vec<SnapId> {
        let mut out = Vec::new();
        for v in self.views() {
            for s in v.snapshots().unwrap_or_default() {
                if !s.deleted {
                    out.push(s.snap);
                }
            }
        }
        out
    }

    fn memory_bytes(&self) -> usize {
        let sealed: usize = self.sealed.iter().map(|g| g.bytes.len()).sum();
        sealed + self.active.node_area().len() + self.active.root_table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceIndex;

    fn m(block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(1, block), SnapId(snap), ImageId(image))
    }

    fn workload(n: u64) -> Vec<(SnapId, Vec<Mapping>)> {
        (1..=n)
            .map(|s| {
                let mut maps: Vec<Mapping> = if s == 1 {
                    (0..200).map(|b| m(b, 1, u64::from(b))).collect()
                } else {
                    (0..5)
                        .map(|k| m(((s * 31 + k * 17) % 220) as u32, s, s * 1000 + k))
                        .collect()
                };
                maps.sort_by_key(|m| m.page);
                maps.dedup_by_key(|m| m.page);
                (SnapId(s), maps)
            })
            .collect()
    }

    #[test]
    fn groups_are_cut_and_lookups_match_the_reference() {
        let mut g = GsnapIndex::fixed_length(7);
        let mut r = ReferenceIndex::new();
        for (s, maps) in workload(30) {
            g.add_snapshot(s, &maps).unwrap();
            r.add_snapshot(s, &maps).unwrap();
        }
        let groups = g.groups();
        assert_eq!(groups.len(), 5);
        assert!(groups[..4].iter().all(|x| x.snapshots == 7 && x.sealed));
        for s in 1..=30 {
            for b in (0..230).step_by(3) {
                let p = PageKey::new(1, b);
                assert_eq!(
                    g.lookup(SnapId(s), p),
                    r.lookup(SnapId(s), p),
                    "snap {s} block {b}"
                );
            }
        }
        // a range across groups equals the reference
        let mut runs = Vec::new();
        g.range(SnapId(3), SnapId(25), RelId(1), &mut |x| runs.push(x))
            .unwrap();
        assert_eq!(runs, r.range(SnapId(3), SnapId(25), RelId(1)));
    }

    #[test]
    fn deleting_a_whole_group_removes_it_and_merges_follow_the_condition() {
        let mut g = GsnapIndex::with_merge(
            DividingConfig {
                initial_length: 10,
                min_length: 10,
                max_length: 10,
                ..Default::default()
            },
            MergeConfig { k_fraction: 0.2 },
        );
        let mut r = ReferenceIndex::new();
        for (s, maps) in workload(40) {
            g.add_snapshot(s, &maps).unwrap();
            r.add_snapshot(s, &maps).unwrap();
        }
        assert_eq!(g.groups().len(), 4);
        for s in 11..=20 {
            g.delete_snapshot(SnapId(s)).unwrap();
            r.delete_snapshot(SnapId(s)).unwrap();
        }
        assert_eq!(g.groups().len(), 3, "the emptied second group is gone");
        // leave 2 snapshots in the (now) second group: 2 <= 10/5, so it merges into the first
        for s in 21..=28 {
            g.delete_snapshot(SnapId(s)).unwrap();
            r.delete_snapshot(SnapId(s)).unwrap();
        }
        let groups = g.groups();
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].live, 12);
        assert_eq!(g.snapshots(), r.snapshots());
        for s in r.snapshots() {
            for b in 0..230 {
                let p = PageKey::new(1, b);
                assert_eq!(g.lookup(s, p), r.lookup(s, p));
            }
        }
        assert_eq!(
            g.lookup(SnapId(15), PageKey::new(1, 0)),
            Err(IndexError::DeletedSnapshot(SnapId(15)))
                .or(Err(IndexError::UnknownSnapshot(SnapId(15))))
        );
    }

    #[test]
    fn the_newest_group_stays_as_the_next_base() {
        let mut g = GsnapIndex::fixed_length(3);
        let mut r = ReferenceIndex::new();
        for (s, maps) in workload(6) {
            g.add_snapshot(s, &maps).unwrap();
            r.add_snapshot(s, &maps).unwrap();
        }
        for s in 4..=6 {
            g.delete_snapshot(SnapId(s)).unwrap();
        }
        assert_eq!(g.groups().len(), 2);
        let maps = vec![m(3, 7, 77)];
        g.add_snapshot(SnapId(7), &maps).unwrap();
        r.add_snapshot(SnapId(7), &maps).unwrap();
        for b in 0..230 {
            let p = PageKey::new(1, b);
            assert_eq!(g.lookup(SnapId(7), p), r.lookup(SnapId(7), p));
        }
    }
}
