//! Capturing a declared snapshot (DESIGN.md, capture steps 3 and 4), in batches between the
//! worker's looks at its requests.
//!
//! The pages of snapshot v are: the pages written in its span, the pages the previous
//! capture left unsettled, and whatever an earlier failed capture or declaration could not
//! cover; for a table in `Fresh` or `Rescan` mode, every block. For each page the v-view is
//! computed and stored (identical views are stored once); a mapping is added only where the
//! view differs from the page's image in the previous page table. Once every page has been
//! read (its view computed and its TOAST values copied into the store), the MVCC snapshot is
//! released: nothing it could see is needed any more, and VACUUM may go on (docs/design.md,
//! third ordering). The snapshot becomes readable only when the store commits it, and only
//! then are its table locks released.

use super::declare::{self, Declared, Mode};
use super::index::IndexState;
use super::page::{capture_page, PageView};
use super::restart::Resumed;
use super::xact::{self, BulkRead, RegisteredSnapshot};
use super::{code_of, Worker};
use crate::shmem::{self, Phase};
use gsnap_protocol::{ErrorCode, WorkerError};
use gsnap_shmem::carry::CarryForward;
use gsnap_store::{Capture, PageKey, RelId, RocksBackend, SnapId, StoreError};
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

struct Item {
    relid: u32,
    rel: RelId,
    fresh: bool,
    blocks: Blocks,
    /// The first capture after a start: what it may skip (`restart.rs`).
    resumed: Option<Resumed>,
}

/// A capture in progress.
pub(crate) struct CaptureJob {
    decl: Declared,
    capture: Capture<RocksBackend>,
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
    strategy: BulkRead,
    /// Phase one's copies: pages read (their views computed, their TOAST values stored)
    /// and not stored yet, and the bytes they hold (at most `gsnap.capture_memory`).
    read: std::collections::VecDeque<ReadPage>,
    read_bytes: usize,
    /// Pages read once the budget was full: stored as they were read, under the snapshot.
    stored_while_reading: u64,
    /// When every page had been read and the MVCC snapshot was released: phase two (storing
    /// the copies) and the commit are left.
    read_all: Option<std::time::Instant>,
    /// Test hooks (gsnap.debug_capture_pause_ms, gsnap.debug_commit_pause_ms): no batch, or
    /// no commit, before this time.
    pub(super) next_batch_at: std::time::Instant,
}

impl CaptureJob {
    /// Images stored before this capture that it maps: reclamation must not free them.
    pub(super) fn capture_existing_images(
        &self,
    ) -> &std::collections::HashSet<gsnap_store::ImageId> {
        self.capture.existing_images()
    }
}

impl Worker {
    /// Begins the capture of the oldest declared snapshot when none is running.
    pub(super) fn start_capture(&mut self) {
        if self.job.is_some() {
            return;
        }
        let (Some(store), Some(decl)) = (self.store.clone(), self.queue.pop_front()) else {
            return;
        };
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
                    relid: t.relid,
                    rel: t.rel,
                    fresh,
                    blocks,
                    resumed: t.resumed.clone(),
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
        shmem::progress().begin(
            decl.snap as i64,
            decl.declared_at_us,
            items.len() as u32,
            total,
        );
        self.job = Some(CaptureJob {
            decl,
            capture,
            items,
            item: 0,
            cursor: 0,
            carried: beyond,
            covered,
            pages_done: 0,
            pages_unchanged: 0,
            strategy: BulkRead::new(),
            read: std::collections::VecDeque::new(),
            read_bytes: 0,
            stored_while_reading: 0,
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
        let budget = crate::gucs::CAPTURE_BATCH_PAGES.get().max(1) as usize;
        if let Some(read_at) = job.read_all {
            if !job.read.is_empty() {
                // Phase two: the copies are fingerprinted, compressed and stored, a batch at
                // a time.
                return match xact::in_subtransaction(|| job.store_read(index, budget)) {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => self.fail_step(Ok(e)),
                    Err(message) => self.fail_step(Err(message)),
                };
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
        match xact::in_subtransaction(|| job.run(index, budget)) {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) => {
                // Every page is read: the next steps store the copies and commit.
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
    fn fail_step(&mut self, failure: Result<StoreError, String>) -> bool {
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
                p.set_phase(Phase::Idle);
                self.catalog_changed();
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

    pub(super) fn abort(&mut self, job: CaptureJob, code: ErrorCode, reason: &str) {
        let CaptureJob {
            decl,
            capture,
            carried,
            mut covered,
            ..
        } = job;
        self.release_kept = true;
        if let Err(e) = capture.abort(reason) {
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
        if let Some(mvcc) = self.decl.mvcc.take() {
            mvcc.release();
            // SAFETY: inside the worker's transaction; the next catalog access takes a new one.
            unsafe { pg_sys::InvalidateCatalogSnapshot() };
            let held_us = super::catalog::now_unix_us().saturating_sub(self.decl.declared_at_us);
            shmem::progress().horizon_released(held_us);
        }
        self.read_all = Some(std::time::Instant::now());
        shmem::progress().set_phase(Phase::Committing);
    }

    /// Phase two: stores up to `budget` of the pages phase one read.
    fn store_read(&mut self, index: &IndexState, budget: usize) -> Result<(), StoreError> {
        for _ in 0..budget {
            let Some(page) = self.read.pop_front() else {
                break;
            };
            self.read_bytes -= page.view.view.capacity();
            let item = &self.items[page.item];
            store_one(index, &mut self.capture, item, page, &mut self.carried)?;
        }
        let st = self.capture.stats();
        shmem::progress().advance(
            self.items.len() as u32,
            self.pages_done,
            st.bytes_stored(),
            st.new_images,
        );
        Ok(())
    }

    /// Phase one: reads up to `budget` pages; Ok(true) while pages remain. A page's copy
    /// waits in memory for phase two while the copies fit `gsnap.capture_memory`; beyond
    /// that, pages are stored as they are read.
    fn run(&mut self, index: &IndexState, budget: usize) -> Result<bool, StoreError> {
        let memory = crate::gucs::capture_memory_bytes();
        let mut done = 0;
        while self.item < self.items.len() {
            let item = &self.items[self.item];
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
                pg_sys::relation_open(pg_sys::Oid::from(item.relid), pg_sys::NoLock as i32)
            };
            let end = (self.cursor + budget - done).min(item.blocks.len());
            let mvcc = self
                .decl
                .mvcc
                .as_ref()
                .expect("the MVCC snapshot is held until every page is read");
            let at = self.item;
            let result = (self.cursor..end).try_for_each(|i| {
                let block = item.blocks.get(i);
                // SAFETY: the relation is open, the block below the size recorded at
                // declaration (the table cannot shrink below it while locked).
                let page = unsafe {
                    read_one(
                        &mut self.capture,
                        mvcc,
                        &self.strategy,
                        rel,
                        item,
                        at,
                        block,
                    )
                }?;
                let Some(page) = page else {
                    self.pages_unchanged += 1;
                    return Ok(());
                };
                let bytes = page.view.view.capacity();
                if self.read_bytes + bytes <= memory {
                    self.read_bytes += bytes;
                    self.read.push_back(page);
                    Ok(())
                } else {
                    self.stored_while_reading += 1;
                    store_one(index, &mut self.capture, item, page, &mut self.carried)
                }
            });
            shmem::progress().beyond_memory(self.stored_while_reading);
            // SAFETY: opened above.
            unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
            result?;
            done += end - self.cursor;
            self.pages_done += (end - self.cursor) as u64;
            self.cursor = end;
        }
        let st = self.capture.stats();
        shmem::progress().advance(
            self.item as u32,
            self.pages_done,
            st.bytes_stored(),
            st.new_images,
        );
        Ok(self.item < self.items.len())
    }
}

/// A page phase one read: its view at the snapshot and the TOAST values stored for it.
struct ReadPage {
    /// The item (table) and block.
    item: usize,
    block: u32,
    view: PageView,
    toasts: Vec<gsnap_store::ToastId>,
}

/// Reads block `block` of `item`'s table (`rel`, item number `at`) at snapshot `mvcc`: its
/// view, with the out-of-line TOAST values its visible tuples name stored first. None if the
/// block is unchanged since the snapshot the first capture after a start compares against
/// (its mapping there stands, `restart.rs`).
///
/// # Safety
/// `rel` is the open, locked relation of `item`; `block` is below its size at declaration.
unsafe fn read_one(
    capture: &mut Capture<RocksBackend>,
    mvcc: &RegisteredSnapshot,
    strategy: &BulkRead,
    rel: pg_sys::Relation,
    item: &Item,
    at: usize,
    block: u32,
) -> Result<Option<ReadPage>, StoreError> {
    let mut toasts = Vec::new();
    // After a start: a block that may be skipped when its LSN says it is unchanged.
    let unchanged_at_or_before = item.resumed.as_ref().and_then(|r| {
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
            &mut |bytes| {
                let id = capture.put_toast(bytes)?;
                toasts.push(id);
                Ok::<u64, StoreError>(id.0)
            },
        )?
    };
    Ok(view.map(|view| ReadPage {
        item: at,
        block,
        view,
        toasts,
    }))
}

/// Stores a page phase one read: its view unless it is the previous page table's image, a
/// mapping where it changed, and a note if it is unsettled.
fn store_one(
    index: &IndexState,
    capture: &mut Capture<RocksBackend>,
    item: &Item,
    page: ReadPage,
    carried: &mut Vec<(u32, u32)>,
) -> Result<(), StoreError> {
    let ReadPage {
        block,
        view,
        toasts,
        ..
    } = page;
    let page = PageKey {
        rel: item.rel,
        block,
    };
    let previous = if item.fresh {
        None
    } else {
        // The previous page table is the newest one in the index.
        index
            .latest_image(page)
            .map_err(|e| StoreError::new(gsnap_store::ErrorKind::Corrupt, e.to_string()))?
    };
    // A page with no mapping reads as empty, so an empty view needs no mapping then.
    if view.tuples > 0 || previous.is_some() {
        let image = capture.put_image(&view.view, &toasts)?;
        if previous != Some(image) {
            capture.add_mapping(page, image)?;
        }
    }
    if view.unsettled {
        capture.carry(page)?;
        carried.push((item.relid, block));
    }
    Ok(())
}
