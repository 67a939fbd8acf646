//! Loading a snapshot's rows into a new table page by page (`gsnap_undrop`).
//!
//! A stored tuple whose row type is the new table's (same attributes, types and typmods, no
//! dropped or missing ones) is copied as it is: [`PageLoad::copy`] stamps it as an insert of
//! the current transaction and command (`heap_insert`'s header, `stamp_inserted`) and packs
//! it onto a page built in local memory, filled up to the table's fillfactor as heap fills a
//! page; a full page is appended to the relation whole, WAL-logged as a full page image when
//! the relation needs WAL (as CREATE INDEX writes its pages). No tuple is formed, deformed or
//! logged one by one. A row that comes as values (an out-of-line value fetched from the
//! snapshot) is formed and given to `heap_insert`, which stores its large values in the new
//! table's TOAST table.
//!
//! The new tuples are exactly those `INSERT` would have stored: visible to this transaction's
//! later commands, to others once it commits, gone with the relation if it aborts. Every block
//! written is recorded in the dirty set *after* it is written (second capture ordering), as
//! the write callbacks do (`writes.rs`).
//!
//! Only for a relation created in this transaction, which no other session can see or extend.

use crate::ffi::relation::OpenRelation;
use crate::shmem::record_write;
use gsnap_format::heap;
use pgrx::pg_sys;

/// `BLCKSZ`.
const PAGE: usize = pg_sys::BLCKSZ as usize;
/// `SizeOfPageHeaderData`.
const PAGE_HEADER: usize = 24;
/// `sizeof(ItemIdData)`.
const LINE_POINTER: usize = 4;
/// `MaxHeapTuplesPerPage` for 8 kB pages.
const MAX_TUPLES: usize = 291;
/// `HEAP_DEFAULT_FILLFACTOR`.
const DEFAULT_FILLFACTOR: usize = 100;

fn maxalign(n: usize) -> usize {
    (n + 7) & !7
}

/// A load into one new relation.
pub struct PageLoad<'a> {
    rel: &'a OpenRelation,
    xid: u32,
    cid: u32,
    /// Bytes heap leaves free on a page it fills (`RelationGetTargetPageFreeSpace`).
    save_free: usize,
    wal: bool,
    /// The tuples of the page being filled, back to back, and their lengths.
    staged: Vec<u8>,
    lengths: Vec<usize>,
    /// Bytes of the page being filled taken by line pointers and aligned tuples.
    used: usize,
    /// The page built before it is appended (u64s: MAXALIGNed, as a page must be).
    page: Box<[u64; PAGE / 8]>,
    bistate: pg_sys::BulkInsertState,
    rows: u64,
    pages: u64,
}

impl<'a> PageLoad<'a> {
    /// Starts a load into `rel`, a heap-layout relation created in this transaction.
    pub fn new(rel: &'a OpenRelation) -> PageLoad<'a> {
        let r = rel.as_ptr();
        // SAFETY: an open relation; the transaction has an id (it created the relation) and
        // the command id is marked used, as heap_insert marks it.
        let (xid, cid, fillfactor, wal, bistate) = unsafe {
            let options = (*r).rd_options.cast::<pg_sys::StdRdOptions>();
            let fillfactor = if options.is_null() {
                DEFAULT_FILLFACTOR
            } else {
                (*options).fillfactor as usize
            };
            (
                pg_sys::GetCurrentTransactionId().into_inner(),
                pg_sys::GetCurrentCommandId(true),
                fillfactor,
                needs_wal(r),
                pg_sys::GetBulkInsertState(),
            )
        };
        PageLoad {
            rel,
            xid,
            cid,
            save_free: PAGE * (100 - fillfactor.min(100)) / 100,
            wal,
            staged: Vec::with_capacity(PAGE),
            lengths: Vec::with_capacity(MAX_TUPLES),
            used: PAGE_HEADER,
            page: Box::new([0; PAGE / 8]),
            bistate,
            rows: 0,
            pages: 0,
        }
    }

    /// Adds a stored tuple (header and data, of the relation's row type, no out-of-line
    /// value), as `heap_insert` would fill pages.
    pub fn copy(&mut self, tuple: &[u8]) {
        let need = LINE_POINTER + maxalign(tuple.len());
        // As RelationGetBufferForTuple: a page takes a tuple if it keeps its free space
        // after it (heap's PageGetHeapFreeSpace counts the new line pointer), an empty page
        // takes any.
        let free = PAGE.saturating_sub(self.used);
        if !self.lengths.is_empty()
            && (self.lengths.len() >= MAX_TUPLES || need + self.save_free > free)
        {
            self.flush();
        }
        if PAGE_HEADER + need > PAGE {
            crate::error::corrupt(format_args!(
                "a stored tuple of {} bytes does not fit on a page",
                tuple.len()
            ));
        }
        self.staged.extend_from_slice(tuple);
        self.lengths.push(tuple.len());
        self.used += need;
        self.rows += 1;
    }

    /// Adds a row given as a formed heap tuple of the relation's row type, through
    /// `heap_insert` (which stores its large values out of line).
    ///
    /// # Safety
    /// `tuple` is a valid heap tuple of the relation's row type.
    pub unsafe fn insert(&mut self, tuple: pg_sys::HeapTuple) {
        let r = self.rel.as_ptr();
        // SAFETY: the caller's promise; our open relation and bulk insert state. heap_insert
        // leaves the tuple's TID in t_self; the block is recorded after the write.
        unsafe {
            pg_sys::heap_insert(r, tuple, self.cid, 0, self.bistate);
            record_write(r, crate::am::tid_block(&(*tuple).t_self));
        }
        self.rows += 1;
    }

    /// Appends the page being filled to the relation.
    fn flush(&mut self) {
        if self.lengths.is_empty() {
            return;
        }
        let r = self.rel.as_ptr();
        // SAFETY: the relation is open and ours alone (created in this transaction, locked
        // ACCESS EXCLUSIVE), so extending it with P_NEW needs no extension lock; the new
        // buffer is pinned, and locked before it is written.
        let buffer = unsafe {
            let b = pg_sys::ReadBufferExtended(
                r,
                pg_sys::ForkNumber::MAIN_FORKNUM,
                pg_sys::InvalidBlockNumber,
                pg_sys::ReadBufferMode::RBM_NORMAL,
                std::ptr::null_mut(),
            );
            pg_sys::LockBuffer(b, pg_sys::BUFFER_LOCK_EXCLUSIVE as i32);
            b
        };
        // SAFETY: a valid pinned buffer.
        let block = unsafe { pg_sys::BufferGetBlockNumber(buffer) };
        let page: pg_sys::Page = self.page.as_mut_ptr().cast();
        // SAFETY: `page` is PAGE bytes, MAXALIGNed; PageAddItemExtended copies each tuple in
        // (the page has room: `copy` counted it as heap does).
        unsafe { pg_sys::PageInit(page, PAGE, 0) };
        let mut at = 0;
        for (i, &len) in self.lengths.iter().enumerate() {
            let lp = i as u16 + 1;
            let tuple = &mut self.staged[at..at + len];
            at += len;
            heap::stamp_inserted(tuple, self.xid, self.cid, (block, lp))
                .unwrap_or_else(|e| crate::error::corrupt(format_args!("{e}")));
            // SAFETY: as above; InvalidOffsetNumber appends after the last line pointer.
            let added = unsafe {
                pg_sys::PageAddItemExtended(
                    page,
                    tuple.as_mut_ptr().cast(),
                    len,
                    pg_sys::InvalidOffsetNumber,
                    0,
                )
            };
            assert_eq!(
                added, lp,
                "a page built by a load takes every tuple staged for it"
            );
        }
        // SAFETY: the buffer is pinned and locked exclusively; the page is copied, marked
        // dirty and logged in one critical section, as every WAL-logged page change is.
        unsafe {
            pg_sys::CritSectionCount += 1;
            std::ptr::copy_nonoverlapping(
                page.cast::<u8>(),
                pg_sys::BufferGetPage(buffer).cast::<u8>(),
                PAGE,
            );
            pg_sys::MarkBufferDirty(buffer);
            if self.wal {
                pg_sys::log_newpage_buffer(buffer, true);
            }
            pg_sys::CritSectionCount -= 1;
            pg_sys::UnlockReleaseBuffer(buffer);
            record_write(r, block);
        }
        self.staged.clear();
        self.lengths.clear();
        self.used = PAGE_HEADER;
        self.pages += 1;
    }

    /// Appends the last page; returns the rows loaded and the pages written whole.
    pub fn finish(mut self) -> (u64, u64) {
        self.flush();
        let r = self.rel.as_ptr();
        // SAFETY: our bulk insert state, not used again; the relation is open.
        unsafe {
            pg_sys::FreeBulkInsertState(self.bistate);
            pg_sys::pgstat_count_heap_insert(r, self.rows as i64);
        }
        (self.rows, self.pages)
    }
}

/// `RelationNeedsWAL`: a permanent relation needs WAL unless `wal_level = minimal` and its
/// storage was created in this transaction (then it is synced at commit instead).
///
/// # Safety
/// `rel` is an open relation.
unsafe fn needs_wal(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's promise; wal_level is a setting of the process.
    unsafe {
        (*(*rel).rd_rel).relpersistence == pg_sys::RELPERSISTENCE_PERMANENT as std::ffi::c_char
            && (pg_sys::wal_level >= pg_sys::WalLevel::WAL_LEVEL_REPLICA as i32
                || ((*rel).rd_createSubid == 0 && (*rel).rd_firstRelfilenodeSubid == 0))
    }
}
