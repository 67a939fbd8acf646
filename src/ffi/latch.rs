//! Waiting on this process's latch, as backends and the worker do.

use pgrx::pg_sys;
use std::time::Duration;

/// True if this process's latch is set (a request or a signal came since it was last reset).
pub fn is_set() -> bool {
    // SAFETY: MyLatch is this process's own latch; `is_set` is a sig_atomic_t that setters
    // write, read without a lock as WaitLatch does.
    unsafe { (&raw const (*pg_sys::MyLatch).is_set).read_volatile() != 0 }
}

/// Sleeps on this process's latch for at most `timeout` (or until it is set), then handles
/// pending interrupts: a cancelled query raises its ERROR here, and the worker absorbs
/// procsignal barriers (DROP DATABASE and ALTER DATABASE SET TABLESPACE wait for every
/// process to absorb one). Exits if the postmaster dies.
pub fn wait(timeout: Duration) {
    // SAFETY: the standard latch wait of a process on its own latch.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            timeout.as_millis().min(i64::MAX as u128) as i64,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
