//! Memory contexts: switching to one for a while, and contexts a Rust value owns.

use pgrx::pg_sys;
use pgrx::PgMemoryContexts;
use std::ffi::c_void;

/// Runs `f` with `cx` as the current memory context; the previous context is current again
/// afterwards, also when `f` raises an ERROR.
///
/// # Safety
/// `cx` is a valid memory context that outlives the call.
pub unsafe fn in_context<R>(cx: pg_sys::MemoryContext, f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::MemoryContext);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the context that was current before, still alive.
            unsafe { pg_sys::MemoryContextSwitchTo(self.0) };
        }
    }
    // SAFETY: the caller's promise.
    let _restore = Restore(unsafe { pg_sys::MemoryContextSwitchTo(cx) });
    f()
}

/// Calls `func(arg)` when `cx` is next reset or deleted (PostgreSQL's memory context reset
/// callbacks: they run last-registered first).
///
/// # Safety
/// `cx` is a valid memory context, and `arg` stays valid for `func` until the callback runs.
pub unsafe fn on_reset(
    cx: pg_sys::MemoryContext,
    func: unsafe extern "C-unwind" fn(*mut c_void),
    arg: *mut c_void,
) {
    let size = std::mem::size_of::<pg_sys::MemoryContextCallback>();
    // SAFETY: the record lives in `cx` itself, so exactly as long as the registration.
    let callback =
        unsafe { pg_sys::MemoryContextAlloc(cx, size) }.cast::<pg_sys::MemoryContextCallback>();
    // SAFETY: filling the record allocated above and handing it to its context.
    unsafe {
        callback.write(pg_sys::MemoryContextCallback {
            func: Some(func),
            arg,
            next: std::ptr::null_mut(),
        });
        pg_sys::MemoryContextRegisterResetCallback(cx, callback);
    }
}

/// A memory context owned by a Rust value and deleted with it. It is made under
/// TopMemoryContext, not under the query's context: a scan may be dropped by a reset
/// callback of the query's context, which runs after PostgreSQL deleted that context's
/// children.
pub struct OwnedContext(PgMemoryContexts);

impl OwnedContext {
    /// A new context named `name`.
    pub fn new(name: &str) -> OwnedContext {
        // SAFETY: creating a child of TopMemoryContext, which lives for the process.
        OwnedContext(unsafe {
            PgMemoryContexts::TopMemoryContext.switch_to(|_| PgMemoryContexts::new(name))
        })
    }

    /// Frees everything allocated in the context.
    ///
    /// # Safety
    /// Nothing allocated in the context is used afterwards.
    pub unsafe fn reset(&self) {
        // SAFETY: the caller's promise.
        unsafe { pg_sys::MemoryContextReset(self.0.value()) };
    }

    /// Runs `f` with this context current.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: the context lives as long as `self`.
        unsafe { in_context(self.0.value(), f) }
    }
}
