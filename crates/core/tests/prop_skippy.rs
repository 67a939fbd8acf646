//! Property tests: Skippy page tables (and whole groups rebuilt from the log) equal the
//! reference for random heights, node sizes and workloads.

use gsnap_core::reference::ReferenceIndex;
use gsnap_core::skippy::{MemoryLogStore, SkippyConfig, SkippyLog, StopWhen};
use gsnap_core::{ImageId, Mapping, PageKey, SnapId, SnapshotIndex};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn skippy_page_tables_equal_the_reference(
        height in 0u8..4,
        node_size in 1usize..12,
        skewed in any::<bool>(),
        raw in prop::collection::vec(prop::collection::vec((0u32..2, any::<u32>(), 0u8..10, any::<u64>()), 0..8), 1..60),
        probes in prop::collection::vec(any::<prop::sample::Index>(), 1..10),
        reopen_at in any::<prop::sample::Index>(),
        group in prop::collection::vec(any::<bool>(), 1..60),
    ) {
        let config = SkippyConfig { node_size, height };
        let mut log = SkippyLog::open(MemoryLogStore::new(), config).unwrap();
        let mut r = ReferenceIndex::new();
        let reopen = reopen_at.index(raw.len());
        for (i, snap_raw) in raw.iter().enumerate() {
            let s = SnapId(i as u64 * 2 + 1);
            let mut maps: Vec<Mapping> = snap_raw
                .iter()
                .map(|&(rel, seed, pick, image)| {
                    let block = if skewed && pick < 8 { seed % 3 } else { seed % 50 };
                    Mapping::new(PageKey::new(rel, block), s, ImageId(image))
                })
                .collect();
            maps.sort_by_key(|m| m.page);
            maps.dedup_by_key(|m| m.page);
            log.append_snapshot(s, &maps).unwrap();
            r.add_snapshot(s, &maps).unwrap();
            if i == reopen {
                log = SkippyLog::open(log.store().clone(), config).unwrap();
            }
        }
        let snaps = r.snapshots();
        for p in &probes {
            let s = *p.get(&snaps);
            let want: Vec<_> = r.page_table_at(s).unwrap().iter().map(|(k, v)| (*k, *v)).collect();
            let (got, _) = log.build_page_table(s, StopWhen::LogStart).unwrap();
            prop_assert_eq!(&got, &want, "snap {:?}", s);
            let (got, _) = log.build_page_table(s, StopWhen::Pages(want.len() as u64)).unwrap();
            prop_assert_eq!(&got, &want, "snap {:?} stopping at {} pages", s, want.len());
            // an id between two snapshots sees the older one
            let (got, _) = log.build_page_table(SnapId(s.0 + 1), StopWhen::LogStart).unwrap();
            prop_assert_eq!(&got, &want);
        }
        let members: Vec<SnapId> = snaps.iter().zip(group.iter().cycle()).filter(|(_, k)| **k).map(|(s, _)| *s).collect();
        let g = log.build_group(&members, StopWhen::LogStart).unwrap();
        for &s in &members {
            let want: Vec<_> = r.page_table_at(s).unwrap().iter().map(|(k, v)| (*k, *v)).collect();
            let mut got = Vec::new();
            g.view().scan_all(s, &mut |k, v| got.push((k, v))).unwrap();
            prop_assert_eq!(got, want, "group snapshot {:?}", s);
        }
    }
}
