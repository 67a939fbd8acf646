//! Talking to the gsnap worker: a backend writes a request into its own request slot, sets
//! the worker's latch, and sleeps on its own latch until the answer is there (DESIGN.md,
//! "Talking to the worker"). The wait is interruptible: a cancelled query gives the request
//! up, and the worker cleans up after it.
//!
//! Bulk answers (page images, TOAST chunks) come through the shared image cache: the worker
//! loads what was asked into cache slots *pinned* for the backend and answers with the list
//! of slots; the backend reads them in place and unpins them ([`Pinned`]). So every read also
//! warms the cache for the next query, and no second copy through a queue is needed.

pub mod protocol;

use crate::error::error;
use crate::shmem::{self, WorkerState};
use gsnap_shmem::requests::{GaveUp, RequestBody, RequestSlot};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use protocol::{ErrorCode, Kind, PinnedEntry};
use std::time::{Duration, Instant};

/// How long a request waits for a worker that is not running (it may be restarting).
const WORKER_START_TIMEOUT: Duration = Duration::from_secs(15);

/// An answer of the worker.
#[derive(Debug, Default, Clone)]
pub struct Answer {
    pub result: i64,
    pub total: u64,
    pub reply: Vec<u8>,
}

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

/// Sleeps on this process's latch for at most `timeout`, then checks for interrupts (a
/// cancelled query raises its ERROR here).
pub fn wait_latch(timeout: Duration) {
    // SAFETY: standard latch wait of a backend on its own latch.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            timeout.as_millis() as i64,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}

/// Waits for a running worker and returns its PGPROC number; errors out after a while.
fn worker_procno() -> usize {
    let deadline = Instant::now() + WORKER_START_TIMEOUT;
    loop {
        let w = shmem::worker();
        if let (Some(p), WorkerState::Ready | WorkerState::StoreUnavailable) =
            (w.procno(), w.state())
        {
            return p;
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

/// Gives up a request whose backend stops waiting (an ERROR unwinds through `call`).
struct InFlight {
    slot: &'static RequestSlot,
    kind: Kind,
    armed: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            abandon(self.slot, self.kind);
        }
    }
}

fn abandon(slot: &RequestSlot, kind: Kind) {
    if slot.give_up() == GaveUp::AnswerArrived {
        if let Some(answer) = slot.answer() {
            if answer.error == 0 {
                kind.release_pins(answer.reply());
            }
        }
        slot.release();
    }
}

/// Waits until the slot is free again (a previous request was abandoned while the worker
/// worked on it: the worker makes it idle when done). The wait can be cancelled.
fn wait_until_idle(slot: &RequestSlot) {
    loop {
        match slot.give_up() {
            GaveUp::Idle => return,
            GaveUp::AnswerArrived => slot.release(),
            GaveUp::Withdrawn => return,
            GaveUp::LeftToWorker => wait_latch(Duration::from_millis(10)),
        }
    }
}

/// Sends a request and waits for its answer. Raises the ERROR the worker reports.
pub fn call(kind: Kind, args: &[i64]) -> Answer {
    call_checked(kind, args).unwrap_or_else(|(code, reply)| raise_worker_error(code, &reply))
}

/// Sends a request with a payload (at most `REPLY_BYTES`) and waits for its answer.
pub fn call_with_payload(kind: Kind, args: &[i64], payload: &[u8]) -> Answer {
    call_inner(kind, args, payload, None)
        .unwrap_or_else(|(code, reply)| raise_worker_error(code, &reply))
}

/// Sends a request and waits for its answer, or the worker's error (code and message).
pub fn call_checked(kind: Kind, args: &[i64]) -> Result<Answer, (u32, Vec<u8>)> {
    call_inner(kind, args, &[], None)
}

/// Sends a request and waits for its answer, calling `watch` every few milliseconds while it
/// waits: `watch` may raise an ERROR (the request is then given up), for example when the
/// wait can never end.
pub fn call_watching(kind: Kind, args: &[i64], watch: &mut dyn FnMut()) -> Answer {
    call_inner(kind, args, &[], Some(watch))
        .unwrap_or_else(|(code, reply)| raise_worker_error(code, &reply))
}

thread_local! {
    /// A [`prefetch`] request of this backend is (or may still be) in its slot.
    static PREFETCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks the worker to load the images `ids` (at most `REPLY_BYTES / 8`) into the image cache
/// and returns at once: a scan prefetches its next batch while it reads the current one, so
/// the worker's reading and the backend's decoding overlap. The next request of this
/// backend first waits for the prefetch to be done; its answer (even an error: the images
/// are then loaded again, and the error raised, by the request that needs them) is dropped.
pub fn prefetch(ids: &[u64]) {
    if ids.is_empty() || PREFETCHING.get() {
        return;
    }
    let (slot, procno) = my_slot();
    let submitted = slot.submit(|b: &mut RequestBody| {
        b.kind = Kind::Prefetch as u32;
        b.requester = procno;
        b.args = [0; gsnap_shmem::requests::ARGS];
        let payload: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        b.set_reply(&payload);
    });
    if submitted {
        PREFETCHING.set(true);
        set_latch_of(worker_procno());
    }
}

/// Waits for this backend's prefetch, if one is in flight, and frees the slot. A worker
/// that exits answers it with an error, so the wait ends; it can be cancelled, and after
/// a few seconds it is left to [`wait_until_idle`].
fn finish_prefetch(slot: &RequestSlot) {
    if !PREFETCHING.replace(false) {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if slot.answer().is_some() {
            slot.release();
            return;
        }
        if slot.is_idle() {
            return;
        }
        wait_latch(Duration::from_millis(100));
    }
}

fn call_inner(
    kind: Kind,
    args: &[i64],
    payload: &[u8],
    mut watch: Option<&mut dyn FnMut()>,
) -> Result<Answer, (u32, Vec<u8>)> {
    let (slot, procno) = my_slot();
    finish_prefetch(slot);
    wait_until_idle(slot);
    let worker = worker_procno();
    let submitted = slot.submit(|b: &mut RequestBody| {
        b.kind = kind as u32;
        b.requester = procno;
        b.args = [0; gsnap_shmem::requests::ARGS];
        b.args[..args.len()].copy_from_slice(args);
        b.set_reply(payload);
    });
    assert!(submitted, "the request slot was idle");
    let mut guard = InFlight {
        slot,
        kind,
        armed: true,
    };
    set_latch_of(worker);
    loop {
        if let Some(body) = slot.answer() {
            let answer = Answer {
                result: body.result,
                total: body.total,
                reply: body.reply().to_vec(),
            };
            let code = body.error;
            slot.release();
            guard.armed = false;
            if code != 0 {
                return Err((code, answer.reply));
            }
            return Ok(answer);
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

/// Collects a paged answer: the argument at `offset_arg` is the byte offset of each page.
pub fn call_paged(kind: Kind, args: &[i64], offset_arg: usize) -> Answer {
    call_paged_checked(kind, args, offset_arg)
        .unwrap_or_else(|(code, reply)| raise_worker_error(code, &reply))
}

/// [`call_paged`] returning the worker's error instead of raising it.
pub fn call_paged_checked(
    kind: Kind,
    args: &[i64],
    offset_arg: usize,
) -> Result<Answer, (u32, Vec<u8>)> {
    let mut args = args.to_vec();
    if args.len() <= offset_arg {
        args.resize(offset_arg + 1, 0);
    }
    let mut bytes = Vec::new();
    loop {
        args[offset_arg] = bytes.len() as i64;
        let a = call_checked(kind, &args)?;
        bytes.extend_from_slice(&a.reply);
        if bytes.len() as u64 >= a.total || a.reply.is_empty() {
            return Ok(Answer {
                result: a.result,
                total: a.total,
                reply: bytes,
            });
        }
    }
}

pub fn raise_worker_error(code: u32, reply: &[u8]) -> ! {
    let message = String::from_utf8_lossy(reply).into_owned();
    let (message, hint) = match message.split_once("\nHINT: ") {
        Some((m, h)) => (m.to_string(), Some(h.to_string())),
        None => (message, None),
    };
    let mut e = error(ErrorCode::from_u32(code).sqlstate(), message);
    if let Some(h) = hint {
        e = e.hint(h);
    }
    e.raise()
}

/// Cache slots pinned for this backend by an answer; unpinned when dropped (also when an
/// ERROR unwinds).
pub struct Pinned {
    pub entries: Vec<PinnedEntry>,
}

impl Pinned {
    /// Takes ownership of the pins listed in `answer`.
    pub fn from_answer(answer: &Answer) -> Pinned {
        Pinned {
            entries: protocol::decode_pinned(&answer.reply),
        }
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
        protocol::unpin_all(&self.entries);
    }
}
