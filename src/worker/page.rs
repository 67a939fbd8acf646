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

/// True if `xid` is unknown to `snapshot` (in progress at declaration, or later) and has
/// not aborted.
///
/// # Safety
/// `snapshot` must be a valid MVCC snapshot.
unsafe fn unsettled_xid(xid: pg_sys::TransactionId, snapshot: pg_sys::Snapshot) -> bool {
    // SAFETY: plain calls into PostgreSQL's transaction status functions.
    unsafe {
        xid.into_inner() >= pg_sys::TransactionId::FIRST_NORMAL.into_inner()
            && pg_sys::XidInMVCCSnapshot(xid, snapshot)
            && !pg_sys::TransactionIdDidAbort(xid)
    }
}

/// True if the tuple version at `header` may still change which snapshots see it.
///
/// # Safety
/// `header` points to a tuple header on a buffer the caller holds locked.
unsafe fn tuple_unsettled(header: pg_sys::HeapTupleHeader, snapshot: pg_sys::Snapshot) -> bool {
    // SAFETY: the caller holds the buffer lock, so the header's fields are stable.
    let (infomask, xmin, xmax) = unsafe {
        let heap = (*header).t_choice.t_heap;
        (u32::from((*header).t_infomask), heap.t_xmin, heap.t_xmax)
    };
    let xmin_frozen = infomask & pg_sys::HEAP_XMIN_FROZEN == pg_sys::HEAP_XMIN_FROZEN;
    let xmin_aborted = !xmin_frozen && infomask & pg_sys::HEAP_XMIN_INVALID != 0;
    if xmin_aborted {
        return false; // never visible to anyone
    }
    // SAFETY: the caller's valid MVCC snapshot.
    if !xmin_frozen && unsafe { unsettled_xid(xmin, snapshot) } {
        return true;
    }
    if infomask & pg_sys::HEAP_XMAX_INVALID != 0 {
        return false;
    }
    let lock_only = infomask & pg_sys::HEAP_XMAX_LOCK_ONLY != 0
        || infomask & (pg_sys::HEAP_XMAX_IS_MULTI | pg_sys::HEAP_LOCK_MASK)
            == pg_sys::HEAP_XMAX_EXCL_LOCK;
    if lock_only {
        return false; // a row lock does not change visibility
    }
    let xmax = if infomask & pg_sys::HEAP_XMAX_IS_MULTI != 0 {
        // SAFETY: a header on the locked buffer whose xmax is a MultiXact.
        unsafe { pg_sys::HeapTupleGetUpdateXid(header) }
    } else {
        xmax
    };
    // SAFETY: the caller's valid MVCC snapshot.
    unsafe { unsettled_xid(xmax, snapshot) }
}

/// Reads block `block` of `rel` and returns its view at `snapshot`. `store_toast` stores
/// one out-of-line value (the bytes of its varlena, possibly compressed) and returns the id
/// of the stored copy. With `unchanged_at_or_before`, a page whose LSN is at or before that
/// LSN (and not 0) is not examined: None (see `restart.rs` for when that is sound).
///
/// # Safety
/// `rel` must be open and locked against storage replacement, `block` below its size, and
/// `snapshot` a registered MVCC snapshot. Must run inside a transaction.
pub unsafe fn capture_page<E>(
    rel: pg_sys::Relation,
    block: u32,
    snapshot: pg_sys::Snapshot,
    strategy: pg_sys::BufferAccessStrategy,
    unchanged_at_or_before: Option<u64>,
    hasher: Option<&mut crate::keymap::KeyHasher>,
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<Option<PageView>, E> {
    let main = pg_sys::ForkNumber::MAIN_FORKNUM;
    let normal = pg_sys::ReadBufferMode::RBM_NORMAL;
    // SAFETY: the caller's contract: `rel` is open, `block` below its size.
    let buffer = unsafe { pg_sys::ReadBufferExtended(rel, main, block, normal, strategy) };
    // SAFETY: the buffer pinned above, share-locked while its tuples are examined and copied.
    unsafe { pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32) };
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
    // SAFETY: the locked buffer of `block` of `rel`, and the caller's registered snapshot.
    let (mut builder, unsettled) = unsafe { copy_visible(rel, buffer, block, snapshot) };
    // SAFETY: releases the lock and the pin taken above; nothing points into the page any more.
    unsafe { pg_sys::UnlockReleaseBuffer(buffer) };

    // The tuples were copied once, into the view being built: their keys are hashed there
    // (before the TOAST pointers are rewritten), then their TOAST pointers and headers are
    // rewritten.
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
    Ok(Some(PageView {
        tuples: builder.len(),
        view: builder.finish(),
        unsettled,
        keys,
    }))
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

/// Copies the tuples of the page in `buffer` that `snapshot` sees (headers not normalized
/// yet) into a view builder of exactly their size (so nothing is allocated or moved once
/// copying starts); true if the page is unsettled (see [`tuple_unsettled`]).
///
/// # Safety
/// `buffer` holds block `block` of the open relation `rel`, pinned and share-locked by the
/// caller; `snapshot` is a registered MVCC snapshot.
unsafe fn copy_visible(
    rel: pg_sys::Relation,
    buffer: pg_sys::Buffer,
    block: u32,
    snapshot: pg_sys::Snapshot,
) -> (ViewBuilder, bool) {
    // SAFETY: the caller's promise: the locked page, and the open relation's OID.
    let (page, relid) = unsafe { (pg_sys::BufferGetPage(buffer), (*rel).rd_id) };
    // SAFETY: the locked page.
    if unsafe { pg_sys::PageIsNew(page) } {
        return (ViewBuilder::with_capacity(0, 0), false);
    }
    // SAFETY: the locked page.
    let max = unsafe { pg_sys::PageGetMaxOffsetNumber(page) };
    // The visible tuples are found first and copied after, into a builder of exactly their
    // size: room for every line pointer (dead and redirected ones too) made the builder
    // move all the tuples again when it finished, a second copy of the page.
    let mut visible: Vec<(u16, *const u8, usize)> = Vec::with_capacity(max as usize);
    let mut unsettled = false;
    for off in 1..=max {
        // SAFETY: line pointer `off` of the locked page, at most its last.
        let item = unsafe { pg_sys::PageGetItemId(page, off) };
        // SAFETY: as above.
        let (flags, len) = unsafe { ((*item).lp_flags(), (*item).lp_len() as usize) };
        if flags != pg_sys::LP_NORMAL {
            continue;
        }
        // SAFETY: the tuple of a normal line pointer, on the locked page.
        let header =
            unsafe { pg_sys::PageGetItem(page, item) }.cast::<pg_sys::HeapTupleHeaderData>();
        let mut tuple = pg_sys::HeapTupleData {
            t_len: len as u32,
            t_self: item_pointer(block, off),
            t_tableOid: relid,
            t_data: header,
        };
        // SAFETY: the tuple's header, on the locked page; the caller's snapshot.
        unsettled |= unsafe { tuple_unsettled(header, snapshot) };
        // SAFETY: the tuple, in its locked buffer, tested against the caller's snapshot.
        if unsafe { pg_sys::HeapTupleSatisfiesVisibility(&mut tuple, snapshot, buffer) } {
            visible.push((off, header.cast::<u8>(), len));
        }
    }
    let bytes = visible
        .iter()
        .map(|&(_, _, len)| view::tuple_room(len))
        .sum();
    let mut builder = ViewBuilder::with_capacity(visible.len(), bytes);
    for (off, at, len) in visible {
        // SAFETY: a visible tuple's header and its `len` bytes, on the page still locked.
        builder.push(off, unsafe { std::slice::from_raw_parts(at, len) });
    }
    (builder, unsettled)
}

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
