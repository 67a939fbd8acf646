//! The *delta* of a page image: what changed on a page between the image a block held before
//! (its *base*) and this one, written by the capture next to the new image so that a diff of
//! the two snapshots reads the few changed tuples instead of both whole images.
//!
//! A delta holds exactly what [`crate::diff::changed_tuples`] reports for the two views: the
//! tuples of the base not at the same line pointer with the same bytes in the new view
//! (*removed*), and those of the new view not so in the base (*added*), each list as a view
//! (`crate::view`) of its own. It depends only on the two contents, so it answers for any
//! pair of snapshots whose images of a block are the base and the new image, whichever
//! relation or snapshots they belong to.
//!
//! Layout (little-endian), version 1: a 16-byte header (version `u8` = 1, three zero bytes,
//! the byte length of the removed view `u32`, the base's image id `u64`), then the removed
//! view, then the added view. Views are a multiple of 8 bytes long, so in a delta stored at an
//! 8-byte aligned address both views are aligned as stored views are. A header with base 0
//! and nothing after it says *there is no delta* (what a reader is given for an image stored
//! without one).

use crate::diff::{changed_tuples, Change};
use crate::view::{self, ViewBuilder, ViewTuple};
use crate::{FormatError, Reader};

const VERSION: u8 = 1;
const HEADER: usize = 16;

/// A delta: the base image it starts from and the tuples that changed (two views, checked
/// as they are read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta<'a> {
    /// Image id of the base (never 0).
    pub base: u64,
    /// The view of the base's tuples that the new image does not have at the same line
    /// pointer.
    removed: &'a [u8],
    /// The view of the new image's tuples that the base does not have at the same line
    /// pointer.
    added: &'a [u8],
}

impl<'a> Delta<'a> {
    /// Calls `changed` for every tuple the delta holds, as [`changed_tuples`] would for the
    /// two views (removed tuples with [`Change::Removed`] first, then the added ones with
    /// [`Change::Added`]). A corrupt view is an error (after the tuples before it).
    pub fn for_each(
        &self,
        mut changed: impl FnMut(Change, ViewTuple<'a>),
    ) -> Result<(), FormatError> {
        view::each_tuple(self.removed, |t| changed(Change::Removed, t))?;
        view::each_tuple(self.added, |t| changed(Change::Added, t))
    }
}

/// The delta from view `before` (of image `base`) to view `after`.
pub fn between(base: u64, before: &[u8], after: &[u8]) -> Result<Vec<u8>, FormatError> {
    if base == 0 {
        return Err(FormatError::corrupt("a delta's base image id is 0"));
    }
    let (before, after) = (view::decode(before)?, view::decode(after)?);
    let (mut removed, mut added) = (ViewBuilder::new(), ViewBuilder::new());
    changed_tuples(&before, &after, |change, t| match change {
        Change::Removed => removed.push(t.lp, t.bytes),
        Change::Added => added.push(t.lp, t.bytes),
    });
    let (removed, added) = (removed.finish(), added.finish());
    let mut out = Vec::with_capacity(HEADER + removed.len() + added.len());
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&(removed.len() as u32).to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&removed);
    out.extend_from_slice(&added);
    Ok(out)
}

/// What stands for a delta that was not stored.
pub fn absent() -> Vec<u8> {
    let mut out = vec![0u8; HEADER];
    out[0] = VERSION;
    out
}

/// Decodes a delta, checking the layout: None for [`absent`].
pub fn decode(bytes: &[u8]) -> Result<Option<Delta<'_>>, FormatError> {
    let mut r = Reader::new(bytes, "page delta");
    r.version(VERSION)?;
    if r.take(3)? != [0, 0, 0] {
        return Err(FormatError::corrupt("page delta has a bad header"));
    }
    let removed_len = r.u32()? as usize;
    let base = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
    if base == 0 {
        r.end()?;
        return Ok(None);
    }
    if !removed_len.is_multiple_of(8) {
        return Err(FormatError::corrupt(format!(
            "page delta's removed view is {removed_len} bytes, not a multiple of 8"
        )));
    }
    let removed = r.take(removed_len)?;
    Ok(Some(Delta {
        base,
        removed,
        added: r.rest(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::decode as decode_view;
    use proptest::prelude::*;

    fn view_of(tuples: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = ViewBuilder::new();
        for (lp, t) in tuples {
            b.push(*lp, t);
        }
        b.finish()
    }

    /// What `changed_tuples` reports for the two views, as owned (change, lp, bytes).
    fn changes_of(before: &[u8], after: &[u8]) -> Vec<(Change, u16, Vec<u8>)> {
        let (b, a) = (view::decode(before).unwrap(), view::decode(after).unwrap());
        let mut out = Vec::new();
        changed_tuples(&b, &a, |c, t| out.push((c, t.lp, t.bytes.to_vec())));
        out
    }

    #[test]
    fn one_update_in_place_is_one_removed_and_one_added_tuple() {
        let before = view_of(&[(1, vec![1; 30]), (2, vec![2; 30]), (3, vec![3; 30])]);
        let after = view_of(&[(1, vec![1; 30]), (2, vec![9; 31]), (3, vec![3; 30])]);
        let bytes = between(7, &before, &after).unwrap();
        assert!(bytes.len() < before.len());
        let d = decode(&bytes).unwrap().unwrap();
        assert_eq!(d.base, 7);
        let (removed, added) = (
            decode_view(d.removed).unwrap(),
            decode_view(d.added).unwrap(),
        );
        assert_eq!(removed.len(), 1);
        assert_eq!((removed[0].lp, removed[0].bytes), (2, &[2u8; 30][..]));
        assert_eq!((added[0].lp, added[0].bytes), (2, &[9u8; 31][..]));
    }

    #[test]
    fn identical_views_have_an_empty_delta() {
        let v = view_of(&[(1, vec![1; 10])]);
        let d = between(3, &v, &v).unwrap();
        let d = decode(&d).unwrap().unwrap();
        let mut n = 0;
        d.for_each(|_, _| n += 1).unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn absent_decodes_to_none_and_base_zero_is_refused() {
        assert_eq!(decode(&absent()).unwrap(), None);
        let v = view::empty();
        assert!(between(0, &v, &v).is_err());
    }

    #[test]
    fn corrupt_deltas_are_errors_not_panics() {
        let before = view_of(&[(1, vec![1; 30])]);
        let after = view_of(&[(2, vec![2; 20])]);
        let good = between(5, &before, &after).unwrap();
        let check =
            |bytes: &[u8]| decode(bytes).and_then(|d| d.map_or(Ok(()), |d| d.for_each(|_, _| ())));
        for n in 0..good.len() {
            assert!(check(&good[..n]).is_err(), "truncated at {n}");
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[4] = 3; // the removed view's length, not a multiple of 8
        assert!(decode(&bad).is_err());
        let mut bad = good.clone();
        bad[4] = 8; // the views cut in the wrong place
        assert!(check(&bad).is_err());
        let mut longer = absent();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }

    fn tuples() -> impl Strategy<Value = Vec<(u16, Vec<u8>)>> {
        proptest::collection::btree_map(1u16..40, proptest::collection::vec(0u8..3, 0..12), 0..20)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        /// A delta reports exactly the changes of its two views, in the same order.
        #[test]
        fn delta_equals_changed_tuples(before in tuples(), after in tuples(), base in 1u64..) {
            let (b, a) = (view_of(&before), view_of(&after));
            let bytes = between(base, &b, &a).unwrap();
            prop_assert_eq!(bytes.len() % 8, 0);
            let d = decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(d.base, base);
            let mut got = Vec::new();
            d.for_each(|c, t| got.push((c, t.lp, t.bytes.to_vec()))).unwrap();
            let mut want = changes_of(&b, &a);
            // The delta lists removed tuples first; changed_tuples interleaves by line pointer.
            want.sort_by_key(|(c, lp, _)| (*c == Change::Added, *lp));
            prop_assert_eq!(got, want);
        }
    }
}
