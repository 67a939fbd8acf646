//! What the worker publishes in shared memory: whether it runs, and how the current capture
//! progresses (read by `gsnap_progress()`).

use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Life cycle of the worker as backends see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WorkerState {
    /// No worker process (not started yet, or restarting after an exit).
    Down = 0,
    /// Started, opening the store.
    Starting = 1,
    /// Serving requests.
    Ready = 2,
    /// Running, but the store cannot be opened: requests get the store's error.
    StoreUnavailable = 3,
}

impl WorkerState {
    fn from_u32(v: u32) -> WorkerState {
        match v {
            1 => WorkerState::Starting,
            2 => WorkerState::Ready,
            3 => WorkerState::StoreUnavailable,
            _ => WorkerState::Down,
        }
    }

    /// Lower-case name for listings.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Down => "down",
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::StoreUnavailable => "store unavailable",
        }
    }
}

/// The worker's identity and state.
#[repr(C)]
pub struct WorkerShared {
    /// PGPROC number of the worker (whose latch backends set), -1 when down.
    procno: AtomicI32,
    pid: AtomicI32,
    state: AtomicU32,
}

impl WorkerShared {
    pub(super) fn new() -> WorkerShared {
        WorkerShared {
            procno: AtomicI32::new(-1),
            pid: AtomicI32::new(0),
            state: AtomicU32::new(WorkerState::Down as u32),
        }
    }

    /// Published by the worker at start.
    pub fn started(&self, procno: i32, pid: i32) {
        self.pid.store(pid, Relaxed);
        self.procno.store(procno, Relaxed);
        self.state.store(WorkerState::Starting as u32, Relaxed);
    }

    /// Sets the state.
    pub fn set_state(&self, state: WorkerState) {
        self.state.store(state as u32, Relaxed);
    }

    /// Published by the worker when it exits.
    pub fn stopped(&self) {
        self.state.store(WorkerState::Down as u32, Relaxed);
        self.procno.store(-1, Relaxed);
        self.pid.store(0, Relaxed);
    }

    /// The worker's PGPROC number, if it runs.
    pub fn procno(&self) -> Option<usize> {
        usize::try_from(self.procno.load(Relaxed)).ok()
    }

    /// The worker's process id (0 when down).
    pub fn pid(&self) -> i32 {
        self.pid.load(Relaxed)
    }

    /// The state.
    pub fn state(&self) -> WorkerState {
        WorkerState::from_u32(self.state.load(Relaxed))
    }
}

/// What the worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// Nothing to do.
    Idle = 0,
    /// Declaring a snapshot (possibly waiting for a table lock).
    Declaring = 1,
    /// Capturing pages.
    Capturing = 2,
    /// Every page is read and the MVCC snapshot released: storing the pages' copies, then
    /// writing the snapshot's final batch.
    Committing = 3,
    /// Every page is read and the MVCC snapshot released: deciding on the pages' copies which
    /// rows the snapshot sees (paced), before storing them.
    Deciding = 4,
}

impl Phase {
    /// Lower-case name for listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Declaring => "declaring",
            Phase::Capturing => "capturing",
            Phase::Committing => "committing",
            Phase::Deciding => "deciding",
        }
    }

    fn from_u32(v: u32) -> Phase {
        match v {
            1 => Phase::Declaring,
            2 => Phase::Capturing,
            3 => Phase::Committing,
            4 => Phase::Deciding,
            _ => Phase::Idle,
        }
    }
}

/// Progress of the capture in flight (all counters relaxed: a listing, not a protocol).
#[repr(C)]
#[derive(Default)]
pub struct ProgressShared {
    phase: AtomicU32,
    snapshot: AtomicI64,
    started_at_us: AtomicI64,
    relations_total: AtomicU32,
    relations_done: AtomicU32,
    pages_total: AtomicU64,
    pages_done: AtomicU64,
    bytes_stored: AtomicU64,
    new_images: AtomicU64,
    /// Declared snapshots waiting for their capture.
    queued: AtomicU32,
    /// OID of the table whose lock a declaration waits for (0: none).
    waiting_for: AtomicU32,
    /// Declarations held back because `gsnap.max_queued_snapshots` snapshots wait for their
    /// capture already (0: none).
    held_for_room: AtomicU32,
    last_durable: AtomicI64,
    last_durable_at_us: AtomicI64,
    /// How long the last capture whose pages were all read held its MVCC snapshot (µs from
    /// declaration; 0: none yet).
    last_horizon_held_us: AtomicI64,
    /// The worst second of the last capture that ended (`worker::disturbance`), in parts per
    /// million of the rate before it; -1: unknown (too few writes before it); 0: none yet.
    last_worst_second_ppm: AtomicI64,
    /// Pages of the capture in flight stored as they were read, the copies' memory
    /// (gsnap.capture_memory) being full.
    pages_beyond_memory: AtomicU64,
    /// Pages of the capture in flight read and not stored yet (phase two).
    pages_to_store: AtomicU64,
    /// Pages of the capture in flight taken from copies made ahead of it, found unchanged.
    pages_copied_ahead: AtomicU64,
    /// Pages copied ahead of the next periodic snapshot and held now (`worker::ahead`).
    copies_ahead: AtomicU64,
    /// The deleted snapshot whose space is being reclaimed (0: none), its dead mappings done
    /// and in all, and the bytes reclamation freed since the worker started.
    reclaim_snapshot: AtomicI64,
    reclaim_done: AtomicU64,
    reclaim_total: AtomicU64,
    reclaimed_bytes: AtomicU64,
    /// Bumped before each reclamation of a deleted snapshot starts (see
    /// `read::table::confirm_readable`, the lease it serves).
    reclaim_generation: AtomicU64,
}

/// A copy of the progress counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    pub phase: Option<Phase>,
    pub snapshot: i64,
    pub started_at_us: i64,
    pub relations_total: u32,
    pub relations_done: u32,
    pub pages_total: u64,
    pub pages_done: u64,
    pub bytes_stored: u64,
    pub new_images: u64,
    pub queued: u32,
    pub waiting_for: u32,
    pub held_for_room: u32,
    pub last_durable: i64,
    pub last_durable_at_us: i64,
    pub last_horizon_held_us: i64,
    pub last_worst_second_ppm: i64,
    pub pages_beyond_memory: u64,
    pub pages_to_store: u64,
    pub pages_copied_ahead: u64,
    pub copies_ahead: u64,
    pub reclaim_snapshot: i64,
    pub reclaim_done: u64,
    pub reclaim_total: u64,
    pub reclaimed_bytes: u64,
}

impl ProgressShared {
    /// Reads every counter.
    pub fn read(&self) -> Progress {
        Progress {
            phase: Some(Phase::from_u32(self.phase.load(Relaxed))),
            snapshot: self.snapshot.load(Relaxed),
            started_at_us: self.started_at_us.load(Relaxed),
            relations_total: self.relations_total.load(Relaxed),
            relations_done: self.relations_done.load(Relaxed),
            pages_total: self.pages_total.load(Relaxed),
            pages_done: self.pages_done.load(Relaxed),
            bytes_stored: self.bytes_stored.load(Relaxed),
            new_images: self.new_images.load(Relaxed),
            queued: self.queued.load(Relaxed),
            waiting_for: self.waiting_for.load(Relaxed),
            held_for_room: self.held_for_room.load(Relaxed),
            last_durable: self.last_durable.load(Relaxed),
            last_durable_at_us: self.last_durable_at_us.load(Relaxed),
            last_horizon_held_us: self.last_horizon_held_us.load(Relaxed),
            last_worst_second_ppm: self.last_worst_second_ppm.load(Relaxed),
            pages_beyond_memory: self.pages_beyond_memory.load(Relaxed),
            pages_to_store: self.pages_to_store.load(Relaxed),
            pages_copied_ahead: self.pages_copied_ahead.load(Relaxed),
            copies_ahead: self.copies_ahead.load(Relaxed),
            reclaim_snapshot: self.reclaim_snapshot.load(Relaxed),
            reclaim_done: self.reclaim_done.load(Relaxed),
            reclaim_total: self.reclaim_total.load(Relaxed),
            reclaimed_bytes: self.reclaimed_bytes.load(Relaxed),
        }
    }

    /// Reclamation of `snap` is at `done` of `total` dead mappings; `bytes` freed in all.
    pub fn reclaiming(&self, snap: u64, done: u64, total: u64, bytes: u64) {
        self.reclaim_snapshot.store(snap as i64, Relaxed);
        self.reclaim_done.store(done, Relaxed);
        self.reclaim_total.store(total, Relaxed);
        self.reclaimed_bytes.store(bytes, Relaxed);
    }

    /// The reclamation generation: it changes whenever a reclamation starts.
    pub fn reclaim_generation(&self) -> u64 {
        self.reclaim_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A reclamation starts (before its snapshot's eligibility is checked for the last time).
    pub fn bump_reclaim_generation(&self) {
        self.reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Nothing is being reclaimed.
    pub fn reclaim_idle(&self) {
        self.reclaim_snapshot.store(0, Relaxed);
        self.reclaim_done.store(0, Relaxed);
        self.reclaim_total.store(0, Relaxed);
    }

    /// Sets the phase.
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u32, Relaxed);
    }

    /// A capture of `snapshot` begins with `pages` pages in `relations` tables.
    pub fn begin(&self, snapshot: i64, started_at_us: i64, relations: u32, pages: u64) {
        self.snapshot.store(snapshot, Relaxed);
        self.started_at_us.store(started_at_us, Relaxed);
        self.relations_total.store(relations, Relaxed);
        self.relations_done.store(0, Relaxed);
        self.pages_total.store(pages, Relaxed);
        self.pages_done.store(0, Relaxed);
        self.bytes_stored.store(0, Relaxed);
        self.new_images.store(0, Relaxed);
        self.pages_beyond_memory.store(0, Relaxed);
        self.pages_copied_ahead.store(0, Relaxed);
        self.set_phase(Phase::Capturing);
    }

    /// Pages of the capture in flight stored as they were read (its copies' memory full).
    pub fn beyond_memory(&self, pages: u64) {
        self.pages_beyond_memory.store(pages, Relaxed);
    }

    /// Pages of the capture in flight taken from copies made ahead of it.
    pub fn copied_ahead(&self, pages: u64) {
        self.pages_copied_ahead.store(pages, Relaxed);
    }

    /// Pages copied ahead of the next periodic snapshot, held now.
    pub fn set_copies_ahead(&self, pages: u64) {
        self.copies_ahead.store(pages, Relaxed);
    }

    /// Pages of the capture in flight that phase two has yet to store.
    pub fn set_to_store(&self, pages: u64) {
        self.pages_to_store.store(pages, Relaxed);
    }

    /// Updates the counters of the capture in flight.
    pub fn advance(&self, relations_done: u32, pages_done: u64, bytes: u64, new_images: u64) {
        self.relations_done.store(relations_done, Relaxed);
        self.pages_done.store(pages_done, Relaxed);
        self.bytes_stored.store(bytes, Relaxed);
        self.new_images.store(new_images, Relaxed);
    }

    /// A capture read its last page and released its MVCC snapshot, `held_us` after its
    /// declaration.
    pub fn horizon_released(&self, held_us: i64) {
        self.last_horizon_held_us.store(held_us.max(1), Relaxed);
    }

    /// The worst second of the last capture that ended: the ratio, or None if unknown.
    pub fn worst_second(&self, ratio: Option<f64>) {
        let ppm = ratio.map_or(-1, |r| ((r * 1e6).round() as i64).max(1));
        self.last_worst_second_ppm.store(ppm, Relaxed);
    }

    /// Snapshot `snapshot` became durable.
    pub fn durable(&self, snapshot: i64, at_us: i64) {
        self.last_durable.store(snapshot, Relaxed);
        self.last_durable_at_us.store(at_us, Relaxed);
    }

    /// Declared snapshots waiting for capture.
    pub fn set_queued(&self, n: u32) {
        self.queued.store(n, Relaxed);
    }

    /// The table a declaration waits for (0: none).
    pub fn set_waiting_for(&self, relid: u32) {
        self.waiting_for.store(relid, Relaxed);
    }

    /// Declarations held back until the capture queue has room (0: none).
    pub fn set_held_for_room(&self, declarations: u32) {
        self.held_for_room.store(declarations, Relaxed);
    }
}
