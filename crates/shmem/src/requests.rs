//! Request slots: how a backend asks the gsnap worker for something and gets the answer.
//!
//! Each backend has its own slot in shared memory (indexed by its PGPROC number), so backends
//! never contend with each other; the worker visits the submitted slots. The slot's `state`
//! says who owns its body:
//!
//! ```text
//!   IDLE ──submit──▶ SUBMITTED ──take──▶ WORKING ──finish──▶ DONE ──release──▶ IDLE
//!    ▲  (backend writes   │ (worker reads and replies)  │             (backend reads)
//!    │   the request)     │                              │
//!    └──── withdraw ──────┘            abandon ──▶ ABANDONED ──finish──▶ IDLE
//! ```
//!
//! A backend that stops waiting (query cancel, error) withdraws a request the worker has not
//! taken, or abandons one it is working on: the worker then cleans up (for example, releases
//! cache pins it took for the backend) instead of delivering. Every transition is a
//! compare-and-swap, so exactly one side owns the body at any time; the body is only touched
//! by its owner, through the guards below.
//!
//! The body is the request's kind tag and one buffer of [`REPLY_BYTES`]: the backend writes
//! the request bytes, the worker replaces them with the answer bytes. What the bytes mean is
//! not this module's business (the extension encodes them with `gsnap_protocol`); the kind
//! stays next to the answer so that whoever cleans up an abandoned answer can decode it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering::AcqRel, Ordering::Acquire, Ordering::Release};

/// Bytes of the one message a slot carries: the request, then its answer (listings larger
/// than that are paged by offset). Equal to `gsnap_protocol::MAX_MESSAGE_BYTES`, which the
/// extension checks at compile time.
pub const REPLY_BYTES: usize = 8192;

const IDLE: u32 = 0;
const SUBMITTED: u32 = 1;
const WORKING: u32 = 2;
const DONE: u32 = 3;
const ABANDONED: u32 = 4;

/// The request and its answer: the request's kind and the one buffer that holds its bytes
/// until the worker replaces them with the answer's. The bytes are opaque here (the
/// extension encodes them with `gsnap_protocol`).
#[repr(C)]
#[derive(Clone)]
pub struct RequestBody {
    /// What is asked: the request kind's tag. It stays when the answer replaces the request
    /// bytes, so whoever cleans up an abandoned answer knows what it answers.
    pub kind: u32,
    /// PGPROC number of the asking backend (whose latch the worker sets when done).
    pub requester: i32,
    /// Bytes of `message` used.
    len: u32,
    /// The request bytes, then the answer bytes.
    message: [u8; REPLY_BYTES],
}

impl RequestBody {
    /// The used part of the buffer: the request, or, once answered, the answer.
    pub fn message(&self) -> &[u8] {
        &self.message[..(self.len as usize).min(REPLY_BYTES)]
    }

    /// Replaces the buffer's contents with `bytes`.
    ///
    /// # Panics
    /// If `bytes` is longer than [`REPLY_BYTES`] (the protocol never encodes more).
    pub fn set_message(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() <= REPLY_BYTES,
            "a message of {} bytes does not fit a request slot",
            bytes.len()
        );
        self.message[..bytes.len()].copy_from_slice(bytes);
        self.len = bytes.len() as u32;
    }
}

/// One backend's request slot.
#[repr(C)]
pub struct RequestSlot {
    state: AtomicU32,
    body: UnsafeCell<RequestBody>,
}

// SAFETY: the body is accessed only by the side that owns it according to `state`, and
// ownership moves with acquire/release compare-and-swap (see the module comment).
unsafe impl Sync for RequestSlot {}

/// What happened to a request the worker finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The backend will read the answer.
    Delivered,
    /// The backend gave up: the worker must undo side effects (the body still holds them).
    Abandoned,
}

/// Where a request stood when its backend gave up on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// Nothing was pending: the slot is idle.
    Idle,
    /// The worker had not taken it: withdrawn, the slot is idle again.
    Withdrawn,
    /// The worker is working on it (or still cleaning up a request given up earlier) and
    /// makes the slot idle when done.
    LeftToWorker,
    /// The answer had arrived: the backend must undo side effects itself, then release.
    AnswerArrived,
}

impl Default for RequestSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestSlot {
    /// An idle slot.
    pub fn new() -> Self {
        RequestSlot {
            state: AtomicU32::new(IDLE),
            body: UnsafeCell::new(RequestBody {
                kind: 0,
                requester: -1,
                len: 0,
                message: [0; REPLY_BYTES],
            }),
        }
    }

    /// Backend: if the slot is idle, lets `fill` write a request and submits it.
    pub fn submit(&self, fill: impl FnOnce(&mut RequestBody)) -> bool {
        if self.state.load(Acquire) != IDLE {
            return false;
        }
        // SAFETY: IDLE means the backend (the only writer of its own slot in this state)
        // owns the body; the worker touches it only after seeing SUBMITTED.
        let body = unsafe { &mut *self.body.get() };
        body.len = 0;
        fill(body);
        self.state.store(SUBMITTED, Release);
        true
    }

    /// True if no request is in the slot (the backend may submit).
    pub fn is_idle(&self) -> bool {
        self.state.load(Acquire) == IDLE
    }

    /// True if a request waits for the worker.
    pub fn is_submitted(&self) -> bool {
        self.state.load(Acquire) == SUBMITTED
    }

    /// Worker: takes a submitted request and lets `work` answer it. Returns `None` if there
    /// was nothing to take, otherwise what became of the answer. When the answer was
    /// abandoned, `cleanup` runs on the body before the slot is made idle.
    pub fn serve(
        &self,
        work: impl FnOnce(&mut RequestBody),
        cleanup: impl FnOnce(&RequestBody),
    ) -> Option<Finished> {
        let body = self.take()?;
        work(body);
        Some(self.finish(cleanup))
    }

    /// Worker: takes a submitted request for answering later (the worker may keep several
    /// requests in progress, e.g. waiting for a capture to become durable).
    // The state machine, not the borrow, makes the worker the body's only user.
    #[allow(clippy::mut_from_ref)]
    pub fn take(&self) -> Option<&mut RequestBody> {
        self.state
            .compare_exchange(SUBMITTED, WORKING, AcqRel, Acquire)
            .ok()?;
        // SAFETY: the successful swap to WORKING made the worker the body's owner.
        Some(unsafe { &mut *self.body.get() })
    }

    /// Worker: gives access to a request it took with [`RequestSlot::take`] and has not
    /// finished yet.
    ///
    /// # Safety
    /// The caller must be the worker holding this request (state WORKING or ABANDONED).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn taken_body(&self) -> &mut RequestBody {
        debug_assert!(matches!(self.state.load(Acquire), WORKING | ABANDONED));
        // SAFETY: per the contract, the worker owns the body.
        unsafe { &mut *self.body.get() }
    }

    /// Worker: finishes a request it took. If the backend abandoned it meanwhile, `cleanup`
    /// runs on the body and the slot becomes idle.
    pub fn finish(&self, cleanup: impl FnOnce(&RequestBody)) -> Finished {
        match self.state.compare_exchange(WORKING, DONE, AcqRel, Acquire) {
            Ok(_) => Finished::Delivered,
            Err(s) => {
                assert_eq!(s, ABANDONED, "finished a request that was not taken");
                // SAFETY: ABANDONED leaves ownership with the worker until it sets IDLE.
                cleanup(unsafe { &*self.body.get() });
                self.state.store(IDLE, Release);
                Finished::Abandoned
            }
        }
    }

    /// Worker: true if the backend gave up on the request the worker holds.
    pub fn abandoned(&self) -> bool {
        self.state.load(Acquire) == ABANDONED
    }

    /// Backend: the answer, once the worker delivered it.
    pub fn answer(&self) -> Option<&RequestBody> {
        if self.state.load(Acquire) == DONE {
            // SAFETY: DONE gives the body back to the backend.
            Some(unsafe { &*self.body.get() })
        } else {
            None
        }
    }

    /// Backend: done with the answer; the slot is idle again.
    pub fn release(&self) {
        let r = self.state.compare_exchange(DONE, IDLE, AcqRel, Acquire);
        assert!(r.is_ok(), "released a request slot that held no answer");
    }

    /// Backend: stops waiting for its request (see [`GaveUp`]).
    pub fn give_up(&self) -> GaveUp {
        loop {
            match self.state.load(Acquire) {
                IDLE => return GaveUp::Idle,
                ABANDONED => return GaveUp::LeftToWorker,
                DONE => return GaveUp::AnswerArrived,
                SUBMITTED => {
                    if self
                        .state
                        .compare_exchange(SUBMITTED, IDLE, AcqRel, Acquire)
                        .is_ok()
                    {
                        return GaveUp::Withdrawn;
                    }
                }
                WORKING => {
                    if self
                        .state
                        .compare_exchange(WORKING, ABANDONED, AcqRel, Acquire)
                        .is_ok()
                    {
                        return GaveUp::LeftToWorker;
                    }
                }
                s => panic!("request slot in unknown state {s}"),
            }
        }
    }

    /// Worker, at start: answers a request a previous worker took but never finished with
    /// `answer` (the encoded error saying so), or frees an abandoned one. Returns whether it
    /// answered one.
    pub fn recover_after_worker_exit(&self, answer: &[u8]) -> bool {
        match self.state.load(Acquire) {
            WORKING => {
                // SAFETY: the previous worker, the owner, is gone; we take its place.
                let body = unsafe { &mut *self.body.get() };
                body.set_message(answer);
                self.state.store(DONE, Release);
                true
            }
            ABANDONED => {
                self.state.store(IDLE, Release);
                false
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn number(b: &RequestBody) -> i64 {
        i64::from_le_bytes(b.message().try_into().expect("an 8-byte message"))
    }

    #[test]
    fn request_answer_release() {
        let slot = RequestSlot::new();
        assert!(slot.answer().is_none());
        assert!(slot.submit(|b| {
            b.kind = 7;
            b.set_message(b"ask");
        }));
        assert!(!slot.submit(|_| {}), "one request at a time");
        let f = slot.serve(
            |b| {
                assert_eq!((b.kind, b.message()), (7, &b"ask"[..]));
                b.set_message(b"hello");
            },
            |_| panic!("not abandoned"),
        );
        assert_eq!(f, Some(Finished::Delivered));
        let a = slot.answer().unwrap();
        assert_eq!((a.kind, a.message()), (7, &b"hello"[..]), "the kind stays");
        slot.release();
        assert!(slot.submit(|b| b.kind = 1));
        // the new request starts with an empty message
        slot.serve(|b| assert!(b.message().is_empty()), |_| {});
    }

    #[test]
    fn the_largest_message_fits_and_a_larger_one_is_refused() {
        let mut body = RequestSlot::new().body.into_inner();
        body.set_message(&[1; REPLY_BYTES]);
        assert_eq!(body.message().len(), REPLY_BYTES);
        let larger = std::panic::catch_unwind(move || body.set_message(&[1; REPLY_BYTES + 1]));
        assert!(larger.is_err());
    }

    #[test]
    fn giving_up_in_every_state() {
        let slot = RequestSlot::new();
        assert_eq!(slot.give_up(), GaveUp::Idle);

        slot.submit(|_| {});
        assert_eq!(slot.give_up(), GaveUp::Withdrawn);
        assert!(slot.take().is_none(), "a withdrawn request is not served");

        slot.submit(|b| b.kind = 5);
        let body = slot.take().unwrap();
        body.set_message(b"pins");
        assert_eq!(slot.give_up(), GaveUp::LeftToWorker);
        assert!(slot.abandoned());
        assert_eq!(
            slot.give_up(),
            GaveUp::LeftToWorker,
            "an abandoned request is not idle until the worker finishes it"
        );
        assert!(!slot.submit(|_| {}), "no new request over an abandoned one");
        let mut cleaned = None;
        assert_eq!(
            slot.finish(|b| cleaned = Some((b.kind, b.message().to_vec()))),
            Finished::Abandoned
        );
        assert_eq!(cleaned, Some((5, b"pins".to_vec())));
        assert!(
            slot.submit(|_| {}),
            "idle again after the worker cleaned up"
        );

        slot.serve(|_| {}, |_| {});
        assert_eq!(slot.give_up(), GaveUp::AnswerArrived);
        slot.release();
    }

    #[test]
    fn a_new_worker_answers_what_the_old_one_dropped() {
        let slot = RequestSlot::new();
        slot.submit(|b| {
            b.kind = 3;
            b.set_message(b"request");
        });
        slot.take().unwrap();
        assert!(slot.recover_after_worker_exit(b"worker restarted"));
        let a = slot.answer().unwrap();
        assert_eq!((a.kind, a.message()), (3, &b"worker restarted"[..]));
        slot.release();

        // An abandoned request is freed, not answered; an idle slot is left alone.
        slot.submit(|_| {});
        slot.take().unwrap();
        assert_eq!(slot.give_up(), GaveUp::LeftToWorker);
        assert!(!slot.recover_after_worker_exit(b"worker restarted"));
        assert!(slot.is_idle());
        assert!(!slot.recover_after_worker_exit(b"worker restarted"));
        assert!(slot.is_idle());
    }

    /// A backend thread and a worker thread exchange many requests, with the backend
    /// sometimes giving up: every delivered answer matches its request, every abandoned one
    /// is cleaned exactly once.
    #[test]
    fn concurrent_exchange() {
        let slot = Arc::new(RequestSlot::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let slot = Arc::clone(&slot);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut cleaned = 0;
                while !stop.load(Acquire) {
                    slot.serve(
                        |b| {
                            let doubled = number(b) * 2;
                            b.set_message(&doubled.to_le_bytes());
                        },
                        |_| cleaned += 1,
                    );
                }
                cleaned
            })
        };
        let (mut delivered, mut gave_up_working) = (0, 0);
        for i in 0..20_000i64 {
            while !slot.submit(|b| b.set_message(&i.to_le_bytes())) {
                std::hint::spin_loop();
            }
            if i % 7 == 0 {
                match slot.give_up() {
                    GaveUp::LeftToWorker => gave_up_working += 1,
                    GaveUp::AnswerArrived => slot.release(),
                    _ => {}
                }
                continue;
            }
            loop {
                if let Some(a) = slot.answer() {
                    assert_eq!(number(a), i * 2);
                    slot.release();
                    delivered += 1;
                    break;
                }
            }
        }
        // Wait until the worker has cleaned the last abandoned request, if any.
        while slot.abandoned() {
            std::hint::spin_loop();
        }
        stop.store(true, Release);
        let cleaned = worker.join().unwrap();
        assert_eq!(cleaned, gave_up_working);
        assert!(delivered > 15_000);
    }
}
