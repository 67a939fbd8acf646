//! Every distinct row version of a range of snapshots once, with the run of snapshots that
//! holds it: the cursor behind `gsnap_versions` (the set-returning function and the "gsnap
//! versions" custom scan) and the "gsnap range aggregate" node.
//!
//! A version is a tuple's bytes at one place (incarnation of the table, block, line pointer).
//! The range cursor (`super::range`) reads each block's images in snapshot order; in versions
//! mode it folds them into runs of consecutive snapshots with
//! `gsnap_format::runs::BlockRuns`, and reads an image from its *delta* (what the capture kept
//! of the tuples removed and added since the block's previous image, `gsnap_format::delta`)
//! when that previous image is the one read just before: unchanged versions continue without
//! being visited, so a range costs about its distinct versions, not versions x snapshots.
//!
//! Loads are queued per block in groups (pinned in one batch): the group's first run as an
//! image, each next run as its delta when it can apply (one row type, the snapshot right
//! after the previous run's). A delta that cannot be read as one (the image was stored
//! without a delta, or its base is not the previous run's image: a snapshot in between was
//! deleted and its image reclaimed) stops the batch at its group: the rest is queued again,
//! that run as its image (the deltas after it apply to that image). A cursor whose deltas are mostly missing (snapshots taken with
//! `gsnap.page_deltas = off` or before deltas existed) stops asking for them.
//!
//! A version that leaves and comes back, or whose snapshots are not consecutive (the block
//! was beyond the end of the table in between), is one row per run. Versions are matched only
//! between images read with one row type; across a change of the table's columns a version
//! starts a new run. A version's row is formed once, when it begins; the rows of a block are
//! freed once all its runs are handed out.

use super::pages::view_tuples;
use super::pins::{small_objects_per_batch, ImageBatches, PinnedBatch};
use super::range::{Holders, Kept, Load, RangeCursor};
use crate::error::corrupt;
use gsnap_core::ImageRun;
use gsnap_format::delta;
use gsnap_format::runs::BlockRuns;
use gsnap_protocol::DELTA_OF;
use pgrx::pg_sys;
use std::ops::Range;

/// How many runs of one block a group queues at most (its first is read as an image).
const GROUP_RUNS: usize = 64;

/// After how many deltas asked for a cursor judges whether they are worth asking for.
const DELTAS_JUDGED_AFTER: u64 = 256;

/// The state of a range cursor reading versions.
pub(super) struct Folding {
    fold: BlockRuns<Kept>,
    /// The block being folded (segment, block), and the row type (decoder) of its open runs.
    block: Option<(usize, u32)>,
    decoder: Option<usize>,
    /// Ended runs are handed out from `next_done`.
    next_done: usize,
    /// The load at `at - 1` is pinned but not folded yet (it begins another block, whose
    /// runs wait for the ones before to be handed out).
    pending: bool,
    ended: bool,
    /// Deltas are asked for; deltas asked and found missing so far.
    ask_deltas: bool,
    asked: u64,
    missing: u64,
    /// Of the batch pinned: where folding stops (the group of the first delta that cannot
    /// be read), and which of its loads are deltas that cannot.
    cut: Option<usize>,
    unusable: Vec<bool>,
    /// Images and deltas folded.
    images: u64,
    deltas: u64,
}

impl Folding {
    /// Whether queued runs are asked for as deltas.
    pub(super) fn asks_deltas(&self) -> bool {
        self.ask_deltas
    }

    /// Where folding `batch` stops.
    pub(super) fn end_of<K: Copy>(&self, batch: &PinnedBatch<K>) -> usize {
        self.cut.unwrap_or(batch.len())
    }
}

/// The positions of a run's snapshots and their row type, if they can be read from deltas:
/// one row type, consecutive positions (first, last, decoder).
fn shape(holders: &Holders) -> Option<(usize, usize, usize)> {
    let [(_, positions, decoder)] = holders.as_slice() else {
        return None;
    };
    let (&first, &last) = (positions.first()?, positions.last()?);
    (last - first + 1 == positions.len()).then_some((first, last, *decoder))
}

impl RangeCursor {
    /// Switches a new cursor to reading versions.
    fn fold_versions(&mut self) {
        self.images = ImageBatches::of_deltas();
        self.folding = Some(Box::new(Folding {
            fold: BlockRuns::new(),
            block: None,
            decoder: None,
            next_done: 0,
            pending: false,
            ended: false,
            ask_deltas: true,
            asked: 0,
            missing: 0,
            cut: None,
            unusable: Vec::new(),
            images: 0,
            deltas: 0,
        }));
    }

    /// What the worker is asked for to load `load`: its run's image id, with
    /// [`DELTA_OF`] for its delta.
    fn id_of(&self, load: Load) -> u64 {
        let image = self.runs[load.run].image.0;
        if load.delta {
            DELTA_OF | image
        } else {
            image
        }
    }

    /// Queues the loads of `runs[range]` (whole blocks) in groups of one block's runs: the
    /// first as an image, the next ones as deltas where one can apply.
    pub(super) fn queue_with_deltas(&mut self, range: Range<usize>) {
        let per_group = (small_objects_per_batch() / 4).clamp(1, GROUP_RUNS);
        let mut holders = Holders::new();
        let mut i = range.start;
        while i < range.end {
            let block = self.runs[i].block;
            let stop = i + self.runs[i..range.end].partition_point(|r| r.block == block);
            for start in (i..stop).step_by(per_group) {
                let mut group = Vec::new();
                let mut before = None;
                for run in start..(start + per_group).min(stop) {
                    self.holders_of(self.runs[run], &mut holders);
                    let now = shape(&holders);
                    let delta = matches!((before, now),
                        (Some((_, last, d0)), Some((first, _, d1))) if d0 == d1 && last + 1 == first);
                    let load = Load {
                        run,
                        delta,
                        group_start: run == start,
                    };
                    group.push((load, self.id_of(load)));
                    before = now;
                }
                self.images.push_group(&group);
            }
            i = stop;
        }
    }

    /// Checks the deltas of the batch just pinned: each must be stored, from the image of the
    /// run before it. The first that is not cuts the batch at its group.
    pub(super) fn check_deltas(&mut self) {
        let batch = self.batch.as_ref().expect("a batch was pinned");
        let folding = self.folding.as_mut().expect("reading versions");
        folding.cut = None;
        folding.unusable.clear();
        let mut group = 0;
        for j in 0..batch.len() {
            let (load, bytes) = batch.get(j);
            if load.group_start {
                group = j;
            }
            let mut unusable = false;
            if load.delta {
                folding.asked += 1;
                let base = self.runs[load.run - 1].image.0;
                unusable = match delta::decode(bytes) {
                    Ok(Some(d)) => d.base != base,
                    Ok(None) => true,
                    Err(e) => corrupt(format_args!(
                        "the delta of page image {} is corrupt: {e}",
                        self.runs[load.run].image.0
                    )),
                };
                if unusable {
                    folding.missing += 1;
                    folding.cut.get_or_insert(group);
                }
            }
            folding.unusable.push(unusable);
        }
        if folding.asked >= DELTAS_JUDGED_AFTER && folding.missing * 4 > folding.asked {
            folding.ask_deltas = false;
        }
    }

    /// Queues again, at the front, the loads of the batch after its cut, in their groups: the
    /// deltas that cannot be read as their images (a delta after one of them applies to that
    /// image), the others as they were.
    pub(super) fn requeue_rest(&mut self) {
        let Some(cut) = self.folding.as_ref().and_then(|f| f.cut) else {
            return;
        };
        let batch = self.batch.as_ref().expect("a batch is pinned");
        let folding = self.folding.as_ref().expect("reading versions");
        let mut groups: Vec<Vec<(Load, u64)>> = Vec::new();
        for j in cut..batch.len() {
            let mut load = batch.get(j).0;
            if load.group_start {
                groups.push(Vec::new());
            }
            load.delta &= !folding.unusable[j];
            groups
                .last_mut()
                .expect("a batch begins a group")
                .push((load, self.id_of(load)));
        }
        self.images.requeue_front(&groups);
        self.folding.as_mut().expect("reading versions").cut = None;
    }

    /// The next version: its run's first and last snapshots as positions among the range's
    /// snapshots that hold the table (`RangeCursor::snap_at`) and its `rec` datum (valid
    /// until the next call); None at the end. `keep(rec, snap)` is asked once per version.
    fn next_run_at(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(usize, usize, pg_sys::Datum)> {
        loop {
            let f = self.folding.as_mut().expect("reading versions");
            while let Some(r) = f.fold.done().get(f.next_done) {
                f.next_done += 1;
                if r.value.keep {
                    return Some((r.first, r.last, r.value.rec));
                }
            }
            f.fold.done().clear();
            f.next_done = 0;
            if f.ended {
                return None;
            }
            if !f.pending {
                if !self.next_load() {
                    let f = self.folding.as_mut().expect("reading versions");
                    f.fold.end_block();
                    f.ended = true;
                    continue;
                }
                self.folding.as_mut().expect("reading versions").pending = true;
            }
            let (load, _) = self
                .batch
                .as_ref()
                .expect("a load is pinned")
                .get(self.at - 1);
            let block = (self.loaded_segment, self.runs[load.run].block);
            let f = self.folding.as_mut().expect("reading versions");
            if f.block != Some(block) {
                if f.block.take().is_some() {
                    // The block before ends: its runs are handed out first.
                    f.fold.end_block();
                    continue;
                }
                // SAFETY: every run of the block before was handed out, and the caller is
                // done with the last one (it asked for the next).
                unsafe { self.block_cx.reset() };
                let f = self.folding.as_mut().expect("reading versions");
                f.block = Some(block);
                f.decoder = None;
            }
            self.folding.as_mut().expect("reading versions").pending = false;
            self.fold_load(load, keep);
        }
    }

    /// Folds the load pinned at `at - 1` (`load`) into the block's runs.
    fn fold_load(&mut self, load: Load, keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool) {
        let run: ImageRun = self.runs[load.run];
        let mut holders = std::mem::take(&mut self.holders);
        self.holders_of(run, &mut holders);
        self.image += 1;
        let first_snaps: Vec<u64> = holders.iter().map(|h| h.0[0]).collect();
        let RangeCursor {
            batch,
            at,
            decoders,
            block_cx,
            folding,
            tuples,
            ..
        } = self;
        let f = folding.as_mut().expect("reading versions");
        let bytes = batch.as_ref().expect("a load is pinned").get(*at - 1).1;
        let mut version = |decoder: usize, snap: u64, lp: u16, tuple: &[u8]| {
            let rec = decoders.form(decoder, block_cx, run.block, lp, tuple);
            Kept {
                rec,
                keep: keep(rec, snap),
            }
        };
        if load.delta {
            let Some((first, last, decoder)) = shape(&holders) else {
                unreachable!("a delta is asked for a run of one row type")
            };
            let d = delta::decode(bytes)
                .ok()
                .flatten()
                .expect("checked when the batch was pinned");
            f.fold
                .delta(&d, first..=last, |lp, t| {
                    version(decoder, first_snaps[0], lp, t)
                })
                .unwrap_or_else(|e| {
                    corrupt(format_args!(
                        "the delta of page image {} does not fit its base: {e}",
                        run.image.0
                    ))
                });
            f.deltas += 1;
        } else {
            view_tuples(bytes, run.block, tuples);
            let page =
                |&(lp, offset, len): &(u16, usize, usize)| (lp, &bytes[offset..offset + len]);
            if let [(_, positions, decoder)] = holders.as_slice() {
                let compare = f.decoder == Some(*decoder);
                f.fold.image(
                    tuples.iter().map(page),
                    positions,
                    compare,
                    true,
                    |lp, t| version(*decoder, first_snaps[0], lp, t),
                );
                f.decoder = Some(*decoder);
            } else {
                // Several row types: their versions are not matched with any other image's.
                for (g, (_, positions, decoder)) in holders.iter().enumerate() {
                    f.fold
                        .image(tuples.iter().map(page), positions, false, false, |lp, t| {
                            version(*decoder, first_snaps[g], lp, t)
                        });
                }
                f.decoder = None;
            }
            f.images += 1;
        }
        self.holders = holders;
    }
}

/// Reads every distinct row version of a range of snapshots once, with its run.
pub struct VersionsCursor {
    range: RangeCursor,
}

impl VersionsCursor {
    /// Reads the versions of `range` (a cursor no row was read from).
    pub fn new(mut range: RangeCursor) -> VersionsCursor {
        range.fold_versions();
        VersionsCursor { range }
    }

    /// The page images and deltas read so far (see [`RangeCursor::images_read`]).
    pub fn images_read(&self) -> u64 {
        self.range.images_read()
    }

    /// How the pages were read so far: (images, deltas).
    pub fn reads(&self) -> (u64, u64) {
        let f = self.range.folding.as_ref().expect("reading versions");
        (f.images, f.deltas)
    }

    /// The next version: its first and last snapshots and its `rec` datum (valid until the
    /// next call); None at the end. `keep(rec, snap)` is asked once per row version, with
    /// the first snapshot holding it.
    pub fn next_run(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(u64, u64, pg_sys::Datum)> {
        let (first, last, rec) = self.range.next_run_at(keep)?;
        Some((self.range.snap_at(first), self.range.snap_at(last), rec))
    }

    /// [`VersionsCursor::next_run`] with the run's first and last snapshots as positions
    /// among the range's snapshots that hold the table (`RangeCursor::snap_at`).
    pub fn next_run_at(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(usize, usize, pg_sys::Datum)> {
        self.range.next_run_at(keep)
    }
}
