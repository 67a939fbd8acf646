//! Work the worker hands to threads of its own so that its loop (declarations, captures,
//! requests) never waits for it: the estimates of what deleting each snapshot would free
//! (`would_free` reads a snapshot's mapping log and its images: up to a second for a large
//! one), the compaction of the key ranges reclamation freed (RocksDB rewrites files), and the
//! mapping log rewritten without the mappings reclamation killed (it reads the whole log).
//!
//! The threads only read the store (estimates: the worker keeps what they find) or ask
//! RocksDB to compact (a manual compaction that is not exclusive: RocksDB's own go on,
//! writers never stall). They never call PostgreSQL. The worker polls them once per loop
//! iteration; an estimates' thread that panicked found only what it sent before (the others
//! are computed again after the next change).

use super::Store;
use gsnap_store::{Freed, ImageId, LogRewrite, SnapId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Starts a thread of the worker's that uses the store, named `name`: RocksDB's
/// per-operation counters are off on it, as on the worker's main thread (`gsnap_worker_main`).
pub(super) fn spawn_store_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(|| {
        gsnap_store::RocksBackend::quiet_counters();
        work()
    })
}

/// Lowers the calling thread's CPU priority to nice 19, as RocksDB lowers its compaction
/// threads (`RocksBackend::lower_compaction_priority`): work nobody waits for then takes the
/// CPU the backends and the capture leave instead of theirs (an estimate competing with a
/// capture's phase one made it hold its MVCC snapshot 1.5-3x longer under pgbench), and
/// still gets all of an idle machine. Not `SCHED_IDLE`: a thread that holds a lock of the
/// store's (a block cache shard's, while it reads) must still run soon when others wait
/// for it. Best effort: a system that refuses leaves the priority as it was.
fn lower_priority() {
    // SAFETY: plain system calls on the calling thread (`gettid` names it; PRIO_PROCESS with
    // a thread id applies to that thread alone on Linux).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// One estimate an estimates' thread computed: what deleting `snap` would free (None:
/// nothing can be said), and the store's estimates epoch read before it was computed (what
/// the store needs to keep it, `SnapshotStore::keep_estimates`).
pub(super) struct FoundFree {
    pub snap: SnapId,
    pub freed: Option<Freed>,
    pub epoch: u64,
}

/// Estimates of `would_free` being computed on a thread, for one catalog generation. Each is
/// handed over as soon as it is computed, so that the listing fills in as they come and a
/// restart loses at most the one under way (a store of hundreds of large snapshots takes
/// minutes).
pub(super) struct FreesThread {
    pub generation: u64,
    cancel: Arc<AtomicBool>,
    found: Receiver<FoundFree>,
    handle: JoinHandle<()>,
}

impl FreesThread {
    /// Starts computing what deleting each of `snaps` would free, in order.
    pub fn start(store: Store, generation: u64, snaps: Vec<SnapId>) -> std::io::Result<Self> {
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&cancel);
        let (send, found) = std::sync::mpsc::channel();
        let handle = spawn_store_thread("gsnap-frees", move || {
            lower_priority();
            for snap in snaps {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let epoch = store.estimates_epoch();
                let estimate = store.would_free_unless(snap, &|| stop.load(Ordering::Relaxed));
                if stop.load(Ordering::Relaxed) {
                    // Given up midway (or just finished): not an estimate; done again later.
                    break;
                }
                let freed = estimate.ok().flatten();
                if send.send(FoundFree { snap, freed, epoch }).is_err() {
                    break;
                }
            }
        })?;
        Ok(FreesThread {
            generation,
            cancel,
            found,
            handle,
        })
    }

    /// Asks the thread to stop: within milliseconds, leaving the snapshot it is on without
    /// an estimate (`would_free_unless`).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// True once the thread has ended.
    pub fn finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The estimates computed since the last call.
    pub fn take_found(&self) -> Vec<FoundFree> {
        self.found.try_iter().collect()
    }
}

/// The compaction of freed image ranges, one rank after the other, or of the mapping log's
/// generation a rewrite retired, on a thread.
pub(super) struct CompactionThread {
    handle: JoinHandle<Vec<String>>,
}

impl CompactionThread {
    /// Starts compacting `ranges` (per rank, the ids of the freed images).
    pub fn start(store: Store, ranges: BTreeMap<u8, (ImageId, ImageId)>) -> std::io::Result<Self> {
        Self::spawn(move || {
            ranges
                .into_values()
                .filter_map(|(from, to)| store.compact_images(from, to).err())
                .map(|e| e.message().to_string())
                .collect()
        })
    }

    /// Starts compacting the mapping log's retired `generation` (its space returns now).
    pub fn start_log(store: Store, generation: u8) -> std::io::Result<Self> {
        Self::spawn(move || {
            store
                .compact_retired_log(generation)
                .err()
                .map(|e| e.message().to_string())
                .into_iter()
                .collect()
        })
    }

    fn spawn(work: impl FnOnce() -> Vec<String> + Send + 'static) -> std::io::Result<Self> {
        let handle = spawn_store_thread("gsnap-compact", work)?;
        Ok(CompactionThread { handle })
    }

    /// True once the thread has ended.
    pub fn finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The errors of an ended thread.
    pub fn join(self) -> Vec<String> {
        self.handle
            .join()
            .unwrap_or_else(|_| vec!["the compaction thread panicked".into()])
    }
}

/// The mapping log rewritten without its dead mappings into the other key generation
/// (`SnapshotStore::rewrite_log`), on a thread; the worker switches to it (`lifetimes.rs`,
/// `poll_log_rewrite`).
pub(super) struct LogRewriteThread {
    handle: JoinHandle<Result<Option<LogRewrite>, String>>,
}

impl LogRewriteThread {
    /// Starts writing the rewrite, in batches of about `batch_bytes`.
    pub fn start(store: Store, batch_bytes: usize) -> std::io::Result<Self> {
        let handle = spawn_store_thread("gsnap-log", move || {
            store
                .rewrite_log(batch_bytes)
                .map_err(|e| e.message().to_string())
        })?;
        Ok(LogRewriteThread { handle })
    }

    /// True once the thread has ended.
    pub fn finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The rewrite an ended thread wrote (None: a reclamation is in flight).
    pub fn join(self) -> Result<Option<LogRewrite>, String> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err("the log rewrite thread panicked".into()))
    }
}
