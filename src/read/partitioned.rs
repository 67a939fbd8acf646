//! A partitioned table at a snapshot: the rows of the partitions it had then (README,
//! "Partitioned tables").
//!
//! A partitioned table has no storage and is in no snapshot; its partitions are, and each
//! records its ancestors at the snapshot, with the attribute each of its columns has in each
//! ancestor (`gsnap_format::definition::PartitionOf`). So the partitions of table P at snapshot
//! s are the tables of s that had P among their ancestors: partitions detached or dropped
//! since included, partitions attached since excluded.
//!
//! A partition's tuples are decoded in its own layout recorded at s, into the columns P has
//! *now*, matched through the attribute numbers recorded at s (attribute numbers survive
//! renames): a column P has gained since is NULL, a column whose type changed is converted
//! as for a plain table (`decode`), a column dropped since is not there.
//!
//! Every partition P has now must be a gsnap table, or rows of a partition no snapshot holds
//! would be silently missing: otherwise an ERROR names it.

use super::asof::{AsofRows, KeyMapUse, Row};
use super::pages::SharedBlocks;
use super::range::RangeCursor;
use super::table::{self, TableAtSnapshot};
use crate::error::error;
use crate::ffi::catalog::partitioning;
use crate::ffi::list;
use crate::ffi::memcx::OwnedContext;
use crate::ffi::relation::{relation_name, OpenRelation};
use crate::ffi::tuple;
use crate::ipc;
use crate::keymap::KeyLookup;
use gsnap_format::columns::Column;
use gsnap_format::rowtype::RowType;
use gsnap_protocol::SnapId;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// One partition of the partitioned table at the snapshot.
pub struct Leaf {
    pub relid: u32,
    pub table: TableAtSnapshot,
    /// Per attribute of the partition: the partitioned table's attribute with the same
    /// column (0: none).
    pub attnums: Vec<i16>,
    /// Its partition constraint in stored node form, over its own attributes (empty: none).
    pub constraint: String,
}

/// How a partition's tuples become rows of the partitioned table: the columns to decode
/// them into (its attributes, typed as the partitioned table's columns are now) and, per
/// column of the partitioned table, the partition attribute it takes its value from.
pub struct Layout {
    pub columns: Vec<Column>,
    pub project: Vec<Option<usize>>,
}

/// The partitions partitioned table `parent` had at snapshot `snap` (none: an empty list).
pub fn leaves(snap: u64, parent: pg_sys::Oid) -> Vec<Leaf> {
    let p = parent.to_u32();
    ipc::snapshot_tables(SnapId(snap))
        .into_iter()
        .filter(|t| t.ancestors.contains(&p))
        .map(|t| {
            let table = table::at(snap, pg_sys::Oid::from(t.relid));
            let (attnums, constraint) = place_in(&table.row_type, parent)
                .map(|(a, c)| (a.to_vec(), c.to_string()))
                .unwrap_or_else(|| {
                    crate::error::corrupt(format_args!(
                        "snapshot {snap} lists table {} under {} without recording where",
                        t.name,
                        relation_name(parent)
                    ))
                });
            Leaf {
                relid: t.relid,
                table,
                attnums,
                constraint,
            }
        })
        .collect()
}

/// Raises an ERROR if a partition `parent` has now is not a gsnap table (its rows are in no
/// snapshot, and reading the partitioned table would silently miss them).
pub fn require_gsnap_partitions(parent: pg_sys::Oid) {
    // SAFETY: a catalog lookup by name.
    let am = unsafe { pg_sys::get_am_oid(c"gsnap".as_ptr(), false) };
    // SAFETY: the partitions below `parent`, locked as a SELECT of it would lock them.
    let all = unsafe {
        list::oids(partitioning::find_all_inheritors(
            parent,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            std::ptr::null_mut(),
        ))
    };
    for relid in all {
        let Some(rel) = OpenRelation::open(relid, pg_sys::NoLock as pg_sys::LOCKMODE) else {
            continue;
        };
        let class = rel.class();
        let storage = matches!(
            class.relkind as u8,
            pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW
        );
        if storage && class.relam != am {
            error(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!(
                    "partition {} of {} does not use the gsnap access method: no snapshot holds \
                     its rows",
                    relation_name(relid),
                    relation_name(parent)
                ),
            )
            .hint(
                "Convert it (ALTER TABLE ... SET ACCESS METHOD gsnap), or read the gsnap \
                 partitions one by one.",
            )
            .raise();
        }
    }
}

thread_local! {
    /// Above 0 while a function that sent its own NOTICE runs the queries that read the
    /// table for it (`gsnap_restore`): theirs would only repeat it.
    static QUIET: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Keeps the readers' NOTICE about inheriting tables quiet while it lives.
pub struct QuietInheritance;

impl QuietInheritance {
    pub fn new() -> QuietInheritance {
        QUIET.set(QUIET.get() + 1);
        QuietInheritance
    }
}

impl Drop for QuietInheritance {
    fn drop(&mut self) {
        QUIET.set(QUIET.get() - 1);
    }
}

/// The names of the tables inheriting from table `relid` (`INHERITS`, not partitions), at
/// most five and a count of the others; None if there are none.
pub fn inheriting_tables(relid: pg_sys::Oid) -> Option<String> {
    let rel = OpenRelation::open(relid, pg_sys::NoLock as pg_sys::LOCKMODE)?;
    let class = rel.class();
    // relhassubclass may stay true after the last child went (until VACUUM clears it).
    if class.relkind as u8 != pg_sys::RELKIND_RELATION || !class.relhassubclass {
        return None;
    }
    // SAFETY: the tables below `relid`, unlocked: only their names are printed.
    let below = unsafe {
        list::oids(partitioning::find_all_inheritors(
            relid,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            std::ptr::null_mut(),
        ))
    };
    let names: Vec<String> = below
        .into_iter()
        .filter(|&r| r != relid)
        .map(relation_name)
        .collect();
    match names.len() {
        0 => None,
        1..=5 => Some(names.join(", ")),
        n => Some(format!("{}, and {} more", names[..5].join(", "), n - 5)),
    }
}

/// Sends a NOTICE if table `relid` has tables inheriting from it (`INHERITS`, not
/// partitions): gsnap reads and restores a table alone, as `FROM ONLY` and `COPY` do, where a
/// query of the table now would include their rows. `what` says what the call does with the
/// table ("reads", "restores"). Called once per query (after parse analysis) or per call.
pub fn note_inheriting_tables(relid: pg_sys::Oid, what: &str, hint: &str) {
    if QUIET.get() > 0 {
        return;
    }
    let Some(shown) = inheriting_tables(relid) else {
        return;
    };
    crate::error::notice(format!(
        "gsnap {what} table {} alone, as FROM ONLY would: the tables that inherit from it \
         ({shown}) are not included",
        relation_name(relid)
    ))
    .hint(hint)
    .send();
}

/// The layout of `leaf`'s rows in the partitioned table whose descriptor is `desc` now.
///
/// # Safety
/// `desc` is a valid descriptor.
pub unsafe fn layout(desc: pg_sys::TupleDesc, leaf: &Leaf) -> Layout {
    // SAFETY: the caller's promise.
    unsafe { layout_of(desc, &leaf.attnums) }
}

/// Where a partition whose row type is `row_type` stood under its ancestor `parent`: for
/// each of its attributes, the attribute of `parent` with the same column, and its partition
/// constraint (stored node form, empty: none); None if it was not a partition of `parent`.
pub fn place_in(row_type: &RowType, parent: pg_sys::Oid) -> Option<(&[i16], &str)> {
    let part = row_type.definition.as_ref()?.partition.as_ref()?;
    let a = part.ancestors.iter().find(|a| a.relid == parent.to_u32())?;
    Some((&a.attnums, &part.constraint))
}

/// The layout of the rows of a partition whose attributes hold the partitioned table's
/// attributes `attnums` (0: none), in that table whose descriptor is `desc` now.
///
/// # Safety
/// `desc` is a valid descriptor.
pub unsafe fn layout_of(desc: pg_sys::TupleDesc, attnums: &[i16]) -> Layout {
    // SAFETY: the caller's promise.
    let parent = unsafe { tuple::attributes(desc) };
    let live = |j: i16| {
        usize::try_from(j - 1)
            .ok()
            .and_then(|j| parent.get(j).map(|a| (j, a)))
            .filter(|(_, a)| !a.attisdropped)
    };
    let columns = attnums
        .iter()
        .map(|&j| match live(j) {
            Some((_, a)) => Column {
                dropped: false,
                type_oid: a.atttypid.to_u32(),
                typmod: a.atttypmod,
                collation: a.attcollation.to_u32(),
            },
            None => Column {
                dropped: true,
                type_oid: 0,
                typmod: -1,
                collation: 0,
            },
        })
        .collect();
    let mut project = vec![None; parent.len()];
    for (i, &j) in attnums.iter().enumerate() {
        if let Some((j, _)) = live(j) {
            project[j] = Some(i);
        }
    }
    Layout { columns, project }
}

/// True if a partition of `layout` holds each of the partitioned table's columns at the
/// table's own place, and nothing else: the first of them, in order, if it has fewer (the
/// table gained columns since; a tuple with fewer attributes reads NULL for the others).
fn same_places(layout: &Layout) -> bool {
    let n = layout.columns.len();
    layout
        .project
        .iter()
        .enumerate()
        .all(|(j, p)| *p == (j < n).then_some(j))
}

/// The readable snapshots of `from..=to` (an ERROR if there is none), and the partitions
/// `parent` had at any of them.
pub fn in_range(parent: pg_sys::Oid, from: u64, to: u64) -> (Vec<u64>, Vec<u32>) {
    let readable = table::readable_in_range(from, to);
    let p = parent.to_u32();
    let mut leaves: Vec<u32> = readable
        .iter()
        .flat_map(|&s| ipc::snapshot_tables(SnapId(s)))
        .filter(|t| t.ancestors.contains(&p))
        .map(|t| t.relid)
        .collect();
    leaves.sort_unstable();
    leaves.dedup();
    (readable, leaves)
}

/// The range cursors of the partitions `parent` had over `from..=to`, one per partition,
/// each over the snapshots at which it was one (`RangeCursor::open_partition`) and that
/// `refuted(constraint, attnums)` does not exclude (the partition's constraint and
/// attribute map recorded at that snapshot).
///
/// # Safety
/// `row_desc` is `parent`'s current row type, alive as long as the cursors; in a
/// transaction.
pub unsafe fn range_cursors(
    parent: pg_sys::Oid,
    from: u64,
    to: u64,
    row_desc: pg_sys::TupleDesc,
    refuted: &mut dyn FnMut(&str, &[i16]) -> bool,
) -> Vec<RangeCursor> {
    super::range::require_ordered(from, to);
    require_gsnap_partitions(parent);
    let (all, leaves) = in_range(parent, from, to);
    // Whether a partition at a snapshot is pruned, by its row type (shared by snapshots).
    let mut known: std::collections::HashMap<Vec<u8>, bool> = std::collections::HashMap::new();
    let mut pruned = |t: &TableAtSnapshot| {
        *known.entry(t.row_type_bytes.clone()).or_insert_with(|| {
            place_in(&t.row_type, parent)
                .is_some_and(|(attnums, constraint)| refuted(constraint, attnums))
        })
    };
    leaves
        .into_iter()
        // SAFETY: the caller's promise.
        .map(|leaf| unsafe {
            RangeCursor::open_partition(
                pg_sys::Oid::from(leaf),
                parent,
                &all,
                row_desc,
                &mut pruned,
            )
        })
        .collect()
}

/// Values of a row of the partitioned table, from a partition row decoded by its layout.
pub fn project(
    project: &[Option<usize>],
    values: &[pg_sys::Datum],
    nulls: &[bool],
    out_values: &mut Vec<pg_sys::Datum>,
    out_nulls: &mut Vec<bool>,
) {
    out_values.clear();
    out_nulls.clear();
    for p in project {
        match *p {
            Some(i) => {
                out_values.push(values[i]);
                out_nulls.push(nulls[i]);
            }
            None => {
                out_values.push(pg_sys::Datum::from(0usize));
                out_nulls.push(true);
            }
        }
    }
}

/// The partition being read.
struct Current {
    relid: u32,
    /// Its place in the list of partitions read.
    at: u32,
    rows: AsofRows,
    layout: Layout,
}

/// The rows of a partitioned table at a snapshot, partition after partition.
///
/// In a parallel scan every participant makes the same list of partitions (those of the
/// snapshot, in its order, less those the plan's conditions prune) and reads the partition
/// the shared cursor is at, taking steps of its blocks as a table's scan does: all the
/// participants read one partition, then move on together to the next.
pub struct PartitionedRows {
    snap: u64,
    desc: pg_sys::TupleDesc,
    /// The partitions to read, in order (taken when opened), and the next one's place.
    leaves: Vec<Option<Leaf>>,
    next: usize,
    /// Of a participant in a parallel scan: the cursor it shares.
    shared: Option<&'static SharedBlocks>,
    /// The consumer takes stored tuples of the partitioned table's row type
    /// ([`AsofRows::open`]).
    stored_tuples: bool,
    current: Option<Current>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    block: u32,
    lp: u16,
    /// Where a consumer forms tuples of the current row (reset at the next row).
    scratch: OwnedContext,
    /// Partitions at the snapshot, and those read (the others were pruned).
    pub partitions: usize,
    pub read: usize,
    /// Of a lookup by key: the key and hashes sought, what the partitions' key maps said so
    /// far, and how many pages they left to read in the partitions closed.
    lookup: Option<KeyLookup>,
    pub key_map: Option<KeyMapUse>,
    pages_read: usize,
}

impl PartitionedRows {
    /// Opens partitioned table `parent` (descriptor `desc` now) at snapshot `snap`, reading
    /// the partitions `keep` keeps; `shared`: as a participant of a parallel scan, reading
    /// the blocks it takes from that cursor (`keep` must then decide alike in every
    /// participant). With `stored_tuples`, rows may come as [`Row::Tuple`], as from
    /// [`AsofRows::open`]: those of a partition whose tuples at the snapshot are tuples of
    /// the partitioned table's row type now (its columns in the same places, with the same
    /// types).
    ///
    /// # Safety
    /// `desc` stays valid while the rows are read; call in a transaction.
    pub unsafe fn open(
        parent: pg_sys::Oid,
        desc: pg_sys::TupleDesc,
        snap: u64,
        keep: &mut dyn FnMut(&Leaf) -> bool,
        shared: Option<&'static SharedBlocks>,
        stored_tuples: bool,
    ) -> PartitionedRows {
        require_gsnap_partitions(parent);
        let all = leaves(snap, parent);
        let partitions = all.len();
        let leaves: Vec<Option<Leaf>> = all.into_iter().filter(|l| keep(l)).map(Some).collect();
        let read = leaves.len();
        PartitionedRows {
            snap,
            desc,
            leaves,
            next: 0,
            shared,
            stored_tuples,
            current: None,
            values: Vec::new(),
            nulls: Vec::new(),
            block: 0,
            lp: 0,
            scratch: OwnedContext::new("gsnap partitioned AS OF rows"),
            partitions,
            read,
            lookup: None,
            key_map: None,
            pages_read: 0,
        }
    }

    /// Reads in each partition only the blocks its key map says may hold one of the keys
    /// of `lookup` (the partitioned table's key), where the map covers the snapshot; call
    /// before the first row, not in a parallel scan. Each partition records the key in its
    /// own attributes (`KeyLookup::definition_in`, by the place it had at the snapshot), so
    /// partitions detached or dropped since are looked up too.
    pub fn look_up_keys(&mut self, lookup: KeyLookup) {
        self.lookup = Some(lookup);
        self.key_map = Some(KeyMapUse::PARTITIONS);
    }

    /// Of a lookup by key: the pages its maps left to read in the partitions opened so far.
    pub fn pages_read(&self) -> Option<usize> {
        self.lookup.as_ref()?;
        let current = self.current.as_ref().and_then(|c| c.rows.pages_read());
        Some(self.pages_read + current.unwrap_or(0))
    }

    /// Opens the next partition (of a parallel scan: the one the participants read now);
    /// false when all are read.
    fn open_next(&mut self) -> bool {
        if let Some(shared) = self.shared {
            // The cursor only moves forward, past the partitions this participant read.
            self.next = self.next.max(shared.blocks.leaf() as usize);
        }
        let at = self.next;
        let Some(leaf) = self.leaves.get_mut(at).and_then(Option::take) else {
            return false;
        };
        self.next += 1;
        // SAFETY: the descriptor stays valid while the rows are read (`open`'s promise).
        let layout = unsafe { layout(self.desc, &leaf) };
        let relid = pg_sys::Oid::from(leaf.relid);
        // Its tuples are the partitioned table's if its attributes are the table's, in the
        // same places (`open_columns` checks that their types are the same).
        let in_place = self.stored_tuples && same_places(&layout);
        // SAFETY: in a transaction (`open`'s promise).
        let mut rows = unsafe {
            AsofRows::open_columns(
                relid,
                layout.columns.clone(),
                self.snap,
                leaf.table,
                in_place,
            )
        };
        let at = at as u32;
        if let Some(shared) = self.shared {
            rows.share(shared, Some(at));
        } else if let (Some(lookup), Some(summary)) = (&self.lookup, &mut self.key_map) {
            let used = match lookup.definition_in(&leaf.attnums) {
                Some(definition) => rows.look_up_keys(&definition, &lookup.hashes),
                None => KeyMapUse::NoMap,
            };
            summary.count(used);
        }
        self.current = Some(Current {
            relid: leaf.relid,
            at,
            rows,
            layout,
        });
        true
    }

    /// The current partition is read (by this participant: what is left of it, the others
    /// take).
    fn close_current(&mut self) {
        let current = self.current.take();
        if let Some(n) = current.as_ref().and_then(|c| c.rows.pages_read()) {
            self.pages_read += n;
        }
        if let (Some(current), Some(shared)) = (current, self.shared) {
            // Nothing left to take from it (a partition of no blocks never moves it on).
            shared.blocks.finish_leaf(current.at);
        }
    }

    /// The next row, in the partitioned table's current row type; valid until the next call.
    pub fn next(&mut self) -> Option<Row<'_>> {
        self.next_with_partition().map(|(row, _)| row)
    }

    /// [`PartitionedRows::next`], with the OID of the partition the row comes from.
    pub fn next_with_partition(&mut self) -> Option<(Row<'_>, u32)> {
        // SAFETY: the previous row is consumed (the caller asked for the next).
        unsafe { self.scratch.reset() };
        loop {
            if self.current.is_none() && !self.open_next() {
                return None;
            }
            let current = self.current.as_mut().expect("opened above");
            match current.rows.next() {
                Some(Row::Tuple { block, lp, bytes }) => {
                    (self.block, self.lp) = (block, lp);
                    let (at, len) = (bytes.as_ptr(), bytes.len());
                    let relid = current.relid;
                    // SAFETY: the tuple lies in the page the current partition's reader
                    // keeps pinned until it is asked for its next row, which takes a call
                    // of this function: the borrow of `self` the row carries forbids that.
                    let bytes = unsafe { std::slice::from_raw_parts(at, len) };
                    return Some((Row::Tuple { block, lp, bytes }, relid));
                }
                Some(Row::Values {
                    block,
                    lp,
                    values,
                    nulls,
                    ..
                }) => {
                    project(
                        &current.layout.project,
                        values,
                        nulls,
                        &mut self.values,
                        &mut self.nulls,
                    );
                    (self.block, self.lp) = (block, lp);
                    break;
                }
                None => self.close_current(),
            }
        }
        let relid = self.current.as_ref().map_or(0, |c| c.relid);
        let row = Row::Values {
            block: self.block,
            lp: self.lp,
            values: &self.values,
            nulls: &self.nulls,
            scratch: &self.scratch,
        };
        Some((row, relid))
    }
}
