//! The gsnap background worker: declares snapshots (on request and periodically), captures
//! them, writes the store, and answers backends' requests (DESIGN.md, Processes).
//!
//! It is the only process that opens the store. Its main loop never blocks on anything a
//! user controls: a declaration that cannot lock a table is retried later, captures run in
//! batches between looks at the request slots, and every unit of PostgreSQL work runs in a
//! subtransaction so an ERROR fails one snapshot, not the worker.

mod ahead;
mod background;
mod capture;
pub(crate) mod catalog;
mod declare;
mod definition;
mod disturbance;
mod index;
mod lifetimes;
mod memory;
mod page;
mod publish;
mod restart;
mod serve;
mod storing;
mod xact;

use crate::gucs;
use crate::shmem::{self, Phase, WorkerState};
use capture::CaptureJob;
use declare::{Declared, Known, PendingDeclare};
use gsnap_protocol::{ErrorCode, WorkerError};
use gsnap_shmem::carry::CarryForward;
use gsnap_store::{ErrorKind, RocksBackend, SnapId, SnapshotStore, StoreError, StoreOptions};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::time::{Duration, Instant};

pub(crate) type Store = SnapshotStore<RocksBackend>;

/// The version of what this gsnap writes into the store as opaque bytes (page views, row
/// types, sealed group bodies). Bump it with any of their formats; an older store is then
/// refused with a clear error instead of being misread. (The store's own records, the mapping
/// log and group metadata included, are versioned by the store's format version.)
/// Version 3: row types may carry the table's definition (row type format 2). Version 4: a
/// definition may end with the table's storage parameters (flagged; older ones read as
/// having none).
const CONTENT_VERSION: u32 = 4;
/// The oldest content version this gsnap reads (a store of version 2 or 3 is raised to 4).
const OLDEST_CONTENT_VERSION: u32 = 2;
pub(crate) use catalog::{now_unix_us, UNIX_TO_PG_EPOCH_US};

/// Registers the worker with the postmaster; called from `_PG_init` during preload.
pub fn register() {
    BackgroundWorkerBuilder::new("gsnap worker")
        .set_type("gsnap worker")
        .set_library("gsnap")
        .set_function("gsnap_worker_main")
        .enable_spi_access()
        .set_start_time(pgrx::bgworkers::BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// Maps a store error to the error code a backend reports.
pub(crate) fn code_of(e: &StoreError) -> ErrorCode {
    match e.kind() {
        ErrorKind::NotFound => ErrorCode::UnknownSnapshot,
        ErrorKind::Incompatible => ErrorCode::Incompatible,
        ErrorKind::Corrupt => ErrorCode::Corrupt,
        ErrorKind::NoSpace => ErrorCode::NoSpace,
        ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        ErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
        _ => ErrorCode::Io,
    }
}

/// PostgreSQL's own handlers for a reload and a shutdown request, declared here without
/// pgrx's FFI guard. A signal sent to the worker may be delivered to any of its threads
/// (RocksDB's background threads included), and pgrx's handlers call guarded FFI that panics,
/// aborting the worker, off the main thread; PostgreSQL's only set a flag and the latch.
mod raw {
    extern "C-unwind" {
        pub fn SignalHandlerForConfigReload(postgres_signal_arg: core::ffi::c_int);
        pub fn SignalHandlerForShutdownRequest(postgres_signal_arg: core::ffi::c_int);
    }
}

/// True once a shutdown was requested (SIGTERM).
fn shutdown_requested() -> bool {
    // SAFETY: a sig_atomic_t the signal handler sets.
    unsafe { (&raw const pg_sys::ShutdownRequestPending).read_volatile() != 0 }
}

/// Gives the open store the settings a reload may change: whether image reads check
/// fingerprints (every read does until told otherwise: the capture reads the previous images
/// of the pages it stores, for deltas), and whether the images captures store are kept in
/// memory (only for page deltas).
fn apply_reloadable_settings(store: &Store) {
    store.set_verify_images(crate::gucs::VERIFY_IMAGES.get());
    store.keep_recent_images(crate::gucs::PAGE_DELTAS.get());
}

/// True (once) after a reload was requested (SIGHUP).
fn reload_requested() -> bool {
    // SAFETY: a sig_atomic_t the signal handler sets and the main loop clears.
    unsafe {
        let pending = &raw mut pg_sys::ConfigReloadPending;
        let requested = pending.read_volatile() != 0;
        if requested {
            pending.write_volatile(0);
        }
        requested
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_worker_main(_arg: pg_sys::Datum) {
    // SAFETY: installing signal handlers at the start of the worker (signals are blocked
    // until then), then unblocking them.
    unsafe {
        pg_sys::pqsignal(
            pg_sys::SIGHUP as i32,
            Some(raw::SignalHandlerForConfigReload),
        );
        pg_sys::pqsignal(
            pg_sys::SIGTERM as i32,
            Some(raw::SignalHandlerForShutdownRequest),
        );
        pg_sys::BackgroundWorkerUnblockSignals();
    }
    gsnap_store::RocksBackend::quiet_counters();
    let db = gucs::database();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    // SAFETY: MyProc and MyProcPid are set for a connected background worker.
    let (procno, pid) = unsafe { ((*pg_sys::MyProc).pgprocno, pg_sys::MyProcPid) };
    let w = shmem::worker();
    w.started(procno, pid);
    recover_request_slots();
    let mut worker = Worker::new();
    log!("gsnap worker started in database \"{db}\"");
    worker.run();
    w.stopped();
    // Exit code 1 makes the postmaster start the worker again (after 5 s) unless the server
    // is shutting down; code 0 would unregister it, so a pg_terminate_backend() of the
    // worker would stop snapshots for good.
    // SAFETY: ends the worker process.
    unsafe { pg_sys::proc_exit(1) };
}

/// Answers requests a previous worker took but never finished.
fn recover_request_slots() {
    let answer = WorkerError::new(
        ErrorCode::WorkerRestarted,
        "the gsnap worker restarted while working on this request; try again",
    )
    .encode();
    for i in 0..shmem::request_slot_count() {
        let slot = shmem::request_slot(i);
        if slot.recover_after_worker_exit(&answer) {
            crate::ipc::set_latch_of(i);
        }
    }
}

/// Everything the worker holds between loop iterations.
pub(crate) struct Worker {
    store: Option<Store>,
    /// The GSnap index over the store (open whenever the store is).
    index: Option<index::IndexState>,
    store_problem: Option<(ErrorCode, String)>,
    /// A storage error (full disk, I/O error) left the open store unable to write: it is
    /// closed at the end of this loop iteration and reopened once it can be.
    store_broken: Option<(ErrorCode, String)>,
    /// Snapshots whose failure could not be recorded with its real reason (the store was
    /// failing): recorded when the store is open again.
    unrecorded_failures: Vec<(u64, String)>,
    next_open_attempt: Instant,
    xact: xact::Xact,
    /// Declaration requests not yet satisfied (waiting for a lock, or for queue room).
    pending: Vec<PendingDeclare>,
    /// Declared snapshots waiting for their capture, oldest first.
    queue: VecDeque<Declared>,
    /// The capture in progress.
    job: Option<CaptureJob>,
    /// Current incarnation of each gsnap table (by OID).
    known: HashMap<u32, Known>,
    /// No snapshot declared since the worker started: the first capture examines every
    /// block (`restart.rs`).
    fresh_start: bool,
    /// When the newest snapshot (not failed) was declared: the eager rank of the next one
    /// depends on it (the retention buckets it opens).
    last_declared_at_us: Option<i64>,
    /// Pages written in spans whose declaration failed: they belong to the next one.
    span_leftover: CarryForward,
    /// Pages the next capture must include (unsettled, or from a failed capture).
    carry: CarryForward,
    /// Cache keys of published copies of the active group not yet removed from the cache.
    active_copies: Vec<u64>,
    /// Requests waiting for a snapshot to become durable: (slot, snapshot).
    durable_waiters: Vec<(usize, u64)>,
    /// Snapshots exported (for tests) and held until released.
    exports: Vec<u64>,
    next_periodic: Option<Instant>,
    /// Pages copied ahead of the next periodic snapshot (`ahead.rs`), and the periodic
    /// snapshot the last copies were made for.
    ahead: Option<ahead::Ahead>,
    ahead_for: Option<Instant>,
    /// The snapshot still being captured a reader last asked for.
    capture_awaited: Option<u64>,
    /// Freed capture memory kept between captures (`memory.rs`).
    heap: memory::Heap,
    /// Write transactions per second around captures (`gsnap_progress().worst_second`).
    write_rates: disturbance::WriteRates,
    /// When the worker last warned that captures fall behind the interval.
    behind_warned: Option<Instant>,
    /// Serialized answers (catalog listings) by key, rebuilt when the catalog changes.
    answers: HashMap<(u32, i64), std::rc::Rc<Vec<u8>>>,
    /// When the retention policy is next applied regardless of commits (pins expire).
    retention_due: Instant,
    /// The invalid `gsnap.retention` last warned about (warned once per setting).
    policy_warned: Option<String>,
    /// The size cap could not be met last time (warned once until it can).
    cap_warned: bool,
    /// The reclamation in progress.
    reclaim_job: Option<gsnap_store::ReclaimJob>,
    /// Per rank, the range of image ids freed since the last tidying, and whether one is due
    /// (`lifetimes.rs`, `tidy_after_reclaim`).
    freed_ranges: std::collections::BTreeMap<u8, (gsnap_store::ImageId, gsnap_store::ImageId)>,
    tidy_due: bool,
    /// A sweep of the key maps' entries is due (after reclamation): where its next step
    /// starts (None inside: at the first entry).
    key_sweep: Option<Option<Vec<u8>>>,
    /// When the next reclamation step may run (test hook `gsnap.debug_reclaim_pause_ms`).
    next_reclaim_at: std::time::Instant,
    /// When to look for reclamation to start next. A search that finds none is repeated
    /// after a deletion or a moment later (a delay passing, a reader's lease ending), not on
    /// every turn of the loop: the loop turns once per request served, and the search walks
    /// the whole catalog (8% of the worker's CPU serving a parallel scan, with 530 snapshots).
    reclaim_search_at: std::time::Instant,
    /// What reclamation freed since the worker started.
    reclaimed_total: gsnap_store::Freed,
    /// What deleting each snapshot would free (bytes; None: nothing can be said), with the
    /// `frees_generation` it was computed at (`lifetimes.rs`, `refresh_frees`).
    frees: HashMap<u64, (u64, Option<u64>)>,
    /// Bumped whenever the catalog changes: every estimate is computed again, in the
    /// background.
    frees_generation: u64,
    /// The records of the images a request loads, read into this buffer (kept between
    /// requests: at most one request's records, a few MB).
    read_buffer: Vec<u8>,
    /// The thread computing estimates, if one runs (`background.rs`).
    frees_thread: Option<background::FreesThread>,
    /// The thread compacting freed image ranges or a retired log generation, if one runs.
    compaction: Option<background::CompactionThread>,
    /// The mapping log's generation a rewrite retired, to compact once the compaction thread
    /// is free.
    retired_log: Option<u8>,
    /// The mapping log's rewrite being computed, and the mappings reclamation killed since
    /// the last one (a rewrite is due once they are half the log; at start, one is due if a
    /// snapshot was reclaimed since the last rewrite).
    log_rewrite: Option<background::LogRewriteThread>,
    killed_mappings: u64,
    /// The mappings reclamation killed since the last sweep of the key entries began (or
    /// since the worker started: after a restart, entries left unswept wait for the next
    /// sweep, which their lookups do not need).
    killed_since_sweep: u64,
    /// Not before this time (see `catalog_changed`).
    frees_quiet_at: Instant,
    /// Estimates are computed only until then (`lifetimes.rs`, `frees_wanted`).
    frees_wanted_until: Instant,
    /// A capture ended: the images reclamation kept for it may be freed.
    release_kept: bool,
    /// Cache keys of index groups replaced (rebuilt without deleted snapshots, merged) not
    /// yet removed from the group cache.
    replaced_groups: Vec<u64>,
    /// The snapshot span of each group this worker put into the group cache, by cache key:
    /// what a reader's pin of it leases.
    group_spans: HashMap<u64, (u64, u64)>,
}

impl Worker {
    fn new() -> Worker {
        Worker {
            store: None,
            index: None,
            store_problem: None,
            store_broken: None,
            unrecorded_failures: Vec::new(),
            next_open_attempt: Instant::now(),
            xact: xact::Xact::default(),
            pending: Vec::new(),
            queue: VecDeque::new(),
            job: None,
            known: HashMap::new(),
            fresh_start: true,
            last_declared_at_us: None,
            span_leftover: CarryForward::default(),
            carry: CarryForward::default(),
            active_copies: Vec::new(),
            durable_waiters: Vec::new(),
            exports: Vec::new(),
            next_periodic: None,
            ahead: None,
            ahead_for: None,
            behind_warned: None,
            heap: memory::Heap::new(),
            write_rates: disturbance::WriteRates::default(),
            capture_awaited: None,
            answers: HashMap::new(),
            retention_due: Instant::now(),
            policy_warned: None,
            cap_warned: false,
            reclaim_job: None,
            next_reclaim_at: std::time::Instant::now(),
            reclaim_search_at: std::time::Instant::now(),
            freed_ranges: std::collections::BTreeMap::new(),
            tidy_due: false,
            key_sweep: None,
            reclaimed_total: gsnap_store::Freed::default(),
            frees: HashMap::new(),
            frees_generation: 1,
            read_buffer: Vec::new(),
            frees_thread: None,
            compaction: None,
            retired_log: None,
            log_rewrite: None,
            killed_mappings: 0,
            killed_since_sweep: 0,
            frees_quiet_at: Instant::now(),
            frees_wanted_until: Instant::now(),
            release_kept: true,
            replaced_groups: Vec::new(),
            group_spans: HashMap::new(),
        }
    }

    /// Reads the next transaction id (at most once a second) and publishes the worst second
    /// of the captures that reading completes.
    fn read_write_rate(&mut self) {
        let now = catalog::now_unix_us();
        if !self.write_rates.due(now) {
            return;
        }
        // SAFETY: reads the transaction id counter under its lock; no transaction needed.
        let next = unsafe { pg_sys::ReadNextFullTransactionId() }.value;
        for worst in self.write_rates.read(now, next) {
            shmem::progress().worst_second(worst);
        }
    }

    fn run(&mut self) {
        self.schedule_periodic();
        while !shutdown_requested() {
            if reload_requested() {
                // SAFETY: reloading the configuration file in the main loop, as workers do.
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
                self.schedule_periodic();
                self.retention_due = Instant::now();
                memory::Heap::configure();
                if let Some(store) = &self.store {
                    apply_reloadable_settings(store);
                }
            }
            self.ensure_store();
            self.serve_requests();
            self.drop_abandoned_waiters();
            self.periodic_due();
            self.declare_pending();
            self.start_capture();
            let mut busy = self.capture_step();
            busy |= self.copy_ahead();
            self.apply_retention(Instant::now(), false);
            busy |= self.reclaim();
            busy |= self.sweep_keys();
            self.refresh_frees();
            self.poll_compaction();
            self.poll_log_rewrite();
            self.close_broken_store();
            self.release_transaction_if_idle();
            self.heap.tick(self.job.is_some() || !self.queue.is_empty());
            self.read_write_rate();
            let timeout = if busy || !self.pending.is_empty() && self.store.is_some() {
                Duration::from_millis(if busy { 0 } else { 20 })
            } else {
                self.idle_timeout()
            };
            crate::ffi::latch::wait(timeout);
        }
        // A capture in flight stops here (phase two's thread first); the store finishes it at
        // its next open.
        self.job = None;
        // The snapshot ids leased and not handed out are given back, so a clean restart
        // goes on without a gap (this synced write also makes every declaration durable).
        if let Some(Err(e)) = self.store.as_ref().map(|s| s.give_back_leases()) {
            log!(
                "gsnap: could not give back the snapshot id lease: {}",
                e.message()
            );
        }
        log!("gsnap worker stopping");
    }

    fn idle_timeout(&self) -> Duration {
        let mut t = Duration::from_secs(1);
        if let Some(job) = &self.job {
            t = t.min(if job.storing() {
                // Phase two's thread is polled: the commit follows it closely.
                Duration::from_millis(10)
            } else {
                job.next_batch_at.saturating_duration_since(Instant::now())
            });
        }
        if let Some(due) = self.next_periodic {
            t = t.min(due.saturating_duration_since(Instant::now()));
        }
        if let Some(at) = self.copy_ahead_at() {
            t = t.min(at.saturating_duration_since(Instant::now()));
        }
        if self.threads_running() {
            t = t.min(Duration::from_millis(50));
        }
        t
    }

    fn schedule_periodic(&mut self) {
        let secs = gucs::SNAPSHOT_INTERVAL.get();
        self.next_periodic = (secs > 0).then(|| {
            let interval = Duration::from_secs(secs as u64);
            match self.next_periodic {
                Some(due) => due.min(Instant::now() + interval),
                None => Instant::now() + interval,
            }
        });
    }

    fn periodic_due(&mut self) {
        let Some(due) = self.next_periodic else {
            return;
        };
        if Instant::now() < due || self.pending.iter().any(|p| p.periodic) {
            return;
        }
        if let Some(job) = &self.job {
            // Captures fall behind the interval: say so (at most once a minute), since every
            // snapshot queued behind this capture holds VACUUM back until it is read.
            if self
                .behind_warned
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
            {
                self.behind_warned = Some(Instant::now());
                warning!(
                    "gsnap: the capture of snapshot {} is not finished when the next periodic \
                     snapshot is due ({} more queued); captures fall behind \
                     gsnap.snapshot_interval",
                    job.snap(),
                    self.queue.len()
                );
            }
        }
        self.pending.push(PendingDeclare::periodic());
        let secs = gucs::SNAPSHOT_INTERVAL.get().max(1) as u64;
        self.next_periodic = Some(Instant::now() + Duration::from_secs(secs));
    }

    /// Opens the store (and its index) if it is not open, at most every few seconds after a
    /// failure.
    fn ensure_store(&mut self) {
        if Instant::now() < self.next_open_attempt {
            return;
        }
        if let (Some(store), None) = (&self.store, &self.index) {
            match index::IndexState::open(store.clone()) {
                Ok(i) => self.index = Some(i),
                Err(e) => {
                    warning!("gsnap: the snapshot index cannot be opened: {e}");
                    self.next_open_attempt = Instant::now() + Duration::from_secs(5);
                }
            }
            return;
        }
        if self.store.is_some() {
            return;
        }
        let dir = store_directory();
        // SAFETY: reading the cluster's system identifier.
        let sysid = unsafe { pg_sys::GetSystemIdentifier() };
        let options = StoreOptions {
            content_version: CONTENT_VERSION,
            oldest_content_version: OLDEST_CONTENT_VERSION,
            block_cache_bytes: Some(crate::gucs::STORE_CACHE_SIZE.get() as usize * 1024),
            open_key_cache_bytes: crate::gucs::KEY_MAP_CACHE_SIZE.get() as usize * 1024,
            recent_image_cache_bytes: crate::gucs::DELTA_BASE_CACHE_SIZE.get() as usize * 1024,
            ..StoreOptions::new(sysid)
        };
        match Store::open_dir(std::path::Path::new(&dir), options) {
            Ok(store) => {
                RocksBackend::lower_compaction_priority();
                apply_reloadable_settings(&store);
                self.store = Some(store.clone());
                if self.store_problem.take().is_some() {
                    log!("gsnap store at \"{dir}\" is open again");
                }
                self.record_failures(&store);
                self.load_kept_frees(&store);
                self.last_declared_at_us = store.latest_declared_at_us();
                // The mappings reclamation killed before this start, if the last rewrite did
                // not drop them: counted as many as the log holds (a rewrite is due).
                self.killed_mappings = match store.log_rewrite_due() {
                    Ok(false) => 0,
                    Ok(true) | Err(_) => u64::MAX,
                };
                shmem::worker().set_state(WorkerState::Ready);
                match index::IndexState::open(store) {
                    Ok(index) => self.index = Some(index),
                    Err(e) => {
                        warning!("gsnap: the snapshot index in \"{dir}\" cannot be opened: {e}");
                        self.next_open_attempt = Instant::now() + Duration::from_secs(5);
                    }
                }
            }
            Err(e) => {
                let message = format!("gsnap store at \"{dir}\" cannot be opened: {}", e.message());
                if self.store_problem.as_ref().map(|(_, m)| m) != Some(&message) {
                    warning!("{message}");
                }
                self.store_problem = Some((code_of(&e), message));
                self.next_open_attempt = Instant::now() + Duration::from_secs(5);
                shmem::worker().set_state(WorkerState::StoreUnavailable);
            }
        }
    }

    /// Notes a store error; one that means the store can no longer write (a full disk, an
    /// I/O error: RocksDB then refuses every write until it is reopened) gets the store closed
    /// and reopened (see `close_broken_store`).
    pub(super) fn note_store_error(&mut self, e: &StoreError) {
        if matches!(e.kind(), ErrorKind::NoSpace | ErrorKind::Io) && self.store_broken.is_none() {
            self.store_broken = Some((code_of(e), e.message().to_string()));
        }
    }

    /// Closes a store that can no longer write: the capture in flight and the declared
    /// snapshots waiting for one fail (their waiters get the error, their pages go to the next
    /// capture), and `ensure_store` reopens the store, which marks them failed durably, once
    /// it can. Meanwhile requests get the storage error at once instead of waiting.
    fn close_broken_store(&mut self) {
        // Still set while the work in flight fails, so `fail` keeps its reason for later.
        let Some((code, message)) = self.store_broken.clone() else {
            return;
        };
        if self.store.is_none() {
            self.store_broken = None;
            return;
        }
        warning!(
            "gsnap: the store can no longer write ({message}); snapshots in progress fail and \
             the store is reopened once it works again"
        );
        let reason = format!("the store failed: {message}");
        if let Some(job) = self.job.take() {
            self.abort(job, code, &reason);
        }
        while let Some(mut decl) = self.queue.pop_front() {
            let pages = std::mem::take(&mut decl.pages);
            self.fail(decl, pages, code, &reason);
        }
        shmem::progress().set_queued(0);
        // The store closes with its last handle: the index and the capture job held the
        // others and are gone, the estimates' thread stops within a batch (a compaction
        // in flight holds one until it ends: reopening waits for it); requests are answered
        // within one loop iteration.
        if let Some(thread) = self.frees_thread.take() {
            thread.cancel();
        }
        self.compaction = None;
        self.index = None;
        self.store = None;
        self.catalog_changed();
        self.store_problem = Some((
            code,
            format!("the gsnap store is unavailable after a storage error: {message}"),
        ));
        shmem::worker().set_state(WorkerState::StoreUnavailable);
        self.next_open_attempt = Instant::now() + Duration::from_secs(1);
        self.store_broken = None;
    }

    /// Records the real reasons of snapshots that failed while the store could not write
    /// (reopening marked them failed as interrupted captures).
    fn record_failures(&mut self, store: &Store) {
        for (snap, reason) in std::mem::take(&mut self.unrecorded_failures) {
            if let Err(e) = store.set_failure_reason(SnapId(snap), &reason) {
                if e.kind() != ErrorKind::NotFound {
                    warning!("gsnap: could not record why snapshot {snap} failed: {e}");
                }
            }
        }
    }

    /// Commits the worker's transaction once it holds no snapshot.
    fn release_transaction_if_idle(&mut self) {
        if self.xact.is_open()
            && self.queue.is_empty()
            && self.job.is_none()
            && self.exports.is_empty()
        {
            self.xact.close();
            shmem::progress().set_phase(Phase::Idle);
        }
    }

    /// Adds a committed snapshot to the index (its mappings read from the store's mapping
    /// log); if that fails the index is reopened from the store (the mapping log is the
    /// truth), so the snapshot is indexed either way.
    pub(super) fn index_snapshot(&mut self, snap: u64) {
        let Some(index) = self.index.as_mut() else {
            return;
        };
        if let Err(e) = index.add_snapshot(SnapId(snap)) {
            warning!(
                "gsnap: indexing snapshot {snap} failed ({e}); rebuilding the index from the store"
            );
            let store = self.store.clone().expect("an index implies a store");
            match index::IndexState::open(store) {
                Ok(i) => self.index = Some(i),
                Err(e) => {
                    warning!("gsnap: the snapshot index cannot be rebuilt: {e}");
                    self.index = None;
                    self.next_open_attempt = Instant::now() + Duration::from_secs(5);
                }
            }
        }
        self.retire_active_copies();
    }

    /// Snapshot `snap` was committed. Of the estimates of what deleting a snapshot would
    /// free, only the one of the snapshot newest before it changes (it had none), unless the
    /// capture referenced content stored before it (`shares_older`): every one is computed
    /// again then. (Recomputing them all after every snapshot cost the worker time in
    /// proportion to the number of snapshots.)
    fn snapshot_committed(&mut self, snap: u64, shares_older: bool) {
        if shares_older {
            self.catalog_changed();
            return;
        }
        let previous = self.frees.keys().copied().filter(|&s| s < snap).max();
        self.estimates_changed(&[previous]);
    }

    /// The reclamation of a deleted snapshot completed. Unless a step left content it
    /// decremented named elsewhere (then any estimate may have changed), only the estimates
    /// of its neighbours change: their dead mappings grow (`gsnap_store`, `estimates.rs`).
    /// (Recomputing them all after every reclamation, under a retention policy, cost the
    /// worker a read of every snapshot's dead mappings after each capture.)
    pub(super) fn snapshot_reclaimed(&mut self, job: &gsnap_store::ReclaimJob) {
        // Never listed with an estimate again: its entry goes (under a retention policy with
        // someone watching, the map would otherwise gain one entry per snapshot ever taken).
        self.frees.remove(&job.snap.0);
        if job.changed_shared_content() {
            self.catalog_changed();
            return;
        }
        self.estimates_changed(&[job.prev.map(|s| s.0), Some(job.next.0)]);
    }

    /// The catalog changed, and of the estimates of what deleting a snapshot would free only
    /// those of `changed` did: the others known now are kept as current.
    fn estimates_changed(&mut self, changed: &[Option<u64>]) {
        let before = self.frees_generation;
        self.catalog_changed();
        let now = self.frees_generation;
        for (&s, entry) in self.frees.iter_mut() {
            if entry.0 == before && !changed.contains(&Some(s)) {
                entry.0 = now;
            }
        }
    }

    /// The catalog changed in a way that changes no estimate of what deleting a snapshot
    /// would free: a declaration, a pin, a rank, a deletion (the snapshot stays in the log
    /// until it is reclaimed, `snapshot_reclaimed`). Only the cached listings go, and a
    /// search for reclamation is due (a deletion or an unpinned snapshot may allow one).
    fn listing_changed(&mut self) {
        self.answers.clear();
        self.reclaim_search_at = Instant::now();
    }

    /// Invalidates cached catalog answers and every estimate of what deleting a snapshot
    /// would free (computed again once the catalog has been quiet for a moment); a search
    /// for reclamation is due.
    fn catalog_changed(&mut self) {
        self.answers.clear();
        self.reclaim_search_at = Instant::now();
        self.frees_generation += 1;
        // The estimates are refreshed once the catalog has been quiet for a moment, so that a
        // series of requests (deletions, pins) does not wait behind them.
        self.frees_quiet_at = Instant::now() + Duration::from_secs(1);
    }
}

/// The store directory: `gsnap.store_directory`, relative to the data directory, or
/// `gsnap` in the data directory.
pub(crate) fn store_directory() -> String {
    match gucs::STORE_DIRECTORY.get() {
        Some(d) if !d.as_bytes().is_empty() => in_data_directory(&d.to_string_lossy()),
        _ => in_data_directory("gsnap"),
    }
}

/// `path` as the server resolves it: an absolute path as it is, a relative one under the
/// data directory.
pub(crate) fn in_data_directory(path: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    // SAFETY: DataDir is set in every backend and worker.
    let data_dir = unsafe { CStr::from_ptr(pg_sys::DataDir) }.to_string_lossy();
    format!("{data_dir}/{path}")
}
