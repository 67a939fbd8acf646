//! Pages a later capture must include: what a drained dirty set, an unsettled page, a failed
//! declaration or a failed capture hands on to the next capture.
//!
//! A [`CarryForward`] is built from a [`Drained`] dirty set or from a list of pages, and
//! absorbs others: the result covers every page and every full capture of both, so handing
//! work on never loses any (absorbing is a set union). It lives in the worker's memory, not
//! in shared memory; it is here, next to [`Drained`], because it is the dirty sets' output.
//!
//! Invariants: `pages` is sorted and without duplicates (every constructor and every change
//! keeps it so), which [`CarryForward::blocks_of`] relies on; a relation marked for a full
//! capture stays marked until the value is dropped.

use crate::dirty::Drained;
use std::collections::BTreeSet;

/// Pages (by table OID and block) and full captures that a later capture must include.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CarryForward {
    /// (table OID, block), sorted and distinct.
    pages: Vec<(u32, u32)>,
    /// Tables to capture completely.
    full: BTreeSet<u32>,
    /// Capture every table completely.
    all: bool,
}

impl CarryForward {
    /// What a retired dirty set holds.
    pub fn from_drained(d: Drained) -> CarryForward {
        let mut c = CarryForward {
            pages: d.pages,
            full: d.full_relations.into_iter().collect(),
            all: d.all_full,
        };
        // Drained pages are sorted and distinct already; this keeps the invariant even if a
        // Drained was made by hand.
        c.normalize();
        c
    }

    /// The pages `pages` (in any order, duplicates allowed), and no full capture.
    pub fn from_pages(pages: Vec<(u32, u32)>) -> CarryForward {
        let mut c = CarryForward {
            pages,
            ..CarryForward::default()
        };
        c.normalize();
        c
    }

    /// Adds everything `other` covers.
    pub fn absorb(&mut self, other: CarryForward) {
        if self.pages.is_empty() {
            self.pages = other.pages;
        } else if !other.pages.is_empty() {
            self.pages.extend(other.pages);
            self.normalize();
        }
        self.full.extend(other.full);
        self.all |= other.all;
    }

    /// Marks `relid` for a full capture.
    pub fn mark_full(&mut self, relid: u32) {
        self.full.insert(relid);
    }

    /// True if `relid` must be captured completely.
    pub fn needs_full(&self, relid: u32) -> bool {
        self.all || self.full.contains(&relid)
    }

    /// The pages, sorted by (table OID, block), without duplicates.
    pub fn pages(&self) -> &[(u32, u32)] {
        &self.pages
    }

    /// The tables marked for a full capture (not counting "every table").
    pub fn full_relations(&self) -> &BTreeSet<u32> {
        &self.full
    }

    /// True if every table must be captured completely.
    pub fn all_full(&self) -> bool {
        self.all
    }

    /// True if nothing is carried.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.full.is_empty() && !self.all
    }

    /// The blocks of `relid` among the pages, in increasing order.
    pub fn blocks_of(&self, relid: u32) -> impl Iterator<Item = u32> + '_ {
        let start = self.pages.partition_point(|&(r, _)| r < relid);
        self.pages[start..]
            .iter()
            .take_while(move |&&(r, _)| r == relid)
            .map(|&(_, b)| b)
    }

    fn normalize(&mut self) {
        self.pages.sort_unstable();
        self.pages.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn from_drained_and_pages() {
        let c = CarryForward::from_drained(Drained {
            pages: vec![(5, 2), (5, 1), (3, 9), (5, 1)],
            full_relations: vec![7],
            all_full: false,
            overflowed_relations: 0,
        });
        assert_eq!(c.pages(), &[(3, 9), (5, 1), (5, 2)]);
        assert!(c.needs_full(7) && !c.needs_full(5));
        assert_eq!(c.blocks_of(5).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(c.blocks_of(4).count(), 0);
        assert!(!c.is_empty());
        let p = CarryForward::from_pages(vec![(1, 1), (1, 1)]);
        assert_eq!(p.pages(), &[(1, 1)]);
        assert!(!p.needs_full(1) && !p.all_full());
        assert!(CarryForward::default().is_empty());
        let mut all = CarryForward::default();
        all.absorb(CarryForward::from_drained(Drained {
            all_full: true,
            ..Drained::default()
        }));
        assert!(all.needs_full(12345) && all.all_full());
        all.mark_full(3);
        assert!(all.full_relations().contains(&3));
    }

    fn arb_carry() -> impl Strategy<Value = CarryForward> {
        (
            proptest::collection::vec((0u32..4, 0u32..20), 0..30),
            proptest::collection::btree_set(0u32..6, 0..3),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(pages, full, all)| {
                let mut c = CarryForward::from_pages(pages);
                for r in full {
                    c.mark_full(r);
                }
                if all {
                    c.absorb(CarryForward::from_drained(Drained {
                        all_full: true,
                        ..Drained::default()
                    }));
                }
                c
            })
    }

    proptest! {
        #[test]
        fn absorb_is_a_set_union(a in arb_carry(), b in arb_carry()) {
            let mut u = a.clone();
            u.absorb(b.clone());
            let pages: BTreeSet<_> = a.pages().iter().chain(b.pages()).copied().collect();
            prop_assert_eq!(u.pages(), &pages.into_iter().collect::<Vec<_>>()[..]);
            let full: BTreeSet<_> = a.full_relations().union(b.full_relations()).copied().collect();
            prop_assert_eq!(u.full_relations(), &full);
            prop_assert_eq!(u.all_full(), a.all_full() || b.all_full());
            for r in 0..8 {
                prop_assert_eq!(u.needs_full(r), a.needs_full(r) || b.needs_full(r));
            }
            // commutative, and idempotent
            let mut v = b.clone();
            v.absorb(a.clone());
            prop_assert_eq!(&u, &v);
            let mut w = u.clone();
            w.absorb(a);
            prop_assert_eq!(&w, &u);
        }

        #[test]
        fn blocks_of_lists_exactly_one_relations_blocks(pages in proptest::collection::vec((0u32..4, 0u32..20), 0..40)) {
            let c = CarryForward::from_pages(pages.clone());
            prop_assert!(c.pages().windows(2).all(|w| w[0] < w[1]));
            for r in 0..5 {
                let got: Vec<u32> = c.blocks_of(r).collect();
                let want: BTreeSet<u32> = pages.iter().filter(|p| p.0 == r).map(|p| p.1).collect();
                prop_assert_eq!(got, want.into_iter().collect::<Vec<_>>());
            }
        }

        #[test]
        fn needs_full_follows_the_marks(
            full in proptest::collection::btree_set(0u32..6, 0..4),
            all in any::<bool>(),
            probe in 0u32..8,
        ) {
            let c = CarryForward::from_drained(Drained {
                full_relations: full.iter().copied().collect(),
                all_full: all,
                ..Drained::default()
            });
            prop_assert_eq!(c.needs_full(probe), all || full.contains(&probe));
        }
    }
}
