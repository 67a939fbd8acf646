//! gsnap's shared memory: requested at postmaster start, attached by every process.
//!
//! The layout is one struct followed by the two dirty sets' slot arrays. The pure data
//! structures live in the `gsnap-shmem` crate; this module only places them in PostgreSQL's
//! shared memory and gives the rest of the extension safe accessors.

use crate::gucs;
use gsnap_shmem::dirty::{DirtySets, SpansHeader};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::mem::size_of;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// The fixed part of gsnap's shared memory.
#[repr(C)]
struct Shared {
    spans: SpansHeader,
    /// Slots per dirty set, fixed at postmaster start.
    dirty_capacity: u64,
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

fn dirty_capacity() -> usize {
    usize::try_from(gucs::MAX_DIRTY_PAGES.get()).expect("gsnap.max_dirty_pages is positive")
}

fn slots_offset() -> usize {
    size_of::<Shared>().next_multiple_of(64)
}

fn total_size() -> usize {
    slots_offset() + 2 * dirty_capacity() * size_of::<AtomicU64>()
}

/// Installs the shared-memory hooks; called from `_PG_init` during preload.
pub fn init() {
    // SAFETY: _PG_init runs once, in the postmaster, before any other process exists.
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: called by the postmaster while it sizes shared memory.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(total_size());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: called once per postmaster start (and crash restart) with the segment mapped;
    // AddinShmemInitLock serializes ShmemInitStruct as PostgreSQL requires.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            prev();
        }
        let init_lock = addin_shmem_init_lock();
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let base = pg_sys::ShmemInitStruct(c"gsnap".as_ptr(), total_size(), &mut found);
        if !found {
            std::ptr::write_bytes(base.cast::<u8>(), 0, total_size());
            base.cast::<Shared>().write(Shared {
                spans: SpansHeader::new(),
                dirty_capacity: dirty_capacity() as u64,
            });
        }
        SHARED.store(base.cast(), Ordering::Release);
        pg_sys::LWLockRelease(init_lock);
    }
}

/// PostgreSQL's `AddinShmemInitLock` (a macro in C: entry 21 of the main LWLock array).
///
/// # Safety
/// Shared memory must be attached.
unsafe fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    // SAFETY: MainLWLockArray has NUM_FIXED_LWLOCKS entries; 21 is AddinShmemInitLock in 15.
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(21)).lock }
}

fn shared() -> &'static Shared {
    let ptr = SHARED.load(Ordering::Acquire);
    if ptr.is_null() {
        crate::require_preloaded();
        error!("gsnap shared memory is not initialized");
    }
    // SAFETY: set once by shmem_startup to a segment that lives as long as the process.
    unsafe { &*ptr }
}

/// The dirty sets of the current and the retired span.
pub fn dirty_sets() -> DirtySets<'static> {
    let shared = shared();
    let capacity = shared.dirty_capacity as usize;
    // SAFETY: shmem_startup reserved two arrays of `capacity` zero-initialized AtomicU64
    // right after the 64-byte aligned fixed part; the segment lives as long as the process.
    unsafe {
        let first = (shared as *const Shared)
            .cast::<u8>()
            .add(slots_offset())
            .cast::<AtomicU64>();
        let set0 = std::slice::from_raw_parts(first, capacity);
        let set1 = std::slice::from_raw_parts(first.add(capacity), capacity);
        DirtySets::new(&shared.spans, set0, set1)
    }
}

/// True for relations whose pages gsnap never snapshots (temporary tables: only their own
/// session can read them, and they vanish with it).
fn is_private(rel: pg_sys::Relation) -> bool {
    // SAFETY: callers pass an open relation.
    unsafe { (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_TEMP }
}

/// Records that `block` of `rel` was written in the current span (DESIGN.md, capture 1).
pub fn record_write(rel: pg_sys::Relation, block: u32) {
    if !is_private(rel) {
        // SAFETY: `rel` is open.
        dirty_sets().record(unsafe { (*rel).rd_id }.to_u32(), block);
    }
}

/// Marks `rel` for a full capture at the next snapshot (its storage was replaced).
pub fn mark_full_capture(rel: pg_sys::Relation) {
    if !is_private(rel) {
        // SAFETY: `rel` is open.
        dirty_sets().mark_full(unsafe { (*rel).rd_id }.to_u32());
    }
}
