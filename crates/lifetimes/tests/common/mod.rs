//! Generators shared by the property tests: timelines with bursts, gaps and downtime from
//! seconds to years, random policies, and a brute-force model of the decision rules.

#![allow(dead_code)]

use gsnap_lifetimes::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::time::Duration;

/// One gap between snapshots: a burst (same time), seconds, minutes, hours, days, weeks,
/// months or years.
fn gap_us() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        6 => 1i64..60_000_000,
        6 => (1i64..120).prop_map(|m| m * US_PER_MINUTE),
        4 => (1i64..48).prop_map(|h| h * US_PER_HOUR + 17_000_000),
        3 => (1i64..20).prop_map(|d| d * US_PER_DAY - 5_000_000),
        2 => (1i64..10).prop_map(|w| w * 7 * US_PER_DAY),
        2 => (25i64..70).prop_map(|d| d * US_PER_DAY + 3 * US_PER_HOUR),
        1 => (300i64..1200).prop_map(|d| d * US_PER_DAY),
    ]
}

/// `taken_at` of a timeline in declaration order, never decreasing, starting anywhere from
/// 600 BC to 2500 AD (so also before 1970).
pub fn sorted_times(max_len: usize) -> impl Strategy<Value = Vec<i64>> {
    let start = (
        -600i64..2500,
        1u32..=12,
        1u32..=28,
        0u32..24,
        0u32..60,
        0u32..60,
    )
        .prop_map(|(y, mo, d, h, mi, s)| utc_timestamp_us(y, mo, d, h, mi, s).unwrap());
    (start, prop::collection::vec(gap_us(), 0..max_len)).prop_map(|(start, gaps)| {
        let mut t = start;
        let mut times = vec![t];
        for gap in gaps {
            t += gap;
            times.push(t);
        }
        times
    })
}

/// A timeline whose clock may step backwards now and then.
pub fn unsorted_times(max_len: usize) -> impl Strategy<Value = Vec<i64>> {
    (
        sorted_times(max_len),
        prop::collection::vec((any::<bool>(), 0i64..3 * US_PER_DAY), 0..4),
    )
        .prop_map(|(mut times, steps)| {
            for (k, (forward, step)) in steps.into_iter().enumerate() {
                let from = times.len() * (k + 1) / 5;
                for t in &mut times[from..] {
                    *t += if forward { step } else { -step };
                }
            }
            times
        })
}

fn keep() -> impl Strategy<Value = Option<Keep>> {
    prop_oneof![
        3 => Just(None),
        4 => (1u32..6).prop_map(|n| Some(Keep::Last(NonZeroU32::new(n).unwrap()))),
        1 => Just(Some(Keep::Unlimited)),
    ]
}

pub fn policy() -> impl Strategy<Value = Policy> {
    let within = prop_oneof![
        2 => Just(None),
        1 => (1u64..3 * 86_400).prop_map(Some),
        1 => (1u64..800 * 86_400).prop_map(Some),
    ];
    (within, prop::collection::vec(keep(), 6)).prop_map(|(within, keeps)| {
        let mut p = Policy::keep_all().with_within(within.map(Duration::from_secs));
        for (level, keep) in Level::ALL.into_iter().zip(keeps) {
            p = p.with_keep(level, keep);
        }
        p
    })
}

/// Live snapshots of a timeline: eager ranks over the whole timeline, then some snapshots
/// deleted (`gone`), some pinned and some raised by an explicit rank.
pub fn snapshots(times: &[i64], gone: &[bool], pins: &[bool], raises: &[u8]) -> Vec<SnapshotInfo> {
    let ranks = eager_ranks(times);
    (0..times.len())
        .filter(|&i| !gone.get(i).copied().unwrap_or(false))
        .map(|i| {
            let explicit = Rank::new(raises.get(i).copied().unwrap_or(0)).unwrap_or(Rank::NONE);
            SnapshotInfo {
                id: i as u64 + 1,
                taken_at_us: times[i],
                rank: ranks[i].raise(explicit),
                pinned: pins.get(i).copied().unwrap_or(false),
            }
        })
        .collect()
}

/// Explicit raises: mostly none, sometimes a level.
pub fn raises(len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop_oneof![8 => Just(0u8), 1 => 1u8..=6], len)
}

/// Flags that are mostly false.
pub fn rare_flags(len: usize) -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(prop::bool::weighted(0.1), len)
}

/// The brute-force model: the buckets of `level` that the policy keeps, computed from the
/// set of buckets holding a member.
pub fn model_kept_buckets(snaps: &[SnapshotInfo], policy: &Policy, level: Level) -> Vec<Bucket> {
    let Some(keep) = policy.keep(level) else {
        return Vec::new();
    };
    let held: BTreeSet<Bucket> = snaps
        .iter()
        .filter(|s| s.rank.includes(level))
        .map(|s| level.bucket(s.taken_at_us))
        .collect();
    let newest_first: Vec<Bucket> = held.into_iter().rev().collect();
    newest_first
        .into_iter()
        .enumerate()
        .take_while(|(k, _)| keep.keeps_age(*k as u32 + 1))
        .map(|(_, b)| b)
        .collect()
}

/// The model's keep verdict for every snapshot, in input order.
pub fn model_keeps(snaps: &[SnapshotInfo], policy: &Policy, min_snapshots: usize) -> Vec<bool> {
    let mut ids: Vec<u64> = snaps.iter().map(|s| s.id).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    let newest: BTreeSet<u64> = ids.into_iter().take(min_snapshots).collect();
    let latest = snaps.iter().map(|s| s.taken_at_us).max().unwrap_or(0);
    let kept: Vec<Vec<Bucket>> = Level::ALL
        .iter()
        .map(|&l| model_kept_buckets(snaps, policy, l))
        .collect();
    snaps
        .iter()
        .map(|s| {
            s.pinned
                || newest.contains(&s.id)
                || policy.is_keep_all()
                || policy
                    .within_us()
                    .is_some_and(|w| latest - s.taken_at_us <= w)
                || Level::ALL.iter().any(|&l| {
                    s.rank.includes(l) && kept[l as usize - 1].contains(&l.bucket(s.taken_at_us))
                })
        })
        .collect()
}
