//! Property tests: every index agrees with the reference model on random workloads (uniform
//! and skewed page choice, random group boundaries, random sparse deletions, more snapshots
//! after them), diff and range agree with the reference, and a GroupReader over sealed bytes or
//! a published prefix agrees with the builder.

use gsnap_core::baselines::{OIndex, TIndex};
use gsnap_core::dividing::DividingConfig;
use gsnap_core::reference::ReferenceIndex;
use gsnap_core::{
    GroupBuilder, GroupReader, GsnapIndex, ImageId, IndexError, Mapping, MergeConfig, PageKey,
    RelId, SnapId, SnapshotIndex, ROOT_RECORD_LEN,
};
use proptest::prelude::*;
use std::collections::BTreeSet;

/// One snapshot's raw choices: (relation, block seed, hot?, image).
type RawSnap = Vec<(u32, u32, u8, u64)>;

const FAR_BLOCKS: [u32; 4] = [65_535, 65_536, 1_000_003, u32::MAX];

fn block_of(seed: u32, pick: u8, skewed: bool) -> u32 {
    if pick == 0 {
        FAR_BLOCKS[(seed % 4) as usize]
    } else if skewed && pick < 8 {
        seed % 6 // 80% of the choices go to six hot blocks
    } else {
        seed % 400
    }
}

fn batch(snap: SnapId, raw: &RawSnap, skewed: bool) -> Vec<Mapping> {
    let mut m: Vec<Mapping> = raw
        .iter()
        .map(|&(rel, seed, pick, image)| {
            Mapping::new(
                PageKey {
                    rel: RelId(rel),
                    block: block_of(seed, pick, skewed),
                },
                snap,
                ImageId(image),
            )
        })
        .collect();
    m.sort_by_key(|x| x.page);
    m.dedup_by_key(|x| x.page);
    m
}

fn raw_snaps(max: usize) -> impl Strategy<Value = Vec<(u64, RawSnap)>> {
    prop::collection::vec(
        (
            1u64..3,
            prop::collection::vec((0u32..3, any::<u32>(), 0u8..10, any::<u64>()), 0..25),
        ),
        1..max,
    )
}

#[derive(Debug, Clone)]
enum GsnapShape {
    Fixed(u32),
    Policy {
        initial: u32,
        budget: Option<u64>,
        punish: f64,
        k: f64,
        accesses: Vec<u64>,
    },
}

fn shape() -> impl Strategy<Value = GsnapShape> {
    prop_oneof![
        (1u32..9).prop_map(GsnapShape::Fixed),
        (
            1u32..10,
            prop::option::of(1u64..120),
            0.3f64..1.0,
            prop_oneof![Just(0.0), Just(0.2), Just(0.6)],
            prop::collection::vec(1u64..30, 0..4)
        )
            .prop_map(
                |(initial, budget, punish, k, accesses)| GsnapShape::Policy {
                    initial,
                    budget,
                    punish,
                    k,
                    accesses
                }
            ),
    ]
}

fn gsnap(shape: &GsnapShape) -> GsnapIndex {
    match shape {
        GsnapShape::Fixed(l) => GsnapIndex::fixed_length(*l),
        GsnapShape::Policy {
            initial,
            budget,
            punish,
            k,
            accesses,
        } => {
            let config = DividingConfig {
                initial_length: *initial,
                initial_page_budget: *budget,
                punish_factor: *punish,
                max_length: 12,
                ..Default::default()
            };
            let mut g = GsnapIndex::with_merge(config, MergeConfig { k_fraction: *k });
            for &a in accesses {
                g.record_access(SnapId(1), SnapId(a));
            }
            g
        }
    }
}

struct All {
    reference: ReferenceIndex,
    others: Vec<Box<dyn SnapshotIndex>>,
    next: u64,
    pages: BTreeSet<PageKey>,
}

impl All {
    fn new(shape: &GsnapShape) -> Self {
        let others: Vec<Box<dyn SnapshotIndex>> = vec![
            Box::new(gsnap(shape)),
            Box::new(TIndex::new()),
            Box::new(OIndex::new()),
            Box::new(GroupBuilder::new()),
        ];
        All {
            reference: ReferenceIndex::new(),
            others,
            next: 0,
            pages: BTreeSet::new(),
        }
    }

    fn add(&mut self, raw: &[(u64, RawSnap)], skewed: bool) {
        for (gap, r) in raw {
            self.next += gap;
            let snap = SnapId(self.next);
            let maps = batch(snap, r, skewed);
            self.pages.extend(maps.iter().map(|m| m.page));
            self.reference.add_snapshot(snap, &maps).unwrap();
            for i in &mut self.others {
                i.add_snapshot(snap, &maps).unwrap();
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let snaps = self.reference.snapshots();
        let mut probe: Vec<PageKey> = self.pages.iter().copied().collect();
        probe.extend([
            PageKey::new(0, 401),
            PageKey::new(7, 0),
            PageKey::new(1, u32::MAX - 1),
        ]);
        for i in &self.others {
            prop_assert_eq!(i.snapshots(), snaps.clone(), "{}", i.name());
            for &s in &snaps {
                for &p in &probe {
                    prop_assert_eq!(
                        i.lookup(s, p),
                        self.reference.lookup(s, p),
                        "{} snap {:?} page {:?}",
                        i.name(),
                        s,
                        p
                    );
                }
                for rel in 0..3 {
                    for range in [0..u32::MAX, 3..200, 65_535..65_537, 0..0] {
                        let (mut a, mut b) = (Vec::new(), Vec::new());
                        i.scan(s, RelId(rel), range.clone(), &mut |k, v| a.push((k, v)))
                            .unwrap();
                        self.reference
                            .scan(s, RelId(rel), range.clone(), &mut |k, v| b.push((k, v)))
                            .unwrap();
                        prop_assert_eq!(
                            a,
                            b,
                            "{} scan snap {:?} rel {} {:?}",
                            i.name(),
                            s,
                            rel,
                            range
                        );
                    }
                }
            }
            prop_assert!(i.lookup(SnapId(self.next + 1), PageKey::new(0, 0)).is_err());
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn every_index_agrees_with_the_reference(
        first in raw_snaps(30),
        later in raw_snaps(10),
        skewed in any::<bool>(),
        shape in shape(),
        deletions in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut all = All::new(&shape);
        all.add(&first, skewed);
        all.check()?;
        for d in &deletions {
            let snaps = all.reference.snapshots();
            if snaps.is_empty() { break; }
            let s = *d.get(&snaps);
            all.reference.delete_snapshot(s).unwrap();
            for i in &mut all.others {
                prop_assert_eq!(i.delete_snapshot(s), Ok(()), "{}", i.name());
                prop_assert!(i.lookup(s, PageKey::new(0, 0)).is_err());
                prop_assert!(i.delete_snapshot(s).is_err());
            }
        }
        all.check()?;
        all.add(&later, skewed);
        all.check()?;
    }

    #[test]
    fn diff_and_range_agree_with_the_reference(
        raw in raw_snaps(30),
        skewed in any::<bool>(),
        shape in shape(),
        deletions in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        queries in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u32..3), 1..12),
    ) {
        let mut g = gsnap(&shape);
        let mut r = ReferenceIndex::new();
        let mut next = 0;
        for (gap, raw) in &raw {
            next += gap;
            let maps = batch(SnapId(next), raw, skewed);
            g.add_snapshot(SnapId(next), &maps).unwrap();
            r.add_snapshot(SnapId(next), &maps).unwrap();
        }
        for d in &deletions {
            let snaps = r.snapshots();
            if snaps.len() <= 1 { break; }
            let s = *d.get(&snaps);
            r.delete_snapshot(s).unwrap();
            g.delete_snapshot(s).unwrap();
        }
        let snaps = r.snapshots();
        for (a, b, rel) in &queries {
            let (a, b) = (*a.get(&snaps), *b.get(&snaps));
            let mut d = Vec::new();
            g.diff(a, b, RelId(*rel), &mut |x| d.push(x)).unwrap();
            prop_assert_eq!(d, r.diff(a, b, RelId(*rel)).unwrap(), "diff {:?} {:?}", a, b);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let mut runs = Vec::new();
            g.range(lo, hi, RelId(*rel), &mut |x| runs.push(x)).unwrap();
            prop_assert_eq!(runs, r.range(lo, hi, RelId(*rel)), "range {:?}..={:?}", lo, hi);
        }
        let deleted = SnapId(next + 5);
        prop_assert_eq!(g.diff(deleted, snaps[0], RelId(0), &mut |_| ()).unwrap_err(), IndexError::UnknownSnapshot(deleted));
    }

    #[test]
    fn group_views_over_bytes_equal_the_builder(raw in raw_snaps(20), skewed in any::<bool>(), cut in any::<prop::sample::Index>()) {
        let mut b = GroupBuilder::new();
        let mut snaps = Vec::new();
        let mut pages = BTreeSet::new();
        let mut published = None;
        let k = cut.index(raw.len());
        for (i, (gap, raw)) in raw.iter().enumerate() {
            let s = SnapId(snaps.last().map_or(0, |x: &SnapId| x.0) + gap);
            let maps = batch(s, raw, skewed);
            pages.extend(maps.iter().map(|m| m.page));
            b.add_snapshot(s, &maps).unwrap();
            snaps.push(s);
            if i == k {
                let p = b.published();
                published = Some((b.node_area()[..p.node_bytes].to_vec(), b.root_table()[..p.roots * ROOT_RECORD_LEN].to_vec(), i + 1));
            }
        }
        let sealed = b.seal();
        let v = GroupReader::new_verified(&sealed).unwrap();
        let (nodes, roots, n) = published.unwrap();
        let prefix = GroupReader::from_parts(&nodes, &roots).unwrap();
        prop_assert_eq!(prefix.len(), n);
        for (i, &s) in snaps.iter().enumerate() {
            for &p in &pages {
                let want = b.view().lookup(s, p);
                prop_assert_eq!(v.lookup(s, p), want.clone());
                if i < n {
                    prop_assert_eq!(prefix.lookup(s, p), want);
                }
            }
        }
        prop_assert!(prefix.lookup(snaps[snaps.len() - 1], PageKey::new(0, 0)).is_ok() == (n == snaps.len()));
    }
}
