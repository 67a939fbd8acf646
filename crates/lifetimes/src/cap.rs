//! The size cap: delete more than the policy does when the store would stay too large.
//!
//! Bytes are the caller's estimates:
//! - `live_bytes`: what the store holds now for all the snapshots given to `decide` (the
//!   snapshots not yet deleted), images and index entries;
//! - `freed_bytes(d)`: what deleting that one snapshot would free, the others staying (its
//!   *exclusive* bytes: images no other live snapshot maps).
//!
//! The estimate of what stays is `live_bytes` minus the freed bytes of every deleted
//! snapshot. Exclusive bytes add up to a lower bound of what deleting a set frees (an image
//! shared only by deleted snapshots is freed but counted by none), so the estimate errs
//! toward deleting more than needed; a caller that wants to err the other way applies the
//! deletions a few at a time and measures again.
//!
//! Rules: while the estimate exceeds `cap_bytes`, delete the next kept snapshot in the order
//! lowest rank first, oldest (`taken_at`, then id) first within a rank, skipping pinned
//! snapshots and the newest `min_snapshots` (`Rule::is_protected`). The deletions are
//! therefore a prefix of that order. If every candidate goes and the estimate still exceeds
//! the cap, `cap_met` is false (the caller warns). What is left stays subset-stable (see
//! `decide.rs`): deciding again over it keeps all of it.

use crate::decide::{Decision, Rule};

/// What `thin_to_cap` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thinning {
    /// The snapshots it deleted, in the order it chose them.
    pub deleted: Vec<u64>,
    /// The bytes estimated to stay after the policy's and these deletions.
    pub estimated_bytes: u64,
    /// Whether `estimated_bytes <= cap_bytes`.
    pub cap_met: bool,
}

/// Marks more kept snapshots `Rule::OverCap` until the estimate fits `cap_bytes`.
pub fn thin_to_cap(
    decisions: &mut [Decision],
    live_bytes: u64,
    cap_bytes: u64,
    freed_bytes: impl Fn(&Decision) -> u64,
) -> Thinning {
    let freed_by_policy: u64 = decisions
        .iter()
        .filter(|d| !d.keep())
        .map(&freed_bytes)
        .fold(0, u64::saturating_add);
    let mut estimate = live_bytes.saturating_sub(freed_by_policy);

    let mut candidates: Vec<usize> = (0..decisions.len())
        .filter(|&i| decisions[i].keep() && !decisions[i].rule.is_protected())
        .collect();
    candidates.sort_by_key(|&i| {
        let d = &decisions[i];
        (d.rank, d.taken_at_us, d.id)
    });

    let mut deleted = Vec::new();
    for i in candidates {
        if estimate <= cap_bytes {
            break;
        }
        estimate = estimate.saturating_sub(freed_bytes(&decisions[i]));
        decisions[i].rule = Rule::OverCap;
        deleted.push(decisions[i].id);
    }
    Thinning {
        deleted,
        estimated_bytes: estimate,
        cap_met: estimate <= cap_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::{Level, Rank};

    fn decision(id: u64, rank: Rank, rule: Rule) -> Decision {
        Decision {
            id,
            taken_at_us: id as i64 * 1_000_000,
            rank,
            rule,
        }
    }

    #[test]
    fn lowest_rank_then_oldest_never_protected() {
        let daily = Level::Daily.rank();
        let mut d = vec![
            decision(1, daily, Rule::Within),
            decision(2, Rank::NONE, Rule::Pinned),
            decision(3, Rank::NONE, Rule::Within),
            decision(4, Rank::NONE, Rule::NotSelected),
            decision(5, Rank::NONE, Rule::Within),
            decision(6, Rank::NONE, Rule::Newest(1)),
        ];
        // 6 snapshots of 10 bytes each; the policy already frees 10.
        let t = thin_to_cap(&mut d, 60, 30, |_| 10);
        assert_eq!(
            t,
            Thinning {
                deleted: vec![3, 5],
                estimated_bytes: 30,
                cap_met: true
            }
        );
        assert_eq!(d[2].rule, Rule::OverCap);
        assert_eq!(d[0].rule, Rule::Within);

        // A cap that cannot be met: every candidate goes, pins and the newest stay.
        for x in &mut d {
            if x.rule == Rule::OverCap {
                x.rule = Rule::Within;
            }
        }
        let t = thin_to_cap(&mut d, 60, 0, |_| 10);
        assert_eq!(
            t,
            Thinning {
                deleted: vec![3, 5, 1],
                estimated_bytes: 20,
                cap_met: false
            }
        );
        assert_eq!(d[1].rule, Rule::Pinned);
        assert_eq!(d[5].rule, Rule::Newest(1));
    }

    #[test]
    fn nothing_to_do_under_the_cap() {
        let mut d = vec![decision(1, Rank::NONE, Rule::KeepAll)];
        let t = thin_to_cap(&mut d, 100, 100, |_| 100);
        assert!(t.deleted.is_empty() && t.cap_met);
        assert_eq!(d[0].rule, Rule::KeepAll);
    }
}
