//! Computing the v-view of one heap page (docs/design.md, capture step 3).
//!
//! Under a share lock on the buffer: every normal line pointer's tuple is tested against the
//! declared MVCC snapshot, visible tuples are copied with their header *normalized* (so the
//! view depends only on what the snapshot sees), and the page is *unsettled* if a tuple
//! version's inserter or deleter is still unknown to the snapshot (in progress at
//! declaration, or started after it) and has not aborted: its view will change for a later
//! snapshot without a recorded write. Out-of-line TOAST values of the visible tuples are
//! copied into the store after the buffer is released, and the tuple's TOAST pointer is
//! rewritten to name the stored copy, so a snapshot never depends on TOAST chunks.

use crate::ffi::tuple::{self, item_pointer};
use gsnap_format::heap;
use gsnap_format::view::{self, ViewBuilder};
use gsnap_format::visibility::{self, SnapshotXids};
use pgrx::pg_sys;

/// The result of capturing one page.
pub struct PageView {
    /// The encoded view.
    pub view: Vec<u8>,
    /// Tuples in the view.
    pub tuples: usize,
    /// The view may change without a recorded write: capture the page again next time.
    pub unsettled: bool,
    /// The key hashes of the view's rows (with a key hasher; rows with a NULL key left out).
    pub keys: Vec<u64>,
}

/// A registered MVCC snapshot, asked with PostgreSQL's `XidInMVCCSnapshot` (the locked path).
struct HeldSnapshot(pg_sys::Snapshot);

impl visibility::InProgress for HeldSnapshot {
    fn in_progress(&self, xid: u32) -> bool {
        // SAFETY: a registered snapshot (capture_page's contract), on the main thread.
        unsafe { pg_sys::XidInMVCCSnapshot(pg_sys::TransactionId::from_inner(xid), self.0) }
    }
}

/// What phase one took of a page.
pub enum Copied {
    /// Its view, decided under the buffer's lock (with its TOAST values stored).
    View(PageView),
    /// The whole page, copied under the buffer's lock, to be decided after the snapshot is
    /// released ([`resolve`]); in words, so its tuples stay 8-byte aligned as on the page.
    Page(Box<[u64]>),
}

/// Reads block `block` of `rel` for `snapshot`. With `whole` (the caller can decide copies
/// after the release, [`resolve`], and has room for one), a page whose tuples
/// [`visibility::copyable`] accepts is copied whole; any other page gets its view at once,
/// where `store_toast` stores one out-of-line value (the bytes of its varlena, possibly
/// compressed) and returns the id of the stored copy. With `unchanged_at_or_before`, a page
/// whose LSN is at or before that LSN (and not 0) is not examined: None (see `restart.rs`
/// for when that is sound).
///
/// # Safety
/// `rel` must be open and locked against storage replacement, `block` below its size, and
/// `snapshot` a registered MVCC snapshot. Must run inside a transaction.
#[allow(clippy::too_many_arguments)]
pub unsafe fn capture_page<E>(
    rel: pg_sys::Relation,
    block: u32,
    snapshot: pg_sys::Snapshot,
    strategy: pg_sys::BufferAccessStrategy,
    unchanged_at_or_before: Option<u64>,
    whole: bool,
    hasher: Option<&mut crate::keymap::KeyHasher>,
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<Option<Copied>, E> {
    // SAFETY: the caller's contract: `rel` is open, `block` below its size. The buffer stays
    // share-locked while its tuples are examined and copied.
    let buffer = unsafe { share_locked(rel, block, strategy, None) };
    if let Some(floor) = unchanged_at_or_before {
        // A page that no WAL record ever set (LSN 0: new, or initialized without a record) is
        // always examined: it may have been truncated away and added again since.
        // SAFETY: the pinned, share-locked page: its header is stable.
        let lsn = unsafe { page_lsn(buffer) };
        if lsn != 0 && lsn <= floor {
            // SAFETY: releases the lock and the pin taken above.
            unsafe { pg_sys::UnlockReleaseBuffer(buffer) };
            return Ok(None);
        }
    }
    // SAFETY: the pinned, share-locked buffer's page.
    let page = unsafe { pg_sys::BufferGetPage(buffer) }.cast::<u8>();
    if whole {
        // SAFETY: the locked page.
        let copy = unsafe { copy_whole(page) };
        // The copy is checked rather than the page: the same bytes, already in the cache.
        // SAFETY: a whole page, in memory this function owns.
        if unsafe { page_copyable(copy.as_ptr().cast()) } {
            // SAFETY: releases the lock and the pin taken above; nothing points into the page.
            unsafe { pg_sys::UnlockReleaseBuffer(buffer) };
            return Ok(Some(Copied::Page(copy)));
        }
    }
    // SAFETY: the open relation.
    let relid = unsafe { (*rel).rd_id };
    // SAFETY: the locked page of `block` of `rel`, decided by PostgreSQL's own test against
    // the caller's registered snapshot (which may set hint bits on the buffer).
    let (builder, unsettled) = unsafe {
        copy_visible(page, block, relid, &mut |tuple| {
            let seen = pg_sys::HeapTupleSatisfiesVisibility(tuple, snapshot, buffer);
            // SAFETY: a normal line pointer's tuple on the locked page (read only from here).
            let t = std::slice::from_raw_parts(tuple.t_data.cast::<u8>(), tuple.t_len as usize);
            let held = &HeldSnapshot(snapshot);
            let open = visibility::unsettled(t, held, &mut CommitLog)
                .expect("every tuple has a header (for_each_tuple checks)");
            (seen, open)
        })
    };
    // SAFETY: releases the lock and the pin taken above; nothing points into the page any more.
    unsafe { pg_sys::UnlockReleaseBuffer(buffer) };
    // SAFETY: the open relation, in the caller's transaction with its snapshot registered.
    unsafe { finish(rel, builder, unsettled, hasher, store_toast) }.map(|v| Some(Copied::View(v)))
}

/// Pins block `block` of `rel` (in `recent` if that buffer still holds it, else through the
/// buffer mapping) and share-locks it; the caller releases both (`UnlockReleaseBuffer`).
///
/// # Safety
/// `rel` is open and locked, `block` below its size; in a transaction, on the main thread.
unsafe fn share_locked(
    rel: pg_sys::Relation,
    block: u32,
    strategy: pg_sys::BufferAccessStrategy,
    recent: Option<pg_sys::Buffer>,
) -> pg_sys::Buffer {
    let main = pg_sys::ForkNumber::MAIN_FORKNUM;
    let normal = pg_sys::ReadBufferMode::RBM_NORMAL;
    // SAFETY: the caller's contract; `recent` is pinned only if it still holds the block.
    unsafe {
        let buffer = match recent {
            Some(b) if pg_sys::ReadRecentBuffer((*rel).rd_node, main, block, b) => b,
            _ => pg_sys::ReadBufferExtended(rel, main, block, normal, strategy),
        };
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        buffer
    }
}

/// A copy of the page at `page`, in words.
///
/// # Safety
/// `page` is a buffer's page, pinned and share-locked (others may set hint bits meanwhile,
/// as when PostgreSQL copies a page to write it).
unsafe fn copy_whole(page: *const u8) -> Box<[u64]> {
    let mut copy = Box::<[u64]>::new_uninit_slice(PAGE / 8);
    // SAFETY: PAGE bytes of the caller's page into the copy, which holds as many; every word
    // of the copy is then written.
    unsafe {
        std::ptr::copy_nonoverlapping(page, copy.as_mut_ptr().cast::<u8>(), PAGE);
        copy.assume_init()
    }
}

/// Copies block `block` of `rel` ahead of a snapshot, without one (`ahead.rs`): the page, its
/// LSN and the buffer that held it, if a capture may later take the copy for the page after
/// checking that the LSN is unchanged: the page was set by a WAL record (LSN not 0) and every
/// tuple on it is [`visibility::copyable`]. None otherwise.
///
/// # Safety
/// `rel` is open and locked (ACCESS SHARE), WAL-logged, and `block` below its size; in a
/// transaction, on the main thread.
pub unsafe fn copy_ahead(
    rel: pg_sys::Relation,
    block: u32,
    strategy: pg_sys::BufferAccessStrategy,
) -> Option<(u64, pg_sys::Buffer, Box<[u64]>)> {
    // SAFETY: the caller's contract: `rel` is open, `block` below its size.
    let buffer = unsafe { share_locked(rel, block, strategy, None) };
    // SAFETY: the buffer pinned above; its page and header are stable under the share lock.
    let (lsn, copy) = unsafe {
        let lsn = page_lsn(buffer);
        let copy = copy_whole(pg_sys::BufferGetPage(buffer).cast::<u8>());
        pg_sys::UnlockReleaseBuffer(buffer);
        (lsn, copy)
    };
    // SAFETY: a whole page, in memory this function owns.
    (lsn != 0 && unsafe { page_copyable(copy.as_ptr().cast()) }).then_some((lsn, buffer, copy))
}

/// True if block `block` of `rel` still has the LSN `lsn` (not 0): no WAL-logged change
/// since a copy of it was made with that LSN, so the copy holds the same tuples (hint bits
/// aside, which no view depends on) and its view at any snapshot is the page's. The page is
/// looked for first in `recent`, the buffer that held it then (no lookup in the buffer
/// mapping when it is still there).
///
/// # Safety
/// `rel` is open and locked against storage replacement, WAL-logged, and `block` below its
/// size; in a transaction, on the main thread.
pub unsafe fn unchanged_since(
    rel: pg_sys::Relation,
    block: u32,
    strategy: pg_sys::BufferAccessStrategy,
    lsn: u64,
    recent: pg_sys::Buffer,
) -> bool {
    // SAFETY: the caller's contract; the header is read under the share lock, then both the
    // lock and the pin are released.
    unsafe {
        let buffer = share_locked(rel, block, strategy, Some(recent));
        let now = page_lsn(buffer);
        pg_sys::UnlockReleaseBuffer(buffer);
        lsn != 0 && now == lsn
    }
}

/// The view at the snapshot `xids` of block `block` of `rel`, copied whole by
/// [`capture_page`] (so every tuple on it is [`visibility::copyable`]).
///
/// # Safety
/// `rel` is open and locked; in a transaction, on the worker's main thread (the commit log
/// and the key hash functions are PostgreSQL's).
pub unsafe fn resolve(
    rel: pg_sys::Relation,
    block: u32,
    page: &[u64],
    xids: &SnapshotXids,
    hasher: Option<&mut crate::keymap::KeyHasher>,
) -> PageView {
    // SAFETY: the open relation.
    let relid = unsafe { (*rel).rd_id };
    let log = &mut CommitLog;
    assert_eq!(page.len() * 8, PAGE, "a whole page");
    // The copy's tuples are only read: a pointer for PostgreSQL's types.
    let page = page.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: a whole page, copied under its lock; `decide` only reads.
    let (builder, unsettled) = unsafe {
        copy_visible(page, block, relid, &mut |tuple| {
            // SAFETY: a normal line pointer's tuple, inside the copy.
            let t = std::slice::from_raw_parts(tuple.t_data.cast::<u8>(), tuple.t_len as usize);
            let checked = "every tuple has a header (for_each_tuple checks)";
            (
                visibility::visible(t, xids, log).expect(checked),
                visibility::unsettled(t, xids, log).expect(checked),
            )
        })
    };
    let no_toast = &mut |_: &[u8]| -> Result<u64, std::convert::Infallible> {
        unreachable!("a page with out-of-line values is not copied whole")
    };
    // SAFETY: the caller's open relation, on the main thread.
    match unsafe { finish(rel, builder, unsettled, hasher, no_toast) } {
        Ok(view) => view,
    }
}

/// True if every normal tuple of the page at `page` can be decided after the page is copied
/// ([`visibility::copyable`]: no out-of-line values, not moved by an old VACUUM FULL).
///
/// # Safety
/// `page` points to a whole heap page whose line pointers are stable.
unsafe fn page_copyable(page: *const u8) -> bool {
    let mut ok = true;
    // SAFETY: the caller's page; each tuple lies inside it.
    unsafe {
        for_each_tuple(page, &mut |_, at, len| {
            ok &= visibility::copyable(std::slice::from_raw_parts(page.add(at), len));
        })
    };
    ok
}

/// Calls `f` with the offset number and the place (start and length within the page) of each
/// normal line pointer's tuple of the heap page at `page` that lies inside the page and is
/// long enough for a tuple header (none for a new page).
///
/// # Safety
/// `page` points to `BLCKSZ` readable bytes whose header and line pointers are stable.
unsafe fn for_each_tuple(page: *const u8, f: &mut dyn FnMut(u16, usize, usize)) {
    // SAFETY: the caller's page: every read below is within its BLCKSZ bytes.
    let u32_at = |at: usize| unsafe { page.add(at).cast::<u32>().read_unaligned() };
    // PageHeaderData: pd_lower and pd_upper at 12 and 14; the line pointers from 24, four
    // bytes each: lp_off (15 bits), lp_flags (2), lp_len (15).
    let bounds = u32_at(12);
    let (lower, upper) = ((bounds & 0xFFFF) as usize, (bounds >> 16) as usize);
    if upper == 0 {
        return; // PageIsNew
    }
    let count = lower.min(PAGE).saturating_sub(LINE_POINTERS_AT) / 4;
    for i in 0..count {
        let lp = u32_at(LINE_POINTERS_AT + 4 * i);
        let (at, flags, len) = ((lp & 0x7FFF) as usize, (lp >> 15) & 3, (lp >> 17) as usize);
        if flags == pg_sys::LP_NORMAL && len >= heap::MIN_HEADER_LEN && at + len <= PAGE {
            f(i as u16 + 1, at, len);
        }
    }
}

/// Where a heap page's line pointers start (`SizeOfPageHeaderData`).
const LINE_POINTERS_AT: usize = 24;

/// The size of a page.
const PAGE: usize = pg_sys::BLCKSZ as usize;

/// PostgreSQL's commit log and MultiXact members, for [`visibility`].
struct CommitLog;

impl visibility::XactStatus for CommitLog {
    fn did_commit(&mut self, xid: u32) -> bool {
        // SAFETY: a commit log lookup, on the main thread.
        unsafe { pg_sys::TransactionIdDidCommit(pg_sys::TransactionId::from_inner(xid)) }
    }

    fn did_abort(&mut self, xid: u32) -> bool {
        // SAFETY: as above.
        unsafe { pg_sys::TransactionIdDidAbort(pg_sys::TransactionId::from_inner(xid)) }
    }

    fn update_xid(&mut self, tuple: &[u8]) -> u32 {
        // SAFETY: a whole tuple header (for_each_tuple checks its length), 8-byte aligned on
        // its page or in the page's copy; PostgreSQL reads its xmax and infomask only.
        unsafe { pg_sys::HeapTupleGetUpdateXid(tuple.as_ptr().cast_mut().cast()) }.into_inner()
    }
}

/// The rest of a page's capture once its visible tuples are copied: their keys are hashed
/// (before the TOAST pointers are rewritten), then their TOAST values stored and their
/// headers normalized.
///
/// # Safety
/// `rel` is open; in a transaction, on the main thread; a registered snapshot if a tuple
/// has out-of-line values (TOAST fetches need one).
unsafe fn finish<E>(
    rel: pg_sys::Relation,
    mut builder: ViewBuilder,
    unsettled: bool,
    hasher: Option<&mut crate::keymap::KeyHasher>,
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<PageView, E> {
    let mut keys = Vec::new();
    if let Some(hasher) = hasher {
        let mut tuples = Vec::with_capacity(builder.len());
        builder.tuples_mut(|t| {
            tuples.push((t.as_ptr(), t.len()));
            Ok::<(), E>(())
        })?;
        // SAFETY: complete heap tuples of `rel`, 8-byte aligned in the builder, and its
        // descriptor; on the worker's main thread.
        unsafe { hasher.hash_page(&tuples, (*rel).rd_att, &mut keys) };
        hasher.end_page();
    }
    builder.tuples_mut(|t| {
        if heap::has_external(t) {
            // SAFETY: `t` is a complete heap tuple of `rel`, 8-byte aligned in the builder.
            unsafe { copy_out_toast(rel, t, store_toast)? };
        }
        heap::normalize(t).expect("a heap tuple is at least as long as its header");
        Ok(())
    })?;
    Ok(PageView {
        tuples: builder.len(),
        view: builder.finish(),
        unsettled,
        keys,
    })
}

/// The LSN in the header of the page in `buffer`.
///
/// # Safety
/// `buffer` is pinned and at least share-locked by the caller.
unsafe fn page_lsn(buffer: pg_sys::Buffer) -> u64 {
    // SAFETY: the caller's pinned, locked buffer; every page starts with its header.
    let header = unsafe { &*pg_sys::BufferGetPage(buffer).cast::<pg_sys::PageHeaderData>() };
    (u64::from(header.pd_lsn.xlogid) << 32) | u64::from(header.pd_lsn.xrecoff)
}

/// Copies the tuples of the heap page at `page` (block `block` of relation `relid`) that
/// `decide` says are visible (headers not normalized yet) into a view builder of exactly
/// their size (so nothing is allocated or moved once copying starts); true if `decide`
/// found one unsettled. `decide` gets each normal tuple and says whether the snapshot sees
/// it and whether it is unsettled ([`visibility::unsettled`]).
///
/// # Safety
/// `page` points to a whole heap page that stays in place, its line pointers and tuples
/// stable but for hint bits (a share-locked buffer's, or a copy); `decide` may read the
/// tuple it is given, and set its hint bits.
unsafe fn copy_visible(
    page: *mut u8,
    block: u32,
    relid: pg_sys::Oid,
    decide: &mut dyn FnMut(&mut pg_sys::HeapTupleData) -> (bool, bool),
) -> (ViewBuilder, bool) {
    // The visible tuples are found first and copied after, into a builder of exactly their
    // size: room for every line pointer (dead and redirected ones too) made the builder
    // move all the tuples again when it finished, a second copy of the page.
    let mut visible: Vec<(u16, usize, usize)> = Vec::with_capacity(MAX_TUPLES_HINT);
    let mut unsettled = false;
    // SAFETY: the caller's page; each tuple lies inside it.
    unsafe {
        for_each_tuple(page, &mut |off, at, len| {
            let mut tuple = pg_sys::HeapTupleData {
                t_len: len as u32,
                t_self: item_pointer(block, off),
                t_tableOid: relid,
                t_data: page.add(at).cast(),
            };
            let (seen, open) = decide(&mut tuple);
            unsettled |= open;
            if seen {
                visible.push((off, at, len));
            }
        })
    };
    let bytes = visible
        .iter()
        .map(|&(_, _, len)| view::tuple_room(len))
        .sum();
    let mut builder = ViewBuilder::with_capacity(visible.len(), bytes);
    for (off, at, len) in visible {
        // SAFETY: a visible tuple's bytes, inside the page (no one writes them meanwhile
        // but for hint bits, which the view drops).
        builder.push(off, unsafe {
            std::slice::from_raw_parts(page.add(at), len)
        });
    }
    (builder, unsettled)
}

/// Room first reserved for the visible tuples of a page (a page of narrow rows holds a few
/// hundred).
const MAX_TUPLES_HINT: usize = 64;

/// Stores each out-of-line TOAST value of `t` and points its TOAST pointer at the copy.
///
/// # Safety
/// `t` holds a complete heap tuple of `rel`, 8-byte aligned; must run inside a transaction
/// with a registered snapshot (TOAST fetches need one).
unsafe fn copy_out_toast<E>(
    rel: pg_sys::Relation,
    t: &mut [u8],
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<(), E> {
    // SAFETY: the caller's promise: an open relation, and its descriptor.
    let (desc, relid) = unsafe { ((*rel).rd_att, (*rel).rd_id) };
    // SAFETY: as above.
    let attrs = unsafe { tuple::attributes(desc) };
    let len = t.len();
    let base = t.as_mut_ptr();
    let mut tuple = pg_sys::HeapTupleData {
        t_len: len as u32,
        t_tableOid: relid,
        t_data: base.cast(),
        ..Default::default()
    };
    let mut values = vec![pg_sys::Datum::from(0usize); attrs.len()];
    let mut nulls = vec![false; attrs.len()];
    // SAFETY: an aligned copy of a tuple of `rel`, deformed with `rel`'s descriptor: the datums
    // of varlena attributes point into the copy, so their offsets locate the TOAST pointers.
    unsafe { tuple::deform(&mut tuple, desc, &mut values, &mut nulls) };
    for (i, att) in attrs.iter().enumerate() {
        if nulls[i] || att.attlen != -1 || att.attisdropped {
            continue;
        }
        // The rest of the tuple from this attribute on, through `base` (which the datums of
        // the remaining attributes point into, so it stays the only way in).
        let ptr = values[i].cast_mut_ptr::<u8>();
        // SAFETY: the datum of a varlena attribute points into the copy, at or after `base`.
        let rest =
            unsafe { std::slice::from_raw_parts_mut(ptr, len - ptr.offset_from(base) as usize) };
        if !heap::is_toast_pointer(rest) {
            continue;
        }
        // SAFETY: a TOAST pointer of `rel`'s tuple, fetched in the caller's transaction.
        let id = unsafe { store_external(ptr, store_toast) }?;
        heap::set_toast_id(rest, id).expect("checked to be a TOAST pointer");
    }
    Ok(())
}

/// Fetches the out-of-line value the TOAST pointer at `pointer` names, stores it with
/// `store_toast`, and returns the stored copy's id.
///
/// # Safety
/// `pointer` is a TOAST pointer (a varlena) of an open relation's tuple; must run inside a
/// transaction with a registered snapshot.
unsafe fn store_external<E>(
    pointer: *mut u8,
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<u64, E> {
    // SAFETY: the caller's promise; the value is a new palloc'd copy.
    let value = unsafe { pg_sys::detoast_external_attr(pointer.cast()) }.cast::<u8>();
    // A detoasted value is an inline varlena: its header tells its whole size.
    // SAFETY: the value's first byte says how long its header is; the header is readable.
    let header = unsafe { std::slice::from_raw_parts(value, heap::varlena_header_len(*value)) };
    let size = heap::varsize_any(header).expect("a detoasted value is a varlena");
    // SAFETY: the whole value, `size` bytes.
    let id = store_toast(unsafe { std::slice::from_raw_parts(value, size) });
    // SAFETY: the copy made above, no longer used.
    unsafe { pg_sys::pfree(value.cast()) };
    id
}
