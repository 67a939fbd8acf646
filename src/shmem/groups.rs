//! The shared group cache (GSnap's Latest_Group and loaded groups, section 4.3): a fixed
//! budget (`gsnap.index_cache_size`) of shared memory holding sealed index groups and
//! published copies of the active group, evicted whole, least recently used first.
//!
//! The bookkeeping is `gsnap_core::cache::GroupCache` over a metadata region; the groups'
//! bytes live in the data area after it, at the extents the cache assigns. Groups are
//! position-independent (offsets, not pointers), so every backend walks them in place. The
//! worker loads groups (and publishes the active group) pinned for the backend that asked;
//! backends unpin them when their query is done. All bookkeeping runs under one LWLock; the
//! bytes of a pinned group are read without it (a pinned group is never evicted).

use super::{shared, ExclusiveLock, LayoutInfo};
use gsnap_core::cache::{Extent, GroupCache};
use std::sync::atomic::Ordering;

/// Groups the cache can hold at once.
pub const SLOTS: u32 = 1024;

/// Bytes of the metadata region.
pub fn meta_size() -> usize {
    GroupCache::region_size(SLOTS)
}

/// Bytes of the data area (after the metadata region).
pub fn data_capacity() -> usize {
    let l: LayoutInfo = super::layout_info();
    l.groups_data
}

/// Initializes the cache in a fresh segment.
///
/// # Safety
/// Only from shmem_startup, before any other process uses the segment.
pub(super) unsafe fn init(meta: *mut u8, data_size: usize) {
    // SAFETY: the caller passes the metadata region reserved for the cache.
    let region = unsafe { std::slice::from_raw_parts_mut(meta, meta_size()) };
    GroupCache::init(region, SLOTS, data_size as u64)
        .expect("the group cache region is sized for its slots");
}

/// Runs `f` on the group cache under its lock.
pub fn with_groups<R>(f: impl FnOnce(&mut GroupCache<'_>) -> R) -> R {
    let s = shared();
    let l = super::layout_info();
    // SAFETY: the lock serializes all users of the metadata region; the region was
    // initialized at startup.
    unsafe {
        let _held = ExclusiveLock::acquire(s.groups_lock.load(Ordering::Relaxed));
        let region =
            std::slice::from_raw_parts_mut(super::base_of(s).add(l.groups_meta_at), meta_size());
        let mut cache = GroupCache::attach(region).expect("the group cache region is valid");
        f(&mut cache)
    }
}

/// The bytes of a cached group at `extent`.
///
/// # Safety
/// The caller holds a pin on the group for as long as it uses the bytes (the lifetime `'a`
/// must end before the pin is released: `read::pins::GroupPins` ties it to its guard).
pub unsafe fn group_bytes<'a>(extent: Extent) -> &'a [u8] {
    let s = shared();
    let l = super::layout_info();
    assert!(
        extent.offset + extent.size <= l.groups_data as u64,
        "extent within the data area"
    );
    // SAFETY: the extent lies in the data area; a pinned group is neither moved nor
    // rewritten, and callers only read while they hold the pin.
    unsafe {
        std::slice::from_raw_parts(
            super::base_of(s).add(l.groups_data_at + extent.offset as usize),
            extent.size as usize,
        )
    }
}

/// Copies `bytes` into the data area at `extent` (the worker, after `reserve`).
pub fn write_group(extent: Extent, bytes: &[u8]) {
    let s = shared();
    let l = super::layout_info();
    assert!(
        bytes.len() as u64 == extent.size && extent.offset + extent.size <= l.groups_data as u64
    );
    // SAFETY: the extent was reserved for this group and is still in the loading state, so no
    // other process reads it.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            super::base_of(s).add(l.groups_data_at + extent.offset as usize),
            bytes.len(),
        );
    }
}
