//! Every distinct row version of a range of snapshots once, with the run of snapshots that
//! holds it: the cursor behind `gsnap_versions`, shared by the set-returning function and the
//! "gsnap versions" custom scan.
//!
//! A version is a tuple's bytes at one place (incarnation of the table, block, line pointer).
//! The range cursor hands each version out once per image of its block, and says when it
//! continues the version of the block's previous image (same line pointer, same bytes); this
//! cursor folds those into runs of consecutive snapshots (consecutive among the snapshots of
//! the range that hold the table) with `gsnap_format::versions::RunFolder`. A version is
//! handed out once its run has ended: when the next image of its block does not hold it, or
//! at the block's end. A version that leaves and comes back, or whose snapshots are not
//! consecutive (the block was beyond the end of the table in between), is one row per run. Versions are matched only between images read with
//! one row type; across a change of the table's columns a version starts a new run.

use super::range::RangeCursor;
use crate::ffi::memcx::OwnedContext;
use gsnap_format::versions::RunFolder;
use pgrx::pg_sys;

/// Reads every distinct row version of a range of snapshots once, with its run.
pub struct VersionsCursor {
    range: RangeCursor,
    /// The runs of the block being read (values: copies of the rows, in `block_cx`).
    folder: RunFolder<pg_sys::Datum>,
    block: Option<(usize, u32)>,
    /// Ended runs are handed out from `next_done`; then the context of their rows is reset.
    next_done: usize,
    reset_due: bool,
    /// The first version of the next block, read before the runs of the block before were
    /// handed out: its snapshots' positions and where it is. Its row is the range cursor's,
    /// valid as long as that is not called.
    held: Option<Held>,
    ended: bool,
    block_cx: OwnedContext,
}

/// A version the range cursor handed out, kept until the runs of the block before it are
/// handed out.
struct Held {
    positions: Vec<usize>,
    rec: pg_sys::Datum,
    block: (usize, u32),
    image: u64,
    lp: u16,
    continued: bool,
    continuable: bool,
}

impl VersionsCursor {
    /// Reads the versions of `range`.
    pub fn new(range: RangeCursor) -> VersionsCursor {
        VersionsCursor {
            range,
            folder: RunFolder::new(),
            block: None,
            next_done: 0,
            reset_due: false,
            held: None,
            ended: false,
            block_cx: OwnedContext::new("gsnap versions block"),
        }
    }

    /// The page images read so far (see [`RangeCursor::images_read`]).
    pub fn images_read(&self) -> u64 {
        self.range.images_read()
    }

    /// The next version: its first and last snapshots and its `rec` datum (valid until the
    /// next call); None at the end. `keep(rec, snap)` is asked once per row version, as by
    /// [`RangeCursor::next_row`].
    pub fn next_run(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(u64, u64, pg_sys::Datum)> {
        let (first, last, rec) = self.next_run_at(keep)?;
        Some((self.range.snap_at(first), self.range.snap_at(last), rec))
    }

    /// [`VersionsCursor::next_run`] with the run's first and last snapshots as positions
    /// among the range's snapshots that hold the table (`RangeCursor::snap_at`).
    pub fn next_run_at(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(usize, usize, pg_sys::Datum)> {
        loop {
            if let Some(r) = self.folder.done().get(self.next_done) {
                self.next_done += 1;
                return Some((r.first, r.last, r.value));
            }
            self.folder.done().clear();
            self.next_done = 0;
            if self.reset_due {
                // SAFETY: every run of the block before was handed out, and the caller is
                // done with the last one (it asked for the next).
                unsafe { self.block_cx.reset() };
                self.reset_due = false;
            }
            if self.ended {
                return None;
            }
            if let Some(h) = self.held.take() {
                self.block = Some(h.block);
                let version = (h.image, h.lp, h.continued, h.continuable, h.rec);
                add(&mut self.folder, &self.block_cx, version, &h.positions);
                continue;
            }
            let Some(v) = self.range.next_version(keep) else {
                self.folder.end_block();
                self.reset_due = true;
                self.ended = true;
                continue;
            };
            if self.block != Some(v.block) && self.block.take().is_some() {
                // The block before ends: its runs are handed out before this version (whose
                // row stays the range cursor's: it is not called meanwhile).
                self.folder.end_block();
                self.reset_due = true;
                self.held = Some(Held {
                    positions: v.positions.to_vec(),
                    rec: v.rec,
                    block: v.block,
                    image: v.image,
                    lp: v.lp,
                    continued: v.continued,
                    continuable: v.continuable,
                });
                continue;
            }
            self.block = Some(v.block);
            let version = (v.image, v.lp, v.continued, v.continuable, v.rec);
            add(&mut self.folder, &self.block_cx, version, v.positions);
        }
    }
}

/// Adds a version (image, line pointer, continued, continuable, row) held at `positions` to
/// the runs of `folder`; a new run's row is copied into `cx`.
fn add(
    folder: &mut RunFolder<pg_sys::Datum>,
    cx: &OwnedContext,
    (image, lp, continued, continuable, rec): (u64, u16, bool, bool, pg_sys::Datum),
    positions: &[usize],
) {
    // SAFETY: the range cursor's row, valid until its next call; copied into the block's
    // context.
    let copy = || cx.run(|| unsafe { copy_record(rec) });
    folder.add(image, lp, positions, continued, continuable, copy);
}

/// A copy of a `rec` datum (a composite value) in the current memory context.
///
/// # Safety
/// `rec` is a valid composite datum.
unsafe fn copy_record(rec: pg_sys::Datum) -> pg_sys::Datum {
    // SAFETY: the caller's promise; a composite value is a varlena, copied whole.
    unsafe {
        pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(
            rec.cast_mut_ptr::<pg_sys::varlena>(),
        ))
    }
}
