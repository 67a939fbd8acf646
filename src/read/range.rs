//! One table at every readable snapshot of a range, row version by row version: the cursor
//! behind `gsnap_range`, shared by the set-returning function and the "gsnap range" custom
//! scan.
//!
//! The index reports, per block, the runs of snapshots that share one image (in block order,
//! and per block in snapshot order), so an image shared by several snapshots is read once for
//! all of them. Within a block, a tuple that an image shares with the block's previous image
//! (same line pointer, same bytes: `gsnap_format::versions`) is the same row version: it is
//! neither decoded nor offered to the caller's filter again, and the filter's answer holds for
//! all the snapshots of both images.
//!
//! Blocks are taken in steps (`Blocks`): a serial cursor takes each incarnation of the table
//! whole; the participants of a parallel scan take steps of a shared cursor
//! ([`SharedRange`], in the parallel query's dynamic shared memory) over the incarnations one
//! after another, so every block is read by exactly one of them, all its images by the same
//! one (a version's run never spans participants).

use super::asof::{key_blocks, KeyMapUse};
use super::decode::Decoder;
use super::pages::{parallel_step, view_tuples};
use super::partitioned;
use super::pins::{GroupPins, ImageBatches, PinnedBatch};
use super::table::{self, TableAtSnapshot};
use crate::error::{corrupt, corrupt_index, error};
use crate::ffi::memcx::OwnedContext;
use crate::keymap::KeyLookup;
use gsnap_core::{ImageRun, RelId, SnapId};
use gsnap_format::versions::ImageMatcher;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::collections::HashMap;
use std::hash::Hasher;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The block cursor the participants of a parallel range or versions scan share (in dynamic
/// shared memory): the range the leader resolved, a digest of the snapshots the participants
/// read in it (each lists them itself and must find the same), and the first position no
/// participant has taken, counted over the table's incarnations one after another (of a
/// partitioned table, over its partitions' cursors one after another, each with its
/// incarnations).
#[repr(C)]
pub struct SharedRange {
    pub from: u64,
    pub to: u64,
    /// The digest of the first participant to list the snapshots (0: none has yet).
    digest: AtomicU64,
    next: AtomicU64,
}

impl SharedRange {
    /// A cursor at the first block of the range `from..=to`.
    pub fn new(from: u64, to: u64) -> SharedRange {
        require_ordered(from, to);
        SharedRange {
            from,
            to,
            digest: AtomicU64::new(0),
            next: AtomicU64::new(0),
        }
    }
}

/// Makes `cursors` (a table's, or a partitioned table's partitions', in the order every
/// participant opens them) read only the blocks this participant takes from `shared`, one
/// cursor after another: the cursors' positions follow each other in the shared count. An
/// ERROR if this participant found other snapshots in the range than another did (one was
/// deleted in between).
pub fn share(cursors: &mut [RangeCursor], shared: &'static SharedRange) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in cursors.iter() {
        h.write_u32(c.decoders.relid.to_u32());
        h.write_u64(digest(&c.snaps));
    }
    let mine = h.finish().max(1);
    let first = match shared
        .digest
        .compare_exchange(0, mine, Ordering::Relaxed, Ordering::Relaxed)
    {
        Ok(_) => mine,
        Err(first) => first,
    };
    if first != mine {
        error(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "the snapshots from {} to {} changed while a parallel scan of them began",
                shared.from, shared.to
            ),
        )
        .hint("Run the query again.")
        .raise();
    }
    let mut base = 0;
    for c in cursors.iter_mut() {
        debug_assert!(c.loaded_segment == 0 && c.taken.is_none());
        c.blocks.shared = Some((shared, base));
        base += c.blocks.positions();
    }
}

/// What identifies the snapshots a range cursor reads and how their blocks are laid out:
/// each one's id, incarnation and size.
fn digest(snaps: &[(u64, TableAtSnapshot)]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (s, t) in snaps {
        h.write_u64(*s);
        h.write_u32(t.rel);
        h.write_u32(t.nblocks);
    }
    h.finish()
}

/// Where a cursor takes its blocks from: positions over the incarnations one after another
/// (incarnation `i` has positions `starts[i]..starts[i + 1]`, one per block of its largest
/// size), handed out whole incarnation by whole incarnation (serial), or in steps of the
/// shared cursor of a parallel scan, where this cursor's positions start at the second
/// number.
struct Blocks {
    starts: Vec<u64>,
    next: u64,
    shared: Option<(&'static SharedRange, u64)>,
}

impl Blocks {
    /// How many positions the cursor has.
    fn positions(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The next blocks to read: (incarnation, blocks); None when all are taken.
    fn take(&mut self) -> Option<(usize, Range<u32>)> {
        let end = *self
            .starts
            .last()
            .expect("one start per incarnation and the end");
        let within = |at: u64| {
            // The incarnation holding position `at` (empty ones hold none).
            let i = self.starts.partition_point(|&s| s <= at) - 1;
            (i, self.starts[i], self.starts[i + 1])
        };
        let (i, first, at, until) = match self.shared {
            None => {
                if self.next >= end {
                    return None;
                }
                let (i, first, stop) = within(self.next);
                (i, first, std::mem::replace(&mut self.next, stop), stop)
            }
            Some((shared, base)) => {
                let mut now = shared.next.load(Ordering::Relaxed);
                loop {
                    // Participants read the cursors in the same order and leave one only
                    // once the count is past it, so the count is never before this one.
                    debug_assert!(now >= base);
                    let at = now.saturating_sub(base);
                    if at >= end {
                        return None;
                    }
                    // A step ends at the end of its incarnation.
                    let (i, first, stop) = within(at);
                    let step = u64::from(parallel_step((stop - first) as u32));
                    let until = (at + step).min(stop);
                    match shared.next.compare_exchange_weak(
                        now,
                        base + until,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break (i, first, at, until),
                        Err(later) => now = later,
                    }
                }
            }
        };
        Some((i, (at - first) as u32..(until - first) as u32))
    }
}

/// Decoders by row type (the row type can change between snapshots), allocated in the
/// cursor's long-lived context.
pub(super) struct Decoders {
    snap: u64,
    relid: pg_sys::Oid,
    row_desc: pg_sys::TupleDesc,
    list: Vec<Decoder>,
    by_row_type: HashMap<Vec<u8>, usize>,
    /// Reading a partition of this partitioned table: each decoder's projection to its
    /// columns (`super::partitioned`), and room for a projected row.
    parent: Option<pg_sys::Oid>,
    projections: Vec<Option<Vec<Option<usize>>>>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
}

impl Decoders {
    /// The `rec` datum (of the table's current row type) of tuple `lp` of `block`, decoded
    /// with decoder `decoder`, formed in `cx`.
    pub(super) fn form(
        &mut self,
        decoder: usize,
        cx: &OwnedContext,
        block: u32,
        lp: u16,
        bytes: &[u8],
    ) -> pg_sys::Datum {
        let Decoders {
            list,
            projections,
            values: out_values,
            nulls: out_nulls,
            row_desc,
            ..
        } = self;
        let projection = &projections[decoder];
        let decoder = &mut list[decoder];
        cx.run(|| {
            let (values, nulls) = decoder.decode_tuple(block, lp, bytes);
            let (values, nulls) = match projection {
                Some(p) => {
                    partitioned::project(p, values, nulls, out_values, out_nulls);
                    (out_values.as_slice(), out_nulls.as_slice())
                }
                None => (values, nulls),
            };
            // SAFETY: the values match the table's current row type.
            unsafe { form_record(*row_desc, values, nulls) }
        })
    }

    /// The index in `list` of the decoder of `t`'s row type (made on first use, in `cx`).
    fn index_of(&mut self, t: &TableAtSnapshot, cx: &OwnedContext) -> usize {
        if let Some(&i) = self.by_row_type.get(&t.row_type_bytes) {
            return i;
        }
        let (snap, relid, desc) = (self.snap, self.relid, self.row_desc);
        let row_type = t.row_type.clone();
        let d = match self.parent {
            Some(parent) => {
                let attnums = partitioned::place_in(&t.row_type, parent).map_or(&[][..], |p| p.0);
                // SAFETY: `row_desc` is the partitioned table's current row type.
                let layout = unsafe { partitioned::layout_of(desc, attnums) };
                self.projections.push(Some(layout.project));
                // SAFETY: in a transaction (see RangeCursor::open).
                cx.run(|| unsafe { Decoder::with_columns(snap, relid, row_type, layout.columns) })
            }
            None => {
                self.projections.push(None);
                // SAFETY: `row_desc` is the table's current row type (see RangeCursor::open).
                cx.run(|| unsafe { Decoder::new(snap, relid, row_type, desc) })
            }
        };
        self.list.push(d);
        self.by_row_type
            .insert(t.row_type_bytes.clone(), self.list.len() - 1);
        self.list.len() - 1
    }
}

/// What the cursor keeps of a row version: its `rec` datum (in the block's context) and
/// whether the caller's filter keeps it.
#[derive(Clone, Copy)]
pub(super) struct Kept {
    pub rec: pg_sys::Datum,
    pub keep: bool,
}

/// What the cursor loads for one run of the index (`runs[run]`): its image, or when reading
/// versions (`super::versions`) its delta from the run before it in the same block. Loads
/// queued together (one group, pinned in one batch) begin with `group_start`.
#[derive(Clone, Copy)]
pub(super) struct Load {
    pub run: usize,
    pub delta: bool,
    pub group_start: bool,
}

impl Load {
    /// A run's image, alone in its group.
    fn image(run: usize) -> Load {
        Load {
            run,
            delta: false,
            group_start: true,
        }
    }
}

/// The snapshots of the current image that hold its block, grouped by row type: (snapshot
/// ids, their positions, the decoder of their row type).
pub(super) type Holders = Vec<(Vec<u64>, Vec<usize>, usize)>;

/// Reads a table at every readable snapshot of `from..=to`, one row version at a time, each
/// with the run of snapshots that hold it.
pub struct RangeCursor {
    snaps: Vec<(u64, TableAtSnapshot)>,
    groups: Option<GroupPins>,
    /// Segments of `snaps` in which the table has one incarnation; the one whose runs are
    /// loaded, numbered from 1 (0: none yet), and its snapshots.
    segments: Vec<Range<usize>>,
    pub(super) loaded_segment: usize,
    segment: Range<usize>,
    /// The blocks of the segments to read, and blocks taken but not queued yet (of a later
    /// segment than the one loaded).
    blocks: Blocks,
    taken: Option<(usize, Range<u32>)>,
    /// Of a lookup by key: the only blocks to read, per segment (sorted; `keymap.rs`).
    only: Option<Vec<Vec<u32>>>,
    /// The current segment's runs (block, image, snapshots sharing it), and their images.
    pub(super) runs: Vec<ImageRun>,
    pub(super) images: ImageBatches<Load>,
    pub(super) batch: Option<PinnedBatch<Load>>,
    pub(super) at: usize,
    /// The current image: its run, its tuples (line pointer, offset, length) and holders.
    run: Option<ImageRun>,
    pub(super) tuples: Vec<(u16, usize, usize)>,
    pub(super) holders: Holders,
    holder: usize,
    next_tuple: usize,
    /// Versions of the block's previous image (when comparable), and whether the current
    /// image is matched with them; the (segment, block, decoder) they belong to.
    matcher: ImageMatcher<Kept>,
    matching: bool,
    /// Images (and deltas) begun so far (numbers the current one).
    pub(super) image: u64,
    versions_of: Option<(usize, u32, usize)>,
    pub(super) decoders: Decoders,
    /// The decoder of each snapshot's row type (by position in `snaps`).
    decoder_of: Vec<usize>,
    /// Reading a partition: the readable snapshots of the range (positions are among them,
    /// so that a partition detached for a while does not join its runs across the gap), and
    /// the position of each of `snaps` among them.
    all: Option<(Vec<u64>, Vec<usize>)>,
    /// Decoders live in `_long`; rows and what decoding allocates in `block_cx`, reset when
    /// the cursor moves to another block.
    _long: OwnedContext,
    pub(super) block_cx: OwnedContext,
    /// Reading versions (`super::versions`): the fold of the block being read.
    pub(super) folding: Option<Box<super::versions::Folding>>,
}

impl RangeCursor {
    /// Opens the range (the readable snapshots of it that hold the table; an ERROR if there
    /// is none).
    ///
    /// # Safety
    /// `row_desc` is the table's current row type, alive as long as the cursor; call in a
    /// transaction.
    pub unsafe fn open(
        relid: pg_sys::Oid,
        from: u64,
        to: u64,
        row_desc: pg_sys::TupleDesc,
    ) -> RangeCursor {
        require_ordered(from, to);
        let snaps = table::in_range(relid, from, to);
        // SAFETY: the caller's promise.
        unsafe { Self::over(relid, snaps, row_desc, None, from) }
    }

    /// Opens partition `leaf` of `parent` over `all`, the readable snapshots of a range: the
    /// snapshots among them at which it was a partition of `parent` and that `pruned` does
    /// not exclude, its rows formed as rows of `parent` (whose current row type is
    /// `row_desc`).
    ///
    /// # Safety
    /// As for [`RangeCursor::open`].
    pub unsafe fn open_partition(
        leaf: pg_sys::Oid,
        parent: pg_sys::Oid,
        all: &[u64],
        row_desc: pg_sys::TupleDesc,
        pruned: &mut dyn FnMut(&TableAtSnapshot) -> bool,
    ) -> RangeCursor {
        let mut snaps = Vec::new();
        let mut at = Vec::new();
        for (i, &s) in all.iter().enumerate() {
            if let Some(t) = table::held_by(s, leaf) {
                if partitioned::place_in(&t.row_type, parent).is_some() && !pruned(&t) {
                    snaps.push((s, t));
                    at.push(i);
                }
            }
        }
        let from = all.first().copied().unwrap_or(1);
        // SAFETY: the caller's promise.
        let mut cursor = unsafe { Self::over(leaf, snaps, row_desc, Some(parent), from) };
        cursor.all = Some((all.to_vec(), at));
        cursor
    }

    /// The cursor over `snaps` (the snapshots that hold table `relid`, ascending).
    ///
    /// # Safety
    /// As for [`RangeCursor::open`].
    unsafe fn over(
        relid: pg_sys::Oid,
        snaps: Vec<(u64, TableAtSnapshot)>,
        row_desc: pg_sys::TupleDesc,
        parent: Option<pg_sys::Oid>,
        from: u64,
    ) -> RangeCursor {
        let mut segments = Vec::new();
        let mut start = 0;
        for segment in snaps.chunk_by(|a, b| a.1.rel == b.1.rel) {
            segments.push(start..start + segment.len());
            start += segment.len();
        }
        let groups = match (snaps.first(), snaps.last()) {
            (Some(first), Some(last)) => Some(GroupPins::pin(first.0, last.0, true)),
            _ => None,
        };
        let lease = snaps.iter().map(|(_, t)| t.lease).min().unwrap_or(0);
        let ids: Vec<u64> = snaps.iter().map(|(s, _)| *s).collect();
        table::confirm_readable(&ids, lease);
        let long = OwnedContext::new("gsnap range");
        let mut decoders = Decoders {
            snap: snaps.first().map_or(from, |s| s.0),
            relid,
            row_desc,
            list: Vec::new(),
            by_row_type: HashMap::new(),
            parent,
            projections: Vec::new(),
            values: Vec::new(),
            nulls: Vec::new(),
        };
        let decoder_of = snaps
            .iter()
            .map(|(_, t)| decoders.index_of(t, &long))
            .collect();
        let mut starts = vec![0];
        for segment in &segments {
            let blocks = snaps[segment.clone()].iter().map(|(_, t)| t.nblocks);
            starts.push(starts.last().copied().unwrap_or(0) + u64::from(blocks.max().unwrap_or(0)));
        }
        RangeCursor {
            snaps,
            groups,
            segments,
            loaded_segment: 0,
            segment: 0..0,
            blocks: Blocks {
                starts,
                next: 0,
                shared: None,
            },
            taken: None,
            only: None,
            runs: Vec::new(),
            images: ImageBatches::default(),
            batch: None,
            at: 0,
            run: None,
            tuples: Vec::new(),
            holders: Vec::new(),
            holder: 0,
            next_tuple: 0,
            matcher: ImageMatcher::new(),
            matching: false,
            image: 0,
            versions_of: None,
            decoders,
            decoder_of,
            all: None,
            _long: long,
            block_cx: OwnedContext::new("gsnap range block"),
            folding: None,
        }
    }

    /// Reads only the blocks the key maps of the range's incarnations say may hold one of
    /// the keys of `lookup` (`keymap.rs`), if a map covers every snapshot of the range; call
    /// before the first row. Returns what the maps said (the candidate pages of all
    /// incarnations). Of a partition, the key is the partitioned table's, which the
    /// partition's map records in its own attributes (by its place at each incarnation's
    /// first snapshot).
    pub fn look_up_keys(&mut self, lookup: &KeyLookup) -> KeyMapUse {
        let mut only = Vec::with_capacity(self.segments.len());
        let mut pages = 0;
        for segment in &self.segments {
            let (first, t) = &self.snaps[segment.start];
            let last = self.snaps[segment.end - 1].0;
            let definition = match self.decoders.parent {
                None => Some(lookup.definition()),
                Some(parent) => partitioned::place_in(&t.row_type, parent)
                    .and_then(|(attnums, _)| lookup.definition_in(attnums)),
            };
            let Some(definition) = definition else {
                return KeyMapUse::NoMap;
            };
            match key_blocks(
                t.rel,
                &definition,
                &lookup.hashes,
                (*first, last),
                t.nblocks,
            ) {
                Ok(blocks) => {
                    pages += blocks.len();
                    only.push(blocks);
                }
                Err(every_page) => return every_page,
            }
        }
        self.only = Some(only);
        KeyMapUse::Pages(pages)
    }

    /// Of a cursor restricted by [`RangeCursor::look_up_keys`]: the images of the runs of
    /// the candidate blocks read so far.
    pub fn images_read(&self) -> u64 {
        self.image
    }

    /// True if no snapshot of the range is read (a partition pruned at every one).
    pub fn is_empty(&self) -> bool {
        self.snaps.is_empty()
    }

    /// How many snapshots of the range hold the table (positions `0..len`).
    pub fn len(&self) -> usize {
        match &self.all {
            Some((all, _)) => all.len(),
            None => self.snaps.len(),
        }
    }

    /// The snapshot at `position` (see [`Version::positions`]).
    pub fn snap_at(&self, position: usize) -> u64 {
        match &self.all {
            Some((all, _)) => all[position],
            None => self.snaps[position].0,
        }
    }

    /// The next row version (a `rec` datum of the table's current row type) and the
    /// snapshots that hold it, valid until the next call; None at the end. `keep(rec, snap)`
    /// is asked once per row version: versions it refuses are skipped for every snapshot
    /// that holds them.
    pub fn next_row(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(&[u64], pg_sys::Datum)> {
        loop {
            if self.holder < self.holders.len() {
                let page = self
                    .batch
                    .as_ref()
                    .expect("an image is pinned")
                    .get(self.at - 1)
                    .1;
                let run = self.run.expect("an image is being read");
                while self.next_tuple < self.tuples.len() {
                    let (lp, offset, len) = self.tuples[self.next_tuple];
                    self.next_tuple += 1;
                    let bytes = &page[offset..offset + len];
                    let known = if self.matching {
                        self.matcher.same_as_before(lp, bytes).copied()
                    } else {
                        None
                    };
                    let kept = known.unwrap_or_else(|| {
                        let (snaps, _, decoder) = &self.holders[self.holder];
                        let rec =
                            self.decoders
                                .form(*decoder, &self.block_cx, run.block, lp, bytes);
                        Kept {
                            rec,
                            keep: keep(rec, snaps[0]),
                        }
                    });
                    if self.matching {
                        self.matcher.keep(lp, bytes, kept);
                    }
                    if kept.keep {
                        return Some((&self.holders[self.holder].0, kept.rec));
                    }
                }
                if self.matching {
                    self.matcher.end_image();
                }
                self.holder += 1;
                self.next_tuple = 0;
                continue;
            }
            if !self.next_image() {
                return None;
            }
        }
    }

    /// Moves to the next image of the range that some snapshot holds; false at the end.
    fn next_image(&mut self) -> bool {
        while self.next_load() {
            let (load, bytes) = self
                .batch
                .as_ref()
                .expect("a load is pinned")
                .get(self.at - 1);
            let run = self.runs[load.run];
            view_tuples(bytes, run.block, &mut self.tuples);
            self.begin_image(run);
            if !self.holders.is_empty() {
                return true;
            }
        }
        false
    }

    /// Moves to the next load (the batch's entry `at - 1`), pinning the next batch when the
    /// one read is done; false at the end.
    pub(super) fn next_load(&mut self) -> bool {
        loop {
            if let Some(batch) = &self.batch {
                let end = match &self.folding {
                    Some(f) => f.end_of(batch),
                    None => batch.len(),
                };
                if self.at < end {
                    self.at += 1;
                    return true;
                }
                if self.folding.is_some() {
                    self.requeue_rest();
                }
            }
            // Unpin the batch read; keep the next batch and the one after it queued, so the
            // latter is prefetched.
            self.batch = None;
            while self.images.queued() < 2 * self.images.per_batch() && self.queue_taken() {}
            if let Some(batch) = self.images.next_batch() {
                self.batch = Some(batch);
                self.at = 0;
                if self.folding.is_some() {
                    self.check_deltas();
                }
                continue;
            }
            if self.taken.is_none() {
                return false;
            }
        }
    }

    /// Takes the next blocks and queues the images of their runs; false when no block is
    /// left, or when the blocks taken are of a later segment than the one loaded and images
    /// of that one are still queued (they are queued once those are read).
    fn queue_taken(&mut self) -> bool {
        let Some((segment, blocks)) = self.taken.take().or_else(|| self.blocks.take()) else {
            return false;
        };
        if segment + 1 != self.loaded_segment {
            if self.images.queued() > 0 {
                self.taken = Some((segment, blocks));
                return false;
            }
            self.load_segment(segment);
        }
        let first = self.runs.partition_point(|r| r.block < blocks.start);
        let end = self.runs.partition_point(|r| r.block < blocks.end);
        if self.folding.as_ref().is_some_and(|f| f.asks_deltas()) {
            self.queue_with_deltas(first..end);
        } else {
            for i in first..end {
                self.images.push(Load::image(i), self.runs[i].image.0);
            }
        }
        true
    }

    /// Sets up reading `run`'s image: which snapshots hold its block, by row type, and
    /// whether its tuples are matched with the block's previous image.
    fn begin_image(&mut self, run: ImageRun) {
        self.run = Some(run);
        self.image += 1;
        let mut holders = std::mem::take(&mut self.holders);
        self.holders_of(run, &mut holders);
        self.holders = holders;
        self.holder = 0;
        self.next_tuple = 0;
        let same_block = self
            .versions_of
            .is_some_and(|(seg, block, _)| (seg, block) == (self.loaded_segment, run.block));
        if !same_block {
            // SAFETY: the previous block's rows are consumed (the caller asked for more).
            unsafe { self.block_cx.reset() };
        }
        // Versions are matched with the block's previous image when all the snapshots of
        // this image that hold the block have the row type of that image.
        let decoder = self.holders.first().map(|h| h.2);
        self.matching = self.holders.len() == 1;
        if !(same_block && self.matching && self.versions_of.map(|v| v.2) == decoder) {
            self.matcher.forget();
        }
        self.versions_of = decoder.map(|d| (self.loaded_segment, run.block, d));
        if self.matching && self.tuples.is_empty() {
            // An empty image: the block's next image has no version in common with it.
            self.matcher.end_image();
        }
    }

    /// The snapshots of the loaded segment that hold `run`'s block with its image (it may be
    /// beyond a snapshot's size, after the table shrank), grouped by row type, into `out`.
    pub(super) fn holders_of(&self, run: ImageRun, out: &mut Holders) {
        out.clear();
        let held = &self.snaps[self.segment.clone()];
        let from = self.segment.start + held.partition_point(|(s, _)| *s < run.first.0);
        let to = self.segment.start + held.partition_point(|(s, _)| *s <= run.last.0);
        let holding: Vec<usize> = (from..to)
            .filter(|&i| run.block < self.snaps[i].1.nblocks)
            .collect();
        for same in holding.chunk_by(|&a, &b| self.decoder_of[a] == self.decoder_of[b]) {
            let positions = match &self.all {
                Some((_, at)) => same.iter().map(|&i| at[i]).collect(),
                None => same.to_vec(),
            };
            out.push((
                same.iter().map(|&i| self.snaps[i].0).collect(),
                positions,
                self.decoder_of[same[0]],
            ));
        }
    }

    /// Loads the runs of segment `index` (one incarnation of the table), in block order.
    fn load_segment(&mut self, index: usize) {
        let segment = self.segments[index].clone();
        self.loaded_segment = index + 1;
        let rel = self.snaps[segment.start].1.rel;
        let (first, last) = (self.snaps[segment.start].0, self.snaps[segment.end - 1].0);
        self.runs.clear();
        let groups = self
            .groups
            .as_ref()
            .expect("a non-empty range has its groups pinned");
        let views = groups.views();
        let runs = &mut self.runs;
        // The index may still list deleted snapshots between readable ones: a run none of
        // the segment's snapshots lies in is skipped (its image may be reclaimed).
        let held = &self.snaps[segment.clone()];
        if let Some(only) = self.only.as_ref().map(|o| &o[index]) {
            // A lookup by key: the runs of the candidate blocks only, from each held
            // snapshot's page table (a walk of the whole range would visit every block).
            runs.extend(candidate_runs(&views, held, rel, only));
        } else {
            // The index may still list deleted snapshots between readable ones: a run none
            // of the segment's snapshots lies in is skipped (its image may be reclaimed).
            gsnap_core::range(&views, SnapId(first), SnapId(last), RelId(rel), &mut |r| {
                let at = held.partition_point(|(s, _)| *s < r.first.0);
                if held.get(at).is_some_and(|(s, _)| *s <= r.last.0) {
                    runs.push(r)
                }
            })
            .unwrap_or_else(|e| corrupt_index(e));
        }
        self.segment = segment;
    }
}

/// The runs of images of `blocks` (ascending) of incarnation `rel` over the snapshots `held`
/// (ascending): for each block, each image it has at consecutive snapshots of `held`, in
/// block order then snapshot order, as `gsnap_core::range` gives them.
fn candidate_runs(
    views: &[gsnap_core::GroupReader<'_>],
    held: &[(u64, TableAtSnapshot)],
    rel: u32,
    blocks: &[u32],
) -> Vec<ImageRun> {
    let trees: Vec<Option<gsnap_core::RelationTree<'_>>> = held
        .iter()
        .map(|(s, _)| {
            let view = views
                .iter()
                .find(|v| v.contains(SnapId(*s)))
                .unwrap_or_else(|| {
                    corrupt(format_args!(
                        "snapshot {s} is not in the index groups pinned"
                    ))
                });
            view.tree(SnapId(*s))
                .and_then(|t| t.relation(RelId(rel)))
                .unwrap_or_else(|e| corrupt_index(e))
        })
        .collect();
    let mut runs = Vec::new();
    for &block in blocks {
        let mut run: Option<ImageRun> = None;
        for ((s, _), tree) in held.iter().zip(&trees) {
            let image = tree
                .as_ref()
                .and_then(|t| t.lookup(block).unwrap_or_else(|e| corrupt_index(e)));
            match (&mut run, image) {
                (Some(r), Some(i)) if r.image == i => r.last = SnapId(*s),
                (r, image) => {
                    runs.extend(r.take());
                    *r = image.map(|image| ImageRun {
                        block,
                        image,
                        first: SnapId(*s),
                        last: SnapId(*s),
                    });
                }
            }
        }
        runs.extend(run);
    }
    runs
}

/// The cursors of table `relid` over `from..=to`: one, or one per partition of a partitioned
/// table (`super::partitioned`, which skips it at the snapshots where
/// `refuted(constraint, attnums)` says the query wants none of its rows).
///
/// # Safety
/// `row_desc` is the table's current row type, alive as long as the cursors; in a
/// transaction.
pub unsafe fn cursors(
    relid: pg_sys::Oid,
    from: u64,
    to: u64,
    row_desc: pg_sys::TupleDesc,
    refuted: &mut dyn FnMut(&str, &[i16]) -> bool,
) -> Vec<RangeCursor> {
    if crate::ffi::relation::relation_kind(relid) == Some(pg_sys::RELKIND_PARTITIONED_TABLE) {
        // SAFETY: the caller's promise.
        unsafe { partitioned::range_cursors(relid, from, to, row_desc, refuted) }
    } else {
        // SAFETY: the caller's promise.
        vec![unsafe { RangeCursor::open(relid, from, to, row_desc) }]
    }
}

/// Raises an ERROR if the range `from..=to` is empty (given the wrong way round).
pub fn require_ordered(from: u64, to: u64) {
    if from > to {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("gsnap_range from snapshot {from} to snapshot {to}: the range is empty"),
        )
        .hint("Give the older snapshot first.")
        .raise();
    }
}

/// Forms a `rec` datum of the table's row type (in the current memory context).
///
/// # Safety
/// `values`/`nulls` match `row_desc`.
pub unsafe fn form_record(
    row_desc: pg_sys::TupleDesc,
    values: &[pg_sys::Datum],
    nulls: &[bool],
) -> pg_sys::Datum {
    // SAFETY: forming a tuple of a named composite type; heap_form_tuple only reads the
    // arrays.
    unsafe {
        let tuple = pg_sys::heap_form_tuple(
            row_desc,
            values.as_ptr().cast_mut(),
            nulls.as_ptr().cast_mut(),
        );
        pg_sys::Datum::from((*tuple).t_data)
    }
}
