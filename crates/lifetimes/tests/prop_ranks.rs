//! Property tests of eager ranks: boundaries nest, and a snapshot of rank `r` is the first
//! snapshot of its bucket at every level up to `r` (Thresher's RT1), except weekly for the
//! first snapshot of a month that began mid-week (see `level.rs`).

mod common;

use common::*;
use gsnap_lifetimes::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn crossed_boundaries_nest(prev in any::<Option<i64>>(), t in any::<i64>()) {
        let crossed = levels_at_declaration(prev, t);
        let implies = |a: Level, b: Level| !crossed.contains(a) || crossed.contains(b);
        prop_assert!(implies(Level::Hourly, Level::Minutely));
        prop_assert!(implies(Level::Daily, Level::Hourly));
        prop_assert!(implies(Level::Weekly, Level::Daily));
        prop_assert!(implies(Level::Monthly, Level::Daily));
        prop_assert!(implies(Level::Yearly, Level::Monthly));
        // The rank covers what was crossed.
        let rank = crossed.highest();
        prop_assert!(crossed.iter().all(|l| rank.includes(l)));
        prop_assert_eq!(rank, rank_at_declaration(prev, t));
        if prev.is_none_or(|p| p >= t) {
            prop_assert_eq!(crossed.is_empty(), prev.is_some());
        }
    }

    #[test]
    fn eager_members_are_the_first_of_their_buckets(times in sorted_times(200)) {
        let ranks = eager_ranks(&times);
        for level in Level::ALL {
            // The first snapshot (in declaration order) of each bucket of this level.
            let mut first: BTreeMap<Bucket, usize> = BTreeMap::new();
            for (i, &t) in times.iter().enumerate() {
                first.entry(level.bucket(t)).or_insert(i);
            }
            for (i, (&t, rank)) in times.iter().zip(&ranks).enumerate() {
                let is_first = first[&level.bucket(t)] == i;
                if level == Level::Weekly && *rank >= Level::Monthly.rank() {
                    // A month's first snapshot joins its week; the week's own first is a member too.
                    let week_first = first[&level.bucket(t)];
                    prop_assert!(ranks[week_first].includes(Level::Weekly));
                } else {
                    prop_assert_eq!(rank.includes(level), is_first, "{:?} at {}", level, i);
                }
            }
        }
    }

    /// What a level rule keeps for its own reason is the first snapshot of its bucket at
    /// every finer level (a kept day is represented by its first hour's first minute...).
    #[test]
    fn kept_members_are_the_first_at_every_finer_level(
        times in sorted_times(200),
        policy in policy(),
    ) {
        let snaps = snapshots(&times, &[], &[], &[]);
        for d in decide(&snaps, &policy, 0) {
            let Rule::Bucket { bucket, .. } = d.rule else { continue };
            for finer in Level::ALL.into_iter().filter(|l| *l <= bucket.level) {
                if finer == Level::Weekly && d.rank >= Level::Monthly.rank() {
                    continue;
                }
                let b = finer.bucket(d.taken_at_us);
                let first = times.iter().position(|&t| finer.bucket(t) == b).unwrap();
                prop_assert_eq!(first as u64 + 1, d.id, "{:?} finer {:?}", bucket, finer);
            }
        }
    }

    /// `eager_ranks` measures from the latest time so far, so clocks that step backwards never
    /// give a bucket two eager members at a level whose boundary they crossed.
    #[test]
    fn at_most_one_eager_crossing_per_bucket(times in unsorted_times(200)) {
        let ranks = eager_ranks(&times);
        let mut latest: Option<i64> = None;
        let mut seen: BTreeMap<Bucket, usize> = BTreeMap::new();
        for (&t, &rank) in times.iter().zip(&ranks) {
            let crossed = levels_at_declaration(latest, t);
            prop_assert_eq!(rank, crossed.highest());
            for level in crossed.iter() {
                *seen.entry(level.bucket(t)).or_default() += 1;
            }
            latest = Some(latest.map_or(t, |l| l.max(t)));
        }
        prop_assert!(seen.values().all(|&n| n == 1));
    }
}
