//! The rows that differ between two snapshots of a table: the diff behind `gsnap_diff`.
//!
//! The two page tables are walked together in the index, skipping the subtrees they share
//! (`gsnap_core::diff`), so only blocks whose images differ are read. Per block, tuples at
//! the same line pointer with the same bytes on both sides are no change
//! (`gsnap_format::diff::changed_tuples`); the others are removed (side a) or added (side b)
//! rows. A block whose image at b was stored with its delta from the image at a (the
//! capture keeps one for each changed page, `gsnap_format::delta`) is read from that delta,
//! which holds exactly those tuples; the others read both images, each once. A row removed from one page and added unchanged on another (VACUUM FULL, CLUSTER,
//! a non-HOT update that changed nothing) is no change (`cancel_moves`), rows compared by
//! their formed `rec` datums.

use super::decode::{current_columns, Decoder};
use super::partitioned;
use super::pins::{GroupPins, ImageBatches};
use super::range::form_record;
use super::table::{self, TableAtSnapshot};
use crate::error::{corrupt, corrupt_index, error};
use crate::ffi::relation::{relation_kind, relation_name};
use gsnap_core::{ImageId, PageDiff, RelId, SnapId};
use gsnap_format::columns::Column;
use gsnap_format::diff::{cancel_moves_hashed, changed_tuples, Change, KeyHasher};
use gsnap_format::{delta, view};
use gsnap_protocol::DELTA_OF;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::collections::BTreeMap;

/// One side of a diff: the decoder of its row type, the table's size in blocks then, and
/// for a partition, which decoded value each column of the partitioned table takes.
struct Side {
    decoder: Decoder,
    nblocks: u32,
    project: Option<Vec<Option<usize>>>,
}

/// How a diff read the pages that changed (EXPLAIN ANALYZE shows it).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiffReads {
    /// Blocks whose image differs between the two snapshots.
    pub pages: u64,
    /// Of those, the blocks read from the delta of their image at b.
    pub from_deltas: u64,
}

/// What one side of a diff reads: the table at the snapshot, the columns to decode its
/// tuples into and, for a partition, the projection to the partitioned table's columns.
pub struct SideInput {
    pub table: TableAtSnapshot,
    pub columns: Vec<Column>,
    pub project: Option<Vec<Option<usize>>>,
}

/// The bytes of a formed `rec` datum (a composite with a 4-byte varlena header), the
/// identity rows are compared by.
fn rec_bytes(rec: &pg_sys::Datum) -> &[u8] {
    let p = rec.cast_mut_ptr::<u8>().cast_const();
    // SAFETY: `rec` is a datum formed by heap_form_tuple (a 4-byte varlena header holding its
    // length), alive for the whole diff.
    unsafe {
        let len = pgrx::varlena::varsize_any(p.cast());
        std::slice::from_raw_parts(p, len)
    }
}

/// The hashes and identities (formed bytes) of `rows`.
fn identities(rows: &[Changed]) -> Vec<(u64, &[u8])> {
    rows.iter().map(|c| (c.hash, rec_bytes(&c.rec))).collect()
}

/// The pages whose image differs between the two sides (block, before, after).
fn changed_pages(
    a: (u64, Option<&TableAtSnapshot>, &GroupPins),
    b: (u64, Option<&TableAtSnapshot>, &GroupPins),
) -> Vec<PageDiff> {
    let mut pages = Vec::new();
    match (a.1, b.1) {
        (Some(x), Some(y)) if x.rel == y.rel => {
            gsnap_core::diff(
                a.2.view_of(a.0),
                SnapId(a.0),
                b.2.view_of(b.0),
                SnapId(b.0),
                RelId(x.rel),
                &mut |d| pages.push(d),
            )
            .unwrap_or_else(|e| corrupt_index(e));
        }
        _ => {
            // Different incarnations (the table was rewritten, created or converted in
            // between), or one side only: every page of each side.
            let mut all: BTreeMap<u32, PageDiff> = BTreeMap::new();
            for (side, (snap, t, pins)) in [a, b].into_iter().enumerate() {
                let Some(t) = t else { continue };
                let view = pins.view_of(snap);
                let tree = view.tree(SnapId(snap)).unwrap_or_else(|e| corrupt_index(e));
                let relation = tree
                    .relation(RelId(t.rel))
                    .unwrap_or_else(|e| corrupt_index(e));
                let Some(relation) = relation else { continue };
                relation
                    .scan(0..t.nblocks, &mut |block, image| {
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
                    .unwrap_or_else(|e| corrupt_index(e));
            }
            pages = all.into_values().collect();
        }
    }
    pages
}

/// Calls `emit(change, rec, at)` for each row that differs between snapshots `a` and `b`
/// (added rows first, then removed ones; `at` is the row's block and line pointer at its
/// snapshot, b for an added row, a for a removed one, in its partition for a partitioned
/// table), and says how the changed pages were read. A snapshot that does not hold the table has no rows of
/// it; neither holding it is an ERROR. A partitioned table's rows are those of the
/// partitions it had at each snapshot (`super::partitioned`): partitions in both are
/// compared page by page, a partition in one only counts all its rows; a row that moved
/// between partitions unchanged is no change.
///
/// # Safety
/// `row_desc` is the table's current row type; call in a transaction.
pub unsafe fn diff_rows(
    relid: pg_sys::Oid,
    a: u64,
    b: u64,
    row_desc: pg_sys::TupleDesc,
    emit: &mut dyn FnMut(Change, pg_sys::Datum, (u32, u16)),
) -> DiffReads {
    let mut rows = Collected::default();
    let mut reads = DiffReads::default();
    if relation_kind(relid) == Some(pg_sys::RELKIND_PARTITIONED_TABLE) {
        partitioned::require_gsnap_partitions(relid);
        let (la, lb) = (partitioned::leaves(a, relid), partitioned::leaves(b, relid));
        if la.is_empty() && lb.is_empty() {
            neither(relid, a, b);
        }
        let mut relids: Vec<u32> = la.iter().chain(&lb).map(|l| l.relid).collect();
        relids.sort_unstable();
        relids.dedup();
        let (mut la, mut lb) = (la, lb);
        for leaf in relids {
            let side = |list: &mut Vec<partitioned::Leaf>| {
                let i = list.iter().position(|l| l.relid == leaf)?;
                let l = list.swap_remove(i);
                // SAFETY: the caller's promise.
                let layout = unsafe { partitioned::layout(row_desc, &l) };
                Some(SideInput {
                    table: l.table,
                    columns: layout.columns,
                    project: Some(layout.project),
                })
            };
            let (sa, sb) = (side(&mut la), side(&mut lb));
            let leaf = pg_sys::Oid::from(leaf);
            // SAFETY: the caller's promise.
            unsafe { collect(leaf, (a, sa), (b, sb), row_desc, &mut rows, &mut reads) };
        }
    } else {
        let (ta, tb) = (table::held_by(a, relid), table::held_by(b, relid));
        if ta.is_none() && tb.is_none() {
            neither(relid, a, b);
        }
        let side = |t: Option<TableAtSnapshot>| {
            t.map(|table| SideInput {
                table,
                // SAFETY: the caller's promise.
                columns: unsafe { current_columns(row_desc) },
                project: None,
            })
        };
        // SAFETY: the caller's promise.
        unsafe {
            collect(
                relid,
                (a, side(ta)),
                (b, side(tb)),
                row_desc,
                &mut rows,
                &mut reads,
            )
        };
    }
    let (added, removed) = (&rows.added, &rows.removed);
    let net = cancel_moves_hashed(&identities(removed), &identities(added));
    for i in net.added {
        emit(Change::Added, added[i].rec, added[i].at);
    }
    for i in net.removed {
        emit(Change::Removed, removed[i].rec, removed[i].at);
    }
    reads
}

/// The blocks of table `relid` that have another image at the newest snapshot holding it
/// than at snapshot `a`, in block order, from the index alone (no image is read); None unless
/// `a` holds the table in the same incarnation as the newest.
pub fn blocks_changed_since(relid: pg_sys::Oid, a: u64) -> Option<Vec<u32>> {
    let ta = table::held_by(a, relid)?;
    let (b, tb) = table::in_range(relid, a, i64::MAX as u64).pop()?;
    if ta.rel != tb.rel {
        return None;
    }
    let (pins_a, pins_b) = (GroupPins::pin(a, a, false), GroupPins::pin(b, b, false));
    let pages = changed_pages((a, Some(&ta), &pins_a), (b, Some(&tb), &pins_b));
    Some(pages.into_iter().map(|p| p.block).collect())
}

/// True if snapshots `a` and `b` both hold table `relid` in one incarnation, with the same
/// row type and recorded definition.
pub fn same_definition(relid: pg_sys::Oid, a: u64, b: u64) -> bool {
    match (table::held_by(a, relid), table::held_by(b, relid)) {
        (Some(ta), Some(tb)) => ta.rel == tb.rel && ta.row_type_bytes == tb.row_type_bytes,
        _ => false,
    }
}

/// The ERROR of a diff of two snapshots neither of which holds the table.
fn neither(relid: pg_sys::Oid, a: u64, b: u64) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        format!(
            "table {} is in neither snapshot {a} nor snapshot {b}",
            relation_name(relid)
        ),
    )
    .hint(crate::error::HINT_TABLES_OF_SNAPSHOT)
    .raise()
}

/// Adds to `collected` the rows of table `relid` (one table, or one partition) that differ
/// between its two sides, formed as rows of `row_desc`, and to `reads` how its changed pages
/// were read.
///
/// # Safety
/// `row_desc` is the (partitioned) table's current row type; call in a transaction.
unsafe fn collect(
    relid: pg_sys::Oid,
    (a, ia): (u64, Option<SideInput>),
    (b, ib): (u64, Option<SideInput>),
    row_desc: pg_sys::TupleDesc,
    collected: &mut Collected,
    reads: &mut DiffReads,
) {
    let pins_a = GroupPins::pin(a, a, true);
    let pins_b = GroupPins::pin(b, b, true);
    for (snap, t) in [(a, &ia), (b, &ib)] {
        if let Some(t) = t {
            table::confirm_readable(&[snap], t.table.lease);
        }
    }
    let (ta, tb) = (ia.as_ref().map(|s| &s.table), ib.as_ref().map(|s| &s.table));
    let pages = changed_pages((a, ta, &pins_a), (b, tb, &pins_b));
    let side = |i: Option<SideInput>, snap: u64| {
        i.map(|i| Side {
            // SAFETY: in a transaction (the caller's promise).
            decoder: unsafe {
                Decoder::with_columns(snap, relid, i.table.row_type.clone(), i.columns)
            },
            nblocks: i.table.nblocks,
            project: i.project,
        })
    };
    let mut sides = [side(ia, a), side(ib, b)];
    let mut rows = Rows {
        sides: &mut sides,
        row_desc,
        collected,
        values: Vec::new(),
        nulls: Vec::new(),
    };
    // A page whose block both sides hold, with an image on each, is read from the delta of
    // its image at b if there is one from its image at a; the others (and those whose delta
    // is missing or from another base) from both images, the two pinned together: key
    // (page, side).
    let mut deltas: ImageBatches<usize> = ImageBatches::of_deltas();
    let mut images: ImageBatches<(usize, usize)> = ImageBatches::default();
    for (i, d) in pages.iter().enumerate() {
        let holds = rows.holds(d.block);
        match (d.before, d.after) {
            (Some(_), Some(after)) if holds == [true, true] => {
                deltas.push(i, after.0 | DELTA_OF);
            }
            _ => push_images(&mut images, i, d, holds),
        }
    }
    reads.pages += pages.len() as u64;
    while let Some(batch) = deltas.next_batch() {
        for at in 0..batch.len() {
            let (page, bytes) = batch.get(at);
            let d = &pages[page];
            let read = delta::decode(bytes).and_then(|delta| match delta {
                Some(delta) if Some(ImageId(delta.base)) == d.before => {
                    reads.from_deltas += 1;
                    delta.for_each(|change, t| rows.changed(d.block, change, t))
                }
                _ => {
                    push_images(&mut images, page, d, rows.holds(d.block));
                    Ok(())
                }
            });
            read.unwrap_or_else(|e| {
                corrupt(format_args!(
                    "the stored delta of block {} is corrupt: {e}",
                    d.block
                ))
            });
        }
    }
    while let Some(batch) = images.next_batch() {
        let mut at = 0;
        while at < batch.len() {
            let ((page, _), _) = batch.get(at);
            let block = pages[page].block;
            let mut views: [Vec<view::ViewTuple<'_>>; 2] = [Vec::new(), Vec::new()];
            while at < batch.len() && batch.get(at).0 .0 == page {
                let ((_, side), bytes) = batch.get(at);
                views[side] = view::decode(bytes).unwrap_or_else(|e| {
                    corrupt(format_args!(
                        "a stored page view of block {block} is corrupt: {e}"
                    ))
                });
                at += 1;
            }
            changed_tuples(&views[0], &views[1], |change, t| {
                rows.changed(block, change, t)
            });
        }
    }
}

/// Queues the images of changed page `i` on the sides that hold its block.
fn push_images(
    images: &mut ImageBatches<(usize, usize)>,
    i: usize,
    d: &PageDiff,
    holds: [bool; 2],
) {
    let mut group = Vec::with_capacity(2);
    for (side, image) in [d.before, d.after].into_iter().enumerate() {
        if let (true, Some(image)) = (holds[side], image) {
            group.push(((i, side), image.0));
        }
    }
    if !group.is_empty() {
        images.push_group(&group);
    }
}

/// A changed row: the hash of its identity (its formed bytes) for `cancel_moves_hashed`, the
/// row, and its block and line pointer at its snapshot.
struct Changed {
    hash: u64,
    rec: pg_sys::Datum,
    at: (u32, u16),
}

/// The changed rows of a diff.
#[derive(Default)]
struct Collected {
    hasher: KeyHasher,
    added: Vec<Changed>,
    removed: Vec<Changed>,
}

/// The changed rows of one table being collected: each changed tuple is decoded by its
/// side, projected for a partition, and formed into a row of the table's current type.
struct Rows<'a> {
    sides: &'a mut [Option<Side>; 2],
    row_desc: pg_sys::TupleDesc,
    collected: &'a mut Collected,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
}

impl Rows<'_> {
    /// Whether each side holds `block` (the table had it at that snapshot).
    fn holds(&self, block: u32) -> [bool; 2] {
        [0, 1].map(|s| self.sides[s].as_ref().is_some_and(|s| block < s.nblocks))
    }

    /// Adds tuple `t` of `block`, removed (side a) or added (side b).
    fn changed(&mut self, block: u32, change: Change, t: view::ViewTuple<'_>) {
        let side = usize::from(change == Change::Added);
        let s = self.sides[side].as_mut().expect("the side has this page");
        let (v, n) = s.decoder.decode_tuple(block, t.lp, t.bytes);
        let (v, n) = match &s.project {
            Some(project) => {
                partitioned::project(project, v, n, &mut self.values, &mut self.nulls);
                (self.values.as_slice(), self.nulls.as_slice())
            }
            None => (v, n),
        };
        // SAFETY: the values match the table's current row type (`row_desc`, the caller's
        // promise in `collect`).
        let rec = unsafe { form_record(self.row_desc, v, n) };
        // Hashed for cancel_moves while its bytes are in the CPU's cache.
        let c = &mut *self.collected;
        let row = Changed {
            hash: c.hasher.hash(rec_bytes(&rec)),
            rec,
            at: (block, t.lp),
        };
        if change == Change::Added {
            c.added.push(row);
        } else {
            c.removed.push(row);
        }
    }
}
