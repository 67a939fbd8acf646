//! One table at one snapshot, row by row: the row iterator behind `gsnap_asof`, shared by the
//! set-returning function and the "gsnap AS OF" custom scan.
//!
//! When the row type recorded at the snapshot is the table's current one (and the consumer
//! can take stored tuples, see [`AsofRows::open`]), a tuple without out-of-line values is
//! handed out as it is stored, straight from the pinned page image, like a heap scan hands
//! out buffer tuples; every other tuple is decoded into the current row type.

use super::decode::{current_columns, Decoder};
use super::pages::{view_tuples, PageReader, SharedBlocks};
use super::table::{self, TableAtSnapshot};
use crate::ffi::memcx::OwnedContext;
use gsnap_format::columns::{self, Column};
use gsnap_format::heap;
use pgrx::pg_sys;

/// A row of a table at a snapshot.
pub enum Row<'a> {
    /// The stored tuple, valid as a tuple of the current row type (until the next row).
    Tuple {
        block: u32,
        lp: u16,
        bytes: &'a [u8],
    },
    /// The row's values in the current row type, one per attribute of the current
    /// descriptor (dropped ones NULL); valid until the next row. What they point to lives in
    /// `scratch`, reset when the reader moves to the next page: a consumer that forms a
    /// tuple from them forms it there too.
    Values {
        block: u32,
        lp: u16,
        values: &'a [pg_sys::Datum],
        nulls: &'a [bool],
        scratch: &'a OwnedContext,
    },
}

/// What a lookup by key made of the table's key map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMapUse {
    /// The map named this many blocks: only those pages are read.
    Pages(usize),
    /// The snapshot's incarnation of the table has no map for this key: every page is read.
    NoMap,
    /// The map starts at a later snapshot: every page is read.
    Later(u64),
    /// The map named more pages than a lookup takes: every page is read.
    TooMany,
    /// Of a partitioned table: the maps of `mapped` partitions named `candidates` blocks in
    /// all; every page of `whole` partitions was read (no map of theirs covered the
    /// snapshot or the range, or one named too many pages).
    Partitions {
        candidates: usize,
        mapped: usize,
        whole: usize,
    },
}

impl KeyMapUse {
    /// The summary of a partitioned table's lookups, none made yet.
    pub const PARTITIONS: KeyMapUse = KeyMapUse::Partitions {
        candidates: 0,
        mapped: 0,
        whole: 0,
    };

    /// Counts one more partition's lookup in a summary ([`KeyMapUse::PARTITIONS`]).
    pub fn count(&mut self, partition: KeyMapUse) {
        if let KeyMapUse::Partitions {
            candidates,
            mapped,
            whole,
        } = self
        {
            match partition {
                KeyMapUse::Pages(n) => {
                    *candidates += n;
                    *mapped += 1;
                }
                _ => *whole += 1,
            }
        }
    }
}

/// Of a lookup of more keys than one request to the worker carries: the fewest blocks per
/// key the table must have for the lookup to be worth it. The worker's search of the map
/// for one key costs about what reading three pages of a snapshot does (bench/sets,
/// part 4), so a wide lookup in a small table reads every page instead.
const BLOCKS_PER_KEY: usize = 3;

/// The blocks of incarnation `rel` (`nblocks` blocks at the snapshots read) that may hold
/// one of the keys hashed to `hashes` at the snapshots `from..=to`, by its key map (key
/// definition `definition`); or why every block must be read (no map, one starting after
/// `from`, too many keys or blocks).
pub fn key_blocks(
    rel: u32,
    definition: &[u8],
    hashes: &[u64],
    (from, to): (u64, u64),
    nblocks: u32,
) -> Result<Vec<u32>, KeyMapUse> {
    if hashes.len() > gsnap_protocol::MAX_KEY_HASHES
        && hashes.len().saturating_mul(BLOCKS_PER_KEY) > nblocks as usize
    {
        return Err(KeyMapUse::TooMany);
    }
    match crate::ipc::key_candidates(rel, definition, hashes, (from, to)) {
        None => Err(KeyMapUse::NoMap),
        Some((start, _)) if start.0 > from => Err(KeyMapUse::Later(start.0)),
        Some((_, None)) => Err(KeyMapUse::TooMany),
        Some((_, Some(blocks))) => Ok(blocks),
    }
}

/// The rows of one table at one snapshot, in block and line pointer order.
pub struct AsofRows {
    pages: PageReader,
    decoder: Decoder,
    in_place: bool,
    /// The current page: its block, and its tuples as (line pointer, offset, length).
    block: u32,
    tuples: Vec<(u16, usize, usize)>,
    next: usize,
    /// What decoding the current page's rows allocates; reset when the next page is read.
    scratch: OwnedContext,
}

impl AsofRows {
    /// Opens table `relid` (whose current descriptor is `desc`) at snapshot `snap`. With
    /// `stored_tuples`, rows may come as [`Row::Tuple`]: the consumer deforms tuples with a
    /// descriptor of the table's live columns that carries no missing values (the custom
    /// scan's heap slot); it is only used when the table has no dropped column.
    ///
    /// # Safety
    /// `desc` is the table's current descriptor, valid while the rows are read; call in a
    /// transaction.
    pub unsafe fn open(
        relid: pg_sys::Oid,
        desc: pg_sys::TupleDesc,
        snap: u64,
        stored_tuples: bool,
    ) -> AsofRows {
        let table: TableAtSnapshot = table::at(snap, relid);
        // SAFETY: the caller's promise.
        unsafe { Self::open_at(relid, desc, snap, table, stored_tuples) }
    }

    /// [`AsofRows::open`] with what the snapshot holds of the table already looked up.
    ///
    /// # Safety
    /// As for [`AsofRows::open`]; `desc` is only read here.
    pub unsafe fn open_at(
        relid: pg_sys::Oid,
        desc: pg_sys::TupleDesc,
        snap: u64,
        table: TableAtSnapshot,
        stored_tuples: bool,
    ) -> AsofRows {
        // SAFETY: the caller's promise.
        let current = unsafe { current_columns(desc) };
        // SAFETY: the caller's promise.
        unsafe { Self::open_columns(relid, current, snap, table, stored_tuples) }
    }

    /// [`AsofRows::open_at`] decoding into the columns `current`.
    ///
    /// # Safety
    /// Call in a transaction.
    pub unsafe fn open_columns(
        relid: pg_sys::Oid,
        current: Vec<Column>,
        snap: u64,
        table: TableAtSnapshot,
        stored_tuples: bool,
    ) -> AsofRows {
        let in_place = stored_tuples && columns::in_place(&table.row_type, &current);
        AsofRows {
            pages: PageReader::open(snap, &table),
            // SAFETY: the caller's promise.
            decoder: unsafe { Decoder::with_columns(snap, relid, table.row_type.clone(), current) },
            in_place,
            block: 0,
            tuples: Vec::new(),
            next: 0,
            scratch: OwnedContext::new("gsnap AS OF rows"),
        }
    }

    /// Reads only the pages the table's key map says may hold one of the keys hashed to
    /// `hashes` (key definition `definition`, `keymap.rs`), if the map covers the snapshot;
    /// call before the first row. Returns what the map said.
    pub fn look_up_keys(&mut self, definition: &[u8], hashes: &[u64]) -> KeyMapUse {
        let (snap, rel) = (self.pages.snap(), self.pages.rel());
        match key_blocks(rel, definition, hashes, (snap, snap), self.pages.nblocks()) {
            Ok(blocks) => {
                let n = blocks.len();
                self.pages.only(blocks);
                KeyMapUse::Pages(n)
            }
            Err(every_page) => every_page,
        }
    }

    /// Of a reader restricted by [`AsofRows::look_up_keys`]: the pages it reads (once the
    /// first row was asked for).
    pub fn pages_read(&self) -> Option<usize> {
        self.pages.restricted_to()
    }

    /// Makes this reader a participant of a parallel scan: it reads only the blocks it takes
    /// from `shared` (call before the first row); `leaf`: of partition `leaf` of the
    /// partitioned table the scan reads ([`PageReader::share`]).
    pub fn share(&mut self, shared: &'static SharedBlocks, leaf: Option<u32>) {
        self.pages.share(shared, leaf);
    }

    /// Moves to the next page with tuples; false at the end.
    fn next_page(&mut self) -> bool {
        loop {
            let Some((block, bytes)) = self.pages.next_page() else {
                return false;
            };
            view_tuples(bytes, block, &mut self.tuples);
            self.block = block;
            self.next = 0;
            // SAFETY: the previous page's rows are consumed (the caller asked for more).
            unsafe { self.scratch.reset() };
            if !self.tuples.is_empty() {
                return true;
            }
        }
    }

    /// The next row; None at the end.
    pub fn next(&mut self) -> Option<Row<'_>> {
        if self.next >= self.tuples.len() && !self.next_page() {
            return None;
        }
        let (lp, offset, len) = self.tuples[self.next];
        self.next += 1;
        let block = self.block;
        let (_, page) = self.pages.current().expect("a page is being read");
        let bytes = &page[offset..offset + len];
        if self.in_place && !heap::has_external(bytes) {
            return Some(Row::Tuple { block, lp, bytes });
        }
        let decoder = &mut self.decoder;
        let (values, nulls) = self
            .scratch
            .run(move || decoder.decode_tuple(block, lp, bytes));
        Some(Row::Values {
            block,
            lp,
            values,
            nulls,
            scratch: &self.scratch,
        })
    }
}
