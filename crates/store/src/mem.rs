//! An in-memory [`KvBackend`]: one `BTreeMap` per column family behind a lock.
//!
//! For tests, here and in other crates (`SnapshotStore::open_in_memory`). Every write is
//! "durable" at once; a batch is applied under the write lock, so readers see all of it or
//! none of it. Clones of a `MemBackend` share the same data (like two handles on one
//! directory); [`MemBackend::deep_copy`] makes an independent copy.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backend::{BatchOp, KvBackend, KvCursor, WriteBatch};
use crate::error::Result;
use crate::keys::Cf;

type Table = BTreeMap<Vec<u8>, Vec<u8>>;

/// An in-memory key-value store. Cloning shares the data.
#[derive(Debug, Clone, Default)]
pub struct MemBackend {
    tables: Arc<RwLock<BTreeMap<Cf, Table>>>,
}

/// How many entries a cursor copies out of the map per refill.
const CURSOR_CHUNK: usize = 64;

impl MemBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An independent copy of the current contents.
    pub fn deep_copy(&self) -> Self {
        MemBackend {
            tables: Arc::new(RwLock::new(self.read().clone())),
        }
    }

    /// Copies every entry of every column family of `source` (used to start a crash
    /// simulation from an existing store).
    pub fn copy_of(source: &dyn KvBackend) -> Result<Self> {
        let mem = MemBackend::new();
        let mut batch = WriteBatch::new();
        for cf in Cf::all() {
            for entry in crate::backend::Scan::range(source, cf, &[], None)? {
                let (k, v) = entry?;
                batch.put(cf, &k, &v);
            }
        }
        mem.write(&batch, true)?;
        Ok(mem)
    }

    /// Applies a batch (shared by the trait's `write` and the fault-injecting backend).
    pub(crate) fn apply(&self, batch: &WriteBatch) {
        let mut tables = self.write_lock();
        for op in batch.ops() {
            match op {
                BatchOp::Put { cf, key, value } => {
                    tables
                        .entry(cf)
                        .or_default()
                        .insert(key.to_vec(), value.to_vec());
                }
                BatchOp::Delete { cf, key } => {
                    if let Some(t) = tables.get_mut(&cf) {
                        t.remove(key);
                    }
                }
                BatchOp::DeleteRange { cf, start, end } => {
                    if let Some(t) = tables.get_mut(&cf) {
                        t.retain(|k, _| k.as_slice() < start || k.as_slice() >= end);
                    }
                }
            }
        }
    }

    /// All entries of `cf`, in key order (for tests and debugging).
    pub fn entries(&self, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.read()
            .get(&cf)
            .map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<Cf, Table>> {
        // A panic while holding the lock cannot leave a half-applied batch visible to a
        // correct test (the panic fails the test), so poisoning is ignored.
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, BTreeMap<Cf, Table>> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk(&self, cf: Cf, from: Bound<&[u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let tables = self.read();
        let Some(t) = tables.get(&cf) else {
            return Vec::new();
        };
        t.range::<[u8], _>((from, Bound::Unbounded))
            .take(CURSOR_CHUNK)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl KvBackend for MemBackend {
    fn describe(&self) -> String {
        "in-memory gsnap store".to_string()
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.read().get(&cf).and_then(|t| t.get(key).cloned()))
    }

    fn cursor(&self, cf: Cf) -> Result<Box<dyn KvCursor + '_>> {
        Ok(Box::new(MemCursor {
            mem: self,
            cf,
            buf: Vec::new(),
            pos: 0,
        }))
    }

    fn last_in_range(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if start >= end {
            return Ok(None);
        }
        let tables = self.read();
        let Some(t) = tables.get(&cf) else {
            return Ok(None);
        };
        Ok(
            t.range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
                .next_back()
                .map(|(k, v)| (k.clone(), v.clone())),
        )
    }

    fn disk_bytes(&self) -> Result<u64> {
        Ok(self
            .read()
            .values()
            .flat_map(|t| t.iter())
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum())
    }

    fn write(&self, batch: &WriteBatch, _sync: bool) -> Result<()> {
        self.apply(batch);
        Ok(())
    }
}

/// A cursor that copies entries out of the map a chunk at a time, so it holds no lock
/// between calls.
struct MemCursor<'a> {
    mem: &'a MemBackend,
    cf: Cf,
    buf: Vec<(Vec<u8>, Vec<u8>)>,
    pos: usize,
}

impl KvCursor for MemCursor<'_> {
    fn seek(&mut self, key: &[u8]) -> Result<()> {
        self.buf = self.mem.chunk(self.cf, Bound::Included(key));
        self.pos = 0;
        Ok(())
    }

    fn next(&mut self) -> Result<()> {
        if self.pos >= self.buf.len() {
            return Ok(());
        }
        self.pos += 1;
        if self.pos == self.buf.len() && self.buf.len() == CURSOR_CHUNK {
            let last = self.buf[self.pos - 1].0.clone();
            self.buf = self.mem.chunk(self.cf, Bound::Excluded(&last));
            self.pos = 0;
        }
        Ok(())
    }

    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.buf
            .get(self.pos)
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Scan;

    #[test]
    fn cursor_crosses_chunk_boundaries_in_order() {
        let mem = MemBackend::new();
        let mut batch = WriteBatch::new();
        for i in 0u32..200 {
            batch.put(Cf::MapLog, &i.to_be_bytes(), &[i as u8]);
        }
        batch.put(Cf::Catalog, b"other", b"x");
        mem.write(&batch, false).unwrap();
        let keys: Vec<u32> = Scan::range(&mem, Cf::MapLog, &10u32.to_be_bytes(), None)
            .unwrap()
            .map(|e| u32::from_be_bytes(e.unwrap().0.try_into().unwrap()))
            .collect();
        assert_eq!(keys, (10..200).collect::<Vec<_>>());
        let last = mem
            .last_in_range(Cf::MapLog, &[], &150u32.to_be_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(last.0, 149u32.to_be_bytes());
    }

    #[test]
    fn delete_and_deep_copy_are_independent() {
        let mem = MemBackend::new();
        let mut b = WriteBatch::new();
        b.put(Cf::Meta, b"a", b"1");
        mem.write(&b, true).unwrap();
        let copy = mem.deep_copy();
        let mut d = WriteBatch::new();
        d.delete(Cf::Meta, b"a");
        mem.write(&d, true).unwrap();
        assert_eq!(mem.get(Cf::Meta, b"a").unwrap(), None);
        assert_eq!(copy.get(Cf::Meta, b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(
            MemBackend::copy_of(&copy).unwrap().entries(Cf::Meta).len(),
            1
        );
    }
}
