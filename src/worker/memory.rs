//! The worker's heap between captures. Phase one allocates the views it keeps (up to
//! `gsnap.capture_memory`) and phase two frees them; glibc would give that memory back to the
//! kernel after every capture, and the next capture would fault in and zero every page of it
//! again, while it holds back VACUUM. So while snapshots come the worker keeps freed memory
//! up to `gsnap.capture_memory` (glibc's trim threshold), and once it has been idle for a
//! while it gives it back (`malloc_trim`).

use std::ffi::c_int;
use std::time::{Duration, Instant};

extern "C" {
    fn mallopt(param: c_int, value: c_int) -> c_int;
    fn malloc_trim(pad: usize) -> c_int;
}

/// glibc's `M_TRIM_THRESHOLD`.
const M_TRIM_THRESHOLD: c_int = -1;
/// Idle this long, the worker gives its free memory back.
const IDLE: Duration = Duration::from_secs(30);

/// When the worker last captured, and whether it gave its memory back since.
pub(super) struct Heap {
    busy_at: Instant,
    trimmed: bool,
}

impl Heap {
    /// Keeps up to `gsnap.capture_memory` of freed memory (called at start and on reload).
    pub fn new() -> Heap {
        Self::configure();
        Heap {
            busy_at: Instant::now(),
            trimmed: true,
        }
    }

    /// Sets the trim threshold from `gsnap.capture_memory` (at least glibc's default).
    pub fn configure() {
        let keep = crate::gucs::capture_memory_bytes().clamp(128 * 1024, i32::MAX as usize);
        // SAFETY: mallopt only changes a setting of the allocator.
        unsafe { mallopt(M_TRIM_THRESHOLD, keep as c_int) };
    }

    /// Called once per loop iteration: `capturing` while a capture runs or waits.
    pub fn tick(&mut self, capturing: bool) {
        if capturing {
            self.busy_at = Instant::now();
            self.trimmed = false;
        } else if !self.trimmed && self.busy_at.elapsed() >= IDLE {
            // SAFETY: returns free memory at the top of each heap to the kernel.
            unsafe { malloc_trim(0) };
            self.trimmed = true;
        }
    }
}
