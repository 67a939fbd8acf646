//! Keep or delete: a policy applied to the snapshots that are not deleted.
//!
//! Rules, for the snapshots passed in (the caller leaves deleted ones out):
//!
//! - **pinned** snapshots are kept;
//! - the **newest** `min_snapshots` (highest ids, i.e. declaration order) are kept;
//! - the **empty policy** keeps everything;
//! - **within** keeps every snapshot taken at most `within` before the latest `taken_at`
//!   among the snapshots (not the wall clock: a paused cluster keeps its history);
//! - a **level** rule `daily=N` takes the buckets of that level that hold a *member* (a
//!   snapshot whose rank includes the level, see `level.rs`), most recent first, and keeps
//!   every member of the first `N` of them (`unlimited`: of all). Bucket `k` of that order
//!   is "daily #k". Empty buckets are skipped, so downtime does not shrink history: it is
//!   the `N` most recent days *with* a daily snapshot, not the last `N` calendar days.
//!
//! A kept snapshot reports one rule, the first that applies in the order above; among level
//! rules the coarsest (the one that keeps it longest). The others report `NotSelected`.
//!
//! Invariants (property tested in `tests/`):
//! - decisions do not depend on the order of the input;
//! - pinned snapshots and the newest `min_snapshots` are always kept;
//! - *subset stability*: for any subset of the kept snapshots (for instance the kept set
//!   itself, or what is left after the size cap or explicit deletions), deciding again keeps
//!   all of it. Ranks are stored, not recomputed from what is left, so a member stays a
//!   member and a kept bucket stays among the `N` most recent (removing snapshots only
//!   moves older buckets up). Deciding again over the kept set gives the same rules.

use crate::calendar::Bucket;
use crate::level::{Level, Rank};
use crate::policy::Policy;
use std::cmp::Reverse;
use std::fmt;

/// What `decide` needs to know about a snapshot that is not deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotInfo {
    /// Snapshot ids grow in declaration order and are unique.
    pub id: u64,
    /// When the snapshot was taken, microseconds since the Unix epoch (UTC).
    pub taken_at_us: i64,
    /// Its rank: the eager rank raised by any explicit one (`Rank::raise`).
    pub rank: Rank,
    /// Whether it holds a pin that has not expired.
    pub pinned: bool,
}

impl SnapshotInfo {
    /// Snapshots taken at `times` (in order), ids from 1, with their eager ranks, unpinned.
    pub fn timeline(times: &[i64]) -> Vec<SnapshotInfo> {
        crate::level::eager_ranks(times)
            .into_iter()
            .zip(times)
            .enumerate()
            .map(|(i, (rank, &taken_at_us))| SnapshotInfo {
                id: i as u64 + 1,
                taken_at_us,
                rank,
                pinned: false,
            })
            .collect()
    }
}

/// Why a snapshot is kept or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Kept: it is pinned.
    Pinned,
    /// Kept: it is the `n`-th newest (1 = the newest) and `min_snapshots >= n`.
    Newest(u32),
    /// Kept: the policy is empty.
    KeepAll,
    /// Kept: taken within the `within` window of the latest snapshot.
    Within,
    /// Kept: a member of `bucket`, the `age`-th most recent bucket of its level holding a
    /// member (1 = the most recent).
    Bucket { bucket: Bucket, age: u32 },
    /// Deleted: no rule keeps it.
    NotSelected,
    /// Deleted by `thin_to_cap` to bring the store under its size cap.
    OverCap,
}

impl Rule {
    /// Whether the snapshot is kept.
    pub fn keeps(self) -> bool {
        !matches!(self, Rule::NotSelected | Rule::OverCap)
    }

    /// Whether nothing may delete it without force: pinned or among the newest.
    pub fn is_protected(self) -> bool {
        matches!(self, Rule::Pinned | Rule::Newest(_))
    }
}

/// `pinned`, `newest #1`, `keep all`, `within`, `daily #3 (2024-03-05)`, `not selected`,
/// `over size cap`.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Pinned => f.write_str("pinned"),
            Rule::Newest(n) => write!(f, "newest #{n}"),
            Rule::KeepAll => f.write_str("keep all"),
            Rule::Within => f.write_str("within"),
            Rule::Bucket { bucket, age } => write!(f, "{} #{age} ({bucket})", bucket.level),
            Rule::NotSelected => f.write_str("not selected"),
            Rule::OverCap => f.write_str("over size cap"),
        }
    }
}

/// The decision for one snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    pub id: u64,
    pub taken_at_us: i64,
    pub rank: Rank,
    pub rule: Rule,
}

impl Decision {
    /// Whether the snapshot is kept.
    pub fn keep(&self) -> bool {
        self.rule.keeps()
    }
}

/// Applies `policy` to the snapshots that are not deleted; one decision per snapshot, in
/// the order given.
pub fn decide(snapshots: &[SnapshotInfo], policy: &Policy, min_snapshots: usize) -> Vec<Decision> {
    let mut newest_first: Vec<usize> = (0..snapshots.len()).collect();
    newest_first.sort_by_key(|&i| Reverse((snapshots[i].id, snapshots[i].taken_at_us)));
    let mut newest = vec![None; snapshots.len()];
    for (position, &i) in newest_first.iter().take(min_snapshots).enumerate() {
        newest[i] = Some(u32::try_from(position + 1).unwrap_or(u32::MAX));
    }

    let latest = snapshots.iter().map(|s| s.taken_at_us).max().unwrap_or(0);
    let within = |s: &SnapshotInfo| {
        policy
            .within_us()
            .is_some_and(|window| latest.saturating_sub(s.taken_at_us) <= window)
    };

    let buckets = kept_buckets(snapshots, policy);
    snapshots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let rule = if s.pinned {
                Rule::Pinned
            } else if let Some(n) = newest[i] {
                Rule::Newest(n)
            } else if policy.is_keep_all() {
                Rule::KeepAll
            } else if within(s) {
                Rule::Within
            } else if let Some((bucket, age)) = buckets[i] {
                Rule::Bucket { bucket, age }
            } else {
                Rule::NotSelected
            };
            Decision {
                id: s.id,
                taken_at_us: s.taken_at_us,
                rank: s.rank,
                rule,
            }
        })
        .collect()
}

/// For each snapshot, the coarsest kept bucket it is a member of and that bucket's age.
fn kept_buckets(snapshots: &[SnapshotInfo], policy: &Policy) -> Vec<Option<(Bucket, u32)>> {
    let mut latest_first: Vec<usize> = (0..snapshots.len()).collect();
    latest_first.sort_by_key(|&i| Reverse((snapshots[i].taken_at_us, snapshots[i].id)));
    let mut kept = vec![None; snapshots.len()];
    // Finest first, so that a coarser level overwrites a finer one.
    for level in Level::ALL {
        let Some(keep) = policy.keep(level) else {
            continue;
        };
        // Buckets never decrease with time, so the members of a bucket are adjacent here.
        let mut age = 0u32;
        let mut current: Option<Bucket> = None;
        for &i in &latest_first {
            let s = &snapshots[i];
            if !s.rank.includes(level) {
                continue;
            }
            let bucket = level.bucket(s.taken_at_us);
            if current != Some(bucket) {
                current = Some(bucket);
                age = age.saturating_add(1);
                if !keep.keeps_age(age) {
                    break;
                }
            }
            kept[i] = Some((bucket, age));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::{utc_timestamp_us, US_PER_HOUR};

    fn timeline(times: &[i64]) -> Vec<SnapshotInfo> {
        SnapshotInfo::timeline(times)
    }

    fn rules(snapshots: &[SnapshotInfo], policy: &str, min: usize) -> Vec<String> {
        let policy = Policy::parse(policy).unwrap();
        decide(snapshots, &policy, min)
            .iter()
            .map(|d| d.rule.to_string())
            .collect()
    }

    #[test]
    fn empty_input_and_empty_policy() {
        assert!(decide(&[], &Policy::keep_all(), 3).is_empty());
        let start = utc_timestamp_us(2024, 3, 5, 10, 0, 0).unwrap();
        let s = timeline(&[start, start + 1, start + 2]);
        assert_eq!(rules(&s, "", 1), ["keep all", "keep all", "newest #1"]);
    }

    #[test]
    fn days_with_downtime() {
        // Snapshots at 10:00 and 16:00 on the 1st, 2nd and 5th (down on the 3rd and 4th).
        let at = |d, h| utc_timestamp_us(2024, 3, d, h, 0, 0).unwrap();
        let s = timeline(&[
            at(1, 10),
            at(1, 16),
            at(2, 10),
            at(2, 16),
            at(5, 10),
            at(5, 16),
        ]);
        assert_eq!(
            rules(&s, "daily=2", 0),
            [
                "not selected",
                "not selected",
                "daily #2 (2024-03-02)",
                "not selected",
                "daily #1 (2024-03-05)",
                "not selected"
            ]
        );
        // The coarsest rule is reported; `within` counts from the latest snapshot.
        assert_eq!(
            rules(&s, "within=6h daily=3 monthly=1", 1),
            [
                "monthly #1 (2024-03)",
                "not selected",
                "daily #2 (2024-03-02)",
                "not selected",
                "within",
                "newest #1"
            ]
        );
    }

    #[test]
    fn explicit_ranks_join_buckets_and_pins_win() {
        let start = utc_timestamp_us(2024, 3, 5, 10, 0, 0).unwrap();
        let mut s = timeline(&[start, start + US_PER_HOUR / 2, start + US_PER_HOUR]);
        s[1].rank = s[1].rank.raise(Level::Daily.rank());
        s[2].pinned = true;
        assert_eq!(
            rules(&s, "daily=1", 0),
            ["daily #1 (2024-03-05)", "daily #1 (2024-03-05)", "pinned"]
        );
    }

    #[test]
    fn unlimited_and_input_order() {
        let at = |y| utc_timestamp_us(y, 6, 1, 0, 0, 0).unwrap();
        let mut s = timeline(&[at(2020), at(2021), at(2022)]);
        s.reverse();
        assert_eq!(
            rules(&s, "yearly=unlimited", 0),
            ["yearly #1 (2022)", "yearly #2 (2021)", "yearly #3 (2020)"]
        );
    }
}
