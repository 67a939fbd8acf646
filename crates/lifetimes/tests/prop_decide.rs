//! Property tests of `decide`: the decisions equal a brute-force model of the rules, the
//! rank-tree properties hold for what is kept, pins and the newest survive, and deciding is
//! deterministic and subset-stable.

mod common;

use common::*;
use gsnap_lifetimes::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// A timeline (with clock steps), deletions, pins, raises, a policy and `min_snapshots`.
fn case() -> impl Strategy<Value = (Vec<SnapshotInfo>, Policy, usize)> {
    (unsorted_times(150), policy(), 0usize..5).prop_flat_map(|(times, policy, min)| {
        let n = times.len();
        (rare_flags(n), rare_flags(n), raises(n)).prop_map(move |(gone, pins, raises)| {
            (
                snapshots(&times, &gone, &pins, &raises),
                policy.clone(),
                min,
            )
        })
    })
}

fn by_id(decisions: &[Decision]) -> BTreeMap<u64, Decision> {
    decisions.iter().map(|d| (d.id, *d)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decisions_equal_the_model((snaps, policy, min) in case()) {
        let decisions = decide(&snaps, &policy, min);
        prop_assert_eq!(decisions.len(), snaps.len());
        let model = model_keeps(&snaps, &policy, min);
        let latest = snaps.iter().map(|s| s.taken_at_us).max().unwrap_or(0);
        for ((s, d), keep) in snaps.iter().zip(&decisions).zip(model) {
            prop_assert_eq!((d.id, d.taken_at_us, d.rank), (s.id, s.taken_at_us, s.rank));
            prop_assert_eq!(d.keep(), keep, "{:?} {:?}", s, d);
            // The reported rule is the first that applies, the coarsest level among levels.
            match d.rule {
                Rule::Pinned => prop_assert!(s.pinned),
                Rule::Newest(n) => prop_assert!(!s.pinned && n as usize <= min),
                Rule::KeepAll => prop_assert!(policy.is_keep_all()),
                Rule::Within => {
                    prop_assert!(latest - s.taken_at_us <= policy.within_us().unwrap())
                }
                Rule::Bucket { bucket, age } => {
                    prop_assert!(policy.within_us().is_none_or(|w| latest - s.taken_at_us > w));
                    prop_assert!(s.rank.includes(bucket.level));
                    prop_assert_eq!(bucket, bucket.level.bucket(s.taken_at_us));
                    let kept = model_kept_buckets(&snaps, &policy, bucket.level);
                    prop_assert_eq!(kept.iter().position(|b| *b == bucket), Some(age as usize - 1));
                    for coarser in Level::ALL.into_iter().filter(|l| *l > bucket.level) {
                        let coarse = model_kept_buckets(&snaps, &policy, coarser);
                        prop_assert!(!s.rank.includes(coarser)
                            || !coarse.contains(&coarser.bucket(s.taken_at_us)));
                    }
                }
                Rule::NotSelected => {}
                Rule::OverCap => prop_assert!(false, "decide never says OverCap"),
            }
        }
    }

    #[test]
    fn kept_buckets_are_the_most_recent_holding_a_member((snaps, policy, min) in case()) {
        let decisions = decide(&snaps, &policy, min);
        for level in Level::ALL {
            let Some(keep) = policy.keep(level) else { continue };
            let held: BTreeSet<Bucket> = snaps
                .iter()
                .filter(|s| s.rank.includes(level))
                .map(|s| level.bucket(s.taken_at_us))
                .collect();
            let kept = model_kept_buckets(&snaps, &policy, level);
            if let Keep::Last(n) = keep {
                prop_assert_eq!(kept.len(), held.len().min(n.get() as usize));
            } else {
                prop_assert_eq!(kept.len(), held.len());
            }
            // No held bucket newer than a kept one is left out.
            if let Some(oldest_kept) = kept.last() {
                prop_assert!(held.iter().filter(|b| *b > oldest_kept).all(|b| kept.contains(b)));
            }
            // Every member of a kept bucket is kept; rules name only kept buckets.
            for (s, d) in snaps.iter().zip(&decisions) {
                if s.rank.includes(level) && kept.contains(&level.bucket(s.taken_at_us)) {
                    prop_assert!(d.keep());
                }
                if let Rule::Bucket { bucket, .. } = d.rule {
                    if bucket.level == level {
                        prop_assert!(kept.contains(&bucket));
                    }
                }
            }
        }
    }

    #[test]
    fn pins_newest_and_within_survive((snaps, policy, min) in case()) {
        let decisions = decide(&snaps, &policy, min);
        let mut ids: Vec<u64> = snaps.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        let newest: BTreeSet<u64> = ids.iter().rev().take(min).copied().collect();
        let latest = snaps.iter().map(|s| s.taken_at_us).max().unwrap_or(0);
        for (s, d) in snaps.iter().zip(&decisions) {
            if s.pinned {
                prop_assert_eq!(d.rule, Rule::Pinned);
            }
            if newest.contains(&s.id) {
                prop_assert!(d.rule.is_protected());
            }
            if policy.within_us().is_some_and(|w| latest - s.taken_at_us <= w) {
                prop_assert!(d.keep());
            }
            if policy.is_keep_all() {
                prop_assert!(d.keep());
            }
        }
    }

    #[test]
    fn deterministic_and_independent_of_input_order(
        (snaps, policy, min) in case(),
        seed in any::<u64>(),
    ) {
        let first = decide(&snaps, &policy, min);
        prop_assert_eq!(&first, &decide(&snaps, &policy, min));
        let mut shuffled = snaps.clone();
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        prop_assert_eq!(by_id(&first), by_id(&decide(&shuffled, &policy, min)));
    }

    #[test]
    fn deciding_again_over_the_kept_set_keeps_it_with_the_same_rules(
        (snaps, policy, min) in case(),
    ) {
        let first = decide(&snaps, &policy, min);
        let kept: Vec<SnapshotInfo> =
            snaps.iter().zip(&first).filter(|(_, d)| d.keep()).map(|(s, _)| *s).collect();
        let again = decide(&kept, &policy, min);
        let first = by_id(&first);
        for d in &again {
            prop_assert_eq!(d, &first[&d.id]);
        }
    }

    #[test]
    fn any_subset_of_the_kept_set_is_kept(
        (snaps, policy, min) in case(),
        drop in prop::collection::vec(any::<bool>(), 150),
    ) {
        let first = decide(&snaps, &policy, min);
        let subset: Vec<SnapshotInfo> = snaps
            .iter()
            .zip(&first)
            .enumerate()
            .filter(|(i, (_, d))| d.keep() && !drop[*i % drop.len()])
            .map(|(_, (s, _))| *s)
            .collect();
        prop_assert!(decide(&subset, &policy, min).iter().all(Decision::keep));
    }

    /// With eager ranks over a gap-free history (nothing deleted), an explicit raise adds
    /// members only to buckets that already hold one, so it never costs another snapshot
    /// its place.
    #[test]
    fn raising_a_rank_only_adds_keeps(
        times in sorted_times(150),
        policy in policy(),
        min in 0usize..3,
        raise in any::<prop::sample::Index>(),
        to in 1u8..=6,
    ) {
        let before = snapshots(&times, &[], &[], &[]);
        let mut raised = before.clone();
        let i = raise.index(raised.len());
        raised[i].rank = raised[i].rank.raise(Rank::new(to).unwrap());
        let (a, b) = (decide(&before, &policy, min), decide(&raised, &policy, min));
        for (x, y) in a.iter().zip(&b) {
            prop_assert!(!x.keep() || y.keep(), "{:?} -> {:?}", x, y);
        }
    }
}
