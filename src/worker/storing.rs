//! Phase two of a capture on a thread of its own (docs/design.md, Capture): once phase one
//! has read every page and released the snapshot's MVCC snapshot, the pages' copies are
//! fingerprinted, compressed and written to the store here, while the worker's loop goes on
//! answering declarations and image requests.
//!
//! The thread never calls PostgreSQL: it holds the store's capture and the previous page
//! table (the sealed bytes of the index group that holds it) and nothing else. It is paced:
//! the pages are spread over a window (`gsnap.capture_pace` of `gsnap.snapshot_interval`,
//! less the time since the declaration) in small chunks, so a capture takes a little CPU at a
//! time from the backends instead of a core at once. It stops pacing (hurries) when the worker
//! says so: someone waits for the snapshot to be durable, or the next snapshot is declared.
//! The worker commits the capture once the thread gives it back.

use super::capture::{index_error, store_one, ReadPage, Target};
use gsnap_core::GroupReader;
use gsnap_store::{Capture, PageKey, RocksBackend, StoreError};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pages stored between two looks at the pace (about a millisecond of work), their views
/// sealed and their keys read ahead together.
const CHUNK: usize = 64;
/// The longest the thread sleeps before looking at its flags again.
const NAP: Duration = Duration::from_millis(10);

/// Why phase two failed: a store error, or a panic (its message).
pub(super) type Failure = Result<StoreError, String>;

/// What the thread and the worker share.
#[derive(Default)]
struct Shared {
    hurry: AtomicBool,
    cancel: AtomicBool,
    /// Pages left to store.
    to_store: AtomicU64,
    bytes: AtomicU64,
    new_images: AtomicU64,
}

/// Phase two in flight.
pub(super) struct Storing {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<Stored>>,
}

/// What phase two gives back: the capture (to commit or abort), the pages it found
/// unsettled, and how it ended.
pub(super) struct Stored {
    pub capture: Capture<RocksBackend>,
    pub carried: Vec<(u32, u32)>,
    pub result: Result<(), Failure>,
}

/// How long phase two of a snapshot declared at `declared_at_us` may take: the part of
/// `gsnap.capture_pace` x `gsnap.snapshot_interval` that is left (zero without an interval:
/// a snapshot taken on request is stored at once).
pub(super) fn pace_window(declared_at_us: i64) -> Duration {
    let interval = crate::gucs::SNAPSHOT_INTERVAL.get().max(0) as f64;
    let pace = crate::gucs::CAPTURE_PACE.get().clamp(0.0, 1.0);
    let since = super::catalog::now_unix_us()
        .saturating_sub(declared_at_us)
        .max(0) as f64
        / 1e6;
    Duration::from_secs_f64((interval * pace - since).max(0.0))
}

/// When the `done`-th of `total` items is due, each item at its share of `window` (phase two's
/// chunks here, and the decisions on the copies before it, `capture.rs`).
pub(super) fn share_of(window: Duration, done: usize, total: usize) -> Duration {
    window.mul_f64(done as f64 / total.max(1) as f64)
}

impl Storing {
    /// Starts storing `pages` (their tables in `targets`) with `capture`; `previous` holds the
    /// previous page table (None: there is none). If the thread cannot start, the capture is
    /// dropped, which records it as abandoned.
    pub fn start(
        capture: Capture<RocksBackend>,
        pages: VecDeque<ReadPage>,
        targets: Vec<Target>,
        previous: Option<Vec<u8>>,
        window: Duration,
    ) -> std::io::Result<Storing> {
        let shared = Arc::new(Shared {
            to_store: AtomicU64::new(pages.len() as u64),
            ..Shared::default()
        });
        let theirs = Arc::clone(&shared);
        let handle = super::background::spawn_store_thread("gsnap-store", move || {
            let mut capture = capture;
            let mut carried = Vec::new();
            let result = catch_unwind(AssertUnwindSafe(|| {
                store_all(
                    &mut capture,
                    pages,
                    &targets,
                    previous.as_deref(),
                    window,
                    &theirs,
                    &mut carried,
                )
            }));
            let result = match result {
                Ok(r) => r,
                Err(panic) => Err(Err(format!(
                    "phase two panicked: {}",
                    panic_message(&*panic)
                ))),
            };
            Stored {
                capture,
                carried,
                result,
            }
        })?;
        Ok(Storing {
            shared,
            handle: Some(handle),
        })
    }

    /// Stop pacing (true), or pace again (false).
    pub fn hurry(&self, hurry: bool) {
        self.shared.hurry.store(hurry, Relaxed);
    }

    /// Asks the thread to stop before its next page (the capture is then aborted).
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Relaxed);
    }

    /// Pages left to store, bytes stored and new images so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = &self.shared;
        (
            s.to_store.load(Relaxed),
            s.bytes.load(Relaxed),
            s.new_images.load(Relaxed),
        )
    }

    /// True once the thread has ended.
    pub fn finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Waits for the thread and takes what it gives back.
    pub fn join(mut self) -> Stored {
        let handle = self.handle.take().expect("joined once");
        // The thread catches its own panics: joining cannot fail.
        handle
            .join()
            .expect("phase two's thread catches its panics")
    }
}

impl Drop for Storing {
    /// A worker that stops with phase two in flight stops the thread first: it must not
    /// write to the store while the process exits.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.cancel();
            let _ = handle.join();
        }
    }
}

/// The thread's work: every page, in chunks, each chunk no earlier than its share of
/// `window` unless the worker asks to hurry.
fn store_all(
    capture: &mut Capture<RocksBackend>,
    pages: VecDeque<ReadPage>,
    targets: &[Target],
    previous: Option<&[u8]>,
    window: Duration,
    shared: &Shared,
    carried: &mut Vec<(u32, u32)>,
) -> Result<(), Failure> {
    let table = match previous {
        Some(bytes) => {
            let group = GroupReader::new(bytes).map_err(|e| Ok(index_error(e)))?;
            let last = group.last_snap().map_err(|e| Ok(index_error(e)))?;
            Some(group.tree(last).map_err(|e| Ok(index_error(e)))?)
        }
        None => None,
    };
    let lookup = |page| match &table {
        Some(t) => t.lookup(page).map_err(index_error),
        None => Ok(None),
    };
    let start = Instant::now();
    let total = pages.len();
    let mut pages = pages;
    let mut done = 0;
    while !pages.is_empty() {
        pace(start, share_of(window, done, total), shared);
        if shared.cancel.load(Relaxed) {
            return Err(Err("the worker stopped it".into()));
        }
        publish(capture, total - done, shared);
        let chunk: Vec<ReadPage> = pages.drain(..CHUNK.min(pages.len())).collect();
        // The open key entries of the chunk's pages, read ahead with one cursor.
        let keyed: Vec<(PageKey, gsnap_store::SnapId)> = chunk
            .iter()
            .filter_map(|p| {
                let t = &targets[p.item];
                let page = PageKey {
                    rel: t.rel,
                    block: p.block,
                };
                t.key_map.map(|map| (page, map))
            })
            .collect();
        if !keyed.is_empty() {
            capture.prefetch_block_keys(&keyed).map_err(Ok)?;
        }
        // The chunk's views, sealed and looked up in the dedup index together: one batched
        // read instead of one per page (an empty view `store_one` does not store is dropped).
        let views: Vec<&[u8]> = chunk.iter().map(|p| p.view.view.as_slice()).collect();
        let sealed = capture.seal_views(&views).map_err(Ok)?;
        for (page, seal) in chunk.into_iter().zip(sealed) {
            done += 1;
            let target = &targets[page.item];
            store_one(&lookup, capture, target, page, Some(seal), carried).map_err(Ok)?;
        }
    }
    publish(capture, 0, shared);
    Ok(())
}

/// Sleeps until `start + due` unless the worker asks to hurry or to stop.
fn pace(start: Instant, due: Duration, shared: &Shared) {
    loop {
        if shared.hurry.load(Relaxed) || shared.cancel.load(Relaxed) {
            return;
        }
        let left = due.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(NAP));
    }
}

/// The message a panic carried, if it was a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s,
        (_, Some(s)) => s,
        _ => "(no message)",
    }
}

fn publish(capture: &Capture<RocksBackend>, to_store: usize, shared: &Shared) {
    let st = capture.stats();
    shared.to_store.store(to_store as u64, Relaxed);
    shared.bytes.store(st.bytes_stored(), Relaxed);
    shared.new_images.store(st.new_images, Relaxed);
}
