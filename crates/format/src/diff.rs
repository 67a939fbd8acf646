//! The pure part of `gsnap_diff`: which tuples of one page differ between two views, and
//! which of the resulting rows only moved.
//!
//! A diff reads each page whose image differs between snapshots a and b once per side.
//! [`changed_tuples`] merges the two views by line pointer: a tuple at the same line pointer
//! with the same bytes on both sides is no change; every other tuple of side a is *removed*
//! and every other tuple of side b is *added* (an update in place is one of each). A side
//! where the page does not exist is an empty view.
//!
//! The changed tuples of all pages are then formed into rows of today's row type, and
//! [`cancel_moves`] drops the pairs that are one row moved (VACUUM FULL, CLUSTER, an update
//! that changed nothing): rows are compared by an identity key (the formed row's bytes), as
//! multisets: a row removed twice and added once is still removed once.
//!
//! Invariants: every input tuple is reported at most once and exactly once unless matched;
//! the result depends only on the inputs (no order of hash iteration leaks into it).

use crate::view::ViewTuple;
use foldhash::fast::RandomState;
use std::hash::{BuildHasher, Hash};

/// Which side a changed tuple or row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// In the first snapshot's view, not the second's.
    Removed,
    /// In the second snapshot's view, not the first's.
    Added,
}

/// Calls `changed` for every tuple of `before` and `after` (the views of one page at the two
/// snapshots) that is not at the same line pointer with the same bytes on the other side,
/// in line pointer order (at one line pointer, the removed tuple first).
///
/// Both lists should be in increasing line pointer order, as [`crate::view::decode`] returns
/// them; if they are not, every tuple is still reported at most once and every unmatched one
/// exactly once.
pub fn changed_tuples<'a>(
    before: &[ViewTuple<'a>],
    after: &[ViewTuple<'a>],
    mut changed: impl FnMut(Change, ViewTuple<'a>),
) {
    let (mut i, mut j) = (0, 0);
    loop {
        match (before.get(i), after.get(j)) {
            (Some(x), Some(y)) if x.lp == y.lp && x.bytes == y.bytes => {
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if y.lp < x.lp => {
                changed(Change::Added, *y);
                j += 1;
            }
            (Some(x), _) => {
                changed(Change::Removed, *x);
                i += 1;
            }
            (None, Some(y)) => {
                changed(Change::Added, *y);
                j += 1;
            }
            (None, None) => return,
        }
    }
}

/// The rows that remain changes once moved rows cancel out: indexes into the `removed` and
/// `added` lists given to [`cancel_moves`], each in increasing order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetChanges {
    /// Removed rows that were not added back.
    pub removed: Vec<usize>,
    /// Added rows that were not removed elsewhere.
    pub added: Vec<usize>,
}

/// Hashes rows' identity keys for [`cancel_moves_hashed`], with a random seed (foldhash:
/// rows crafted to collide would have to guess it to make the cancelling quadratic). A
/// caller hashes each key where it is still in the CPU's cache, as it forms the row.
#[derive(Debug, Clone, Default)]
pub struct KeyHasher(RandomState);

impl KeyHasher {
    /// A hasher with a new random seed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of `key`.
    pub fn hash<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.0.hash_one(key)
    }
}

/// Cancels rows removed in one place and added identically in another. `removed` and
/// `added` are the rows' identity keys. For a key removed r times and added a times, the
/// first `min(r, a)` occurrences on each side cancel, and the rest remain.
pub fn cancel_moves<K: Eq + Hash>(removed: &[K], added: &[K]) -> NetChanges {
    let hasher = KeyHasher::new();
    let removed: Vec<(u64, &K)> = removed.iter().map(|k| (hasher.hash(k), k)).collect();
    let added: Vec<(u64, &K)> = added.iter().map(|k| (hasher.hash(k), k)).collect();
    cancel_moves_hashed(&removed, &added)
}

/// [`cancel_moves`] of keys hashed by the caller (each `(hash, key)`, all hashed by one
/// [`KeyHasher`]): [`pair_hashed`] with the keys' equality.
pub fn cancel_moves_hashed<K: Eq>(removed: &[(u64, K)], added: &[(u64, K)]) -> NetChanges {
    let hashes = |side: &[(u64, K)]| side.iter().map(|(h, _)| *h).collect::<Vec<u64>>();
    let pairing = pair_hashed(&hashes(removed), &hashes(added), |r, a| {
        removed[r].1 == added[a].1
    });
    NetChanges {
        removed: pairing.removed,
        added: pairing.added,
    }
}

/// Removed and added rows paired: `pairs` of (removed, added) indices, in the order of the
/// added rows, then the indices of the rows left on each side, ascending.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pairing {
    pub pairs: Vec<(usize, usize)>,
    pub removed: Vec<usize>,
    pub added: Vec<usize>,
}

/// Pairs rows by hash and an equality the caller decides (`equal(removed, added)`, by
/// index; rows with different hashes are never compared): the removed rows are sorted by
/// hash, and each added row, in order, takes the first removed one not taken yet with the
/// same hash for which `equal` holds. Equal keys pair as multisets: a key removed r times
/// and added a times makes `min(r, a)` pairs.
pub fn pair_hashed(
    removed: &[u64],
    added: &[u64],
    mut equal: impl FnMut(usize, usize) -> bool,
) -> Pairing {
    let mut by_hash: Vec<(u64, usize)> = removed.iter().copied().zip(0..).collect();
    by_hash.sort_unstable();
    let mut taken = vec![false; removed.len()];
    let mut pairing = Pairing::default();
    for (a, h) in added.iter().enumerate() {
        let first = by_hash.partition_point(|&(x, _)| x < *h);
        let same = by_hash[first..]
            .iter()
            .take_while(|&&(x, _)| x == *h)
            .map(|&(_, r)| r)
            .find(|&r| !taken[r] && equal(r, a));
        match same {
            Some(r) => {
                taken[r] = true;
                pairing.pairs.push((r, a));
            }
            None => pairing.added.push(a),
        }
    }
    pairing.removed = (0..removed.len()).filter(|&r| !taken[r]).collect();
    pairing
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn t(lp: u16, bytes: &[u8]) -> ViewTuple<'_> {
        ViewTuple { lp, bytes }
    }

    fn changes<'a>(before: &[ViewTuple<'a>], after: &[ViewTuple<'a>]) -> Vec<(Change, u16)> {
        let mut out = Vec::new();
        changed_tuples(before, after, |c, t| out.push((c, t.lp)));
        out
    }

    #[test]
    fn merge_by_line_pointer() {
        let before = [t(1, b"a"), t(2, b"b"), t(4, b"d")];
        let after = [t(1, b"a"), t(2, b"B"), t(3, b"c")];
        assert_eq!(
            changes(&before, &after),
            vec![
                (Change::Removed, 2),
                (Change::Added, 2),
                (Change::Added, 3),
                (Change::Removed, 4),
            ]
        );
        assert_eq!(changes(&before, &before), vec![]);
        assert_eq!(changes(&[], &[]), vec![]);
        assert_eq!(
            changes(&[], &after),
            vec![(Change::Added, 1), (Change::Added, 2), (Change::Added, 3)]
        );
        assert_eq!(
            changes(&before, &[]),
            vec![
                (Change::Removed, 1),
                (Change::Removed, 2),
                (Change::Removed, 4)
            ]
        );
        // The same bytes at another line pointer are a change here (cancel_moves decides).
        assert_eq!(
            changes(&[t(1, b"x")], &[t(2, b"x")]),
            vec![(Change::Removed, 1), (Change::Added, 2)]
        );
    }

    #[test]
    fn pairs_by_equality_among_equal_hashes() {
        // Every row has the same hash: only `equal` tells them apart.
        let removed = ["k1", "k2", "k1", "k3"];
        let added = ["k2", "k1", "k4", "k1", "k1"];
        let pairing = pair_hashed(&[7; 4], &[7; 5], |r, a| removed[r] == added[a]);
        assert_eq!(
            pairing,
            Pairing {
                pairs: vec![(1, 0), (0, 1), (2, 3)],
                removed: vec![3],
                added: vec![2, 4],
            }
        );
        // Different hashes are never compared, even where `equal` would hold.
        let pairing = pair_hashed(&[1, 2], &[3, 2], |_, _| true);
        assert_eq!(pairing.pairs, vec![(1, 1)]);
        assert_eq!((pairing.removed, pairing.added), (vec![0], vec![0]));
        assert_eq!(pair_hashed(&[], &[], |_, _| true), Pairing::default());
    }

    #[test]
    fn moves_cancel_as_multisets() {
        let removed = ["a", "b", "a", "c"];
        let added = ["a", "d", "c", "c"];
        assert_eq!(
            cancel_moves(&removed, &added),
            NetChanges {
                removed: vec![1, 2],
                added: vec![1, 3],
            }
        );
        assert_eq!(cancel_moves::<&str>(&[], &[]), NetChanges::default());
        assert_eq!(
            cancel_moves(&["x"], &[]),
            NetChanges {
                removed: vec![0],
                added: vec![]
            }
        );
    }

    /// Tuples in increasing line pointer order from (gap, bytes) pairs.
    fn arb_view() -> impl Strategy<Value = Vec<(u16, Vec<u8>)>> {
        proptest::collection::vec((1u16..4, proptest::collection::vec(0u8..3, 0..3)), 0..10)
            .prop_map(|v| {
                let mut lp = 0;
                v.into_iter()
                    .map(|(gap, b)| {
                        lp += gap;
                        (lp, b)
                    })
                    .collect()
            })
    }

    fn multiset<K: Ord + Clone>(keys: impl IntoIterator<Item = K>) -> BTreeMap<K, usize> {
        let mut m = BTreeMap::new();
        for k in keys {
            *m.entry(k).or_default() += 1;
        }
        m
    }

    /// `a - b` as multisets.
    fn minus<K: Ord + Clone>(a: &BTreeMap<K, usize>, b: &BTreeMap<K, usize>) -> BTreeMap<K, usize> {
        a.iter()
            .filter_map(|(k, &n)| {
                let left = n.saturating_sub(b.get(k).copied().unwrap_or(0));
                (left > 0).then(|| (k.clone(), left))
            })
            .collect()
    }

    proptest! {
        #[test]
        fn merge_matches_the_model(before in arb_view(), after in arb_view()) {
            let b: Vec<ViewTuple<'_>> = before.iter().map(|(lp, x)| t(*lp, x)).collect();
            let a: Vec<ViewTuple<'_>> = after.iter().map(|(lp, x)| t(*lp, x)).collect();
            let mut removed = Vec::new();
            let mut added = Vec::new();
            let mut last = None;
            changed_tuples(&b, &a, |c, x| {
                let entry = (x.lp, x.bytes.to_vec());
                match c {
                    Change::Removed => removed.push(entry),
                    Change::Added => added.push(entry),
                }
                // line pointer order, removed before added at one line pointer
                let key = (x.lp, c == Change::Added);
                assert!(last < Some(key), "{last:?} then {key:?}");
                last = Some(key);
            });
            // Model: the views as sets of (lp, bytes); each side's changes are its set
            // minus the other's.
            let before_set = multiset(before.iter().cloned());
            let after_set = multiset(after.iter().cloned());
            prop_assert_eq!(multiset(removed), minus(&before_set, &after_set));
            prop_assert_eq!(multiset(added), minus(&after_set, &before_set));
        }

        #[test]
        fn merge_of_unsorted_views_reports_each_tuple_at_most_once(
            before in proptest::collection::vec((0u16..5, 0u8..2), 0..8),
            after in proptest::collection::vec((0u16..5, 0u8..2), 0..8),
        ) {
            let bb: Vec<[u8; 1]> = before.iter().map(|x| [x.1]).collect();
            let ab: Vec<[u8; 1]> = after.iter().map(|x| [x.1]).collect();
            let b: Vec<ViewTuple<'_>> = before.iter().zip(&bb).map(|(x, y)| t(x.0, y)).collect();
            let a: Vec<ViewTuple<'_>> = after.iter().zip(&ab).map(|(x, y)| t(x.0, y)).collect();
            let (mut removed, mut added) = (0, 0);
            changed_tuples(&b, &a, |c, _| match c {
                Change::Removed => removed += 1,
                Change::Added => added += 1,
            });
            // Matched tuples go in pairs: both sides lose the same number.
            prop_assert!(removed <= b.len() && added <= a.len());
            prop_assert_eq!(b.len() - removed, a.len() - added);
        }

        #[test]
        fn cancel_moves_is_multiset_difference(
            removed in proptest::collection::vec(0u8..5, 0..12),
            added in proptest::collection::vec(0u8..5, 0..12),
        ) {
            let net = cancel_moves(&removed, &added);
            prop_assert!(net.removed.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(net.added.windows(2).all(|w| w[0] < w[1]));
            let r = multiset(removed.iter().copied());
            let a = multiset(added.iter().copied());
            prop_assert_eq!(multiset(net.removed.iter().map(|&i| removed[i])), minus(&r, &a));
            prop_assert_eq!(multiset(net.added.iter().map(|&i| added[i])), minus(&a, &r));
            // The occurrences that cancel are the first ones of each key.
            for (list, kept) in [(&removed, &net.removed), (&added, &net.added)] {
                for (i, k) in list.iter().enumerate() {
                    if kept.contains(&i) {
                        let later = list[i + 1..].iter().enumerate()
                            .filter(|(_, x)| *x == k)
                            .all(|(d, _)| kept.contains(&(i + 1 + d)));
                        prop_assert!(later);
                    }
                }
            }
        }

        /// Keys that share a hash (the worst a weak hash could do) still cancel only when
        /// equal: the result is that of well-hashed keys.
        #[test]
        fn colliding_hashes_cancel_only_equal_keys(
            removed in proptest::collection::vec(0u8..5, 0..12),
            added in proptest::collection::vec(0u8..5, 0..12),
        ) {
            let collide = |keys: &[u8]| -> Vec<(u64, u8)> {
                keys.iter().map(|&k| (u64::from(k % 2), k)).collect()
            };
            let net = cancel_moves_hashed(&collide(&removed), &collide(&added));
            prop_assert_eq!(net, cancel_moves(&removed, &added));
        }
    }
}
