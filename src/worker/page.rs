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

use gsnap_format::heap;
use gsnap_format::view::ViewBuilder;
use pgrx::pg_sys;

/// The result of capturing one page.
pub struct PageView {
    /// The encoded view.
    pub view: Vec<u8>,
    /// Tuples in the view.
    pub tuples: usize,
    /// The view may change without a recorded write: capture the page again next time.
    pub unsettled: bool,
}

/// A visible tuple copied out of the page into the page's arena of 8-byte words (so it can
/// be deformed in place): `len` bytes from word `at`.
struct Copied {
    lp: u16,
    len: usize,
    at: usize,
    has_external: bool,
}

impl Copied {
    fn bytes<'a>(&self, arena: &'a [u64]) -> &'a [u8] {
        let words = &arena[self.at..self.at + self.len.div_ceil(8)];
        // SAFETY: the words hold at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut<'a>(&self, arena: &'a mut [u64]) -> &'a mut [u8] {
        let words = &mut arena[self.at..self.at + self.len.div_ceil(8)];
        // SAFETY: as above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), self.len) }
    }
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
    // SAFETY: the caller holds the buffer lock; reading header fields and transaction status.
    unsafe {
        let infomask = u32::from((*header).t_infomask);
        let xmin_frozen = infomask & pg_sys::HEAP_XMIN_FROZEN == pg_sys::HEAP_XMIN_FROZEN;
        let xmin_aborted = !xmin_frozen && infomask & pg_sys::HEAP_XMIN_INVALID != 0;
        if xmin_aborted {
            return false; // never visible to anyone
        }
        if !xmin_frozen && unsettled_xid((*header).t_choice.t_heap.t_xmin, snapshot) {
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
            pg_sys::HeapTupleGetUpdateXid(header)
        } else {
            (*header).t_choice.t_heap.t_xmax
        };
        unsettled_xid(xmax, snapshot)
    }
}

/// Reads block `block` of `rel` and returns its view at `snapshot`. `store_toast` stores
/// one out-of-line value (the bytes of its varlena, possibly compressed) and returns the id
/// of the stored copy.
///
/// # Safety
/// `rel` must be open and locked against storage replacement, `block` below its size, and
/// `snapshot` a registered MVCC snapshot. Must run inside a transaction.
pub unsafe fn capture_page<E>(
    rel: pg_sys::Relation,
    block: u32,
    snapshot: pg_sys::Snapshot,
    strategy: pg_sys::BufferAccessStrategy,
    store_toast: &mut dyn FnMut(&[u8]) -> Result<u64, E>,
) -> Result<PageView, E> {
    let mut copied = Vec::new();
    // One allocation per page for all its tuples (a page holds at most BLCKSZ bytes of them).
    let mut arena: Vec<u64> = Vec::with_capacity(pg_sys::BLCKSZ as usize / 8 + 64);
    let mut unsettled = false;
    // SAFETY: the caller's contract; the buffer is pinned and share-locked while its
    // tuples are examined and copied, then released.
    unsafe {
        let buffer = pg_sys::ReadBufferExtended(
            rel,
            pg_sys::ForkNumber::MAIN_FORKNUM,
            block,
            pg_sys::ReadBufferMode::RBM_NORMAL,
            strategy,
        );
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        let page = pg_sys::BufferGetPage(buffer);
        if !pg_sys::PageIsNew(page) {
            let max = pg_sys::PageGetMaxOffsetNumber(page);
            for off in 1..=max {
                let item = pg_sys::PageGetItemId(page, off);
                if (*item).lp_flags() != pg_sys::LP_NORMAL {
                    continue;
                }
                let header = pg_sys::PageGetItem(page, item).cast::<pg_sys::HeapTupleHeaderData>();
                let len = (*item).lp_len() as usize;
                let mut tuple = pg_sys::HeapTupleData {
                    t_len: len as u32,
                    t_self: pg_sys::ItemPointerData::default(),
                    t_tableOid: (*rel).rd_id,
                    t_data: header,
                };
                pgrx::itemptr::item_pointer_set_all(&mut tuple.t_self, block, off);
                if tuple_unsettled(header, snapshot) {
                    unsettled = true;
                }
                if pg_sys::HeapTupleSatisfiesVisibility(&mut tuple, snapshot, buffer) {
                    let at = arena.len();
                    arena.resize(at + len.div_ceil(8), 0);
                    std::ptr::copy_nonoverlapping(
                        header.cast::<u8>(),
                        arena[at..].as_mut_ptr().cast::<u8>(),
                        len,
                    );
                    let has_external =
                        u32::from((*header).t_infomask) & pg_sys::HEAP_HASEXTERNAL != 0;
                    copied.push(Copied {
                        lp: off,
                        len,
                        at,
                        has_external,
                    });
                }
            }
        }
        pg_sys::UnlockReleaseBuffer(buffer);
    }

    let mut builder = ViewBuilder::new();
    for t in copied {
        if t.has_external {
            // SAFETY: `t` is a complete heap tuple of `rel` (aligned copy).
            unsafe { copy_out_toast(rel, t.bytes_mut(&mut arena), store_toast)? };
        }
        heap::normalize(t.bytes_mut(&mut arena))
            .expect("a heap tuple is at least as long as its header");
        builder.push(t.lp, t.bytes(&arena));
    }
    Ok(PageView {
        tuples: builder.len(),
        view: builder.finish(),
        unsettled,
    })
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
    // SAFETY: deforming an aligned copy of a tuple of `rel` with `rel`'s descriptor; the
    // datums of varlena attributes point into the copy, so their offsets locate the TOAST
    // pointers to rewrite.
    unsafe {
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let len = t.len();
        let base = t.as_mut_ptr();
        let mut tuple = pg_sys::HeapTupleData {
            t_len: len as u32,
            t_self: pg_sys::ItemPointerData::default(),
            t_tableOid: (*rel).rd_id,
            t_data: base.cast(),
        };
        let mut values = vec![pg_sys::Datum::from(0usize); natts];
        let mut nulls = vec![false; natts];
        pg_sys::heap_deform_tuple(&mut tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        for i in 0..natts {
            let att = (*desc).attrs.as_slice(natts)[i];
            if nulls[i] || att.attlen != -1 || att.attisdropped {
                continue;
            }
            // The rest of the tuple from this attribute on, through `base` (which the datums
            // of the remaining attributes point into, so it stays the only way in).
            let ptr = values[i].cast_mut_ptr::<u8>();
            let rest = std::slice::from_raw_parts_mut(ptr, len - ptr.offset_from(base) as usize);
            if !heap::is_toast_pointer(rest) {
                continue;
            }
            let value = pg_sys::detoast_external_attr(ptr.cast()).cast::<u8>();
            // A detoasted value is an inline varlena: its header tells its whole size.
            let header = std::slice::from_raw_parts(value, heap::varlena_header_len(*value));
            let size = heap::varsize_any(header).expect("a detoasted value is a varlena");
            let id = store_toast(std::slice::from_raw_parts(value, size))?;
            pg_sys::pfree(value.cast());
            heap::set_toast_id(rest, id).expect("checked to be a TOAST pointer");
        }
    }
    Ok(())
}
