//! Cache pins an answer holds for this backend, and their release.
//!
//! The worker answers LoadImages and ToastFetch with image cache slots and IndexPin with
//! group cache entries, each *pinned* for the requester: a pinned slot or group is never
//! evicted or rewritten. Whoever ends up with such an answer releases its pins exactly once:
//! the backend through the guards here ([`Pinned`], [`PinnedGroups`], unpinned when dropped,
//! also when an ERROR unwinds), or, for an answer nobody will read (the backend gave the
//! request up), whichever side cleans it up through [`release_answer`].

use crate::shmem;
use gsnap_protocol::{decode_answer, GroupEntry, Kind, PinnedEntry, Pins, Reply};

/// Image cache slots pinned for this backend; unpinned when dropped (also when an ERROR
/// unwinds).
pub struct Pinned {
    pub entries: Vec<PinnedEntry>,
}

impl Pinned {
    /// The bytes of one pinned entry.
    pub fn bytes(&self, e: &PinnedEntry) -> &[u8] {
        // SAFETY: the slot is pinned by this backend, so the worker neither evicts nor
        // rewrites it; `len` bytes were written before the pin was handed to us.
        unsafe {
            std::slice::from_raw_parts(shmem::cache_slot_ptr(e.slot as usize), e.len as usize)
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        unpin_images(&self.entries);
    }
}

/// Groups pinned in the shared group cache for this backend; unpinned when dropped (also
/// when an ERROR unwinds).
pub struct PinnedGroups {
    pub entries: Vec<GroupEntry>,
}

impl Drop for PinnedGroups {
    fn drop(&mut self) {
        unpin_groups(&self.entries);
    }
}

/// Releases the image cache pins of `entries`.
pub fn unpin_images(entries: &[PinnedEntry]) {
    if entries.is_empty() {
        return;
    }
    shmem::with_cache(|c| {
        for e in entries {
            c.unpin(e.slot as usize);
        }
    });
}

/// Releases the group cache pins of `entries`.
pub fn unpin_groups(entries: &[GroupEntry]) {
    if entries.is_empty() {
        return;
    }
    shmem::groups::with_groups(|c| {
        for e in entries {
            // A group this backend pinned is still there; an error here is a bug.
            c.unpin(e.key).expect("a pinned group is in the cache");
        }
    });
}

/// Releases the pins `reply` holds.
pub fn release(reply: &Reply) {
    match reply.pins() {
        Pins::None => {}
        Pins::Images(entries) => unpin_images(entries),
        Pins::Groups(entries) => unpin_groups(entries),
    }
}

/// Releases the pins held by an answer nobody will read: the answer bytes of a request of
/// kind `tag` (the kind the request slot kept next to them). An error answer, or one that
/// does not decode, holds none that can be known.
pub fn release_answer(tag: u32, answer: &[u8]) {
    let Ok(kind) = Kind::from_tag(tag) else {
        return;
    };
    if let Ok(Ok(reply)) = decode_answer(kind, answer) {
        release(&reply);
    }
}
