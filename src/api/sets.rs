//! Queries over sets of snapshots, answered from the GSnap index:
//!
//! - `gsnap_range(NULL::t, from, to)`: the table's rows at every retained snapshot in
//!   `from..=to`, as `(snap_id, rec)`. The index reports, per block, the runs of snapshots
//!   that share one image, so an image shared by several snapshots is read and decoded once.
//! - `gsnap_diff(NULL::t, a, b)`: rows present at b and not at a (`'added'`) and at a and not
//!   at b (`'removed'`); an update is one of each. Only blocks whose images differ are read,
//!   and subtrees the two page tables share are skipped whole, so the cost follows the change.

use super::access::{relation_name, require_gsnap_database, require_read_access};
use super::asof::table_of_first_argument;
use super::decode::Decoder;
use super::index::{
    for_each_pinned_batch, images_per_batch, index_error, pin_images, prefetch_images, GroupPins,
};
use super::scan::{scan_begin_if_present, TableAtSnapshot};
use crate::error::error;
use crate::ipc::Pinned;
use gsnap_core::{PageDiff, RelId, SnapId};
use gsnap_format::view;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::collections::HashMap;

/// Decoders by row type (the row type can change between snapshots), allocated in
/// `context` (the range cursor's long-lived context, not the one reset between blocks).
struct Decoders {
    snap: u64,
    relid: pg_sys::Oid,
    row_desc: pg_sys::TupleDesc,
    context: pg_sys::MemoryContext,
    list: Vec<Decoder>,
    by_row_type: HashMap<Vec<u8>, usize>,
}

impl Decoders {
    /// The index in `list` of the decoder of `t`'s row type (made on first use).
    fn index_of(&mut self, t: &TableAtSnapshot) -> usize {
        if let Some(&i) = self.by_row_type.get(&t.row_type_bytes) {
            return i;
        }
        // SAFETY: `row_desc` is the table's current row type; the decoder's allocations go to
        // the cursor's long-lived context, which outlives it.
        let d = unsafe {
            let old = pg_sys::MemoryContextSwitchTo(self.context);
            let d = Decoder::new(self.snap, self.relid, t.row_type.clone(), self.row_desc);
            pg_sys::MemoryContextSwitchTo(old);
            d
        };
        self.list.push(d);
        self.by_row_type
            .insert(t.row_type_bytes.clone(), self.list.len() - 1);
        self.list.len() - 1
    }
}

/// The argument at `i`, which must not be NULL.
///
/// # Safety
/// `fcinfo` must be a valid call with more than `i` arguments.
unsafe fn int8_arg(fcinfo: pg_sys::FunctionCallInfo, i: usize, what: &str) -> u64 {
    // SAFETY: reading the call's arguments.
    let arg = unsafe { &*(*fcinfo).args.as_ptr().add(i) };
    if arg.isnull {
        error(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("{what} must not be NULL"),
        )
        .raise();
    }
    let v = arg.value.value() as i64;
    if v <= 0 {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("snapshot {v} does not exist"),
        )
        .hint("Snapshot ids start at 1; gsnap_snapshots() lists them.")
        .raise();
    }
    v as u64
}

/// The result set of a call returning `TABLE(x, rec anyelement)`, and the row type of `rec`.
///
/// # Safety
/// `fcinfo` must be a valid set-returning call.
unsafe fn result_set(
    fcinfo: pg_sys::FunctionCallInfo,
) -> (
    pg_sys::TupleDesc,
    *mut pg_sys::Tuplestorestate,
    pg_sys::TupleDesc,
) {
    // SAFETY: the materialize-mode SRF protocol; the second result column is the table's
    // composite type, whose descriptor comes from the type cache.
    unsafe {
        pg_sys::InitMaterializedSRF(fcinfo, 0);
        let rsinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        let desc = (*rsinfo).setDesc;
        let rec_type = (*desc).attrs.as_slice(2)[1].atttypid;
        let row_desc = pg_sys::lookup_rowtype_tupdesc_copy(rec_type, -1);
        (desc, (*rsinfo).setResult, row_desc)
    }
}

/// Forms a `rec` datum of the table's row type.
///
/// # Safety
/// `values`/`nulls` match `row_desc`.
unsafe fn record(
    row_desc: pg_sys::TupleDesc,
    values: &[pg_sys::Datum],
    nulls: &[bool],
) -> pg_sys::Datum {
    // SAFETY: forming a tuple of a named composite type.
    unsafe {
        let tuple = pg_sys::heap_form_tuple(
            row_desc,
            values.as_ptr().cast_mut(),
            nulls.as_ptr().cast_mut(),
        );
        pg_sys::Datum::from((*tuple).t_data)
    }
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_gsnap_range() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `gsnap_range(anyelement, from_snap bigint, to_snap bigint)`.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_range(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    unsafe {
        let relid = table_of_first_argument(fcinfo, "gsnap_range");
        require_gsnap_database();
        require_read_access(relid);
        let from = int8_arg(fcinfo, 1, "the first snapshot of gsnap_range");
        let to = int8_arg(fcinfo, 2, "the last snapshot of gsnap_range");
        if from > to {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("gsnap_range from snapshot {from} to snapshot {to}: the range is empty"),
            )
            .hint("Give the older snapshot first.")
            .raise();
        }
        let (desc, store, row_desc) = result_set(fcinfo);
        let snap_att = (*desc).attrs.as_slice(2)[0];
        if snap_att.atttypid != pg_sys::INT8OID || !snap_att.attbyval {
            error(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "gsnap_range must return (snap_id bigint, rec)",
            )
            .raise();
        }
        let mut cursor = RangeCursor::open(relid, from, to, row_desc);
        let rows = pgrx::PgMemoryContexts::new("gsnap_range rows");
        while let Some((snaps, rec)) = cursor.next_row(&mut |_, _| true) {
            // One result tuple per row version and run of snapshots; only its snap_id
            // differs from one snapshot to the next (tuplestore_puttuple copies it).
            let old = pg_sys::MemoryContextSwitchTo(rows.value());
            let cols = [pg_sys::Datum::from(0i64), rec];
            let cnulls = [false, false];
            let tuple =
                pg_sys::heap_form_tuple(desc, cols.as_ptr().cast_mut(), cnulls.as_ptr().cast_mut());
            let header = (*tuple).t_data;
            // No NULLs, so the data starts at t_hoff, and snap_id (int8, by value) first.
            let snap_id = header
                .cast::<u8>()
                .add(usize::from((*header).t_hoff))
                .cast::<i64>();
            for &snap in snaps {
                snap_id.write_unaligned(snap as i64);
                pg_sys::tuplestore_puttuple(store, tuple);
            }
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::MemoryContextReset(rows.value());
        }
    }
    pg_sys::Datum::from(0usize)
}

/// The readable snapshots in `from..=to` that hold the table, with the table as declared in
/// each. The rule every reader follows (README, "Snapshots that do not hold a table"): a
/// snapshot that does not hold the table has no rows of it, and reading a table from
/// snapshots none of which holds it is an ERROR. So snapshots of the range that do not hold
/// the table (before it used gsnap, after it was dropped) are left out; a range with no
/// readable snapshot at all, or none holding the table, raises the error.
fn snapshots_in(relid: pg_sys::Oid, from: u64, to: u64) -> Vec<(u64, TableAtSnapshot)> {
    let listing = crate::ipc::protocol::decode_snapshots(
        &crate::ipc::call_paged(crate::ipc::protocol::Kind::Snapshots, &[0], 0).reply,
    );
    let readable: Vec<u64> = listing
        .into_iter()
        .filter(|s| s.state == "committed" && s.id >= from && s.id <= to)
        .map(|s| s.id)
        .collect();
    if readable.is_empty() {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("no readable snapshot from snapshot {from} to snapshot {to}"),
        )
        .hint("gsnap_snapshots() lists the snapshots and their states.")
        .raise();
    }
    let holding: Vec<(u64, TableAtSnapshot)> = readable
        .into_iter()
        .filter_map(|s| scan_begin_if_present(s, relid).map(|t| (s, t)))
        .collect();
    if holding.is_empty() {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!(
                "table {} is in no snapshot from snapshot {from} to snapshot {to}",
                relation_name(relid)
            ),
        )
        .hint("A snapshot holds the tables that used the gsnap access method when it was taken; see gsnap_snapshot_tables().")
        .raise();
    }
    holding
}

/// Reads a table at every retained snapshot of `from..=to`, one row at a time, each row once
/// per run of snapshots that share its page image: [`RangeCursor::next_row`] hands out the
/// row (in the table's current row type) with the run's snapshots that hold it. Used by the
/// `gsnap_range` function and its custom scan.
pub struct RangeCursor {
    snaps: Vec<(u64, TableAtSnapshot)>,
    /// Keeps the groups `views` read pinned.
    _groups: Option<GroupPins>,
    views: Vec<gsnap_core::GroupView<'static>>,
    /// Segments of `snaps` in which the table has one incarnation; the next one to read.
    segments: Vec<std::ops::Range<usize>>,
    next_segment: usize,
    /// The current segment's snapshots.
    segment: std::ops::Range<usize>,
    /// The current segment's runs (block, image, snapshots sharing it); the next to pin.
    runs: Vec<gsnap_core::ImageRun>,
    next_run: usize,
    /// The pinned batch: its pins and the index of its first run in `runs`.
    batch: Option<(Pinned, usize)>,
    next_entry: usize,
    /// The current page: its run, tuples (line pointer, offset, length) into `page`.
    run: Option<gsnap_core::ImageRun>,
    page: *const u8,
    tuples: Vec<(u16, usize, usize)>,
    /// The run's snapshots that hold the block, by row type: (snapshots, the decoder of
    /// their row type); the group and tuple being read.
    holders: Vec<(Vec<u64>, usize)>,
    holder: usize,
    next_tuple: usize,
    /// The row versions of the block being read, as of its previous run (by line pointer),
    /// and those of the current run so far: a tuple a run shares with the previous run of its
    /// block (same line pointer, same bytes) is the same row, neither decoded nor checked
    /// again. Kept for one row type at a time (`versions_of`: (segment, block, the decoder
    /// of that row type)).
    versions: Vec<Version>,
    next_versions: Vec<Version>,
    versions_of: Option<(usize, u32, usize)>,
    /// Position in `versions` of the next line pointer to compare.
    version_at: usize,
    /// Whether the current page's rows are matched against `versions`.
    matching: bool,
    decoders: Decoders,
    /// The decoder of each snapshot's row type (by position in `snaps`).
    decoder_of: Vec<usize>,
    /// Decoders live in `_long`; rows, their bytes and what decoding allocates in `block_cx`,
    /// reset when the cursor moves to another block.
    _long: pgrx::PgMemoryContexts,
    block_cx: pgrx::PgMemoryContexts,
}

/// A row of one block as some run of snapshots holds it: the tuple's bytes (a copy in the
/// block's context), the `rec` datum formed from it, and whether the caller keeps it.
#[derive(Clone, Copy)]
struct Version {
    lp: u16,
    bytes: *const u8,
    len: usize,
    rec: pg_sys::Datum,
    keep: bool,
}

impl RangeCursor {
    /// Opens the range (an empty cursor if no retained snapshot of the range holds the table).
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
        let snaps = snapshots_in(relid, from, to);
        let mut segments = Vec::new();
        let mut at = 0;
        for segment in snaps.chunk_by(|a, b| a.1.rel == b.1.rel) {
            segments.push(at..at + segment.len());
            at += segment.len();
        }
        let groups = match (snaps.first(), snaps.last()) {
            (Some(first), Some(last)) => Some(GroupPins::pin(first.0, last.0, true)),
            _ => None,
        };
        let views = groups.as_ref().map(|g| g.views()).unwrap_or_default();
        // Not children of the query's context: a cursor may be dropped by a reset callback of
        // that context, after PostgreSQL deleted its children.
        // SAFETY: creating two contexts under TopMemoryContext; the cursor owns them.
        let (long, block_cx) = unsafe {
            pgrx::PgMemoryContexts::TopMemoryContext.switch_to(|_| {
                (
                    pgrx::PgMemoryContexts::new("gsnap range"),
                    pgrx::PgMemoryContexts::new("gsnap range block"),
                )
            })
        };
        let mut decoders = Decoders {
            snap: snaps.first().map_or(from, |s| s.0),
            relid,
            row_desc,
            context: long.value(),
            list: Vec::new(),
            by_row_type: HashMap::new(),
        };
        let decoder_of = snaps.iter().map(|(_, t)| decoders.index_of(t)).collect();
        RangeCursor {
            decoders,
            decoder_of,
            snaps,
            _groups: groups,
            views,
            segments,
            next_segment: 0,
            segment: 0..0,
            runs: Vec::new(),
            next_run: 0,
            batch: None,
            next_entry: 0,
            run: None,
            page: std::ptr::null(),
            tuples: Vec::new(),
            holders: Vec::new(),
            holder: 0,
            next_tuple: 0,
            versions: Vec::new(),
            next_versions: Vec::new(),
            versions_of: None,
            version_at: 0,
            matching: false,
            _long: long,
            block_cx,
        }
    }

    /// The next row (a `rec` datum of the table's current row type) and the snapshots that
    /// hold it, valid until the next call; None at the end. `keep(rec, snap)` is asked once
    /// per row version: rows it refuses are skipped, for every snapshot that holds them.
    pub fn next_row(
        &mut self,
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Option<(&[u64], pg_sys::Datum)> {
        loop {
            if self.holder < self.holders.len() {
                while self.next_tuple < self.tuples.len() {
                    let (lp, offset, len) = self.tuples[self.next_tuple];
                    self.next_tuple += 1;
                    // SAFETY: the page stays pinned while its tuples are read.
                    let bytes = unsafe { std::slice::from_raw_parts(self.page.add(offset), len) };
                    let v = match self.same_as_before(lp, bytes) {
                        Some(v) => v,
                        None => self.new_version(lp, bytes, keep),
                    };
                    if self.matching {
                        self.next_versions.push(v);
                    }
                    if v.keep {
                        return Some((&self.holders[self.holder].0, v.rec));
                    }
                }
                if self.matching {
                    std::mem::swap(&mut self.versions, &mut self.next_versions);
                    self.next_versions.clear();
                }
                self.holder += 1;
                self.next_tuple = 0;
                self.version_at = 0;
                continue;
            }
            if !self.next_page() {
                return None;
            }
        }
    }

    /// The version of line pointer `lp` in the block's previous run, if it has these bytes.
    fn same_as_before(&mut self, lp: u16, bytes: &[u8]) -> Option<Version> {
        if !self.matching {
            return None;
        }
        while self.version_at < self.versions.len() && self.versions[self.version_at].lp < lp {
            self.version_at += 1;
        }
        let v = *self.versions.get(self.version_at)?;
        // SAFETY: the copy lives in the block's context, not reset while the block is read.
        let before = unsafe { std::slice::from_raw_parts(v.bytes, v.len) };
        (v.lp == lp && before == bytes).then_some(v)
    }

    /// Decodes a tuple into a new row version (in the block's context) and asks `keep`.
    fn new_version(
        &mut self,
        lp: u16,
        bytes: &[u8],
        keep: &mut dyn FnMut(pg_sys::Datum, u64) -> bool,
    ) -> Version {
        let run = self.run.expect("a page is being read");
        let (snaps, decoder) = &self.holders[self.holder];
        let row_desc = self.decoders.row_desc;
        let decoder = &mut self.decoders.list[*decoder];
        // SAFETY: everything of this row goes to the block's context; the values match the
        // table's current row type.
        let (copy, rec) = unsafe {
            let old = pg_sys::MemoryContextSwitchTo(self.block_cx.value());
            let (values, nulls) = decoder.decode_tuple(run.block, lp, bytes);
            let rec = record(row_desc, values, nulls);
            let copy = if self.matching {
                let p = pg_sys::palloc(bytes.len()).cast::<u8>();
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
                p.cast_const()
            } else {
                std::ptr::null()
            };
            pg_sys::MemoryContextSwitchTo(old);
            (copy, rec)
        };
        Version {
            lp,
            bytes: copy,
            len: bytes.len(),
            rec,
            keep: keep(rec, snaps[0]),
        }
    }

    /// Moves to the next page of the range that some snapshot holds; false at the end.
    fn next_page(&mut self) -> bool {
        loop {
            if let Some((pinned, first_run)) = &self.batch {
                if self.next_entry < pinned.entries.len() {
                    let e = pinned.entries[self.next_entry];
                    self.next_entry += 1;
                    let run = self.runs[first_run + e.key as usize];
                    let bytes = pinned.bytes(&e);
                    let tuples = view::decode(bytes).unwrap_or_else(|e| corrupt(e));
                    let base = bytes.as_ptr() as usize;
                    self.tuples.clear();
                    self.tuples.extend(
                        tuples
                            .iter()
                            .map(|t| (t.lp, t.bytes.as_ptr() as usize - base, t.bytes.len())),
                    );
                    self.page = bytes.as_ptr();
                    self.run = Some(run);
                    // The snapshots of this run that hold the block (it may be beyond a
                    // snapshot's size, after the table shrank), grouped by row type.
                    self.holders.clear();
                    let holding: Vec<usize> = self
                        .segment
                        .clone()
                        .filter(|&i| {
                            let (s, t) = &self.snaps[i];
                            *s >= run.first.0 && *s <= run.last.0 && run.block < t.nblocks
                        })
                        .collect();
                    let (snaps, decoder_of) = (&self.snaps, &self.decoder_of);
                    for same in holding.chunk_by(|&a, &b| decoder_of[a] == decoder_of[b]) {
                        self.holders.push((
                            same.iter().map(|&i| snaps[i].0).collect(),
                            decoder_of[same[0]],
                        ));
                    }
                    self.holder = 0;
                    self.next_tuple = 0;
                    self.version_at = 0;
                    // Rows are matched with the block's previous run when all the snapshots
                    // of this run that hold the block have the row type of that run.
                    let decoder = self.holders.first().map(|h| h.1);
                    let same_block = self.versions_of.is_some_and(|(seg, block, _)| {
                        (seg, block) == (self.next_segment, run.block)
                    });
                    if !same_block {
                        // SAFETY: the rows of the previous block are consumed (the caller
                        // asked for more).
                        unsafe { pg_sys::MemoryContextReset(self.block_cx.value()) };
                    }
                    self.matching = self.holders.len() == 1;
                    if !(same_block && self.matching && self.versions_of.map(|v| v.2) == decoder) {
                        self.versions.clear();
                    }
                    self.versions_of = decoder.map(|d| (self.next_segment, run.block, d));
                    if !self.tuples.is_empty() && !self.holders.is_empty() {
                        return true;
                    }
                    continue;
                }
                self.batch = None; // unpins
            }
            if self.next_run < self.runs.len() {
                let n = images_per_batch().min(self.runs.len() - self.next_run);
                let first = self.next_run;
                let ids: Vec<u64> = self.runs[first..first + n]
                    .iter()
                    .map(|r| r.image.0)
                    .collect();
                let pinned = pin_images(&ids);
                self.next_run += n;
                let next: Vec<u64> = self.runs[self.next_run..]
                    .iter()
                    .take(images_per_batch())
                    .map(|r| r.image.0)
                    .collect();
                prefetch_images(&next);
                self.batch = Some((pinned, first));
                self.next_entry = 0;
                continue;
            }
            let Some(segment) = self.segments.get(self.next_segment).cloned() else {
                return false;
            };
            self.next_segment += 1;
            let rel = self.snaps[segment.start].1.rel;
            let (first, last) = (self.snaps[segment.start].0, self.snaps[segment.end - 1].0);
            self.runs.clear();
            let runs = &mut self.runs;
            gsnap_core::range(
                &self.views,
                SnapId(first),
                SnapId(last),
                RelId(rel),
                &mut |r| runs.push(r),
            )
            .unwrap_or_else(|e| index_error(e));
            self.segment = segment;
            self.next_run = 0;
        }
    }
}

fn corrupt(e: gsnap_format::FormatError) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("a stored page view is corrupt: {e}"),
    )
    .raise()
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_gsnap_diff() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `gsnap_diff(anyelement, a bigint, b bigint)`.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_diff(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: called by PostgreSQL as a set-returning function.
    unsafe {
        let relid = table_of_first_argument(fcinfo, "gsnap_diff");
        require_gsnap_database();
        require_read_access(relid);
        let a = int8_arg(fcinfo, 1, "the first snapshot of gsnap_diff");
        let b = int8_arg(fcinfo, 2, "the second snapshot of gsnap_diff");
        let (desc, store, row_desc) = result_set(fcinfo);
        let added = pg_sys::Datum::from(pg_sys::cstring_to_text(c"added".as_ptr()));
        let removed = pg_sys::Datum::from(pg_sys::cstring_to_text(c"removed".as_ptr()));
        diff_rows(relid, a, b, row_desc, &mut |is_added, rec| {
            let cols = [if is_added { added } else { removed }, rec];
            let cnulls = [false, false];
            pg_sys::tuplestore_putvalues(
                store,
                desc,
                cols.as_ptr().cast_mut(),
                cnulls.as_ptr().cast_mut(),
            );
        });
    }
    pg_sys::Datum::from(0usize)
}

/// A row on one side of a diff: the `rec` datum (a composite of the table's current row
/// type, formed by `heap_form_tuple`, so equal values give equal bytes).
struct Side {
    rec: pg_sys::Datum,
}

impl Side {
    /// The whole composite datum, the identity rows are compared by.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `rec` is a formed composite datum (a 4-byte varlena header with its length),
        // alive for the whole call.
        unsafe {
            let p = self.rec.cast_mut_ptr::<u8>();
            let len = pgrx::varlena::varsize_any(p.cast());
            std::slice::from_raw_parts(p, len)
        }
    }
}

/// One side of a diff: the decoder of its row type and the table's size in blocks then.
struct DiffSide {
    decoder: Decoder,
    nblocks: u32,
}

/// Decodes `bytes` (tuple `lp` of `block`) with `side` into a `rec` datum.
///
/// # Safety
/// In a transaction; `row_desc` is the table's current row type.
unsafe fn side_row(
    side: &mut DiffSide,
    row_desc: pg_sys::TupleDesc,
    block: u32,
    lp: u16,
    bytes: &[u8],
) -> Side {
    let (values, nulls) = side.decoder.decode_tuple(block, lp, bytes);
    // SAFETY: values match the table's row type.
    let rec = unsafe { record(row_desc, values, nulls) };
    Side { rec }
}

/// Compares the changed pages `pages`, reading each image once: tuples of one page with the
/// same line pointer and the same bytes on both sides are no change; every other tuple is a
/// removed row (side a) or an added row (side b).
///
/// # Safety
/// In a transaction; the decoders match the sides' row types.
unsafe fn changed_rows(
    pages: &[PageDiff],
    sides: &mut [Option<DiffSide>; 2],
    row_desc: pg_sys::TupleDesc,
    removed: &mut Vec<Side>,
    added: &mut Vec<Side>,
) {
    // The image of each side of a page, if the block exists on that side.
    let nblocks = [0, 1].map(|i| sides[i].as_ref().map(|s| s.nblocks));
    let image_of = |d: &PageDiff, side: usize| {
        let image = if side == 0 { d.before } else { d.after };
        nblocks[side]
            .filter(|&n| d.block < n)
            .and(image)
            .map(|i| i.0)
    };
    let per_batch = (images_per_batch() / 2).max(1);
    let ids_of = |batch: &[PageDiff]| {
        let mut ids: Vec<u64> = Vec::with_capacity(batch.len() * 2);
        for d in batch {
            for side in 0..2 {
                if let Some(id) = image_of(d, side) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        ids
    };
    for_each_pinned_batch(pages, per_batch, ids_of, |batch, ids, pinned| {
        let bytes_of = |id: Option<u64>| -> Vec<view::ViewTuple<'_>> {
            let Some(id) = id else { return Vec::new() };
            let at = ids
                .iter()
                .position(|&x| x == id)
                .expect("the batch lists every image");
            let e = &pinned.entries[pinned
                .entries
                .binary_search_by_key(&(at as u32), |e| e.key)
                .expect("pin_images pins every image it is given")];
            view::decode(pinned.bytes(e)).unwrap_or_else(|e| corrupt(e))
        };
        for d in batch {
            let before = bytes_of(image_of(d, 0));
            let after = bytes_of(image_of(d, 1));
            // A tuple of side 0 (removed) or side 1 (added) of this page.
            let mut take = |side: usize, t: &view::ViewTuple<'_>| {
                let s = sides[side].as_mut().expect("the side has this page");
                // SAFETY: the caller's contract (the decoders match the sides' row types).
                let row = unsafe { side_row(s, row_desc, d.block, t.lp, t.bytes) };
                if side == 0 {
                    removed.push(row);
                } else {
                    added.push(row);
                }
            };
            // Both views list their tuples by increasing line pointer: merge them.
            let (mut i, mut j) = (0, 0);
            while i < before.len() || j < after.len() {
                match (before.get(i), after.get(j)) {
                    (Some(x), Some(y)) if x.lp == y.lp && x.bytes == y.bytes => {
                        i += 1;
                        j += 1;
                    }
                    (Some(x), Some(y)) if y.lp < x.lp => {
                        take(1, y);
                        j += 1;
                    }
                    (Some(x), _) => {
                        take(0, x);
                        i += 1;
                    }
                    (None, Some(y)) => {
                        take(1, y);
                        j += 1;
                    }
                    (None, None) => unreachable!(),
                }
            }
        }
    });
}

/// Calls `emit(added, rec)` for each row that differs between snapshots `a` and `b`.
///
/// # Safety
/// `row_desc` is the table's current row type; call in a transaction.
unsafe fn diff_rows(
    relid: pg_sys::Oid,
    a: u64,
    b: u64,
    row_desc: pg_sys::TupleDesc,
    emit: &mut dyn FnMut(bool, pg_sys::Datum),
) {
    let ta = scan_begin_if_present(a, relid);
    let tb = scan_begin_if_present(b, relid);
    if ta.is_none() && tb.is_none() {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!(
                "table {} is in neither snapshot {a} nor snapshot {b}",
                relation_name(relid)
            ),
        )
        .raise();
    }
    let pins_a = GroupPins::pin(a, a, true);
    let pins_b = GroupPins::pin(b, b, true);
    // Pages whose image differs: (block, before, after).
    let mut pages: Vec<PageDiff> = Vec::new();
    match (&ta, &tb) {
        (Some(x), Some(y)) if x.rel == y.rel => {
            gsnap_core::diff(
                pins_a.view_of(a),
                SnapId(a),
                pins_b.view_of(b),
                SnapId(b),
                RelId(x.rel),
                &mut |d| pages.push(d),
            )
            .unwrap_or_else(|e| index_error(e));
        }
        _ => {
            // Different incarnations (the table was rewritten, created or converted in
            // between): every page of each side.
            let mut all: HashMap<u32, PageDiff> = HashMap::new();
            for (side, t, pins, snap) in [(0, &ta, &pins_a, a), (1, &tb, &pins_b, b)] {
                let Some(t) = t else { continue };
                let view = pins.view_of(snap);
                let tree = view.tree(SnapId(snap)).unwrap_or_else(|e| index_error(e));
                if let Some(rel) = tree
                    .relation(RelId(t.rel))
                    .unwrap_or_else(|e| index_error(e))
                {
                    rel.scan(0..t.nblocks, &mut |block, image| {
                        let d = all.entry(block).or_insert(PageDiff {
                            block,
                            before: None,
                            after: None,
                        });
                        if side == 0 {
                            d.before = Some(image);
                        } else {
                            d.after = Some(image);
                        }
                    })
                    .unwrap_or_else(|e| index_error(e));
                }
            }
            pages = all.into_values().collect();
            pages.sort_by_key(|d| d.block);
        }
    }
    let side = |t: &Option<TableAtSnapshot>, snap: u64| {
        t.as_ref().map(|t| DiffSide {
            // SAFETY: the caller's contract.
            decoder: unsafe { Decoder::new(snap, relid, t.row_type.clone(), row_desc) },
            nblocks: t.nblocks,
        })
    };
    let mut sides = [side(&ta, a), side(&tb, b)];
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    // SAFETY: the caller's contract.
    unsafe { changed_rows(&pages, &mut sides, row_desc, &mut removed, &mut added) };
    // A row that only moved (the same values on another page) is no change.
    let mut counts: HashMap<&[u8], i64> = HashMap::new();
    for r in &removed {
        *counts.entry(r.bytes()).or_default() += 1;
    }
    let mut moved: HashMap<&[u8], i64> = HashMap::new();
    for r in &added {
        let c = counts.entry(r.bytes()).or_default();
        if *c > 0 {
            *c -= 1;
            *moved.entry(r.bytes()).or_default() += 1;
        } else {
            emit(true, r.rec);
        }
    }
    for r in &removed {
        let m = moved.entry(r.bytes()).or_default();
        if *m > 0 {
            *m -= 1;
        } else {
            emit(false, r.rec);
        }
    }
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_range(rel anyelement, from_snap bigint, to_snap bigint)
    RETURNS TABLE (snap_id bigint, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_range' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_range(anyelement, bigint, bigint) IS
    'rows of a table at every snapshot of a range: SELECT snap_id, (rec).* FROM gsnap_range(NULL::t, 40, 60)';
CREATE FUNCTION gsnap_diff(rel anyelement, a bigint, b bigint)
    RETURNS TABLE (change text, rec anyelement)
    AS 'MODULE_PATHNAME', 'gsnap_diff' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_diff(anyelement, bigint, bigint) IS
    'rows added and removed between two snapshots (an update is one of each)';
"#,
    name = "gsnap_sets",
    requires = ["gsnap_preload_check_call"],
);
