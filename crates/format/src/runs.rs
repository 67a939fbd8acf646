//! The row versions of one block over a range of snapshots, folded into runs of consecutive
//! snapshots as the block's images are read in snapshot order: either whole images, or the
//! delta of an image from the one before it (`crate::delta`), which touches only the versions
//! that changed.
//!
//! A version is a tuple's bytes at one line pointer (see `crate::versions`): it continues from
//! one image to the next when the next image has the same bytes at the same line pointer and
//! is held by the snapshot right after the last one holding the previous image. Snapshots are
//! numbered by *position* (consecutive among the snapshots of the range that hold the table),
//! so "right after" is `last + 1`.
//!
//! Invariants: each line pointer has at most one open run; an open run ends at the last
//! position of the image it was last seen in; a delta applies only to the image the open runs
//! belong to (its removed tuples must be open, with the same bytes) and only at the next
//! position, so folding by deltas gives exactly the runs folding by images gives
//! (`crate::versions::version_runs`, checked by the property tests below).

use crate::delta::Delta;
use crate::diff::Change;
use crate::versions::Run;
use crate::FormatError;
use std::ops::RangeInclusive;

/// A run still open to continuation: where it began, the caller's value, and the version's
/// bytes (in [`BlockRuns`]'s buffer) to match the next whole image with.
#[derive(Debug, Clone)]
struct Open<T> {
    first: usize,
    value: T,
    offset: u32,
    len: u32,
    /// The image (a number of [`BlockRuns`]) that last held it.
    seen: u64,
}

/// Folds one block's images into runs of row versions (see the module's comment). Feed the
/// images in snapshot order with [`BlockRuns::image`] or [`BlockRuns::delta`], take the runs
/// that ended from [`BlockRuns::done`], and call [`BlockRuns::end_block`] after the block's
/// last image.
#[derive(Debug, Clone)]
pub struct BlockRuns<T> {
    /// Open runs by line pointer.
    open: Vec<Option<Open<T>>>,
    /// The bytes of the open versions (and of versions that ended in this block).
    bytes: Vec<u8>,
    /// The last position of the image the open runs belong to (None: no run is open).
    last: Option<usize>,
    /// Images read in this block.
    images: u64,
    done: Vec<Run<T>>,
}

impl<T> Default for BlockRuns<T> {
    fn default() -> Self {
        BlockRuns {
            open: Vec::new(),
            bytes: Vec::new(),
            last: None,
            images: 0,
            done: Vec::new(),
        }
    }
}

impl<T: Clone> BlockRuns<T> {
    /// A fold at the start of a block.
    pub fn new() -> Self {
        Self::default()
    }

    /// True if a delta can be applied next: runs are open, and `first` is the position right
    /// after their image's last.
    pub fn continues_at(&self, first: usize) -> bool {
        self.last.is_some_and(|l| l.checked_add(1) == Some(first))
    }

    /// Reads a whole image: its tuples `(line pointer, bytes)` in increasing line pointer
    /// order, held by the snapshots at `positions` (increasing, not empty; gaps break runs).
    /// `compare`: the image may continue the open runs (same row type); `continuable`: the
    /// next image may continue its versions. `value(lp, bytes)` makes a new version's value.
    pub fn image<'b>(
        &mut self,
        tuples: impl IntoIterator<Item = (u16, &'b [u8])>,
        positions: &[usize],
        compare: bool,
        continuable: bool,
        mut value: impl FnMut(u16, &'b [u8]) -> T,
    ) {
        let (Some(&start), Some(&end)) = (positions.first(), positions.last()) else {
            return;
        };
        let before = self.last.filter(|_| compare);
        if before.is_none() {
            self.end_open();
        }
        let adjacent = self.continues_at(start) && before.is_some();
        self.images += 1;
        let image = self.images;
        let mut prev_lp = 0u16;
        for (lp, bytes) in tuples {
            assert!(lp > prev_lp, "an image's tuples come in line pointer order");
            prev_lp = lp;
            let slot = lp as usize;
            if self.open.len() <= slot {
                self.open.resize_with(slot + 1, || None);
            }
            let same = self.open[slot]
                .as_ref()
                .is_some_and(|o| before.is_some() && self.bytes_of(o) == bytes);
            let (mut first, value, offset, len) = if same {
                let o = self.open[slot].take().expect("checked");
                if adjacent {
                    (o.first, o.value, o.offset, o.len)
                } else {
                    // The same version after a gap: the run before the gap ends.
                    let last = before.expect("compared");
                    self.done.push(Run {
                        lp,
                        first: o.first,
                        last,
                        value: o.value.clone(),
                    });
                    (start, o.value, o.offset, o.len)
                }
            } else {
                if let Some(o) = self.open[slot].take() {
                    self.end(lp, o);
                }
                let (offset, len) = self.keep_bytes(bytes);
                (start, value(lp, bytes), offset, len)
            };
            // Gaps in `positions` split the version into runs; the last one stays open.
            for w in positions.windows(2) {
                if w[1] != w[0] + 1 {
                    self.done.push(Run {
                        lp,
                        first,
                        last: w[0],
                        value: value.clone(),
                    });
                    first = w[1];
                }
            }
            if continuable {
                self.open[slot] = Some(Open {
                    first,
                    value,
                    offset,
                    len,
                    seen: image,
                });
            } else {
                self.done.push(Run {
                    lp,
                    first,
                    last: end,
                    value,
                });
            }
        }
        // The open runs this image does not hold end.
        for lp in 0..self.open.len() {
            if self.open[lp].as_ref().is_some_and(|o| o.seen != image) {
                let o = self.open[lp].take().expect("checked");
                self.end(lp as u16, o);
            }
        }
        self.last = continuable.then_some(end);
    }

    /// Reads the next image from its `delta` from the image the open runs belong to, held by
    /// the snapshots at `positions`. Versions the delta does not name continue; removed ones
    /// end; added ones begin, with `value(lp, bytes)`. Call only when
    /// [`BlockRuns::continues_at`] `(positions.start())`, with a delta whose base is that
    /// image. An error if the delta does not fit the open runs (a removed tuple that is not
    /// open with those bytes, an added one at a line pointer still open) or is corrupt; the
    /// fold is then left as it was before the failing tuple.
    pub fn delta<'b>(
        &mut self,
        delta: &Delta<'b>,
        positions: RangeInclusive<usize>,
        mut value: impl FnMut(u16, &'b [u8]) -> T,
    ) -> Result<(), FormatError> {
        let (start, end) = (*positions.start(), *positions.end());
        assert!(
            self.continues_at(start) && start <= end,
            "a delta applies at the position after the open runs' image"
        );
        let last = self.last.expect("checked");
        self.images += 1;
        let image = self.images;
        let mut failed = None;
        delta.for_each(|change, t| {
            if failed.is_some() {
                return;
            }
            let slot = t.lp as usize;
            let open = self.open.get(slot).and_then(Option::as_ref);
            match change {
                Change::Removed => match open {
                    Some(o) if self.bytes_of(o) == t.bytes => {
                        let o = self.open[slot].take().expect("checked");
                        self.done.push(Run {
                            lp: t.lp,
                            first: o.first,
                            last,
                            value: o.value,
                        });
                    }
                    _ => {
                        failed = Some(format!(
                            "a page delta removes a tuple at line pointer {} that its base \
                             does not hold",
                            t.lp
                        ))
                    }
                },
                Change::Added => {
                    if open.is_some() {
                        failed = Some(format!(
                            "a page delta adds a tuple at line pointer {} where its base \
                             keeps one",
                            t.lp
                        ));
                        return;
                    }
                    if self.open.len() <= slot {
                        self.open.resize_with(slot + 1, || None);
                    }
                    let (offset, len) = self.keep_bytes(t.bytes);
                    self.open[slot] = Some(Open {
                        first: start,
                        value: value(t.lp, t.bytes),
                        offset,
                        len,
                        seen: image,
                    });
                }
            }
        })?;
        if let Some(message) = failed {
            return Err(FormatError::corrupt(message));
        }
        // Every open run continues to this image.
        for o in self.open.iter_mut().flatten() {
            o.seen = image;
        }
        self.last = Some(end);
        Ok(())
    }

    /// The block ends: every open run ends, and the fold is ready for the next block.
    pub fn end_block(&mut self) {
        self.end_open();
        self.open.clear();
        self.bytes.clear();
        self.images = 0;
    }

    /// The runs that ended, for the caller to take.
    pub fn done(&mut self) -> &mut Vec<Run<T>> {
        &mut self.done
    }

    /// Ends every open run at the last position of their image.
    fn end_open(&mut self) {
        for lp in 0..self.open.len() {
            if let Some(o) = self.open[lp].take() {
                self.end(lp as u16, o);
            }
        }
        self.last = None;
    }

    /// Ends the open run `o` of line pointer `lp` at the last position of its image.
    fn end(&mut self, lp: u16, o: Open<T>) {
        let last = self
            .last
            .expect("a run is open only with its image's last position");
        self.done.push(Run {
            lp,
            first: o.first,
            last,
            value: o.value,
        });
    }

    fn bytes_of(&self, o: &Open<T>) -> &[u8] {
        &self.bytes[o.offset as usize..(o.offset + o.len) as usize]
    }

    fn keep_bytes(&mut self, bytes: &[u8]) -> (u32, u32) {
        let offset = self.bytes.len() as u32;
        self.bytes.extend_from_slice(bytes);
        (offset, bytes.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta;
    use crate::versions::{version_runs, HeldImage};
    use crate::view::{ViewBuilder, ViewTuple};
    use proptest::prelude::*;

    /// An image's tuples as owned (line pointer, bytes) pairs.
    type Image = Vec<(u16, Vec<u8>)>;

    fn view_of(image: &Image) -> Vec<u8> {
        let mut b = ViewBuilder::new();
        for (lp, bytes) in image {
            b.push(*lp, bytes);
        }
        b.finish()
    }

    fn tuples(image: &Image) -> impl Iterator<Item = (u16, &[u8])> {
        image.iter().map(|(lp, b)| (*lp, b.as_slice()))
    }

    /// Every run the fold gave, as (lp, bytes, first, last), sorted.
    fn runs(fold: &mut BlockRuns<Vec<u8>>) -> Vec<(u16, Vec<u8>, usize, usize)> {
        let mut got: Vec<_> = fold
            .done()
            .drain(..)
            .map(|r| (r.lp, r.value, r.first, r.last))
            .collect();
        got.sort();
        got
    }

    /// The runs `version_runs` gives for `held` (first, last, image), sorted as [`runs`].
    fn expected(held: &[(usize, usize, &Image)]) -> Vec<(u16, Vec<u8>, usize, usize)> {
        let tuples: Vec<Vec<ViewTuple<'_>>> = held
            .iter()
            .map(|(_, _, i)| {
                i.iter()
                    .map(|(lp, bytes)| ViewTuple { lp: *lp, bytes })
                    .collect()
            })
            .collect();
        let images: Vec<HeldImage<'_, '_>> = held
            .iter()
            .zip(&tuples)
            .map(|(&(first, last, _), tuples)| HeldImage {
                first,
                last,
                tuples,
            })
            .collect();
        let mut want: Vec<_> = version_runs(&images)
            .into_iter()
            .map(|v| (v.lp, v.bytes.to_vec(), v.first, v.last))
            .collect();
        want.sort();
        want
    }

    /// A block over a few snapshot positions: per position, absent or one of a few images.
    fn arb_block() -> impl Strategy<Value = Vec<Option<Image>>> {
        let image =
            proptest::collection::btree_map(1u16..7, proptest::collection::vec(0u8..3, 1..3), 0..6)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>());
        proptest::collection::vec(proptest::option::weighted(0.85, image), 0..12)
    }

    /// The block's image runs as the index reports them: consecutive positions holding the
    /// same image are one run (first, last, image).
    fn image_runs(block: &[Option<Image>]) -> Vec<(usize, usize, &Image)> {
        let mut held: Vec<(usize, usize, &Image)> = Vec::new();
        for (p, image) in block.iter().enumerate() {
            let Some(image) = image else { continue };
            match held.last_mut() {
                Some((_, last, i)) if *last + 1 == p && *i == image => *last = p,
                _ => held.push((p, p, image)),
            }
        }
        held
    }

    #[test]
    fn a_delta_ends_only_what_it_removes() {
        let i0: Image = vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())];
        let i1: Image = vec![
            (1, b"a".to_vec()),
            (2, b"B".to_vec()),
            (3, b"c".to_vec()),
            (4, b"d".to_vec()),
        ];
        let mut fold = BlockRuns::new();
        fold.image(tuples(&i0), &[0, 1], true, true, |_, b| b.to_vec());
        assert!(fold.continues_at(2) && !fold.continues_at(3));
        let d = delta::between(7, &view_of(&i0), &view_of(&i1)).unwrap();
        let d = delta::decode(&d).unwrap().unwrap();
        let mut made = Vec::new();
        fold.delta(&d, 2..=4, |lp, b| {
            made.push(lp);
            b.to_vec()
        })
        .unwrap();
        assert_eq!(made, vec![2, 4], "only the added versions are made");
        assert_eq!(runs(&mut fold), vec![(2, b"b".to_vec(), 0, 1)]);
        fold.end_block();
        assert_eq!(
            runs(&mut fold),
            vec![
                (1, b"a".to_vec(), 0, 4),
                (2, b"B".to_vec(), 2, 4),
                (3, b"c".to_vec(), 0, 4),
                (4, b"d".to_vec(), 2, 4)
            ]
        );
        assert!(!fold.continues_at(5), "a new block has nothing open");
    }

    #[test]
    fn a_delta_that_does_not_fit_is_an_error() {
        let i0: Image = vec![(1, b"a".to_vec())];
        let other: Image = vec![(1, b"x".to_vec())];
        let next: Image = vec![(1, b"y".to_vec())];
        // removes a tuple the open runs do not hold with those bytes
        let mut fold = BlockRuns::new();
        fold.image(tuples(&i0), &[0], true, true, |_, b| b.to_vec());
        let bytes = delta::between(7, &view_of(&other), &view_of(&next)).unwrap();
        let d = delta::decode(&bytes).unwrap().unwrap();
        let e = fold.delta(&d, 1..=1, |_, b| b.to_vec()).unwrap_err();
        assert!(
            e.to_string().contains("removes a tuple at line pointer 1"),
            "{e}"
        );
        // adds a tuple where the base keeps one
        let mut fold = BlockRuns::new();
        fold.image(tuples(&i0), &[0], true, true, |_, b| b.to_vec());
        let bytes = delta::between(7, &view_of(&vec![]), &view_of(&next)).unwrap();
        let d = delta::decode(&bytes).unwrap().unwrap();
        let e = fold.delta(&d, 1..=1, |_, b| b.to_vec()).unwrap_err();
        assert!(
            e.to_string().contains("adds a tuple at line pointer 1"),
            "{e}"
        );
    }

    #[test]
    fn images_of_several_row_types_end_their_runs_at_once() {
        let a: Image = vec![(1, b"a".to_vec())];
        let mut fold = BlockRuns::new();
        fold.image(tuples(&a), &[0, 1], true, true, |_, b| b.to_vec());
        // image at 2..3 is read with two row types: not compared, not continuable
        fold.image(tuples(&a), &[2], false, false, |_, _| b"a'".to_vec());
        fold.image(tuples(&a), &[3], false, false, |_, _| b"a''".to_vec());
        assert!(!fold.continues_at(4));
        fold.image(tuples(&a), &[4], true, true, |_, b| b.to_vec());
        fold.end_block();
        assert_eq!(
            runs(&mut fold),
            vec![
                (1, b"a".to_vec(), 0, 1),
                (1, b"a".to_vec(), 4, 4),
                (1, b"a'".to_vec(), 2, 2),
                (1, b"a''".to_vec(), 3, 3)
            ]
        );
    }

    proptest! {
        /// Whole images in their index runs give `version_runs`' runs.
        #[test]
        fn images_give_version_runs(block in arb_block()) {
            let held = image_runs(&block);
            let mut fold = BlockRuns::new();
            for &(first, last, image) in &held {
                let positions: Vec<usize> = (first..=last).collect();
                fold.image(tuples(image), &positions, true, true, |_, b| b.to_vec());
            }
            fold.end_block();
            prop_assert_eq!(runs(&mut fold), expected(&held));
        }

        /// Deltas, wherever one applies (the image right after the one before it), give the
        /// same runs as whole images; `use_delta` picks which adjacent images are read whole.
        #[test]
        fn deltas_give_version_runs(block in arb_block(), use_delta in proptest::collection::vec(any::<bool>(), 12)) {
            let held = image_runs(&block);
            let mut fold = BlockRuns::new();
            for (i, &(first, last, image)) in held.iter().enumerate() {
                if i > 0 && use_delta[i] && fold.continues_at(first) {
                    let bytes = delta::between(9, &view_of(held[i - 1].2), &view_of(image)).unwrap();
                    let d = delta::decode(&bytes).unwrap().unwrap();
                    fold.delta(&d, first..=last, |_, b| b.to_vec()).unwrap();
                } else {
                    let positions: Vec<usize> = (first..=last).collect();
                    fold.image(tuples(image), &positions, true, true, |_, b| b.to_vec());
                }
                prop_assert!(fold.continues_at(last + 1));
            }
            fold.end_block();
            prop_assert_eq!(runs(&mut fold), expected(&held));
        }

        /// An image the index shares across a gap (the block beyond the table's end between
        /// its snapshots) comes once, with positions that are not consecutive.
        #[test]
        fn images_across_gaps_give_version_runs(block in arb_block(), bridge in proptest::collection::vec(any::<bool>(), 12)) {
            let mut handed: Vec<(Vec<usize>, &Image)> = Vec::new();
            let mut single = Vec::new();
            for (p, image) in block.iter().enumerate() {
                let Some(image) = image else { continue };
                single.push((p, p, image));
                match handed.last_mut() {
                    Some((positions, i)) if *i == image
                        && (positions.last() == Some(&(p - 1)) || bridge[p]) => positions.push(p),
                    _ => handed.push((vec![p], image)),
                }
            }
            let mut fold = BlockRuns::new();
            for (positions, image) in &handed {
                fold.image(tuples(image), positions, true, true, |_, b| b.to_vec());
            }
            fold.end_block();
            prop_assert_eq!(runs(&mut fold), expected(&single));
        }
    }
}
