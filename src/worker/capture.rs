//! Capturing a declared snapshot (DESIGN.md, capture steps 3 and 4), in batches between the
//! worker's looks at its requests.
//!
//! The pages of snapshot v are: the pages written in its span, the pages the previous
//! capture left unsettled, and whatever an earlier failed capture or declaration could not
//! cover; for a table in `Fresh` or `Rescan` mode, every block. For each page the v-view is
//! computed and stored (identical views are stored once); a mapping is added only where the
//! view differs from the page's image in the previous page table. Once every page has been
//! read (copied whole, or its view computed and its TOAST values copied into the store), the
//! MVCC snapshot is released: nothing it could see is needed any more, and VACUUM may go on
//! (docs/design.md, third ordering). The pages copied whole are decided after that, from
//! the list of transactions the snapshot saw running (`page.rs`). The snapshot becomes
//! readable only when the store commits it, and only then are its table locks released.

use super::ahead::Ahead;
use super::declare::{self, Declared, Mode};
use super::index::IndexState;
use super::page::{capture_page, resolve, Copied, PageView};
use super::restart::Resumed;
use super::storing::{Failure, Storing};
use super::xact::{self, BulkRead, RegisteredSnapshot};
use super::{code_of, Worker};
use crate::ffi::latch;
use crate::keymap::{self, KeyHasher};
use crate::shmem::{self, Phase};
use gsnap_format::visibility::SnapshotXids;
use gsnap_protocol::{ErrorCode, WorkerError};
use gsnap_shmem::carry::CarryForward;
use gsnap_store::{Capture, ImageId, PageKey, RelId, RocksBackend, SealedView, SnapId, StoreError};
use pgrx::pg_sys;

/// The blocks of one table a capture visits.
enum Blocks {
    All(u32),
    List(Vec<u32>),
}

impl Blocks {
    fn len(&self) -> usize {
        match self {
            Blocks::All(n) => *n as usize,
            Blocks::List(l) => l.len(),
        }
    }

    fn get(&self, i: usize) -> u32 {
        match self {
            Blocks::All(_) => i as u32,
            Blocks::List(l) => l[i],
        }
    }
}

/// What storing a table's page needs to know about the table.
#[derive(Clone, Copy)]
pub(super) struct Target {
    pub relid: u32,
    pub rel: RelId,
    /// First capture of this incarnation: no previous page table to compare with.
    pub fresh: bool,
    /// The table's key map (`keymap.rs`), by its start snapshot: the pages' key hashes are
    /// recorded under it.
    pub key_map: Option<SnapId>,
    /// Store the delta of each changed page's new image (`gsnap.page_deltas`).
    pub deltas: bool,
}

struct Item {
    target: Target,
    blocks: Blocks,
    /// The table's size at declaration.
    nblocks: u32,
    /// The first capture after a start: what it may skip (`restart.rs`).
    resumed: Option<Resumed>,
    /// The table's key, hashed into the key map (decided when the table is first opened).
    hasher: Option<KeyHasher>,
    keys_decided: bool,
}

/// A capture in progress.
pub(crate) struct CaptureJob {
    decl: Declared,
    /// The store's side of the capture; on phase two's thread while that runs.
    capture: Option<Capture<RocksBackend>>,
    /// Phase two, storing the copies on a thread of its own.
    storing: Option<Storing>,
    items: Vec<Item>,
    item: usize,
    cursor: usize,
    /// Pages found unsettled: the next capture takes them again.
    carried: Vec<(u32, u32)>,
    /// What this capture covers, handed on if it fails.
    covered: CarryForward,
    pages_done: u64,
    /// Blocks not examined: unchanged by their page LSN (`restart.rs`).
    pages_unchanged: u64,
    /// Pages copied ahead of the declaration (`ahead.rs`), taken when found unchanged; the
    /// rest are dropped once every page is read.
    ahead: Option<Ahead>,
    pages_ahead: u64,
    strategy: BulkRead,
    /// Phase one's copies: pages read (their views computed, their TOAST values stored)
    /// and not stored yet, pages copied whole and not decided yet, and the bytes both hold
    /// (at most `gsnap.capture_memory`).
    read: std::collections::VecDeque<ReadPage>,
    copied: std::collections::VecDeque<CopiedPage>,
    read_bytes: usize,
    /// The transactions v's MVCC snapshot saw running, which decide the pages copied whole
    /// once it is released; None: every page is decided as it is read (the snapshot's
    /// subtransactions overflowed, or `gsnap.capture_page_copies` is off).
    xids: Option<SnapshotXids>,
    /// Phase two has been started (after the copies were decided), or there was nothing for
    /// it.
    stored: bool,
    /// Pages read once the budget was full: stored as they were read, under the snapshot.
    stored_while_reading: u64,
    /// The pace of the decisions on the copies (when they began, over how long, how many):
    /// set when the first batch is decided.
    deciding: Option<Deciding>,
    /// When every page had been read and the MVCC snapshot was released: phase two (storing
    /// the copies) and the commit are left.
    read_all: Option<std::time::Instant>,
    /// Test hooks (gsnap.debug_capture_pause_ms, gsnap.debug_commit_pause_ms): no batch, or
    /// no commit, before this time.
    pub(super) next_batch_at: std::time::Instant,
}

/// The decisions on phase one's copies spread over a window (a quarter of phase two's, so
/// that phase two keeps most of it, and at most [`DECIDING_AT_MOST`]): deciding a page takes
/// the worker's main thread ~10-15 us, and deciding a capture's ~15,000 pages at once took a
/// core for a quarter of a second right after the declaration, the second whose throughput
/// `worst_second` reports.
#[derive(Clone, Copy)]
struct Deciding {
    began: std::time::Instant,
    window: std::time::Duration,
    pages: usize,
}

/// The longest the decisions are spread over. They look the commit log up for transactions
/// that ended before the snapshot; if VACUUM truncated it past them meanwhile (a database-wide
/// freeze), the lookup fails and so does the snapshot: seconds, not a fifth of a long
/// interval, keep that window short.
const DECIDING_AT_MOST: std::time::Duration = std::time::Duration::from_secs(5);

impl Deciding {
    fn new(pages: usize, declared_at_us: i64) -> Deciding {
        Deciding {
            began: std::time::Instant::now(),
            window: (super::storing::pace_window(declared_at_us) / 4).min(DECIDING_AT_MOST),
            pages,
        }
    }

    /// When the next batch is due, `left` pages being still undecided: each page at its share
    /// of the window.
    fn next_due(&self, left: usize) -> std::time::Instant {
        let done = self.pages.saturating_sub(left);
        self.began + super::storing::share_of(self.window, done, self.pages)
    }
}

impl CaptureJob {
    /// True if reclamation must keep image `id`: the capture maps it and it was stored
    /// before the capture began. While phase two runs on its thread nothing can be said, so
    /// every image is kept (reclamation waits for the commit, `Worker::reclaim`).
    pub(super) fn keeps(&self, id: gsnap_store::ImageId) -> bool {
        self.capture
            .as_ref()
            .is_none_or(|c| c.existing_images().contains(&id))
    }

    /// The snapshot being captured.
    pub(super) fn snap(&self) -> u64 {
        self.decl.snap
    }

    /// Phase two runs on its thread.
    pub(super) fn storing(&self) -> bool {
        self.storing.is_some()
    }

    /// True once every page is read and the MVCC snapshot released.
    pub(super) fn read_all(&self) -> bool {
        self.read_all.is_some()
    }

    /// The memory phase one's copies and views took (of `gsnap.capture_memory`).
    pub(super) fn read_bytes(&self) -> usize {
        self.read_bytes
    }
}

impl Worker {
    /// Begins the capture of the oldest declared snapshot when none is running.
    pub(super) fn start_capture(&mut self) {
        if self.job.is_some() {
            return;
        }
        let (Some(store), Some(mut decl)) = (self.store.clone(), self.queue.pop_front()) else {
            return;
        };
        self.stop_frees();
        shmem::progress().set_queued(self.queue.len() as u32);
        let mut covered = std::mem::take(&mut self.carry);
        covered.absorb(decl.pages.clone());
        let items: Vec<Item> = decl
            .tables
            .iter()
            .map(|t| {
                let fresh = t.mode == Mode::Fresh;
                let blocks = if fresh || t.mode == Mode::Rescan || covered.needs_full(t.relid) {
                    Blocks::All(t.nblocks)
                } else {
                    Blocks::List(
                        covered
                            .blocks_of(t.relid)
                            .filter(|&b| b < t.nblocks)
                            .collect(),
                    )
                };
                Item {
                    target: Target {
                        relid: t.relid,
                        rel: t.rel,
                        fresh,
                        key_map: None,
                        deltas: crate::gucs::PAGE_DELTAS.get(),
                    },
                    blocks,
                    nblocks: t.nblocks,
                    resumed: t.resumed.clone(),
                    hasher: None,
                    keys_decided: false,
                }
            })
            .collect();
        // Blocks written in this span beyond the size recorded at declaration were added to
        // the table after the MVCC snapshot (the size is read after it): their view at this
        // snapshot is empty, but a later snapshot sees their rows, so the next capture must
        // take them even if nothing writes them again.
        let beyond: Vec<(u32, u32)> = decl
            .tables
            .iter()
            .flat_map(|t| {
                covered
                    .blocks_of(t.relid)
                    .filter(move |&b| b >= t.nblocks)
                    .map(move |b| (t.relid, b))
            })
            .collect();
        let total: u64 = items.iter().map(|i| i.blocks.len() as u64).sum();
        let capture = match store.begin_capture(SnapId(decl.snap)) {
            Ok(c) => c,
            Err(e) => {
                self.note_store_error(&e);
                let reason = format!("its capture could not begin: {}", e.message());
                if let Err(e) = store.abandon(SnapId(decl.snap), &reason) {
                    self.note_store_error(&e);
                }
                self.fail(decl, covered, code_of(&e), &reason);
                return;
            }
        };
        let xids = crate::gucs::CAPTURE_PAGE_COPIES
            .get()
            .then(|| decl.mvcc.as_ref().and_then(|m| m.xids()))
            .flatten();
        shmem::progress().begin(
            decl.snap as i64,
            decl.declared_at_us,
            items.len() as u32,
            total,
        );
        shmem::progress().set_copies_ahead(0);
        let ahead = decl.ahead.take();
        self.job = Some(CaptureJob {
            decl,
            capture: Some(capture),
            storing: None,
            items,
            item: 0,
            cursor: 0,
            carried: beyond,
            covered,
            pages_done: 0,
            pages_unchanged: 0,
            ahead,
            pages_ahead: 0,
            strategy: BulkRead::new(),
            read: std::collections::VecDeque::new(),
            copied: std::collections::VecDeque::new(),
            read_bytes: 0,
            xids,
            stored: false,
            stored_while_reading: 0,
            deciding: None,
            read_all: None,
            next_batch_at: std::time::Instant::now(),
        });
    }

    /// Captures one batch of pages; returns true while there is more to do.
    pub(super) fn capture_step(&mut self) -> bool {
        let (Some(_), Some(job), Some(index)) =
            (&self.store, self.job.as_mut(), self.index.as_ref())
        else {
            return false;
        };
        let hurry = self.capture_awaited == Some(job.decl.snap)
            || !self.queue.is_empty()
            || self
                .durable_waiters
                .iter()
                .any(|&(_, s)| s == job.decl.snap);
        if let Some(read_at) = job.read_all {
            if !job.stored {
                // The pages copied whole are decided (a batch at a time, between the worker's
                // looks at its requests, paced like phase two unless it must hurry), then
                // phase two starts.
                let now = std::time::Instant::now();
                let deciding = *job.deciding.get_or_insert_with(|| {
                    Deciding::new(job.copied.len(), job.decl.declared_at_us)
                });
                if !hurry && now < job.next_batch_at {
                    return false;
                }
                let budget = crate::gucs::CAPTURE_BATCH_PAGES.get().max(1) as usize;
                return match xact::in_subtransaction(|| job.decide_copies(budget)) {
                    Ok(true) => {
                        job.next_batch_at = deciding.next_due(job.copied.len());
                        hurry || job.next_batch_at <= std::time::Instant::now()
                    }
                    Ok(false) => {
                        job.stored = true;
                        shmem::progress().set_phase(Phase::Committing);
                        match job.start_storing(index) {
                            Ok(()) => true,
                            Err(failure) => self.fail_step(failure),
                        }
                    }
                    Err(message) => self.fail_step(Err(message)),
                };
            }
            if let Some(storing) = &job.storing {
                // Phase two runs on its thread, paced; it hurries once someone waits for this
                // snapshot to be durable or reads it, or the next one is declared.
                storing.hurry(hurry);
                let (to_store, bytes, new_images) = storing.counts();
                let p = shmem::progress();
                p.advance(job.items.len() as u32, job.pages_done, bytes, new_images);
                p.set_to_store(to_store);
                if !storing.finished() {
                    return false;
                }
                if let Err(failure) = job.take_back_from_storing() {
                    return self.fail_step(failure);
                }
            }
            // (the test hook's pause is read again each time: resetting it commits at once)
            let pause = crate::gucs::DEBUG_COMMIT_PAUSE_MS.get().max(0) as u64;
            let until = read_at + std::time::Duration::from_millis(pause);
            if std::time::Instant::now() < until {
                job.next_batch_at = until;
                return false;
            }
            let job = self.job.take().expect("job");
            self.commit(job);
            return !self.queue.is_empty();
        }
        let pause = crate::gucs::DEBUG_CAPTURE_PAUSE_MS.get();
        if pause > 0 {
            let now = std::time::Instant::now();
            if now < job.next_batch_at {
                return false;
            }
            job.next_batch_at = now + std::time::Duration::from_millis(pause as u64);
        }
        // Batches follow one another for up to PHASE_ONE_SLICE (one with the test hook's
        // pause), unless a request comes: each step costs the worker's loop and a
        // subtransaction, and the snapshot is held meanwhile (with 256 pages a batch, that
        // was half of phase one's CPU when the pages were copied ahead).
        let budget = crate::gucs::CAPTURE_BATCH_PAGES.get().max(1) as usize;
        let until = std::time::Instant::now() + PHASE_ONE_SLICE;
        let slice = || loop {
            let more = job.run(index, budget)?;
            if !more || pause > 0 || latch::is_set() || std::time::Instant::now() >= until {
                return Ok(more);
            }
        };
        match xact::in_subtransaction(slice) {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) => {
                // Every page is read: the snapshot is released; the pages copied whole are
                // decided, then phase two stores the views on its thread, then the capture
                // commits.
                job.release_horizon();
                true
            }
            Ok(Err(e)) => self.fail_step(Ok(e)),
            Err(message) => self.fail_step(Err(message)),
        }
    }

    /// Fails the capture in flight after a step of it failed: a store error (noted, with its
    /// code) or a PostgreSQL ERROR (internal). True: the worker has more to do (the next
    /// snapshot).
    fn fail_step(&mut self, failure: Failure) -> bool {
        let (code, reason) = match failure {
            Ok(e) => {
                self.note_store_error(&e);
                (code_of(&e), e.message().to_string())
            }
            Err(message) => (ErrorCode::Internal, message),
        };
        let job = self.job.take().expect("job");
        self.abort(job, code, &format!("its capture failed: {reason}"));
        true
    }

    fn commit(&mut self, job: CaptureJob) {
        shmem::progress().set_phase(Phase::Committing);
        let resumed_from = job
            .items
            .iter()
            .any(|i| i.resumed.is_some())
            .then_some((job.pages_done, job.pages_unchanged));
        let CaptureJob {
            decl,
            capture,
            carried,
            covered,
            ..
        } = job;
        self.release_kept = true;
        let capture = capture.expect("phase two gave the capture back before the commit");
        let names_toast = capture.names_toast_values();
        let older_images = capture.older_images_mapped();
        match capture.commit() {
            Ok(info) => {
                if let Some((blocks, unchanged)) = resumed_from {
                    pgrx::log!(
                        "gsnap: snapshot {} is the first since the worker started: it read {} \
                         of {} blocks, the others unchanged since the previous snapshot by their \
                         page LSN; {} pages changed",
                        decl.snap,
                        blocks - unchanged,
                        blocks,
                        info.stats.pages_captured
                    );
                }
                // An older image the previous page table names is named by a mapping no older
                // snapshot's deletion removes: mapping it again changes no older estimate (an
                // empty page's image is the common case).
                let shares_older = names_toast
                    || !older_images.is_empty()
                        && self.index.as_ref().is_none_or(|index| {
                            !index.latest_names_all(&older_images).unwrap_or(false)
                        });
                self.index_snapshot(decl.snap);
                self.retention_due = std::time::Instant::now();
                declare::release(&decl.locked, decl.mvcc);
                self.carry.absorb(CarryForward::from_pages(carried));
                let p = shmem::progress();
                p.advance(
                    decl.tables.len() as u32,
                    info.stats.pages_captured,
                    info.stats.bytes_stored(),
                    info.stats.new_images,
                );
                p.durable(decl.snap as i64, decl.declared_at_us);
                self.write_rates
                    .capture_ended(decl.declared_at_us, super::catalog::now_unix_us());
                p.set_phase(Phase::Idle);
                self.snapshot_committed(decl.snap, shares_older);
                self.notify_durable(decl.snap, None);
            }
            Err(e) => {
                self.note_store_error(&e);
                let reason = format!("its capture could not be committed: {}", e.message());
                let mut covered = covered;
                covered.absorb(CarryForward::from_pages(carried));
                self.fail(decl, covered, code_of(&e), &reason);
            }
        }
    }

    pub(super) fn abort(&mut self, mut job: CaptureJob, code: ErrorCode, reason: &str) {
        if let Some(storing) = &job.storing {
            // Stop phase two's thread and take the capture back (how it ended does not
            // matter: the capture fails for `reason`).
            storing.cancel();
            let _ = job.take_back_from_storing();
        }
        let CaptureJob {
            decl,
            capture,
            carried,
            mut covered,
            ..
        } = job;
        self.release_kept = true;
        // (None: phase two's thread never started, and the capture's drop recorded it as
        // abandoned)
        if let Some(Err(e)) = capture.map(|c| c.abort(reason)) {
            pgrx::warning!(
                "gsnap: could not record the failure of snapshot {}: {}",
                decl.snap,
                e.message()
            );
            self.note_store_error(&e);
        }
        covered.absorb(CarryForward::from_pages(carried));
        self.fail(decl, covered, code, reason);
    }

    /// Gives up a declared snapshot: its pages go to the next capture, its waiters get
    /// `reason`.
    pub(super) fn fail(
        &mut self,
        decl: Declared,
        mut covered: CarryForward,
        code: ErrorCode,
        reason: &str,
    ) {
        pgrx::warning!("gsnap: snapshot {} failed: {reason}", decl.snap);
        if self.store_broken.is_some() {
            // The store may not have recorded the failure: record it again once reopened.
            self.unrecorded_failures
                .push((decl.snap, reason.to_string()));
        }
        declare::release(&decl.locked, decl.mvcc);
        // Tables the failed capture would have captured completely must be captured
        // completely by the next one.
        for t in &decl.tables {
            if t.mode != Mode::Incremental {
                covered.mark_full(t.relid);
            }
        }
        self.carry.absorb(covered);
        shmem::progress().set_phase(Phase::Idle);
        self.catalog_changed();
        self.notify_durable(
            decl.snap,
            Some((code, format!("snapshot {} failed: {reason}", decl.snap))),
        );
    }

    /// Frees the slots of backends that stopped waiting for a snapshot to become durable
    /// (cancelled or errored out), so they can send new requests before the capture ends.
    pub(super) fn drop_abandoned_waiters(&mut self) {
        self.durable_waiters.retain(|&(slot, _)| {
            let slot = shmem::request_slot(slot);
            if slot.abandoned() {
                slot.finish(|_| {});
                false
            } else {
                true
            }
        });
    }

    /// Answers the requests waiting for snapshot `snap` to become durable.
    fn notify_durable(&mut self, snap: u64, error: Option<(ErrorCode, String)>) {
        let (done, rest): (Vec<_>, Vec<_>) = self
            .durable_waiters
            .drain(..)
            .partition(|&(_, s)| s == snap);
        self.durable_waiters = rest;
        let error = error.map(|(code, message)| WorkerError::new(code, message));
        for (slot, _) in done {
            match &error {
                None => declare::answer_snapshot(slot, snap, None),
                Some(error) => declare::answer_error(Some(slot), error),
            }
        }
    }
}

impl CaptureJob {
    /// Every page has been read: releases the MVCC snapshot (the table locks stay until the
    /// commit), drops the catalog snapshot the reads used, and reports how long the snapshot
    /// held back VACUUM. The phase is "committing" from here (phase two, then the commit).
    fn release_horizon(&mut self) {
        // The copies made ahead and not taken are not needed any more.
        self.ahead = None;
        if let Some(mvcc) = self.decl.mvcc.take() {
            mvcc.release();
            // SAFETY: inside the worker's transaction; the next catalog access takes a new one.
            unsafe { pg_sys::InvalidateCatalogSnapshot() };
            let held_us = super::catalog::now_unix_us().saturating_sub(self.decl.declared_at_us);
            shmem::progress().horizon_released(held_us);
        }
        self.read_all = Some(std::time::Instant::now());
        shmem::progress().set_phase(if self.copied.is_empty() {
            Phase::Committing
        } else {
            Phase::Deciding
        });
    }

    /// Waits for phase two's thread (finished or cancelled) and takes back the capture and
    /// the pages it found unsettled; returns how phase two ended.
    fn take_back_from_storing(&mut self) -> Result<(), Failure> {
        let stored = self.storing.take().expect("phase two runs").join();
        self.capture = Some(stored.capture);
        self.carried.extend(stored.carried);
        shmem::progress().set_to_store(0);
        stored.result
    }

    /// Decides up to `budget` of the pages phase one copied whole, at the released snapshot's
    /// transactions (`page::resolve`), and queues their views for phase two; true while
    /// copies remain.
    fn decide_copies(&mut self, budget: usize) -> bool {
        let mut open: Option<(usize, pg_sys::Relation)> = None;
        for i in 0..budget {
            // A request (a declaration, a reader's images) ends the batch early, as in phase
            // one: deciding a page takes ~10-15 us.
            if i > 0 && i.is_multiple_of(REQUEST_CHECK_PAGES) && latch::is_set() {
                break;
            }
            let Some(copy) = self.copied.pop_front() else {
                break;
            };
            let xids = self
                .xids
                .as_ref()
                .expect("pages are copied with the snapshot's ids");
            let rel = match open {
                Some((item, rel)) if item == copy.item => rel,
                _ => {
                    if let Some((_, rel)) = open.take() {
                        // SAFETY: opened below, in an earlier round.
                        unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
                    }
                    let relid = pg_sys::Oid::from(self.items[copy.item].target.relid);
                    // SAFETY: the table is locked by this snapshot's session lock, in the
                    // worker's transaction; closed before the step ends.
                    let rel = unsafe { pg_sys::relation_open(relid, pg_sys::NoLock as i32) };
                    open = Some((copy.item, rel));
                    rel
                }
            };
            let hasher = self.items[copy.item].hasher.as_mut();
            // SAFETY: the open, locked relation of the copy's table, on the main thread.
            let view = unsafe { resolve(rel, copy.block, &copy.page, xids, hasher) };
            self.read_bytes = self.read_bytes - PAGE_BYTES + view.view.capacity();
            self.read.push_back(ReadPage {
                item: copy.item,
                block: copy.block,
                view,
                toasts: Vec::new(),
            });
        }
        if let Some((_, rel)) = open {
            // SAFETY: opened above.
            unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
        }
        // A catalog snapshot opening a relation may have taken would hold VACUUM back.
        // SAFETY: inside the worker's transaction; the next catalog access takes a new one.
        unsafe { pg_sys::InvalidateCatalogSnapshot() };
        shmem::progress().set_to_store((self.read.len() + self.copied.len()) as u64);
        !self.copied.is_empty()
    }

    /// Starts phase two: the pages phase one kept go to a thread that fingerprints,
    /// compresses and stores them, paced over `gsnap.capture_pace` of the snapshot interval
    /// (`storing.rs`). Nothing to store: nothing starts.
    fn start_storing(&mut self, index: &IndexState) -> Result<(), Failure> {
        if self.read.is_empty() {
            return Ok(());
        }
        let previous = index.latest_table().map_err(|e| Ok(index_error(e)))?;
        let pages = std::mem::take(&mut self.read);
        self.read_bytes = 0;
        shmem::progress().set_to_store(pages.len() as u64);
        let targets = self.items.iter().map(|i| i.target).collect();
        let capture = self
            .capture
            .take()
            .expect("phase one gives the capture back");
        let window = super::storing::pace_window(self.decl.declared_at_us);
        let storing = Storing::start(capture, pages, targets, previous, window).map_err(|e| {
            Err(format!(
                "phase two's thread could not be started ({e}); the capture was abandoned"
            ))
        })?;
        self.storing = Some(storing);
        Ok(())
    }

    /// Phase one: reads up to `budget` pages; Ok(true) while pages remain. A page's copy
    /// waits in memory for phase two while the copies fit `gsnap.capture_memory`; beyond
    /// that, pages are stored as they are read.
    fn run(&mut self, index: &IndexState, budget: usize) -> Result<bool, StoreError> {
        let memory = crate::gucs::capture_memory_bytes();
        let mut done = 0;
        while self.item < self.items.len() {
            if !self.items[self.item].keys_decided {
                let snap = SnapId(self.decl.snap);
                let capture = self.capture.as_mut().expect("phase one holds the capture");
                // SAFETY: in the worker's transaction, the table locked by the snapshot.
                unsafe { decide_keys(capture, &mut self.items[self.item], snap) }?;
            }
            let item = &mut self.items[self.item];
            if self.cursor >= item.blocks.len() {
                self.item += 1;
                self.cursor = 0;
                continue;
            }
            if done == budget {
                break;
            }
            // SAFETY: the table is locked by this snapshot's session lock and we run inside
            // the worker's transaction; the relation is closed before the step ends.
            let rel = unsafe {
                pg_sys::relation_open(pg_sys::Oid::from(item.target.relid), pg_sys::NoLock as i32)
            };
            let end = (self.cursor + budget - done).min(item.blocks.len());
            let mvcc = self
                .decl
                .mvcc
                .as_ref()
                .expect("the MVCC snapshot is held until every page is read");
            let at = self.item;
            let capture = self.capture.as_mut().expect("phase one holds the capture");
            let start = self.cursor;
            let mut reached = start;
            let Item {
                target,
                blocks,
                resumed,
                hasher,
                ..
            } = item;
            let mut read = |i: usize| -> Result<(), StoreError> {
                let block = blocks.get(i);
                let hasher = hasher.as_mut();
                // A copy made ahead, if the page is unchanged since (`ahead.rs`).
                let ahead = self
                    .ahead
                    .as_mut()
                    .filter(|_| resumed.is_none() && self.xids.is_some());
                // SAFETY: the open relation, locked by this snapshot; the block below its size
                // at declaration.
                let taken = ahead.and_then(|ahead| unsafe { ahead.take(rel, block) });
                let page = if let Some(page) = taken {
                    self.pages_ahead += 1;
                    Some(Read::Whole(page))
                } else {
                    // A page is copied whole while the copy fits the budget (beside the
                    // copies made ahead and not taken yet).
                    let ahead_bytes = self.ahead.as_ref().map_or(0, Ahead::bytes);
                    let whole =
                        self.xids.is_some() && self.read_bytes + ahead_bytes + PAGE_BYTES <= memory;
                    // SAFETY: the relation is open, the block below the size recorded at
                    // declaration (the table cannot shrink below it while locked).
                    unsafe {
                        read_one(
                            capture,
                            mvcc,
                            &self.strategy,
                            rel,
                            resumed.as_ref(),
                            whole,
                            hasher,
                            at,
                            block,
                        )
                    }?
                };
                let page = match page {
                    None => {
                        self.pages_unchanged += 1;
                        return Ok(());
                    }
                    Some(Read::Whole(page)) => {
                        self.read_bytes += PAGE_BYTES;
                        self.copied.push_back(CopiedPage {
                            item: at,
                            block,
                            page,
                        });
                        return Ok(());
                    }
                    Some(Read::View(page)) => page,
                };
                let bytes = page.view.view.capacity();
                if self.read_bytes + bytes <= memory {
                    self.read_bytes += bytes;
                    self.read.push_back(page);
                    Ok(())
                } else {
                    self.stored_while_reading += 1;
                    let previous = |page| index.latest_image(page).map_err(index_error);
                    store_one(&previous, capture, target, page, None, &mut self.carried)
                }
            };
            let result = (|| {
                for i in start..end {
                    // A request (a declaration, a reader's images) sets the worker's latch:
                    // the batch ends early so the worker answers it.
                    if i > start
                        && (i - start).is_multiple_of(REQUEST_CHECK_PAGES)
                        && latch::is_set()
                    {
                        break;
                    }
                    read(i)?;
                    reached = i + 1;
                }
                Ok::<(), StoreError>(())
            })();
            shmem::progress().beyond_memory(self.stored_while_reading);
            shmem::progress().copied_ahead(self.pages_ahead);
            // SAFETY: opened above.
            unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
            result?;
            done += reached - start;
            self.pages_done += (reached - start) as u64;
            self.cursor = reached;
            if reached < end {
                break;
            }
        }
        let st = self
            .capture
            .as_ref()
            .expect("phase one holds the capture")
            .stats();
        shmem::progress().advance(
            self.item as u32,
            self.pages_done,
            st.bytes_stored(),
            st.new_images,
        );
        Ok(self.item < self.items.len())
    }
}

/// Phase one looks at the worker's latch every this many pages of a batch.
const REQUEST_CHECK_PAGES: usize = 32;

/// The memory a page copied whole holds.
const PAGE_BYTES: usize = pg_sys::BLCKSZ as usize;

/// How long phase one reads batch after batch before the worker looks at its other work.
const PHASE_ONE_SLICE: std::time::Duration = std::time::Duration::from_millis(5);

/// A page phase one copied whole, decided after the snapshot is released.
struct CopiedPage {
    item: usize,
    block: u32,
    page: Box<[u64]>,
}

/// What phase one took of a page.
enum Read {
    /// Its view (and the TOAST values stored for it).
    View(ReadPage),
    /// The whole page.
    Whole(Box<[u64]>),
}

/// A page phase one read: its view at the snapshot and the TOAST values stored for it.
pub(super) struct ReadPage {
    /// The item (table) and block.
    pub item: usize,
    pub block: u32,
    pub view: PageView,
    pub toasts: Vec<gsnap_store::ToastId>,
}

/// Reads block `block` of `item`'s table (`rel`, item number `at`) at snapshot `mvcc`: with
/// `whole`, a copy of the page when it can be decided after the release (`page.rs`), else
/// its view, with the out-of-line TOAST values its visible tuples name stored first. None if
/// the block is unchanged since the snapshot the first capture after a start compares against
/// (its mapping there stands, `restart.rs`).
///
/// # Safety
/// `rel` is the open, locked relation of `item`; `block` is below its size at declaration.
#[allow(clippy::too_many_arguments)]
unsafe fn read_one(
    capture: &mut Capture<RocksBackend>,
    mvcc: &RegisteredSnapshot,
    strategy: &BulkRead,
    rel: pg_sys::Relation,
    resumed: Option<&Resumed>,
    whole: bool,
    hasher: Option<&mut KeyHasher>,
    at: usize,
    block: u32,
) -> Result<Option<Read>, StoreError> {
    let mut toasts = Vec::new();
    // After a start: a block that may be skipped when its LSN says it is unchanged.
    let unchanged_at_or_before = resumed.and_then(|r| {
        r.lsn_floor
            .filter(|_| block < r.prev_nblocks && !r.carried.contains(&block))
    });
    // SAFETY: the caller's promise; the snapshot is registered and the strategy alive.
    let view = unsafe {
        capture_page(
            rel,
            block,
            mvcc.as_ptr(),
            strategy.as_ptr(),
            unchanged_at_or_before,
            whole,
            hasher,
            &mut |bytes| {
                let id = capture.put_toast(bytes)?;
                toasts.push(id);
                Ok::<u64, StoreError>(id.0)
            },
        )?
    };
    Ok(view.map(|copied| match copied {
        Copied::Page(page) => Read::Whole(page),
        Copied::View(view) => Read::View(ReadPage {
            item: at,
            block,
            view,
            toasts,
        }),
    }))
}

/// Stores a page phase one read: its view unless it is the previous page table's image, a
/// mapping where it changed, and a note if it is unsettled. `previous` looks a page up in the
/// previous page table (the newest one in the index). `sealed` is the page's view sealed
/// ahead with others (`storing.rs`), or None to seal it here.
pub(super) fn store_one(
    previous: &dyn Fn(PageKey) -> Result<Option<ImageId>, StoreError>,
    capture: &mut Capture<RocksBackend>,
    target: &Target,
    page: ReadPage,
    sealed: Option<SealedView>,
    carried: &mut Vec<(u32, u32)>,
) -> Result<(), StoreError> {
    let ReadPage {
        block,
        view,
        toasts,
        ..
    } = page;
    let page = PageKey {
        rel: target.rel,
        block,
    };
    let previous = if target.fresh { None } else { previous(page)? };
    // A page with no mapping reads as empty, so an empty view needs no mapping then.
    if view.tuples > 0 || previous.is_some() {
        let image = match sealed {
            Some(sealed) => capture.put_sealed(sealed, &toasts)?,
            None => capture.put_image(&view.view, &toasts)?,
        };
        if previous != Some(image) {
            capture.add_mapping(page, image)?;
            if let Some(base) = previous.filter(|_| target.deltas) {
                store_delta(capture, base, image, &view.view)?;
            }
        }
    }
    // Every page stored is compared with the keys its block held at its last recording
    // (changed or not: a failed capture may have recorded another content).
    if let Some(map) = target.key_map {
        capture.record_keys(page, map, &view.keys)?;
    }
    if view.unsettled {
        capture.carry(page)?;
        carried.push((target.relid, block));
    }
    Ok(())
}

/// Stores the delta from `base` (the image the page had) to `image` (its new one, whose view
/// is `view`) if this capture stored `image` and the delta is at most half of the view: a
/// diff of the two then reads the delta instead of both images (`read::diff`). An image
/// found by its content among older ones keeps the delta it has, if any. A delta only saves
/// reads: a base that cannot be read or decoded gives none (the capture goes on; a diff then
/// reads both images, and reports a damaged one).
fn store_delta(
    capture: &mut Capture<RocksBackend>,
    base: ImageId,
    image: ImageId,
    view: &[u8],
) -> Result<(), StoreError> {
    if !capture.stored_image(image) {
        return Ok(());
    }
    let Ok(before) = capture.base_image(base) else {
        return Ok(());
    };
    match gsnap_format::delta::between(base.0, &before, view) {
        Ok(delta) if delta.len() <= view.len() / 2 => capture.put_delta(image, &delta),
        _ => Ok(()),
    }
}

/// Decides how this capture keeps `item`'s key map: none if the table has no key (or key
/// maps are off: a map the incarnation had ends), the map recorded if the table's key is the
/// one it was started with, else a map started by this capture, which then reads every
/// block of the table (not only the changed ones). Either way every page stored is recorded
/// (`store_one`).
///
/// # Safety
/// In the worker's transaction, with the table locked by the snapshot being captured.
unsafe fn decide_keys(
    capture: &mut Capture<RocksBackend>,
    item: &mut Item,
    snap: SnapId,
) -> Result<(), StoreError> {
    item.keys_decided = true;
    let relid = pg_sys::Oid::from(item.target.relid);
    // SAFETY: the caller's promise.
    let rel = unsafe { pg_sys::relation_open(relid, pg_sys::NoLock as i32) };
    // SAFETY: the open relation.
    let key = crate::gucs::KEY_MAPS
        .get()
        .then(|| unsafe { keymap::table_key(rel) })
        .flatten();
    let recorded = capture.store().key_map(item.target.rel);
    let decided = (|| {
        let recorded = recorded?;
        let Some(key) = key else {
            if recorded.is_some() {
                capture.end_key_map(item.target.rel)?;
            }
            return Ok(());
        };
        let definition = key.encode();
        let map = match recorded {
            Some(map) if map.definition == definition => map.start,
            _ => {
                // The map starts with this capture, which records every page of the table
                // (none skipped by its LSN either).
                capture.start_key_map(item.target.rel, &definition)?;
                item.blocks = Blocks::All(item.nblocks);
                item.resumed = None;
                snap
            }
        };
        item.target.key_map = Some(map);
        // SAFETY: in the transaction; the relation's descriptor outlives the capture's use
        // of the hasher (it is reopened under the same lock for every batch).
        item.hasher = Some(unsafe { KeyHasher::new(key, (*rel).rd_att) });
        Ok(())
    })();
    // SAFETY: opened above.
    unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
    decided
}

/// A failure of the index, as the capture reports it.
pub(super) fn index_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(gsnap_store::ErrorKind::Corrupt, e.to_string())
}
