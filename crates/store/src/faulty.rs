//! A fault-injecting [`KvBackend`] wrapper for crash and error tests.
//!
//! It forwards everything to an inner backend, counts write batches, and can
//! - fail the Nth write with an I/O error or a "no space" error (the batch is not applied,
//!   later writes succeed again, like a disk that had a transient error or was freed);
//! - simulate a crash at the Nth write: that write and every later one fail and apply
//!   nothing, as if the process had died just before it.
//!
//! Alongside, it keeps the *disk* as a crash would leave it: the contents as of the last synced
//! batch plus the list of unsynced batches since. [`FaultyBackend::disk_after_crash`] returns
//! that disk with the first `k` unsynced batches replayed (k = 0: everything not synced is
//! lost), which is exactly the set of outcomes the [`KvBackend`] contract allows.

use std::sync::{Mutex, MutexGuard};

use crate::backend::{KvBackend, KvCursor, WriteBatch};
use crate::error::{ErrorKind, Result, StoreError};
use crate::keys::Cf;
use crate::mem::MemBackend;

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write fails with an I/O error ([`ErrorKind::Io`]); later writes work.
    Io,
    /// The write fails with "No space left on device" ([`ErrorKind::NoSpace`]); later writes
    /// work.
    NoSpace,
    /// The process "dies" before this write: it and all later writes fail.
    Crash,
}

struct FaultState {
    attempts: u64,
    armed: Option<(u64, Fault)>,
    crashed: bool,
    durable: MemBackend,
    unsynced: Vec<WriteBatch>,
}

/// A backend wrapper that injects write failures and simulates crashes.
pub struct FaultyBackend<B: KvBackend = MemBackend> {
    inner: B,
    state: Mutex<FaultState>,
}

impl<B: KvBackend> FaultyBackend<B> {
    /// Wraps `inner`; its current contents are taken as durable.
    pub fn new(inner: B) -> Result<Self> {
        let durable = MemBackend::copy_of(&inner)?;
        let state = FaultState {
            attempts: 0,
            armed: None,
            crashed: false,
            durable,
            unsynced: vec![],
        };
        Ok(FaultyBackend {
            inner,
            state: Mutex::new(state),
        })
    }

    /// Makes write number `n` (0-based, counting every `write` call since creation, see
    /// [`FaultyBackend::writes_attempted`]) fail with `fault`. Replaces any earlier arming.
    pub fn fail_write(&self, n: u64, fault: Fault) {
        self.lock().armed = Some((n, fault));
    }

    /// How many `write` calls were made so far (failed ones included).
    pub fn writes_attempted(&self) -> u64 {
        self.lock().attempts
    }

    /// True once a [`Fault::Crash`] has fired.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Number of batches written since the last synced one.
    pub fn unsynced_batches(&self) -> usize {
        self.lock().unsynced.len()
    }

    /// The disk a crash right now would leave: everything up to the last synced batch, plus
    /// the first `keep_unsynced` batches written after it (clamped to how many there are).
    pub fn disk_after_crash(&self, keep_unsynced: usize) -> MemBackend {
        let state = self.lock();
        let disk = state.durable.deep_copy();
        for batch in state.unsynced.iter().take(keep_unsynced) {
            disk.apply(batch);
        }
        disk
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: KvBackend> KvBackend for FaultyBackend<B> {
    fn describe(&self) -> String {
        format!("fault-injecting wrapper of {}", self.inner.describe())
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(cf, key)
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.inner.multi_get(cf, keys)
    }

    fn value_sizes(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<usize>>> {
        self.inner.value_sizes(cf, keys)
    }

    fn cursor(&self, cf: Cf) -> Result<Box<dyn KvCursor + '_>> {
        self.inner.cursor(cf)
    }

    fn last_in_range(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.inner.last_in_range(cf, start, end)
    }

    fn compact_range(&self, cf: Cf, start: &[u8], end: &[u8]) -> Result<()> {
        self.inner.compact_range(cf, start, end)
    }

    fn disk_bytes(&self) -> Result<u64> {
        self.inner.disk_bytes()
    }

    fn copy_to(&self, dir: &std::path::Path) -> Result<()> {
        self.inner.copy_to(dir)
    }

    fn estimate(&self, cf: Cf) -> Result<crate::backend::CfEstimate> {
        self.inner.estimate(cf)
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()> {
        // The state lock is held across the inner write so that the disk model sees batches
        // in the same order as the inner backend.
        let mut state = self.lock();
        let n = state.attempts;
        state.attempts += 1;
        if state.crashed {
            return Err(StoreError::new(
                ErrorKind::Io,
                "simulated crash: the store is gone",
            ));
        }
        if let Some((at, fault)) = state.armed {
            if at == n {
                state.armed = None;
                match fault {
                    Fault::Io => {
                        return Err(StoreError::new(
                            ErrorKind::Io,
                            format!("IO error: injected failure of write {n}"),
                        ))
                    }
                    Fault::NoSpace => {
                        return Err(StoreError::new(
                            ErrorKind::NoSpace,
                            format!("IO error: No space left on device (injected at write {n})"),
                        ))
                    }
                    Fault::Crash => {
                        state.crashed = true;
                        return Err(StoreError::new(
                            ErrorKind::Io,
                            format!("simulated crash before write {n}"),
                        ));
                    }
                }
            }
        }
        self.inner.write(batch, sync)?;
        if sync {
            let pending = std::mem::take(&mut state.unsynced);
            for b in &pending {
                state.durable.apply(b);
            }
            state.durable.apply(batch);
        } else {
            state.unsynced.push(batch.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(Cf::Meta, key, b"v");
        b
    }

    #[test]
    fn crash_loses_exactly_the_unsynced_suffix() {
        let f = FaultyBackend::new(MemBackend::new()).unwrap();
        f.write(&put(b"a"), false).unwrap();
        f.write(&put(b"b"), true).unwrap();
        f.write(&put(b"c"), false).unwrap();
        f.write(&put(b"d"), false).unwrap();
        assert_eq!(f.unsynced_batches(), 2);
        let keys = |m: &MemBackend| {
            m.entries(Cf::Meta)
                .into_iter()
                .map(|e| e.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(&f.disk_after_crash(0)),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(keys(&f.disk_after_crash(1)).len(), 3);
        assert_eq!(keys(&f.disk_after_crash(9)).len(), 4);
    }

    #[test]
    fn injected_faults_fail_without_applying() {
        let f = FaultyBackend::new(MemBackend::new()).unwrap();
        f.fail_write(1, Fault::NoSpace);
        f.write(&put(b"a"), false).unwrap();
        let e = f.write(&put(b"b"), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(f.get(Cf::Meta, b"b").unwrap(), None);
        f.write(&put(b"c"), false).unwrap();
        f.fail_write(3, Fault::Crash);
        assert!(f.write(&put(b"d"), true).is_err());
        assert!(f.write(&put(b"e"), true).is_err());
        assert!(f.crashed());
        assert_eq!(f.get(Cf::Meta, b"d").unwrap(), None);
        assert_eq!(f.writes_attempted(), 5);
    }
}
