//! Cache pins an answer holds for this backend, and their release.
//!
//! The worker answers LoadImages and ToastFetch with image cache slots and IndexPin with
//! group cache entries, each *pinned* for the requester: a pinned slot or group is never
//! evicted or rewritten. Whoever ends up with such an answer releases its pins exactly once:
//! the backend through the guards here ([`Pinned`], [`PinnedGroups`], unpinned when dropped,
//! also when an ERROR unwinds), or, for an answer nobody will read (the backend gave the
//! request up), whichever side cleans it up through [`release_answer`].
//!
//! A process can also end without dropping its guards: a FATAL error (`pg_terminate_backend`,
//! a parallel worker stopped by its leader) ends the process from inside the wait that
//! noticed it, and the Rust frames above that wait never unwind. A pin left so would hold its
//! slot until the server restarts, and enough of them would leave no room for any read. So,
//! as PostgreSQL counts each backend's buffer pins to release them at exit, each process
//! counts the pins its guards hold, and [`release_at_exit`] gives back what is left when it
//! exits, after its transaction was aborted (which drops the guards its scans own), with the
//! request still in its slot, if any, given up.

use super::transport;
use crate::shmem;
use gsnap_protocol::{decode_answer, GroupEntry, Kind, PinnedEntry, Pins, Reply};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The pins this process's guards hold: how many of each image cache slot and each group.
#[derive(Default)]
struct Held {
    images: HashMap<u32, u32>,
    groups: HashMap<u64, u32>,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
    /// Whether [`release_at_exit`] is registered in this process.
    static AT_EXIT: Cell<bool> = const { Cell::new(false) };
    /// Whether [`release_at_exit`] ran: a guard dropped after it has nothing left to unpin.
    static RELEASED: Cell<bool> = const { Cell::new(false) };
}

/// Counts `keys` as held by a guard (`add`) or no longer held.
fn count<K: std::hash::Hash + Eq>(
    held: &mut HashMap<K, u32>,
    keys: impl Iterator<Item = K>,
    add: bool,
) {
    for k in keys {
        if add {
            *held.entry(k).or_default() += 1;
        } else if let Some(n) = held.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                held.remove(&k);
            }
        }
    }
}

/// Changes the count of pins held, registering [`release_at_exit`] before the first pin.
fn held(f: impl FnOnce(&mut Held)) {
    if !AT_EXIT.replace(true) {
        // SAFETY: registering an exit callback of this process; it needs no argument.
        unsafe { pg_sys::on_shmem_exit(Some(release_at_exit), pg_sys::Datum::from(0)) };
    }
    HELD.with_borrow_mut(f);
}

/// At exit (after the transaction's abort, while shared memory is still attached): gives up
/// the request in this process's slot and releases the pins no guard released.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    transport::give_up_at_exit();
    RELEASED.set(true);
    let left = HELD.take();
    if !left.images.is_empty() {
        shmem::with_cache(|c| {
            for (&slot, &n) in &left.images {
                for _ in 0..n {
                    c.unpin(slot as usize);
                }
            }
        });
    }
    if !left.groups.is_empty() {
        shmem::groups::with_groups(|c| {
            for (&key, &n) in &left.groups {
                for _ in 0..n {
                    c.unpin(key).expect("a pinned group is in the cache");
                }
            }
        });
    }
}

/// Image cache slots pinned for this backend; unpinned when dropped (also when an ERROR
/// unwinds; at exit if the process ends without dropping it).
pub struct Pinned {
    pub entries: Vec<PinnedEntry>,
    /// (Made by [`Pinned::adopt`] only, so that every guard's pins are counted.)
    _counted: (),
}

impl Pinned {
    /// The guard of the pins `entries` (pinned for this process).
    pub fn adopt(entries: Vec<PinnedEntry>) -> Pinned {
        held(|h| count(&mut h.images, entries.iter().map(|e| e.slot), true));
        Pinned {
            entries,
            _counted: (),
        }
    }

    /// Forgets the pin of `slot`, which this process gave up otherwise (it discarded the
    /// slot's object), after taking its entry out of a guard.
    pub fn discarded(slot: u32) {
        held(|h| count(&mut h.images, std::iter::once(slot), false));
    }

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
        if RELEASED.get() {
            return;
        }
        unpin_images(&self.entries);
        held(|h| count(&mut h.images, self.entries.iter().map(|e| e.slot), false));
    }
}

/// Groups pinned in the shared group cache for this backend; unpinned when dropped (also
/// when an ERROR unwinds; at exit if the process ends without dropping it).
pub struct PinnedGroups {
    pub entries: Vec<GroupEntry>,
    /// (Made by [`PinnedGroups::adopt`] only.)
    _counted: (),
}

impl PinnedGroups {
    /// The guard of the pins `entries` (pinned for this process).
    pub fn adopt(entries: Vec<GroupEntry>) -> PinnedGroups {
        held(|h| count(&mut h.groups, entries.iter().map(|e| e.key), true));
        PinnedGroups {
            entries,
            _counted: (),
        }
    }
}

impl Drop for PinnedGroups {
    fn drop(&mut self) {
        if RELEASED.get() {
            return;
        }
        unpin_groups(&self.entries);
        held(|h| count(&mut h.groups, self.entries.iter().map(|e| e.key), false));
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
