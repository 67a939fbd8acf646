//! The exchange through this backend's request slot: encode the request, submit it, set the
//! worker's latch, sleep on our own latch until the answer is there, decode it.
//!
//! Invariants:
//! - A backend has at most one request in its slot. A [`prefetch`] leaves one behind; the
//!   next exchange first waits for it (and drops its answer), then for a request given up
//!   earlier to be cleaned by the worker.
//! - A request whose backend stops waiting (an ERROR unwinds through [`exchange`], e.g. a
//!   cancel) is given up: withdrawn if the worker has not taken it, left to the worker to
//!   clean if it is working on it, and, if the answer had already arrived, the pins it holds
//!   are released here. No pin outlives the request that asked for it.

use super::pinned;
use crate::error::error;
use crate::shmem::{self, WorkerState};
use gsnap_protocol::{
    decode_answer, DecodeError, ImageId, Kind, Reply, Request, WorkerError, MAX_IDS_PER_REQUEST,
    MAX_MESSAGE_BYTES,
};
use gsnap_shmem::requests::{GaveUp, RequestBody, RequestSlot, REPLY_BYTES};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::time::{Duration, Instant};

// The slot's buffer holds any request or answer the protocol encodes.
const _: () = assert!(MAX_MESSAGE_BYTES == REPLY_BYTES);

/// How long a request waits for a worker that is not running (it may be restarting).
const WORKER_START_TIMEOUT: Duration = Duration::from_secs(15);

fn my_slot() -> (&'static RequestSlot, i32) {
    // SAFETY: MyProc is set for every backend that runs SQL.
    let procno = unsafe { (*pg_sys::MyProc).pgprocno };
    (shmem::request_slot(procno as usize), procno)
}

/// Sets the latch of the process with PGPROC number `procno`.
pub fn set_latch_of(procno: usize) {
    // SAFETY: ProcGlobal->allProcs has an entry for every PGPROC number.
    unsafe {
        let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno);
        pg_sys::SetLatch(&raw mut (*proc_).procLatch);
    }
}

pub use crate::ffi::latch::wait as wait_latch;

/// Waits for a running worker and returns its PGPROC number; errors out after a while, and at
/// once while the server is in recovery.
fn worker_procno() -> usize {
    let deadline = Instant::now() + WORKER_START_TIMEOUT;
    loop {
        let w = shmem::worker();
        if let (Some(p), WorkerState::Ready | WorkerState::StoreUnavailable) =
            (w.procno(), w.state())
        {
            return p;
        }
        if super::in_recovery() {
            // The worker starts when recovery ends: on a standby it never runs.
            error(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "gsnap snapshots cannot be used while the server is in recovery",
            )
            .detail(
                "This server is a standby or is still recovering. gsnap's snapshot store is \
                 not replicated, and its background worker starts only when recovery ends.",
            )
            .hint(
                "Read, declare and manage snapshots on the primary server. A promoted \
                 standby keeps the store it was copied with (see the README, \"Standbys and \
                 backups\").",
            )
            .raise();
        }
        if Instant::now() >= deadline {
            error(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "the gsnap background worker is not running",
            )
            .detail(format!("worker state: {}", w.state().as_str()))
            .hint(format!(
                "Check the server log. The worker runs in database \"{}\" (gsnap.database), \
                 which must exist.",
                crate::gucs::database()
            ))
            .raise();
        }
        wait_latch(Duration::from_millis(100));
    }
}

/// Gives up a request whose backend stops waiting (an ERROR unwinds through `exchange`).
struct InFlight {
    slot: &'static RequestSlot,
    armed: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            abandon(self.slot);
        }
    }
}

fn abandon(slot: &RequestSlot) {
    if slot.give_up() == GaveUp::AnswerArrived {
        release_unread(slot);
    }
}

/// Frees a slot whose answer nobody will read, releasing the pins the answer holds.
fn release_unread(slot: &RequestSlot) {
    if let Some(body) = slot.answer() {
        pinned::release_answer(body.kind, body.message());
    }
    slot.release();
}

/// At exit: gives up the request still in this process's slot, if there is one (see
/// [`pinned`]'s exit callback).
pub(super) fn give_up_at_exit() {
    // SAFETY: MyProc is only read; it is set while the process is attached to shared memory.
    if unsafe { pg_sys::MyProc.is_null() } {
        return;
    }
    abandon(my_slot().0);
    PREFETCHING.set(false);
}

/// Waits until the slot is free again (a previous request was abandoned while the worker
/// worked on it: the worker makes it idle when done; an answer there was for a process that
/// has since exited with this PGPROC number, or for a prefetch given up). The wait can be
/// cancelled.
fn wait_until_idle(slot: &RequestSlot) {
    loop {
        match slot.give_up() {
            GaveUp::Idle => return,
            GaveUp::AnswerArrived => release_unread(slot),
            GaveUp::Withdrawn => return,
            GaveUp::LeftToWorker => wait_latch(Duration::from_millis(10)),
        }
    }
}

/// Fills the slot's body with `request`.
fn fill(body: &mut RequestBody, kind: Kind, bytes: &[u8], procno: i32) {
    body.kind = kind.tag();
    body.requester = procno;
    body.set_message(bytes);
}

thread_local! {
    /// A [`prefetch`] request of this backend is (or may still be) in its slot.
    static PREFETCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks the worker to load the images `ids` (the first [`MAX_IDS_PER_REQUEST`]) into the
/// image cache and returns at once: a scan prefetches its next batch while it reads the
/// current one, so the worker's reading and the backend's decoding overlap. The next request
/// of this backend first waits for the prefetch to be done; its answer (even an error: the
/// images are then loaded again, and the error raised, by the request that needs them) is
/// dropped.
pub fn prefetch(ids: &[ImageId]) {
    if ids.is_empty() {
        return;
    }
    let (slot, procno) = my_slot();
    // A scan whose batches are all in the cache when it pins them makes no other request,
    // so the previous prefetch is collected here (or this one is skipped while it runs):
    // without this, every other batch of a scan was loaded while the backend waited.
    if PREFETCHING.get() && !prefetch_done(slot) {
        return;
    }
    let ids = ids[..ids.len().min(MAX_IDS_PER_REQUEST)].to_vec();
    let request = Request::Prefetch { ids };
    let bytes = request
        .encode()
        .expect("at most MAX_IDS_PER_REQUEST ids fit a message");
    if slot.submit(|b| fill(b, request.kind(), &bytes, procno)) {
        PREFETCHING.set(true);
        set_latch_of(worker_procno());
    }
}

/// Waits for this backend's prefetch, if one is in flight, and frees the slot. A worker
/// that exits answers it with an error, so the wait ends; it can be cancelled, and after
/// a few seconds it is left to [`wait_until_idle`].
fn finish_prefetch(slot: &RequestSlot) {
    if !PREFETCHING.get() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if prefetch_done(slot) {
            return;
        }
        wait_latch(Duration::from_millis(100));
    }
    PREFETCHING.set(false);
}

/// True if this backend's prefetch is done (its answer, which pins nothing, is dropped and
/// the slot freed), false while the worker still has it.
fn prefetch_done(slot: &RequestSlot) -> bool {
    if slot.answer().is_some() {
        slot.release();
    } else if !slot.is_idle() {
        return false;
    }
    PREFETCHING.set(false);
    true
}

/// Sends `request` and waits for the worker's answer: its reply, or the error it reported.
/// With `watch`, calls it every few milliseconds while waiting: `watch` may raise an ERROR
/// (the request is then given up), for example when the wait can never end.
pub(super) fn exchange(
    request: &Request,
    mut watch: Option<&mut dyn FnMut()>,
) -> Result<Reply, WorkerError> {
    let kind = request.kind();
    let bytes = request.encode().unwrap_or_else(|e| {
        error(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("gsnap: a {kind:?} request cannot be sent: {e}"),
        )
        .raise()
    });
    let (slot, procno) = my_slot();
    finish_prefetch(slot);
    wait_until_idle(slot);
    let worker = worker_procno();
    let submitted = slot.submit(|b| fill(b, kind, &bytes, procno));
    assert!(submitted, "the request slot was idle");
    let mut guard = InFlight { slot, armed: true };
    set_latch_of(worker);
    loop {
        if let Some(body) = slot.answer() {
            let answer = body.message().to_vec();
            slot.release();
            guard.armed = false;
            return decode_answer(kind, &answer).unwrap_or_else(|e| bad_answer(kind, e));
        }
        match watch.as_mut() {
            Some(watch) => {
                wait_latch(Duration::from_millis(20));
                watch();
            }
            None => wait_latch(Duration::from_millis(1000)),
        }
        if slot.is_submitted() {
            // Not taken yet: the worker may have restarted; nudge whichever worker runs.
            set_latch_of(worker_procno());
        }
    }
}

/// An answer of the worker that does not decode (a bug: the worker and the backends run the
/// same library).
pub(super) fn bad_answer(kind: Kind, e: DecodeError) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("gsnap: the worker's answer to a {kind:?} request cannot be decoded: {e}"),
    )
    .raise()
}
