//! gsnap's shared memory: requested at postmaster start, attached by every process.
//!
//! One segment, laid out as (each part 64-byte aligned):
//!
//! | part | what |
//! |---|---|
//! | [`Shared`] | worker state, capture progress, cache lock, sizes |
//! | request slots | one [`RequestSlot`] per PGPROC (`MaxBackends + NUM_AUXILIARY_PROCS`) |
//! | cache metadata | [`SlotMeta`] per cache slot, then the cache's hash table |
//! | cache data | `gsnap.image_cache_size` of 8 KB slots |
//! | group cache | its metadata region, then `gsnap.index_cache_size` of group bytes |
//! | dirty sets | three arrays of `gsnap.max_dirty_pages` keys |
//!
//! The data structures live in the pure `gsnap-shmem` crate; this module only places them
//! in PostgreSQL's shared memory and gives the rest of the extension safe accessors.

pub mod groups;
mod state;

pub use state::{Phase, Progress, ProgressShared, WorkerShared, WorkerState};

use crate::gucs;
use gsnap_shmem::cache::{CacheHeader, CacheIndex, SlotMeta};
use gsnap_shmem::dirty::{DirtySets, SpansHeader, SETS};
use gsnap_shmem::requests::RequestSlot;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::UnsafeCell;
use std::mem::size_of;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Bytes of one cache slot (a page view or a TOAST chunk).
pub const CACHE_SLOT_BYTES: usize = 8192;

/// The fixed part of gsnap's shared memory.
#[repr(C)]
pub(crate) struct Shared {
    spans: SpansHeader,
    worker: WorkerShared,
    progress: ProgressShared,
    dirty_capacity: u64,
    request_slots: u64,
    cache_slots: u64,
    groups_data: u64,
    /// The LWLock that guards the group cache's bookkeeping.
    groups_lock: AtomicPtr<pg_sys::LWLock>,
    /// The LWLock that guards the cache index (inside the main LWLock array, so at the same
    /// address in every process).
    cache_lock: AtomicPtr<pg_sys::LWLock>,
    cache_header: UnsafeCell<CacheHeader>,
    /// The last version number given to a published copy of the active index group. Kept
    /// here, not in the worker, so a restarted worker never reuses a number whose old copy
    /// may still sit in the group cache.
    active_versions: AtomicU64,
    /// Images decompressed by the backends that read them (scans in parallel queries) since
    /// the server started.
    reader_decodes: AtomicU64,
}

/// Offsets of the parts of the segment, from the sizes fixed at postmaster start.
#[derive(Clone, Copy)]
pub(crate) struct LayoutInfo {
    request_slots: usize,
    cache_slots: usize,
    dirty_capacity: usize,
    slots_at: usize,
    meta_at: usize,
    table_at: usize,
    data_at: usize,
    pub groups_meta_at: usize,
    pub groups_data_at: usize,
    pub groups_data: usize,
    dirty_at: usize,
    total: usize,
}

type Layout = LayoutInfo;

impl Layout {
    fn new(
        request_slots: usize,
        cache_slots: usize,
        groups_data: usize,
        dirty_capacity: usize,
    ) -> Layout {
        let align = |n: usize| n.next_multiple_of(64);
        let slots_at = align(size_of::<Shared>());
        let meta_at = align(slots_at + request_slots * size_of::<RequestSlot>());
        let table_at = align(meta_at + cache_slots * size_of::<SlotMeta>());
        let data_at = align(table_at + CacheIndex::table_len(cache_slots) * size_of::<u32>());
        let groups_meta_at = align(data_at + cache_slots * CACHE_SLOT_BYTES);
        let groups_data_at = align(groups_meta_at + groups::meta_size());
        let dirty_at = align(groups_data_at + groups_data);
        let total = dirty_at + SETS * dirty_capacity * size_of::<AtomicU64>();
        Layout {
            request_slots,
            cache_slots,
            dirty_capacity,
            slots_at,
            meta_at,
            table_at,
            data_at,
            groups_meta_at,
            groups_data_at,
            groups_data,
            dirty_at,
            total,
        }
    }

    /// The layout the settings ask for (postmaster, at request time).
    fn from_settings() -> Layout {
        // SAFETY: MaxBackends is final when shared memory is requested (PostgreSQL 15).
        let procs = unsafe { pg_sys::MaxBackends } as usize + pg_sys::NUM_AUXILIARY_PROCS as usize;
        let cache_bytes = gucs::IMAGE_CACHE_SIZE.get() as usize * 1024;
        Layout::new(
            procs,
            (cache_bytes / CACHE_SLOT_BYTES).max(256),
            gucs::INDEX_CACHE_SIZE.get() as usize * 1024,
            usize::try_from(gucs::MAX_DIRTY_PAGES.get()).expect("positive"),
        )
    }
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;
const TRANCHE: &std::ffi::CStr = c"gsnap";

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
    // SAFETY: set once by `init`, before the postmaster requests shared memory.
    if let Some(prev) = unsafe { PREV_SHMEM_REQUEST_HOOK } {
        // SAFETY: the previous hook, called where PostgreSQL calls ours.
        unsafe { prev() };
    }
    // SAFETY: the postmaster is sizing shared memory, the one time these requests count.
    unsafe {
        pg_sys::RequestAddinShmemSpace(Layout::from_settings().total);
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 2);
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

/// Lock `i` of gsnap's named tranche (two were requested).
///
/// # Safety
/// Shared memory must be attached and the tranche's locks initialized.
unsafe fn tranche_lock(i: usize) -> *mut pg_sys::LWLock {
    assert!(i < 2, "gsnap's tranche has two locks");
    // SAFETY: the caller's promise; the tranche is an array of the two locks requested.
    unsafe { &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()).add(i)).lock }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: set once by `init`, before shared memory is set up.
    if let Some(prev) = unsafe { PREV_SHMEM_STARTUP_HOOK } {
        // SAFETY: the previous hook, called where PostgreSQL calls ours.
        unsafe { prev() };
    }
    let layout = Layout::from_settings();
    // SAFETY: called once per postmaster start (and crash restart) with the segment mapped;
    // AddinShmemInitLock serializes ShmemInitStruct as PostgreSQL requires.
    let _init_lock = unsafe { ExclusiveLock::acquire(addin_shmem_init_lock()) };
    let mut found = false;
    // SAFETY: under the init lock; the size is the one requested in shmem_request.
    let base = unsafe { pg_sys::ShmemInitStruct(c"gsnap".as_ptr(), layout.total, &mut found) };
    if !found {
        // SAFETY: a new segment of `layout.total` bytes, which no other process uses while
        // this one holds the init lock.
        unsafe { init_segment(base.cast(), &layout) };
    }
    SHARED.store(base.cast(), Ordering::Release);
}

/// Initializes a new segment: the fixed part, the request slots, the caches.
///
/// # Safety
/// `base` is a new segment of `layout.total` bytes that no other process uses yet.
unsafe fn init_segment(base: *mut u8, layout: &Layout) {
    // SAFETY: the caller's promise; the tranche's locks were initialized with the segment.
    let (groups_lock, cache_lock) = unsafe { (tranche_lock(1), tranche_lock(0)) };
    let shared = Shared {
        spans: SpansHeader::new(),
        worker: WorkerShared::new(),
        progress: ProgressShared::default(),
        dirty_capacity: layout.dirty_capacity as u64,
        request_slots: layout.request_slots as u64,
        cache_slots: layout.cache_slots as u64,
        groups_data: layout.groups_data as u64,
        groups_lock: AtomicPtr::new(groups_lock),
        cache_lock: AtomicPtr::new(cache_lock),
        cache_header: UnsafeCell::new(CacheHeader::default()),
        active_versions: AtomicU64::new(0),
        reader_decodes: AtomicU64::new(0),
    };
    // SAFETY: the caller's promise: the whole segment is ours; the fixed part comes first.
    unsafe {
        std::ptr::write_bytes(base, 0, layout.total);
        base.cast::<Shared>().write(shared);
    }
    // SAFETY: the layout reserved `request_slots` slots at `slots_at`.
    let slots = unsafe { base.add(layout.slots_at) }.cast::<RequestSlot>();
    for i in 0..layout.request_slots {
        // SAFETY: slot `i` of those.
        unsafe { slots.add(i).write(RequestSlot::new()) };
    }
    // SAFETY: the fixed part written above.
    let shared = unsafe { &*base.cast::<Shared>() };
    // SAFETY: the cache's arrays in the new segment, which no other process uses yet.
    unsafe {
        let (meta, table) = cache_arrays(shared, layout);
        CacheIndex::new(&mut *shared.cache_header.get(), meta, table, true);
        groups::init(base.add(layout.groups_meta_at), layout.groups_data);
    }
}

pub(crate) fn shared() -> &'static Shared {
    let ptr = SHARED.load(Ordering::Acquire);
    if ptr.is_null() {
        crate::require_preloaded();
        error!("gsnap shared memory is not initialized");
    }
    // SAFETY: set once by shmem_startup to a segment that lives as long as the process.
    unsafe { &*ptr }
}

thread_local! {
    /// The layout computed for the segment at this address (it is fixed once the segment
    /// exists; accessors that run per row must not recompute it).
    static LAYOUT: std::cell::Cell<Option<(usize, Layout)>> = const { std::cell::Cell::new(None) };
}

fn layout(shared: &Shared) -> Layout {
    let at = std::ptr::from_ref(shared) as usize;
    if let Some((known, layout)) = LAYOUT.get() {
        if known == at {
            return layout;
        }
    }
    let layout = Layout::new(
        shared.request_slots as usize,
        shared.cache_slots as usize,
        shared.groups_data as usize,
        shared.dirty_capacity as usize,
    );
    LAYOUT.set(Some((at, layout)));
    layout
}

/// The layout of the attached segment.
pub(crate) fn layout_info() -> LayoutInfo {
    layout(shared())
}

fn base_of(shared: &Shared) -> *mut u8 {
    (shared as *const Shared).cast::<u8>().cast_mut()
}

/// The cache metadata arrays.
///
/// # Safety
/// The caller holds the cache lock exclusively (or is initializing the segment).
#[allow(clippy::mut_from_ref)]
unsafe fn cache_arrays(
    shared: &Shared,
    l: &Layout,
) -> (&'static mut [SlotMeta], &'static mut [u32]) {
    // SAFETY: the layout reserved these arrays; exclusivity is the caller's promise.
    unsafe {
        let base = base_of(shared);
        (
            std::slice::from_raw_parts_mut(base.add(l.meta_at).cast::<SlotMeta>(), l.cache_slots),
            std::slice::from_raw_parts_mut(
                base.add(l.table_at).cast::<u32>(),
                CacheIndex::table_len(l.cache_slots),
            ),
        )
    }
}

/// The dirty sets: the current span's, the held first part of a split span, the retired one.
pub fn dirty_sets() -> DirtySets<'static> {
    let shared = shared();
    let l = layout(shared);
    let first = base_of(shared).wrapping_add(l.dirty_at).cast::<AtomicU64>();
    // SAFETY: shmem_startup reserved SETS arrays of `dirty_capacity` zero-initialized
    // AtomicU64 at `dirty_at`; the segment lives as long as the process.
    let set = |i: usize| unsafe {
        std::slice::from_raw_parts(first.add(i * l.dirty_capacity), l.dirty_capacity)
    };
    DirtySets::new(&shared.spans, std::array::from_fn(set))
}

/// The worker's shared state.
pub fn worker() -> &'static WorkerShared {
    &shared().worker
}

/// Counts `n` images this backend decompressed from their records (`read::pins`; once per
/// batch, not per image: the counter's cache line is shared by every reader).
pub fn count_reader_decodes(n: u64) {
    shared().reader_decodes.fetch_add(n, Ordering::Relaxed);
}

/// Images decompressed by the backends that read them since the server started.
pub fn reader_decodes() -> u64 {
    shared().reader_decodes.load(Ordering::Relaxed)
}

/// A new version number for the active index group, never used before in this server's life.
pub fn next_active_version() -> u64 {
    shared().active_versions.fetch_add(1, Ordering::AcqRel) + 1
}

/// The progress of the current capture.
pub fn progress() -> &'static ProgressShared {
    &shared().progress
}

/// Number of request slots (one per PGPROC).
pub fn request_slot_count() -> usize {
    shared().request_slots as usize
}

/// The request slot of the process with PGPROC number `procno`.
pub fn request_slot(procno: usize) -> &'static RequestSlot {
    let shared = shared();
    let l = layout(shared);
    assert!(
        procno < l.request_slots,
        "PGPROC number {procno} out of range"
    );
    // SAFETY: the layout reserved `request_slots` initialized slots at `slots_at`.
    unsafe {
        &*base_of(shared)
            .add(l.slots_at)
            .cast::<RequestSlot>()
            .add(procno)
    }
}

/// Runs `f` on the cache index under the cache lock.
pub fn with_cache<R>(f: impl FnOnce(&mut CacheIndex<'_>) -> R) -> R {
    let shared = shared();
    let l = layout(shared);
    // SAFETY: the lock lives in the main LWLock array; holding it exclusively makes this
    // process the only user of the cache metadata until `_held` drops.
    unsafe {
        let _held = ExclusiveLock::acquire(shared.cache_lock.load(Ordering::Relaxed));
        let (meta, table) = cache_arrays(shared, &l);
        let mut index = CacheIndex::new(&mut *shared.cache_header.get(), meta, table, false);
        f(&mut index)
    }
}

/// An LWLock held exclusively by this process; released when dropped (also when an ERROR
/// unwinds).
pub(crate) struct ExclusiveLock(*mut pg_sys::LWLock);

impl ExclusiveLock {
    /// Waits for and takes `lock`.
    ///
    /// # Safety
    /// `lock` is an initialized LWLock in shared memory (one of gsnap's, or PostgreSQL's),
    /// not held by this process.
    pub(crate) unsafe fn acquire(lock: *mut pg_sys::LWLock) -> ExclusiveLock {
        // SAFETY: the caller's promise.
        unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        ExclusiveLock(lock)
    }
}

impl Drop for ExclusiveLock {
    fn drop(&mut self) {
        // SAFETY: acquired by `acquire` in this process.
        unsafe { pg_sys::LWLockRelease(self.0) };
    }
}

/// The bytes of cache slot `slot`. Valid to read while the caller holds a pin on the slot;
/// written only by the worker under the cache lock before it pins the slot for anyone.
pub fn cache_slot_ptr(slot: usize) -> *mut u8 {
    let shared = shared();
    let l = layout(shared);
    assert!(slot < l.cache_slots, "cache slot {slot} out of range");
    // SAFETY: within the data area reserved by the layout.
    unsafe { base_of(shared).add(l.data_at + slot * CACHE_SLOT_BYTES) }
}

/// Cache capacity in slots.
pub fn cache_capacity() -> usize {
    shared().cache_slots as usize
}

/// True for relations whose pages gsnap never snapshots (temporary tables: only their own
/// session can read them, and they vanish with it).
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn is_private(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's promise.
    unsafe { (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_TEMP }
}

/// Records that `block` of `rel` was written in the current span (docs/design.md, capture 1).
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn record_write(rel: pg_sys::Relation, block: u32) {
    // SAFETY: the caller's promise.
    unsafe {
        if !is_private(rel) {
            dirty_sets().record((*rel).rd_id.to_u32(), block);
        }
    }
}

/// Marks `rel` for a full capture at the next snapshot (its storage was replaced).
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn mark_full_capture(rel: pg_sys::Relation) {
    // SAFETY: the caller's promise.
    unsafe {
        if !is_private(rel) {
            dirty_sets().mark_full((*rel).rd_id.to_u32());
        }
    }
}
