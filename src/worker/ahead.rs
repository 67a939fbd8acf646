//! Copies made ahead of a periodic snapshot, so that its capture holds VACUUM back for less.
//!
//! A capture holds its MVCC snapshot until it has copied every page it must read, and on a
//! busy machine most of that time is the copying waiting for a core. With
//! `gsnap.snapshot_interval` set the worker knows when the next snapshot is due: shortly
//! before (`gsnap.capture_copy_ahead`), it *splits* the span's dirty set (writers go on in a
//! second part, `DirtySets::split_span`) and copies the pages of the first part (whole, with
//! each page's LSN), holding no snapshot. The capture that follows takes a copy instead of
//! the page:
//!
//! - when the page is not recorded in the span's second part: nobody wrote it since the
//!   split, so since the copy (made after it). What can still have changed it unrecorded is
//!   what never changes a view (docs/design.md, "why this is correct"): pruning and VACUUM
//!   remove only versions no snapshot sees (v's is taken later), freezing and hint bits
//!   re-stamp versions without changing who sees them. The copy's view at v, decided after
//!   the release like any page copy, is the page's, and the capture does not touch the
//!   buffer at all;
//! - else when the page's LSN is still the copy's (a pin and a share lock): no WAL-logged
//!   change since the copy, so the copy holds the same tuple versions (hint bits aside).
//!
//! Only WAL-logged tables are copied ahead (an unlogged table's page LSNs do not change),
//! only pages whose LSN is set (not 0) and whose tuples can be decided on a copy (no
//! out-of-line TOAST values: those must be copied under the snapshot), and only while the
//! copies fit `gsnap.capture_memory` beside the capture in flight. A copy is used only with
//! the table's storage unchanged (the same relfilenode), only by the snapshot whose span was
//! split (its declaration takes the copies), and never by the first capture after a start,
//! whose blocks follow their own LSN rule (`restart.rs`). Copies are a cache: a copy not
//! taken is dropped when its capture has read every page, and losing them (an error, a
//! restart) loses nothing: the split span's first part stays in shared memory until the
//! span ends.

use super::page;
use super::xact::BulkRead;
use crate::ffi::relation::OpenRelation;
use gsnap_shmem::carry::CarryForward;
use pgrx::pg_sys;
use std::collections::HashMap;
use std::time::Instant;

/// A page copied ahead.
pub(super) struct AheadCopy {
    /// The relation's storage when the copy was made.
    relfilenode: u32,
    /// The page's LSN then, and the buffer that held it.
    lsn: u64,
    buffer: pg_sys::Buffer,
    page: Box<[u64]>,
}

/// Pages copied between two looks at the worker's latch (a run opens its relation once).
const REQUEST_CHECK_PAGES: usize = 64;

/// The bytes one copy holds.
const COPY_BYTES: usize = pg_sys::BLCKSZ as usize;

/// The copies made (and to make) ahead of one periodic snapshot.
pub(super) struct Ahead {
    /// The pages written in the span when copying began, (relation, block) sorted, and how
    /// many of them were looked at.
    todo: Vec<(u32, u32)>,
    next: usize,
    copies: HashMap<(u32, u32), AheadCopy>,
    strategy: BulkRead,
    /// The pages written since the split were listed again to be copied anew.
    refreshed: bool,
    /// What the span recorded after its split, once the snapshot is declared: a copy of a
    /// page not in it is taken without looking at the page. None: every copy's page is
    /// checked.
    written_since: Option<CarryForward>,
}

impl Ahead {
    /// Copies of `pages` (the first part of a split span), to be made.
    pub fn new(pages: Vec<(u32, u32)>) -> Ahead {
        Ahead {
            todo: pages,
            next: 0,
            copies: HashMap::new(),
            strategy: BulkRead::new(),
            written_since: None,
            refreshed: false,
        }
    }

    /// Copies `pages` (written since the split) again, replacing their copies: shortly
    /// before the snapshot, so that fewer of them change before it. The capture checks
    /// their LSN, as for every page written after the split.
    pub fn refresh(&mut self, pages: Vec<(u32, u32)>) {
        self.todo = pages;
        self.next = 0;
        self.refreshed = true;
    }

    /// When the pages written since the split are to be copied again, for the periodic
    /// snapshot due at `due`: a fifth of the lead before it (a copy made earlier is more
    /// likely written since). None once they were.
    fn refresh_at(&self, due: Instant) -> Option<Instant> {
        (!self.refreshed).then(|| due.checked_sub(lead() / 5).unwrap_or(due))
    }

    /// The snapshot is declared and its span's second part is `written`: the pages recorded
    /// after the split (which was before every copy), and the tables marked for a full
    /// capture since.
    pub fn written_since_split(&mut self, written: CarryForward) {
        self.written_since = Some(written);
    }

    /// The copies held.
    pub fn len(&self) -> usize {
        self.copies.len()
    }

    /// The memory the copies hold.
    pub fn bytes(&self) -> usize {
        self.copies.len() * COPY_BYTES
    }

    /// True while pages are left to copy.
    pub fn copying(&self) -> bool {
        self.next < self.todo.len()
    }

    /// Copies up to `budget` more pages while the copies stay within `memory` bytes; true
    /// while pages are left. Stops early when the worker's latch is set (a request came).
    ///
    /// # Safety
    /// In the worker's transaction (a subtransaction of it), on the main thread.
    pub unsafe fn step(&mut self, budget: usize, memory: usize) -> bool {
        let end = (self.next + budget).min(self.todo.len());
        while self.next < end {
            if self.bytes() + COPY_BYTES > memory {
                self.next = self.todo.len();
                break;
            }
            // A run of one relation's pages, at most REQUEST_CHECK_PAGES long: the worker
            // looks at its latch between runs.
            let relid = self.todo[self.next].0;
            let run = self.todo[self.next..end]
                .iter()
                .take(REQUEST_CHECK_PAGES)
                .take_while(|p| p.0 == relid)
                .count();
            // SAFETY: the caller's promise.
            unsafe { self.copy_run(relid, self.next..self.next + run, memory) };
            self.next += run;
            if crate::ffi::latch::is_set() {
                break;
            }
        }
        self.copying()
    }

    /// Copies the pages `todo[run]`, all of relation `relid`, while the copies stay within
    /// `memory` bytes, if the relation can be locked at once (a table being rewritten or
    /// dropped is left to the capture) and is WAL-logged.
    ///
    /// # Safety
    /// As [`Ahead::step`].
    unsafe fn copy_run(&mut self, relid: u32, run: std::ops::Range<usize>, memory: usize) {
        let oid = pg_sys::Oid::from(relid);
        let share = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        // SAFETY: a lock request in the worker's transaction, given back below.
        if !unsafe { pg_sys::ConditionalLockRelationOid(oid, share) } {
            return;
        }
        if let Some(rel) = OpenRelation::open(oid, pg_sys::NoLock as pg_sys::LOCKMODE) {
            // Opening may have read the catalog: its snapshot is let go, so that copying
            // holds no xmin.
            // SAFETY: in a transaction; the next catalog access takes a new one.
            unsafe { pg_sys::InvalidateCatalogSnapshot() };
            let logged = rel.class().relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT;
            if logged {
                // SAFETY: the open relation.
                let relfilenode = unsafe { (*rel.as_ptr()).rd_node.relNode.to_u32() };
                let nblocks = rel.nblocks();
                for &(_, block) in &self.todo[run] {
                    if block >= nblocks || self.bytes() + COPY_BYTES > memory {
                        continue;
                    }
                    // SAFETY: the open, locked, WAL-logged relation; the block below its
                    // size; the strategy alive.
                    let copy =
                        unsafe { page::copy_ahead(rel.as_ptr(), block, self.strategy.as_ptr()) };
                    if let Some((lsn, buffer, page)) = copy {
                        let copy = AheadCopy {
                            relfilenode,
                            lsn,
                            buffer,
                            page,
                        };
                        self.copies.insert((relid, block), copy);
                    } else {
                        // (a copy made before, now out of date, is of no use)
                        self.copies.remove(&(relid, block));
                    }
                }
            }
        }
        // SAFETY: the lock taken above (a session lock of a declared snapshot is another).
        unsafe { pg_sys::UnlockRelationOid(oid, share) };
    }

    /// The copy of `block` of `rel` (open, locked by the snapshot being captured,
    /// WAL-logged), if one was made and the page is unchanged since, in the same storage: not
    /// written since the split, or without a WAL-logged change since the copy. The copy is
    /// taken either way.
    ///
    /// # Safety
    /// `rel` is open and locked against storage replacement, `block` below its size; in a
    /// transaction, on the main thread.
    pub unsafe fn take(&mut self, rel: pg_sys::Relation, block: u32) -> Option<Box<[u64]>> {
        if self.copies.is_empty() {
            return None;
        }
        // SAFETY: the caller's open relation.
        let (relid, relfilenode, logged) = unsafe {
            (
                (*rel).rd_id.to_u32(),
                (*rel).rd_node.relNode.to_u32(),
                (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT,
            )
        };
        let copy = self.copies.remove(&(relid, block))?;
        if !logged || copy.relfilenode != relfilenode {
            return None;
        }
        let written = self.written_since.as_ref().is_none_or(|w| {
            w.needs_full(relid) || w.pages().binary_search(&(relid, block)).is_ok()
        });
        if !written {
            return Some(copy.page);
        }
        // SAFETY: the caller's promise.
        let unchanged = unsafe {
            page::unchanged_since(rel, block, self.strategy.as_ptr(), copy.lsn, copy.buffer)
        };
        unchanged.then_some(copy.page)
    }
}

impl super::Worker {
    /// Copies a batch of the span's pages ahead of the next periodic snapshot, when it is
    /// due within `gsnap.capture_copy_ahead` (at most a quarter of the interval) and no
    /// capture is reading; true while there is more to copy now.
    pub(super) fn copy_ahead(&mut self) -> bool {
        let due = self.next_periodic.filter(|_| ahead_wanted());
        let Some(due) = due else {
            if self.ahead.take().is_some() {
                crate::shmem::progress().set_copies_ahead(0);
            }
            return false;
        };
        if self.ahead_waits() {
            return false;
        }
        if self.ahead_for != Some(due) {
            if Instant::now() < copies_from(due) {
                return false;
            }
            // Once per periodic snapshot: the span is split and the pages of its first part
            // copied (a declaration on request in between takes the copies; none are made
            // again for this one).
            self.ahead_for = Some(due);
            let pages = crate::shmem::dirty_sets().split_span(|| {
                // SAFETY: a short sleep while a writer finishes recording.
                unsafe { pg_sys::pg_usleep(10) }
            });
            self.ahead = Some(Ahead::new(pages));
        }
        let Some(ahead) = self.ahead.as_mut() else {
            return false;
        };
        if !ahead.copying() {
            if ahead.refresh_at(due).is_none_or(|at| Instant::now() < at) {
                return false;
            }
            // Shortly before the snapshot, the pages written since the split are copied
            // again (the capture checks their LSN): fewer are left to read under it.
            ahead.refresh(crate::shmem::dirty_sets().second_part_pages());
        }
        // Beside the capture in flight and the copies declared snapshots hold.
        let queued: usize = self
            .queue
            .iter()
            .map(|d| d.ahead.as_ref().map_or(0, Ahead::bytes))
            .sum();
        let memory = crate::gucs::capture_memory_bytes()
            .saturating_sub(self.job.as_ref().map_or(0, |j| j.read_bytes()) + queued);
        let budget = crate::gucs::CAPTURE_BATCH_PAGES.get().max(1) as usize;
        self.xact.ensure_open();
        // SAFETY: in the worker's transaction, on the main thread.
        let more = super::xact::in_subtransaction(|| unsafe { ahead.step(budget, memory) });
        crate::shmem::progress().set_copies_ahead(ahead.len() as u64);
        match more {
            Ok(more) => more,
            Err(message) => {
                // Copies are a cache: the capture reads the pages at its snapshot instead.
                pgrx::warning!("gsnap: copying pages ahead of a snapshot failed: {message}");
                self.ahead = None;
                crate::shmem::progress().set_copies_ahead(0);
                false
            }
        }
    }

    /// When the worker must wake to copy ahead of the next periodic snapshot (None: it
    /// need not).
    pub(super) fn copy_ahead_at(&self) -> Option<Instant> {
        let due = self.next_periodic.filter(|_| ahead_wanted())?;
        if self.ahead_waits() {
            None
        } else if self.ahead_for != Some(due) {
            Some(copies_from(due))
        } else {
            self.ahead.as_ref()?.refresh_at(due)
        }
    }

    /// No copies are made now: a capture is reading its pages (they come first), or the
    /// index is not open.
    fn ahead_waits(&self) -> bool {
        self.job.as_ref().is_some_and(|j| !j.read_all()) || self.index.is_none()
    }
}

/// When the copies for the periodic snapshot due at `due` begin.
fn copies_from(due: Instant) -> Instant {
    due.checked_sub(lead()).unwrap_or(due)
}

/// Copies ahead are made: `gsnap.capture_copy_ahead` is set, and captures copy pages whole
/// (`gsnap.capture_page_copies`, with memory for them).
fn ahead_wanted() -> bool {
    crate::gucs::CAPTURE_COPY_AHEAD_MS.get() > 0
        && crate::gucs::CAPTURE_PAGE_COPIES.get()
        && crate::gucs::capture_memory_bytes() > 0
}

/// How long before a periodic snapshot its copies are made: `gsnap.capture_copy_ahead`, at
/// most a quarter of the interval.
fn lead() -> std::time::Duration {
    let ms = crate::gucs::CAPTURE_COPY_AHEAD_MS.get().max(0) as u64;
    let interval_ms = crate::gucs::SNAPSHOT_INTERVAL.get().max(0) as u64 * 1000;
    std::time::Duration::from_millis(ms.min(interval_ms / 4))
}
