//! The storage trait under the store: column families of ordered byte keys, point reads,
//! cursors, and atomic write batches with a sync flag.
//!
//! Three implementations: [`crate::RocksBackend`] (the real one), [`crate::MemBackend`]
//! (BTreeMaps, for tests here and in other crates) and [`crate::FaultyBackend`] (injects
//! write failures and simulates crashes).
//!
//! The contract every implementation keeps, and on which the store's crash safety rests:
//! - a batch is applied atomically: after any failure or crash, either all of its operations
//!   are visible or none is;
//! - batches become durable in the order they were written: a crash keeps a prefix of the
//!   batches (every batch up to the last synced one, possibly some unsynced ones after it, in
//!   order), never a later batch without an earlier one;
//! - `write(.., sync = true)` returns only when that batch and every earlier one are durable;
//! - a failed `write` has applied nothing.

use crate::error::{ErrorKind, Result, StoreError};
use crate::keys::Cf;
use std::path::Path;

/// One operation of a [`WriteBatch`] (borrowed from the batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp<'a> {
    /// Set `key` to `value` in `cf`.
    Put {
        /// Column family.
        cf: Cf,
        /// Key.
        key: &'a [u8],
        /// Value.
        value: &'a [u8],
    },
    /// Remove `key` from `cf` (no error if absent).
    Delete {
        /// Column family.
        cf: Cf,
        /// Key.
        key: &'a [u8],
    },
    /// Remove every key of `cf` in `[start, end)` (one range tombstone in RocksDB: the cost
    /// does not grow with the keys removed).
    DeleteRange {
        /// Column family.
        cf: Cf,
        /// First key removed.
        start: &'a [u8],
        /// First key kept after the range.
        end: &'a [u8],
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Put,
    Delete,
    DeleteRange,
}

/// Where an operation's two byte strings (key and value, or start and end; the second is
/// empty for a delete) lie in the batch's buffer: `first` bytes from `at`, then `second`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpRecord {
    kind: OpKind,
    cf: Cf,
    at: usize,
    first: u32,
    second: u32,
}

/// A set of operations applied atomically by [`KvBackend::write`], in order.
///
/// The keys and values are copied into one buffer, kept with its room when the batch is
/// cleared: a capture fills thousands of batches of about the same size, and a batch of
/// separately allocated keys and values cost it two allocations and two frees per
/// operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    data: Vec<u8>,
    ops: Vec<OpRecord>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, kind: OpKind, cf: Cf, first: &[u8], second: &[u8]) {
        let at = self.data.len();
        self.data.extend_from_slice(first);
        self.data.extend_from_slice(second);
        let len = |b: &[u8]| u32::try_from(b.len()).expect("a key or value over 4 GiB");
        self.ops.push(OpRecord {
            kind,
            cf,
            at,
            first: len(first),
            second: len(second),
        });
    }

    /// Adds a put.
    pub fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) {
        self.push(OpKind::Put, cf, key, value);
    }

    /// Adds a delete.
    pub fn delete(&mut self, cf: Cf, key: &[u8]) {
        self.push(OpKind::Delete, cf, key, &[]);
    }

    /// Adds the removal of every key in `[start, end)`.
    pub fn delete_range(&mut self, cf: Cf, start: &[u8], end: &[u8]) {
        self.push(OpKind::DeleteRange, cf, start, end);
    }

    /// Empties the batch, keeping its room for the next one (a capture writes many batches
    /// of about the same size).
    pub fn clear(&mut self) {
        self.data.clear();
        self.ops.clear();
    }

    /// The operations, in order.
    pub fn ops(&self) -> impl ExactSizeIterator<Item = BatchOp<'_>> + '_ {
        self.ops.iter().map(|op| {
            let mid = op.at + op.first as usize;
            let first = &self.data[op.at..mid];
            let second = &self.data[mid..mid + op.second as usize];
            match op.kind {
                OpKind::Put => BatchOp::Put {
                    cf: op.cf,
                    key: first,
                    value: second,
                },
                OpKind::Delete => BatchOp::Delete {
                    cf: op.cf,
                    key: first,
                },
                OpKind::DeleteRange => BatchOp::DeleteRange {
                    cf: op.cf,
                    start: first,
                    end: second,
                },
            }
        })
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if the batch has no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Approximate memory (and WAL) size of the batch in bytes: its keys and values, and 16
    /// bytes per operation.
    pub fn size_bytes(&self) -> usize {
        self.data.len() + 16 * self.ops.len()
    }
}

/// A position in one column family's ordered key space.
///
/// A new cursor is unpositioned: call [`KvCursor::seek`] first. A cursor need not see writes
/// made after it was positioned.
pub trait KvCursor {
    /// Positions the cursor at the first key `>= key`.
    fn seek(&mut self, key: &[u8]) -> Result<()>;
    /// Moves to the next key. Only valid while [`KvCursor::current`] is `Some`.
    fn next(&mut self) -> Result<()>;
    /// The entry at the cursor, or `None` past the end.
    fn current(&self) -> Option<(&[u8], &[u8])>;
}

/// A key-value store with column families: what the snapshot store needs from its storage.
///
/// Implementations are `Send + Sync`: reads may come from several threads while one thread
/// writes.
pub trait KvBackend: Send + Sync {
    /// A short description for error messages, e.g. "gsnap store at /var/lib/pg/gsnap".
    fn describe(&self) -> String;

    /// The value of `key` in `cf`.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// The values of several keys of `cf`, in the order of `keys`.
    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(cf, k)).collect()
    }

    /// The sizes of the values of several keys of `cf` (None: absent), in the order of
    /// `keys`, for when only the size matters (what removing the records would give back):
    /// a backend that can do so reads them without copying the values out.
    fn value_sizes(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<usize>>> {
        Ok(self
            .multi_get(cf, keys)?
            .into_iter()
            .map(|v| v.map(|v| v.len()))
            .collect())
    }

    /// A cursor over `cf`.
    fn cursor(&self, cf: Cf) -> Result<Box<dyn KvCursor + '_>>;

    /// The last entry of `cf` whose key is in `[start, end)`, if any.
    fn last_in_range(&self, cf: Cf, start: &[u8], end: &[u8])
        -> Result<Option<(Vec<u8>, Vec<u8>)>>;

    /// Applies `batch` atomically. With `sync`, returns only once it (and every earlier batch)
    /// is durable.
    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()>;

    /// Asks the backend to rewrite the files that hold keys of `cf` in `[start, end)`, so
    /// that deleted entries stop taking space. Default: nothing to do.
    fn compact_range(&self, _cf: Cf, _start: &[u8], _end: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Writes a consistent copy of everything into the directory `dir`, which must not exist
    /// yet: what a reader of the copy finds is the backend's content at one moment (every
    /// batch written before it, none after). Default: not supported.
    fn copy_to(&self, dir: &Path) -> Result<()> {
        Err(StoreError::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} cannot be copied to \"{}\"",
                self.describe(),
                dir.display()
            ),
        ))
    }

    /// Bytes the backend takes on disk (or in memory), everything included (a write-ahead
    /// log too). Default: unknown, 0.
    fn disk_bytes(&self) -> Result<u64> {
        Ok(0)
    }

    /// How many entries `cf` holds and the bytes of their values, without reading them where
    /// the backend can tell (RocksDB estimates both from its files' properties and memtables,
    /// keys included; its estimates become exact once compaction has dropped deleted
    /// entries). Default: counted by a scan, exact.
    fn estimate(&self, cf: Cf) -> Result<CfEstimate> {
        let mut e = CfEstimate::default();
        for entry in Scan::prefix(self, cf, &[])? {
            let (_, v) = entry?;
            e.entries += 1;
            e.bytes += v.len() as u64;
        }
        Ok(e)
    }
}

/// What [`KvBackend::estimate`] says of a column family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CfEstimate {
    /// Entries (keys).
    pub entries: u64,
    /// Bytes of their values (RocksDB: of keys and values, as stored).
    pub bytes: u64,
}

/// An iterator over the entries of one column family with keys in `[start, end)`, in key
/// order (`end = None`: to the end of the column family).
pub struct Scan<'a> {
    cursor: Box<dyn KvCursor + 'a>,
    end: Option<Vec<u8>>,
    started: bool,
    start: Vec<u8>,
    done: bool,
}

impl<'a> Scan<'a> {
    /// Entries of `cf` with keys in `[start, end)`.
    pub fn range<B: KvBackend + ?Sized>(
        backend: &'a B,
        cf: Cf,
        start: &[u8],
        end: Option<Vec<u8>>,
    ) -> Result<Self> {
        Ok(Scan {
            cursor: backend.cursor(cf)?,
            end,
            started: false,
            start: start.to_vec(),
            done: false,
        })
    }

    /// Entries of `cf` whose key starts with `prefix`.
    pub fn prefix<B: KvBackend + ?Sized>(backend: &'a B, cf: Cf, prefix: &[u8]) -> Result<Self> {
        Self::range(backend, cf, prefix, crate::keys::prefix_end(prefix))
    }

    fn step(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if self.done {
            return Ok(None);
        }
        if self.started {
            self.cursor.next()?;
        } else {
            self.started = true;
            self.cursor.seek(&self.start)?;
        }
        match self.cursor.current() {
            Some((k, v)) if self.end.as_deref().is_none_or(|end| k < end) => {
                Ok(Some((k.to_vec(), v.to_vec())))
            }
            _ => {
                self.done = true;
                Ok(None)
            }
        }
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// A shared backend is a backend (lets a test keep a handle on the backend a store owns).
impl<T: KvBackend + ?Sized> KvBackend for std::sync::Arc<T> {
    fn describe(&self) -> String {
        (**self).describe()
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        (**self).get(cf, key)
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        (**self).multi_get(cf, keys)
    }

    fn value_sizes(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<usize>>> {
        (**self).value_sizes(cf, keys)
    }

    fn cursor(&self, cf: Cf) -> Result<Box<dyn KvCursor + '_>> {
        (**self).cursor(cf)
    }

    fn last_in_range(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        (**self).last_in_range(cf, start, end)
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()> {
        (**self).write(batch, sync)
    }

    fn compact_range(&self, cf: Cf, start: &[u8], end: &[u8]) -> Result<()> {
        (**self).compact_range(cf, start, end)
    }

    fn disk_bytes(&self) -> Result<u64> {
        (**self).disk_bytes()
    }

    fn estimate(&self, cf: Cf) -> Result<CfEstimate> {
        (**self).estimate(cf)
    }
}
