//! Heap's tuple-writing callbacks, wrapped so each records the blocks it changed.
//!
//! Each wrapper calls heap's callback first and records afterwards: the dirty set must never
//! name a page whose change has not happened yet (docs/design.md, second capture ordering). A
//! wrapper records every block heap may have touched, even when heap reports a concurrency
//! failure: an extra page costs one recapture of an unchanged view, a missing one would cost
//! a wrong snapshot.

use crate::shmem::record_write;
use pgrx::pg_guard;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::pg_sys::{
    self, BulkInsertStateData, CommandId, ItemPointer, ItemPointerData, LockTupleMode,
    LockWaitPolicy, Relation, Snapshot, TM_FailureData, TM_Result, TupleTableSlot,
};

use super::heap_routine;

/// The block number of a TID.
pub(crate) fn tid_block(tid: &ItemPointerData) -> u32 {
    (u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo)
}

/// The block of the TID a slot was stored at.
///
/// # Safety
/// `slot` must be a valid slot.
unsafe fn slot_block(slot: *mut TupleTableSlot) -> u32 {
    // SAFETY: the caller passes a valid slot.
    unsafe { tid_block(&(*slot).tts_tid) }
}

pub(super) fn install(r: &mut pg_sys::TableAmRoutine) {
    r.tuple_insert = Some(tuple_insert);
    r.tuple_insert_speculative = Some(tuple_insert_speculative);
    r.tuple_complete_speculative = Some(tuple_complete_speculative);
    r.multi_insert = Some(multi_insert);
    r.tuple_delete = Some(tuple_delete);
    r.tuple_update = Some(tuple_update);
    r.tuple_lock = Some(tuple_lock);
}

#[pg_guard]
unsafe extern "C-unwind" fn tuple_insert(
    rel: Relation,
    slot: *mut TupleTableSlot,
    cid: CommandId,
    options: i32,
    bistate: *mut BulkInsertStateData,
) {
    let heap = heap_routine().tuple_insert.expect("heap has tuple_insert");
    // SAFETY: we forward PostgreSQL's own arguments to heap's callback (errors it raises are
    // turned into Rust panics by the boundary and back into ERRORs by #[pg_guard]); then the
    // slot holds the stored tuple's TID, in the open relation `rel`.
    unsafe {
        pg_guard_ffi_boundary(|| heap(rel, slot, cid, options, bistate));
        record_write(rel, slot_block(slot));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn tuple_insert_speculative(
    rel: Relation,
    slot: *mut TupleTableSlot,
    cid: CommandId,
    options: i32,
    bistate: *mut BulkInsertStateData,
    spec_token: u32,
) {
    let heap = heap_routine()
        .tuple_insert_speculative
        .expect("heap has tuple_insert_speculative");
    // SAFETY: as in tuple_insert.
    unsafe {
        pg_guard_ffi_boundary(|| heap(rel, slot, cid, options, bistate, spec_token));
        record_write(rel, slot_block(slot));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn tuple_complete_speculative(
    rel: Relation,
    slot: *mut TupleTableSlot,
    spec_token: u32,
    succeeded: bool,
) {
    let heap = heap_routine()
        .tuple_complete_speculative
        .expect("heap has tuple_complete_speculative");
    // SAFETY: as in tuple_insert.
    unsafe {
        pg_guard_ffi_boundary(|| heap(rel, slot, spec_token, succeeded));
        record_write(rel, slot_block(slot));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn multi_insert(
    rel: Relation,
    slots: *mut *mut TupleTableSlot,
    nslots: i32,
    cid: CommandId,
    options: i32,
    bistate: *mut BulkInsertStateData,
) {
    let heap = heap_routine().multi_insert.expect("heap has multi_insert");
    // SAFETY: as in tuple_insert.
    unsafe { pg_guard_ffi_boundary(|| heap(rel, slots, nslots, cid, options, bistate)) };
    let mut last = None;
    for i in 0..usize::try_from(nslots).unwrap_or(0) {
        // SAFETY: one of the `nslots` slots, whose TID heap stored.
        let block = unsafe { slot_block(*slots.add(i)) };
        if last != Some(block) {
            // SAFETY: PostgreSQL's open relation.
            unsafe { record_write(rel, block) };
            last = Some(block);
        }
    }
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn tuple_delete(
    rel: Relation,
    tid: ItemPointer,
    cid: CommandId,
    snapshot: Snapshot,
    crosscheck: Snapshot,
    wait: bool,
    tmfd: *mut TM_FailureData,
    changing_part: bool,
) -> TM_Result::Type {
    let heap = heap_routine().tuple_delete.expect("heap has tuple_delete");
    // SAFETY: `tid` is the TID of the tuple PostgreSQL deletes.
    let block = tid_block(unsafe { &*tid });
    // SAFETY: as in tuple_insert.
    let result = unsafe {
        pg_guard_ffi_boundary(|| {
            heap(
                rel,
                tid,
                cid,
                snapshot,
                crosscheck,
                wait,
                tmfd,
                changing_part,
            )
        })
    };
    // SAFETY: PostgreSQL's open relation.
    unsafe { record_write(rel, block) };
    result
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn tuple_update(
    rel: Relation,
    otid: ItemPointer,
    slot: *mut TupleTableSlot,
    cid: CommandId,
    snapshot: Snapshot,
    crosscheck: Snapshot,
    wait: bool,
    tmfd: *mut TM_FailureData,
    lockmode: *mut LockTupleMode::Type,
    update_indexes: *mut bool,
) -> TM_Result::Type {
    let heap = heap_routine().tuple_update.expect("heap has tuple_update");
    // SAFETY: `otid` is the TID of the tuple PostgreSQL updates.
    let old_block = tid_block(unsafe { &*otid });
    // SAFETY: as in tuple_insert.
    let result = unsafe {
        pg_guard_ffi_boundary(|| {
            heap(
                rel,
                otid,
                slot,
                cid,
                snapshot,
                crosscheck,
                wait,
                tmfd,
                lockmode,
                update_indexes,
            )
        })
    };
    // SAFETY: PostgreSQL's open relation.
    unsafe { record_write(rel, old_block) };
    if result == TM_Result::TM_Ok {
        // SAFETY: on success heap stored the new version's TID in the slot.
        let new_block = unsafe { slot_block(slot) };
        if new_block != old_block {
            // SAFETY: PostgreSQL's open relation.
            unsafe { record_write(rel, new_block) };
        }
    }
    result
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn tuple_lock(
    rel: Relation,
    tid: ItemPointer,
    snapshot: Snapshot,
    slot: *mut TupleTableSlot,
    cid: CommandId,
    mode: LockTupleMode::Type,
    wait_policy: LockWaitPolicy::Type,
    flags: u8,
    tmfd: *mut TM_FailureData,
) -> TM_Result::Type {
    let heap = heap_routine().tuple_lock.expect("heap has tuple_lock");
    // SAFETY: `tid` is the TID of the tuple PostgreSQL locks.
    let first_block = tid_block(unsafe { &*tid });
    // SAFETY: as in tuple_insert.
    let result = unsafe {
        pg_guard_ffi_boundary(|| {
            heap(
                rel,
                tid,
                snapshot,
                slot,
                cid,
                mode,
                wait_policy,
                flags,
                tmfd,
            )
        })
    };
    // SAFETY: PostgreSQL's open relation.
    unsafe { record_write(rel, first_block) };
    // Heap may move `*tid` forward along the update chain to the version it finally locked,
    // so both the first and the last block are recorded.
    // SAFETY: the same TID, as heap left it.
    let last_block = tid_block(unsafe { &*tid });
    if last_block != first_block {
        // SAFETY: PostgreSQL's open relation.
        unsafe { record_write(rel, last_block) };
    }
    result
}
