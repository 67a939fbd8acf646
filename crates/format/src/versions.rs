//! Row versions across consecutive images of one block: which tuples of an image are the
//! same row version as in the block's previous image.
//!
//! A range reads, per block, the runs of snapshots that share one image, in snapshot order.
//! A tuple at the same line pointer with the same bytes as in the block's previous image is
//! the same row version: same place, same contents, so the same decoded row. The range
//! cursor uses that to decode and filter each version once ([`VersionMatcher`]), and
//! `gsnap_versions` (every distinct row version of a range once, with the run of snapshots
//! holding it) is [`version_runs`] (the model; `crate::runs::BlockRuns` folds them as a
//! stream, from images or deltas): a version that leaves the block and comes back is two
//! versions, as is one whose bytes changed and changed back.
//!
//! Invariants: a tuple is matched only with a previous tuple at the same line pointer and
//! with equal bytes, and each previous version is matched at most once per image (line
//! pointers are unique within an image).

use crate::view::ViewTuple;

/// What a [`VersionMatcher`] must know of a kept row version; the rest (the decoded row,
/// whether a filter kept it) is the caller's.
pub trait RowVersion {
    /// The tuple's line pointer.
    fn lp(&self) -> u16;
    /// The tuple's bytes.
    fn bytes(&self) -> &[u8];
}

/// A row version that owns a copy of its tuple, with the caller's `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned<T> {
    /// Line pointer.
    pub lp: u16,
    /// The tuple's bytes.
    pub bytes: Vec<u8>,
    /// What the caller keeps per version.
    pub value: T,
}

impl<T> RowVersion for Owned<T> {
    fn lp(&self) -> u16 {
        self.lp
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// For each tuple of `current` (an image's tuples, by increasing line pointer), the index in
/// `previous` (the versions of the block's previous image, by increasing line pointer) of the
/// same row version, or `None` for a new one.
pub fn match_image<V: RowVersion>(previous: &[V], current: &[ViewTuple<'_>]) -> Vec<Option<usize>> {
    let mut at = 0;
    current
        .iter()
        .map(|t| same_as(previous, &mut at, t.lp, t.bytes))
        .collect()
}

/// Advances `at` past the versions of `previous` before `lp`, and returns the version at `lp`
/// if it has these bytes.
fn same_as<V: RowVersion>(previous: &[V], at: &mut usize, lp: u16, bytes: &[u8]) -> Option<usize> {
    while previous.get(*at).is_some_and(|v| v.lp() < lp) {
        *at += 1;
    }
    let v = previous.get(*at)?;
    (v.lp() == lp && v.bytes() == bytes).then_some(*at)
}

/// Matches the tuples of a block's images, one image after the other, with the versions kept
/// from the previous image.
///
/// Per image: ask [`VersionMatcher::same_as_before`] for each tuple in line pointer order,
/// hand every version of the image (matched or new) to [`VersionMatcher::keep`], then call
/// [`VersionMatcher::end_image`]. Call [`VersionMatcher::forget`] when the next image is not
/// comparable with the previous one (another block, another row type).
#[derive(Debug, Clone)]
pub struct VersionMatcher<V> {
    previous: Vec<V>,
    current: Vec<V>,
    at: usize,
}

impl<V> Default for VersionMatcher<V> {
    fn default() -> Self {
        VersionMatcher {
            previous: Vec::new(),
            current: Vec::new(),
            at: 0,
        }
    }
}

impl<V: RowVersion> VersionMatcher<V> {
    /// A matcher with no previous image.
    pub fn new() -> Self {
        Self::default()
    }

    /// The versions of the previous image, by line pointer.
    pub fn previous(&self) -> &[V] {
        &self.previous
    }

    /// The version of line pointer `lp` in the previous image if it had these `bytes`. Within
    /// one image, ask in increasing line pointer order.
    pub fn same_as_before(&mut self, lp: u16, bytes: &[u8]) -> Option<&V> {
        let k = same_as(&self.previous, &mut self.at, lp, bytes)?;
        Some(&self.previous[k])
    }

    /// Records a version of the current image (in increasing line pointer order).
    pub fn keep(&mut self, version: V) {
        self.current.push(version);
    }

    /// The current image is complete: its versions become the previous ones.
    pub fn end_image(&mut self) {
        std::mem::swap(&mut self.previous, &mut self.current);
        self.current.clear();
        self.at = 0;
    }

    /// Forgets every version: the next image is compared with nothing.
    pub fn forget(&mut self) {
        self.previous.clear();
        self.current.clear();
        self.at = 0;
    }
}

/// [`VersionMatcher`] for readers that keep a value per version (the decoded row) and copy
/// each image's tuples once into one buffer, instead of one allocation per tuple: it matches
/// the same way (same line pointer, same bytes as in the previous image).
#[derive(Debug, Clone)]
pub struct ImageMatcher<T> {
    /// The previous image's tuples, by line pointer: (lp, offset, length in `previous_bytes`,
    /// value); the current image's, being kept.
    previous: Vec<(u16, u32, u32, T)>,
    previous_bytes: Vec<u8>,
    current: Vec<(u16, u32, u32, T)>,
    current_bytes: Vec<u8>,
    at: usize,
}

impl<T> Default for ImageMatcher<T> {
    fn default() -> Self {
        ImageMatcher {
            previous: Vec::new(),
            previous_bytes: Vec::new(),
            current: Vec::new(),
            current_bytes: Vec::new(),
            at: 0,
        }
    }
}

impl<T> ImageMatcher<T> {
    /// A matcher with no previous image.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value kept for line pointer `lp` in the previous image if it had these `bytes`.
    /// Within one image, ask in increasing line pointer order.
    pub fn same_as_before(&mut self, lp: u16, bytes: &[u8]) -> Option<&T> {
        while self.previous.get(self.at).is_some_and(|v| v.0 < lp) {
            self.at += 1;
        }
        let (vlp, offset, len, value) = self.previous.get(self.at)?;
        let (offset, len) = (*offset as usize, *len as usize);
        (*vlp == lp && &self.previous_bytes[offset..offset + len] == bytes).then_some(value)
    }

    /// Records a version of the current image (in increasing line pointer order).
    pub fn keep(&mut self, lp: u16, bytes: &[u8], value: T) {
        let offset = self.current_bytes.len() as u32;
        self.current_bytes.extend_from_slice(bytes);
        self.current.push((lp, offset, bytes.len() as u32, value));
    }

    /// The current image is complete: its versions become the previous ones.
    pub fn end_image(&mut self) {
        std::mem::swap(&mut self.previous, &mut self.current);
        std::mem::swap(&mut self.previous_bytes, &mut self.current_bytes);
        self.current.clear();
        self.current_bytes.clear();
        self.at = 0;
    }

    /// Forgets every version: the next image is compared with nothing.
    pub fn forget(&mut self) {
        self.previous.clear();
        self.previous_bytes.clear();
        self.current.clear();
        self.current_bytes.clear();
        self.at = 0;
    }
}

/// One image of a block, held by the consecutive snapshots at positions `first..=last` of the
/// range's snapshots (positions, not ids, so that "consecutive" is plain arithmetic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldImage<'i, 't> {
    /// Position of the first snapshot holding the image.
    pub first: usize,
    /// Position of the last snapshot holding it.
    pub last: usize,
    /// The image's tuples, by increasing line pointer.
    pub tuples: &'i [ViewTuple<'t>],
}

/// A row version of a block and the consecutive snapshots (by position) that hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRun<'t> {
    /// Line pointer.
    pub lp: u16,
    /// The tuple's bytes.
    pub bytes: &'t [u8],
    /// Position of the first snapshot holding the version.
    pub first: usize,
    /// Position of the last one.
    pub last: usize,
}

/// Every row version of one block over a range and the run of snapshots holding it, from the
/// block's images in snapshot order. A version continues from one image to the next only if
/// the images are adjacent (`next.first == previous.last + 1`: snapshots where the block is
/// absent, or beyond the table's size, break a run) and it is at the same line pointer with
/// the same bytes. The result is ordered by first snapshot, then line pointer.
pub fn version_runs<'t>(images: &[HeldImage<'_, 't>]) -> Vec<VersionRun<'t>> {
    let mut done = Vec::new();
    let mut open: Vec<VersionRun<'t>> = Vec::new();
    let mut last: Option<usize> = None;
    for image in images {
        let adjacent = last.is_some_and(|l| l.checked_add(1) == Some(image.first));
        if !adjacent {
            done.append(&mut open);
        }
        let matches = match_image(&open, image.tuples);
        let mut next = Vec::with_capacity(image.tuples.len());
        let mut continued = vec![false; open.len()];
        for (t, m) in image.tuples.iter().zip(matches) {
            match m {
                Some(k) if !continued[k] => {
                    continued[k] = true;
                    next.push(VersionRun {
                        last: image.last,
                        ..open[k]
                    });
                }
                _ => next.push(VersionRun {
                    lp: t.lp,
                    bytes: t.bytes,
                    first: image.first,
                    last: image.last,
                }),
            }
        }
        done.extend(
            open.into_iter()
                .zip(continued)
                .filter(|(_, c)| !c)
                .map(|(v, _)| v),
        );
        open = next;
        last = Some(image.last);
    }
    done.append(&mut open);
    done.sort_by_key(|v| (v.first, v.lp));
    done
}

/// A run of a row version folded by [`crate::runs::BlockRuns`]: its line pointer, the
/// positions of its first and last snapshots, and the caller's value (the decoded row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run<T> {
    /// Line pointer.
    pub lp: u16,
    /// Position of the first snapshot holding the version.
    pub first: usize,
    /// Position of the last one.
    pub last: usize,
    /// What the caller keeps per version.
    pub value: T,
}

impl RowVersion for VersionRun<'_> {
    fn lp(&self) -> u16 {
        self.lp
    }

    fn bytes(&self) -> &[u8] {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn t(lp: u16, bytes: &[u8]) -> ViewTuple<'_> {
        ViewTuple { lp, bytes }
    }

    fn owned(lp: u16, bytes: &[u8], value: u32) -> Owned<u32> {
        Owned {
            lp,
            bytes: bytes.to_vec(),
            value,
        }
    }

    #[test]
    fn matcher_reuses_unchanged_versions() {
        let mut m = VersionMatcher::new();
        let mut decoded = 0;
        let mut read = |m: &mut VersionMatcher<Owned<u32>>, image: &[ViewTuple<'_>]| {
            let mut values = Vec::new();
            for t in image {
                let v = match m.same_as_before(t.lp, t.bytes) {
                    Some(v) => v.clone(),
                    None => {
                        decoded += 1;
                        owned(t.lp, t.bytes, decoded)
                    }
                };
                values.push(v.value);
                m.keep(v);
            }
            m.end_image();
            values
        };
        assert_eq!(read(&mut m, &[t(1, b"a"), t(2, b"b")]), vec![1, 2]);
        // lp 1 unchanged, lp 2 updated in place, lp 3 new
        assert_eq!(
            read(&mut m, &[t(1, b"a"), t(2, b"B"), t(3, b"c")]),
            vec![1, 3, 4]
        );
        // lp 1 gone; lp 2 back to "b" (a new version: compared with the previous image only)
        assert_eq!(read(&mut m, &[t(2, b"b"), t(3, b"c")]), vec![5, 4]);
        m.forget();
        assert_eq!(read(&mut m, &[t(3, b"c")]), vec![6]);
        assert_eq!(m.previous().len(), 1);
    }

    #[test]
    fn runs_of_versions() {
        let i0 = [t(1, b"a"), t(2, b"b")];
        let i1 = [t(1, b"a"), t(2, b"B")];
        let i2 = [t(1, b"a"), t(2, b"b")];
        let runs = version_runs(&[
            HeldImage {
                first: 0,
                last: 1,
                tuples: &i0,
            },
            HeldImage {
                first: 2,
                last: 2,
                tuples: &i1,
            },
            HeldImage {
                first: 3,
                last: 4,
                tuples: &i2,
            },
            // the block is absent at position 5
            HeldImage {
                first: 6,
                last: 6,
                tuples: &i2,
            },
        ]);
        let got: Vec<_> = runs
            .iter()
            .map(|v| (v.lp, v.bytes, v.first, v.last))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, &b"a"[..], 0, 4),
                (2, &b"b"[..], 0, 1),
                (2, &b"B"[..], 2, 2),
                (2, &b"b"[..], 3, 4),
                (1, &b"a"[..], 6, 6),
                (2, &b"b"[..], 6, 6),
            ]
        );
        assert_eq!(version_runs(&[]), vec![]);
    }

    /// An image's tuples as owned (line pointer, bytes) pairs.
    type Image = Vec<(u16, Vec<u8>)>;

    /// A block over a few snapshot positions: per position, absent or one of a few images.
    fn arb_block() -> impl Strategy<Value = Vec<Option<Image>>> {
        let image =
            proptest::collection::btree_map(1u16..6, proptest::collection::vec(0u8..2, 1..2), 0..5)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>());
        proptest::collection::vec(proptest::option::weighted(0.85, image), 0..10)
    }

    proptest! {
        #[test]
        fn match_image_matches_the_model(
            previous in proptest::collection::btree_map(1u16..8, 0u8..2, 0..6),
            current in proptest::collection::btree_map(1u16..8, 0u8..2, 0..6),
        ) {
            let prev: Vec<Owned<()>> = previous.iter().map(|(&lp, &b)| Owned { lp, bytes: vec![b], value: () }).collect();
            let bytes: Vec<[u8; 1]> = current.values().map(|&b| [b]).collect();
            let cur: Vec<ViewTuple<'_>> = current.keys().zip(&bytes).map(|(&lp, b)| t(lp, b)).collect();
            let got = match_image(&prev, &cur);
            prop_assert_eq!(got.len(), cur.len());
            for (c, m) in cur.iter().zip(&got) {
                let model = prev.iter().position(|p| p.lp == c.lp && p.bytes == c.bytes);
                prop_assert_eq!(*m, model);
            }
        }

        /// Consecutive snapshots holding the same image are one image run, as the index
        /// reports them; the versions equal those computed snapshot by snapshot.
        #[test]
        fn version_runs_match_the_model(block in arb_block()) {
            let images: Vec<Option<Vec<ViewTuple<'_>>>> = block.iter().map(|i| i.as_ref().map(|ts| {
                ts.iter().map(|(lp, b)| t(*lp, b)).collect()
            })).collect();
            let mut held = Vec::new();
            let mut p = 0;
            while p < images.len() {
                let mut q = p;
                while q + 1 < images.len() && images[q + 1] == images[p] {
                    q += 1;
                }
                if let Some(tuples) = &images[p] {
                    held.push(HeldImage { first: p, last: q, tuples });
                }
                p = q + 1;
            }
            let got: BTreeSet<(usize, u16, Vec<u8>, usize)> = version_runs(&held)
                .into_iter()
                .map(|v| (v.first, v.lp, v.bytes.to_vec(), v.last))
                .collect();
            // Model: at each position, the set of (lp, bytes); a version is a maximal run of
            // positions holding it.
            let at = |p: usize| -> BTreeSet<(u16, Vec<u8>)> {
                block.get(p).cloned().flatten().unwrap_or_default().into_iter().collect()
            };
            let mut model = BTreeSet::new();
            for p in 0..block.len() {
                for v in at(p) {
                    if p > 0 && at(p - 1).contains(&v) {
                        continue;
                    }
                    let mut q = p;
                    while q + 1 < block.len() && at(q + 1).contains(&v) {
                        q += 1;
                    }
                    model.insert((p, v.0, v.1, q));
                }
            }
            prop_assert_eq!(&got, &model);
            // Ordered by first snapshot, then line pointer, and no snapshot holds two versions
            // at one line pointer.
            let runs = version_runs(&held);
            prop_assert!(runs.windows(2).all(|w| (w[0].first, w[0].lp) < (w[1].first, w[1].lp)));
        }

        /// The buffer-backed matcher answers as the per-tuple one does, image after image.
        #[test]
        fn image_matcher_equals_version_matcher(block in arb_block(), forget_at in 0usize..12) {
            let mut a: VersionMatcher<Owned<usize>> = VersionMatcher::new();
            let mut b: ImageMatcher<usize> = ImageMatcher::new();
            let mut n = 0;
            for (i, image) in block.iter().enumerate() {
                if i == forget_at {
                    a.forget();
                    b.forget();
                }
                for (lp, bytes) in image.iter().flatten() {
                    let va = a.same_as_before(*lp, bytes).map(|v| v.value);
                    let vb = b.same_as_before(*lp, bytes).copied();
                    prop_assert_eq!(va, vb);
                    let value = va.unwrap_or_else(|| { n += 1; n });
                    a.keep(Owned { lp: *lp, bytes: bytes.clone(), value });
                    b.keep(*lp, bytes, value);
                }
                a.end_image();
                b.end_image();
            }
        }

        /// Split image runs (one snapshot each) give the same versions as merged ones.
        #[test]
        fn splitting_image_runs_changes_nothing(block in arb_block()) {
            let images: Vec<Option<Vec<ViewTuple<'_>>>> = block.iter().map(|i| i.as_ref().map(|ts| {
                ts.iter().map(|(lp, b)| t(*lp, b)).collect()
            })).collect();
            let single: Vec<HeldImage<'_, '_>> = images.iter().enumerate()
                .filter_map(|(p, i)| i.as_ref().map(|tuples| HeldImage { first: p, last: p, tuples }))
                .collect();
            let mut merged: Vec<HeldImage<'_, '_>> = Vec::new();
            for h in &single {
                match merged.last_mut() {
                    Some(m) if m.last + 1 == h.first && m.tuples == h.tuples => m.last = h.last,
                    _ => merged.push(*h),
                }
            }
            prop_assert_eq!(version_runs(&single), version_runs(&merged));
        }
    }
}
