//! Property tests over raw bytes: corrupted group bytes give errors (never a panic or an
//! out-of-bounds read), and the group cache state keeps its invariants under random use.

use gsnap_core::cache::{GroupCache, Probe};
use gsnap_core::{
    GroupBuilder, GroupReader, ImageId, Mapping, PageKey, RelId, SnapId, GROUP_HEADER_LEN,
    ROOT_RECORD_LEN,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn sample_group(snaps: u64) -> (GroupBuilder, Vec<u8>) {
    let mut b = GroupBuilder::new();
    for s in 1..=snaps {
        let mut maps: Vec<Mapping> = (0..40u32)
            .filter(|x| s == 1 || (u64::from(*x) * 7 + s) % 9 == 0)
            .map(|x| {
                Mapping::new(
                    PageKey::new(x % 3, x * 37),
                    SnapId(s),
                    ImageId(s * 1000 + u64::from(x)),
                )
            })
            .collect();
        maps.sort_by_key(|m| m.page);
        b.add_snapshot(SnapId(s), &maps).unwrap();
    }
    let sealed = b.seal();
    (b, sealed)
}

/// Runs every query on a possibly corrupt view; any outcome but a panic is fine.
fn exercise(v: &GroupReader<'_>) {
    for s in 0..8u64 {
        for x in 0..40u32 {
            let _ = v.lookup(SnapId(s), PageKey::new(x % 3, x * 37));
        }
        for rel in 0..3 {
            let _ = v.scan(SnapId(s), RelId(rel), 0..u32::MAX, &mut |_, _| ());
            let _ = v.diff(SnapId(s), SnapId(s + 1), RelId(rel), &mut |_| ());
            let _ = v.range(SnapId(1), SnapId(s), RelId(rel), &mut |_| ());
        }
        let _ = v.scan_all(SnapId(s), &mut |_, _| ());
        let _ = v.reachable_nodes(SnapId(s));
    }
}

fn is_flags_byte(sealed_len: usize, roots_at: usize, at: usize) -> bool {
    at >= roots_at && at < sealed_len && (at - roots_at) % ROOT_RECORD_LEN == 17
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn corrupted_group_bytes_are_errors_not_panics(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (_, sealed) = sample_group(6);
        let nodes_len = u64::from_le_bytes(sealed[16..24].try_into().unwrap()) as usize;
        let roots_at = GROUP_HEADER_LEN + nodes_len;
        let mut bad = sealed.clone();
        let mut only_deleted_flags = true;
        for (i, x) in &flips {
            let at = i.index(bad.len());
            bad[at] ^= x;
            only_deleted_flags &= is_flags_byte(sealed.len(), roots_at, at);
        }
        if let Some(c) = cut {
            bad.truncate(c.index(bad.len()));
        }
        if bad != sealed && !(only_deleted_flags && cut.is_none()) {
            prop_assert!(GroupReader::new_verified(&bad).is_err(), "damage must be detected");
        }
        if let Ok(v) = GroupReader::new(&bad) {
            exercise(&v);
        }
        // A damaged published prefix (no checksum) must not panic either.
        let (nodes, roots) = (&bad[GROUP_HEADER_LEN.min(bad.len())..roots_at.min(bad.len())], &bad[roots_at.min(bad.len())..]);
        if let Ok(v) = GroupReader::from_parts(nodes, roots) {
            exercise(&v);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Get(u64, u64),
    Unpin(u64),
    Remove(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..12, 1u64..70).prop_map(|(g, s)| Op::Get(g, s)),
        3 => (0u64..12).prop_map(Op::Unpin),
        1 => (0u64..12).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cache_state_keeps_budget_pins_and_lru(ops in prop::collection::vec(op(), 1..80), slots in 2u32..6) {
        const DATA: u64 = 150;
        let mut region = vec![0u8; GroupCache::region_size(slots)];
        GroupCache::init(&mut region, slots, DATA).unwrap();
        // the model: group -> (pins, last use order, size)
        let mut model: BTreeMap<u64, (u32, u64, u64)> = BTreeMap::new();
        let mut clock = 0u64;
        for op in ops {
            let mut c = GroupCache::attach(&mut region).unwrap();
            clock += 1;
            match op {
                Op::Get(g, size) => match c.pin(g).unwrap() {
                    Probe::Hit(e) => {
                        let m = model.get_mut(&g).unwrap();
                        prop_assert_eq!(e.size, m.2);
                        m.0 += 1;
                        m.1 = clock;
                    }
                    Probe::Loading => prop_assert!(false, "nothing stays loading here"),
                    Probe::Miss => {
                        prop_assert!(!model.contains_key(&g));
                        match c.reserve(g, size) {
                            Ok(r) => {
                                let mut evictable: Vec<(u64, u64)> = model.iter().filter(|(_, m)| m.0 == 0).map(|(g, m)| (m.1, *g)).collect();
                                evictable.sort();
                                let evicted: Vec<u64> = r.evicted.iter().map(|e| e.0).collect();
                                let lru: Vec<u64> = evictable.iter().take(evicted.len()).map(|e| e.1).collect();
                                prop_assert_eq!(&evicted, &lru, "evicts least recently used first");
                                for e in &evicted {
                                    prop_assert_eq!(model.remove(e).unwrap().0, 0, "never evicts a pinned group");
                                }
                                c.finish_load(g).unwrap();
                                model.insert(g, (1, clock, size));
                            }
                            Err(_) => {
                                let pinned: u64 = model.values().filter(|m| m.0 > 0).map(|m| m.2).sum();
                                let pinned_slots = model.values().filter(|m| m.0 > 0).count() as u32;
                                prop_assert!(pinned + size > DATA || pinned_slots >= slots || pinned > 0, "refused although it could fit");
                                prop_assert!(c.pin(g).unwrap() == Probe::Miss);
                            }
                        }
                    }
                },
                Op::Unpin(g) => {
                    let r = c.unpin(g);
                    match model.get_mut(&g) {
                        Some(m) if m.0 > 0 => { r.unwrap(); m.0 -= 1; }
                        _ => prop_assert!(r.is_err()),
                    }
                }
                Op::Remove(g) => {
                    let r = c.remove(g);
                    match model.get(&g) {
                        Some(m) if m.0 > 0 => prop_assert!(r.is_err()),
                        Some(_) => { prop_assert_eq!(r, Ok(true)); model.remove(&g); }
                        None => prop_assert_eq!(r, Ok(false)),
                    }
                }
            }
            let entries = c.entries().unwrap();
            let mut extents: Vec<(u64, u64)> = entries.iter().map(|e| (e.extent.offset, e.extent.size)).collect();
            extents.sort();
            prop_assert!(extents.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "extents overlap");
            prop_assert!(extents.iter().all(|e| e.0 + e.1 <= DATA), "beyond the data area");
            prop_assert!(c.stats().unwrap().used_bytes <= DATA);
            prop_assert_eq!(entries.len(), model.len());
            for e in &entries {
                prop_assert_eq!(e.pins, model[&e.group].0);
            }
        }
    }
}
