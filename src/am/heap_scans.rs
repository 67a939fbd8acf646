//! Heap's index-build and index-validate scans, run with heap's routine swapped in.
//!
//! Both end in `heap_getnext()`, which refuses a relation whose `rd_tableam` is not heap's
//! own routine ("only heap AM is supported"). They only read, so for their duration the
//! relation's routine pointer is set back to heap's and restored afterwards, also when the
//! scan raises an ERROR (the guard's `Drop` runs while the error unwinds through Rust).

use pgrx::pg_guard;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::pg_sys::{
    self, BlockNumber, IndexBuildCallback, IndexInfo, Relation, Snapshot, TableScanDesc,
    ValidateIndexState,
};

use super::heap_routine;

pub(super) fn install(r: &mut pg_sys::TableAmRoutine) {
    r.index_build_range_scan = Some(index_build_range_scan);
    r.index_validate_scan = Some(index_validate_scan);
}

/// Sets `rel`'s routine to heap's while alive.
struct HeapRoutineSwap {
    rel: Relation,
    saved: *const pg_sys::TableAmRoutine,
}

impl HeapRoutineSwap {
    /// # Safety
    /// `rel` must be an open relation that outlives the guard.
    unsafe fn new(rel: Relation) -> HeapRoutineSwap {
        // SAFETY: the caller passes an open relation.
        unsafe {
            let saved = (*rel).rd_tableam;
            (*rel).rd_tableam = heap_routine();
            HeapRoutineSwap { rel, saved }
        }
    }
}

impl Drop for HeapRoutineSwap {
    fn drop(&mut self) {
        // SAFETY: the relation is still open (see `new`).
        unsafe { (*self.rel).rd_tableam = self.saved };
    }
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn index_build_range_scan(
    table_rel: Relation,
    index_rel: Relation,
    index_info: *mut IndexInfo,
    allow_sync: bool,
    anyvisible: bool,
    progress: bool,
    start_blockno: BlockNumber,
    numblocks: BlockNumber,
    callback: IndexBuildCallback,
    callback_state: *mut std::ffi::c_void,
    scan: TableScanDesc,
) -> f64 {
    let heap = heap_routine()
        .index_build_range_scan
        .expect("heap has index_build_range_scan");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback with the routine swapped.
    unsafe {
        let _swap = HeapRoutineSwap::new(table_rel);
        pg_guard_ffi_boundary(|| {
            heap(
                table_rel,
                index_rel,
                index_info,
                allow_sync,
                anyvisible,
                progress,
                start_blockno,
                numblocks,
                callback,
                callback_state,
                scan,
            )
        })
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn index_validate_scan(
    table_rel: Relation,
    index_rel: Relation,
    index_info: *mut IndexInfo,
    snapshot: Snapshot,
    state: *mut ValidateIndexState,
) {
    let heap = heap_routine()
        .index_validate_scan
        .expect("heap has index_validate_scan");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback with the routine swapped.
    unsafe {
        let _swap = HeapRoutineSwap::new(table_rel);
        pg_guard_ffi_boundary(|| heap(table_rel, index_rel, index_info, snapshot, state));
    }
}
