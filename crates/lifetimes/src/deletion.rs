//! Checks for an explicit deletion (`gsnap_delete`), for the SQL layer to refuse with.
//!
//! The SQL layer decides what to refuse; this module only says what a set of ids would do
//! to the snapshots that are not deleted: which ids are unknown (or already deleted), which
//! are pinned, whether the set holds the newest snapshot (the highest id) and whether it
//! holds every snapshot. The suggested use: unknown or pinned ids are an ERROR; the newest
//! or every snapshot needs `force => true`.

use crate::decide::SnapshotInfo;
use std::collections::BTreeSet;

/// What deleting a set of ids would do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeletionCheck {
    /// Ids that name no live snapshot, ascending, without duplicates.
    pub unknown: Vec<u64>,
    /// Ids of pinned snapshots in the set, ascending.
    pub pinned: Vec<u64>,
    /// The newest snapshot's id, if the set holds it.
    pub newest: Option<u64>,
    /// Whether the set holds every live snapshot (and there is at least one).
    pub every_snapshot: bool,
}

impl DeletionCheck {
    /// Whether the deletion needs `force`: it takes the newest or every snapshot.
    pub fn needs_force(&self) -> bool {
        self.newest.is_some() || self.every_snapshot
    }
}

/// The newest live snapshot: the highest id.
pub fn newest_snapshot(live: &[SnapshotInfo]) -> Option<u64> {
    live.iter().map(|s| s.id).max()
}

/// What deleting `ids` would do to the `live` snapshots (duplicates in `ids` are fine).
pub fn check_deletion(live: &[SnapshotInfo], ids: &[u64]) -> DeletionCheck {
    let wanted: BTreeSet<u64> = ids.iter().copied().collect();
    let live_ids: BTreeSet<u64> = live.iter().map(|s| s.id).collect();
    let newest = newest_snapshot(live).filter(|id| wanted.contains(id));
    let mut pinned: Vec<u64> = live
        .iter()
        .filter(|s| s.pinned && wanted.contains(&s.id))
        .map(|s| s.id)
        .collect();
    pinned.sort_unstable();
    pinned.dedup();
    DeletionCheck {
        unknown: wanted.difference(&live_ids).copied().collect(),
        pinned,
        newest,
        every_snapshot: !live_ids.is_empty() && live_ids.is_subset(&wanted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::Rank;

    fn live() -> Vec<SnapshotInfo> {
        (1..=4)
            .map(|id| SnapshotInfo {
                id,
                taken_at_us: id as i64,
                rank: Rank::NONE,
                pinned: id == 2,
            })
            .collect()
    }

    #[test]
    fn checks() {
        let s = live();
        assert_eq!(check_deletion(&s, &[1, 1, 3]), DeletionCheck::default());
        let c = check_deletion(&s, &[9, 2, 4, 9]);
        assert_eq!(c.unknown, [9]);
        assert_eq!(c.pinned, [2]);
        assert_eq!(c.newest, Some(4));
        assert!(!c.every_snapshot && c.needs_force());
        let c = check_deletion(&s, &[4, 3, 2, 1]);
        assert!(c.every_snapshot);
        assert_eq!(check_deletion(&[], &[]), DeletionCheck::default());
        assert_eq!(check_deletion(&[], &[1]).unknown, [1]);
        assert_eq!(newest_snapshot(&s), Some(4));
    }
}
