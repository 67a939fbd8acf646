//! Property tests of `thin_to_cap`: it never touches pinned snapshots or the newest
//! `min_snapshots`, deletes lowest ranks first and oldest first, stops as soon as the
//! estimate fits, reports honestly, and leaves a set that deciding again keeps.

mod common;

use common::*;
use gsnap_lifetimes::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn thinning_follows_the_rules(
        times in unsorted_times(120),
        policy in policy(),
        min in 0usize..4,
        flags in prop::collection::vec((prop::bool::weighted(0.1), prop::bool::weighted(0.1), 0u8..7, 0u64..1000), 121),
        cap_fraction in 0u64..=100,
    ) {
        let gone: Vec<bool> = flags.iter().map(|f| f.0).collect();
        let pins: Vec<bool> = flags.iter().map(|f| f.1).collect();
        let raises: Vec<u8> = flags.iter().map(|f| if f.2 > 4 { f.2 - 1 } else { 0 }).collect();
        let snaps = snapshots(&times, &gone, &pins, &raises);
        let size = |id: u64| flags[id as usize - 1].3;
        let live_bytes: u64 = snaps.iter().map(|s| size(s.id)).sum();
        let cap = live_bytes * cap_fraction / 100;

        let before = decide(&snaps, &policy, min);
        let mut after = before.clone();
        let t = thin_to_cap(&mut after, live_bytes, cap, |d| size(d.id));

        // Only kept, unprotected snapshots change, and they become OverCap, in `deleted` order.
        let changed: Vec<u64> = before.iter().zip(&after).filter(|(b, a)| b != a).map(|(b, _)| b.id).collect();
        let mut deleted_sorted = t.deleted.clone();
        deleted_sorted.sort_unstable();
        let mut changed_sorted = changed.clone();
        changed_sorted.sort_unstable();
        prop_assert_eq!(&deleted_sorted, &changed_sorted);
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                prop_assert!(b.keep() && !b.rule.is_protected());
                prop_assert_eq!(a.rule, Rule::OverCap);
            }
            if b.rule.is_protected() {
                prop_assert_eq!(b, a);
            }
        }

        // The deletions are a prefix of (rank, taken_at, id) order over the candidates.
        let key = |d: &Decision| (d.rank, d.taken_at_us, d.id);
        let max_deleted = after.iter().filter(|d| d.rule == Rule::OverCap).map(key).max();
        if let Some(max_deleted) = max_deleted {
            for d in after.iter().filter(|d| d.keep() && !d.rule.is_protected()) {
                prop_assert!(key(d) > max_deleted);
            }
        }

        // The estimate is live minus what every deletion frees; it stops as soon as it fits.
        let freed: u64 = after.iter().filter(|d| !d.keep()).map(|d| size(d.id)).sum();
        prop_assert_eq!(t.estimated_bytes, live_bytes - freed);
        prop_assert_eq!(t.cap_met, t.estimated_bytes <= cap);
        if let Some(&last) = t.deleted.last() {
            prop_assert!(t.estimated_bytes + size(last) > cap);
        }
        if !t.cap_met {
            prop_assert!(after.iter().all(|d| !d.keep() || d.rule.is_protected()));
        }

        // What stays is kept again by the policy.
        let left: Vec<SnapshotInfo> =
            snaps.iter().zip(&after).filter(|(_, d)| d.keep()).map(|(s, _)| *s).collect();
        prop_assert!(decide(&left, &policy, min).iter().all(Decision::keep));
    }
}
