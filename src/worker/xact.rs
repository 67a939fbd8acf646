//! The worker's transaction, subtransactions and session locks.
//!
//! A declared snapshot's MVCC snapshot must stay registered until its capture has read its
//! last page (docs/design.md, third ordering), and PostgreSQL ties registered snapshots to a
//! transaction.
//! So the worker keeps one transaction open while it holds any snapshot and commits it
//! when it holds none. Its snapshots are registered on the top transaction's resource owner;
//! each unit of work (one declaration, one batch of pages) runs in a subtransaction, so an
//! ERROR fails that unit only, not every snapshot held.
//!
//! Tables are locked with *session* locks (ACCESS SHARE), taken at declaration and released
//! when the snapshot's capture ends, independently of transactions: TRUNCATE, VACUUM FULL,
//! CLUSTER, rewriting ALTER TABLE and DROP TABLE wait for them, so no storage a declared
//! snapshot needs can disappear, while ordinary reads and writes never conflict.

use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;

/// The worker's top-level transaction.
#[derive(Default)]
pub struct Xact {
    open: bool,
}

impl Xact {
    /// Starts the transaction if none is open.
    pub fn ensure_open(&mut self) {
        if !self.open {
            // SAFETY: the worker's main loop runs outside any transaction when `open` is
            // false, and these calls are PostgreSQL's way to start one in a background worker.
            unsafe {
                pg_sys::SetCurrentStatementStartTimestamp();
                pg_sys::StartTransactionCommand();
            }
            self.open = true;
        }
    }

    /// True while the transaction is open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Commits the transaction (the caller holds no snapshot any more).
    pub fn close(&mut self) {
        if self.open {
            // SAFETY: started by ensure_open; no subtransaction is open between units.
            unsafe { pg_sys::CommitTransactionCommand() };
            self.open = false;
        }
    }
}

/// Runs `f` in a subtransaction of the open transaction. A PostgreSQL ERROR (or a Rust
/// panic) inside `f` rolls the subtransaction back and comes back as `Err(message)`.
pub fn in_subtransaction<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    // SAFETY: this process's current memory context and resource owner.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    // SAFETY: the worker calls this with its transaction open and no subtransaction open; the
    // caller's memory context stays current inside, as PL/pgSQL does for its blocks.
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let f = std::panic::AssertUnwindSafe(f);
    let outcome = PgTryBuilder::new(move || {
        let f = f;
        Ok((f.0)())
    })
    .catch_others(|e| Err(describe(e)))
    .execute();
    // SAFETY: ends the subtransaction begun above (committed, or rolled back after an ERROR)
    // and restores the memory context and resource owner current before it.
    unsafe {
        if outcome.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    outcome
}

fn describe(e: CaughtError) -> String {
    match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r.message().to_string(),
        CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
    }
}

/// Takes an ACCESS SHARE session lock on a table without waiting; false if another
/// transaction holds a conflicting lock (a TRUNCATE, VACUUM FULL, ... in progress).
pub fn try_lock_table(relid: u32) -> bool {
    let tag = crate::locks::relation_locktag(relid);
    // SAFETY: a session-level lock request on a relation of the worker's database.
    let r = unsafe { pg_sys::LockAcquire(&tag, pg_sys::AccessShareLock as i32, true, true) };
    r != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Releases one session lock taken by [`try_lock_table`].
pub fn unlock_table(relid: u32) {
    let tag = crate::locks::relation_locktag(relid);
    // SAFETY: releases a session lock this process holds.
    unsafe {
        pg_sys::LockRelease(&tag, pg_sys::AccessShareLock as i32, true);
    }
}

/// A declared snapshot's MVCC snapshot, registered on the worker's top transaction (its xmin
/// holds back pruning and VACUUM of what it sees) until [`RegisteredSnapshot::release`]. The
/// worker keeps its transaction open while it holds any (see [`Xact`]).
pub struct RegisteredSnapshot(pg_sys::Snapshot);

impl RegisteredSnapshot {
    /// Takes the latest MVCC snapshot and registers it.
    ///
    /// # Safety
    /// Inside the worker's top transaction, which stays open until the snapshot is released.
    pub unsafe fn take_latest() -> RegisteredSnapshot {
        // SAFETY: the caller's promise.
        RegisteredSnapshot(unsafe {
            pg_sys::RegisterSnapshotOnOwner(
                pg_sys::GetLatestSnapshot(),
                pg_sys::TopTransactionResourceOwner,
            )
        })
    }

    /// The snapshot, for PostgreSQL calls (valid until released).
    pub fn as_ptr(&self) -> pg_sys::Snapshot {
        self.0
    }

    /// The transactions the snapshot saw running, to decide visibility on copied pages after
    /// it is released (`gsnap_format::visibility`); None if they are not all listed (its
    /// subtransaction array overflowed) or it was taken during recovery.
    ///
    /// The flags are read before the arrays: a registered snapshot is a copy
    /// (`CopySnapshot`), which keeps `subxcnt` but leaves `subxip` NULL when the array
    /// overflowed, so an overflowed snapshot that had listed some subtransactions before it
    /// met the overflow has a count and no array.
    pub fn xids(&self) -> Option<gsnap_format::visibility::SnapshotXids> {
        // SAFETY: the registered snapshot, valid until released; each of its arrays holds
        // its count of ids where it is not NULL (checked below).
        unsafe {
            let s = &*self.0;
            if s.suboverflowed || s.takenDuringRecovery {
                return None;
            }
            let ids = |p: *mut pg_sys::TransactionId, n: i32| -> Option<Vec<u32>> {
                match usize::try_from(n).unwrap_or(0) {
                    0 => Some(Vec::new()),
                    _ if p.is_null() => None,
                    n => Some(
                        std::slice::from_raw_parts(p, n)
                            .iter()
                            .map(|x| x.into_inner())
                            .collect(),
                    ),
                }
            };
            gsnap_format::visibility::SnapshotXids::from_parts(
                s.xmin.into_inner(),
                s.xmax.into_inner(),
                &ids(s.xip, s.xcnt as i32)?,
                &ids(s.subxip, s.subxcnt)?,
                s.suboverflowed,
                s.takenDuringRecovery,
            )
        }
    }

    /// Unregisters the snapshot.
    pub fn release(self) {
        // SAFETY: registered on the top transaction's owner by `take_latest`, in the
        // transaction that is still open, and released once (this consumes it).
        unsafe { pg_sys::UnregisterSnapshotFromOwner(self.0, pg_sys::TopTransactionResourceOwner) };
    }
}

/// A bulk-read buffer access strategy (a small ring of buffers, so a capture does not evict
/// the backends' working set), freed when dropped.
pub struct BulkRead(pg_sys::BufferAccessStrategy);

impl BulkRead {
    /// A new strategy, allocated in TopMemoryContext so it outlives the subtransactions of a
    /// capture.
    pub fn new() -> BulkRead {
        // SAFETY: an allocation in TopMemoryContext, which lives for the process.
        BulkRead(unsafe {
            crate::ffi::memcx::in_context(pg_sys::TopMemoryContext, || {
                pg_sys::GetAccessStrategy(pg_sys::BufferAccessStrategyType::BAS_BULKREAD)
            })
        })
    }

    /// The strategy, for PostgreSQL calls.
    pub fn as_ptr(&self) -> pg_sys::BufferAccessStrategy {
        self.0
    }
}

impl Drop for BulkRead {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once.
        unsafe { pg_sys::FreeAccessStrategy(self.0) };
    }
}
