//! Storage for later work, with simple put/get now: Skippy levels of the mapping log, sealed
//! index groups with their metadata, and garbage-collection progress.
//!
//! The store treats all of it as opaque bytes; its meaning belongs to `gsnap-core`. Every
//! write here is one synced batch, so each call is atomic and durable when it returns.
//! Invariant: a group's body (`groups` column family) and its metadata (`catalog`, tag 'G')
//! are written and deleted together.

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::Result;
use crate::ids::GroupId;
use crate::keys::{self, Cf};
use crate::store::SnapshotStore;

impl<B: KvBackend> SnapshotStore<B> {
    /// Stores Skippy nodes: (level, node number, opaque bytes), in one synced batch.
    pub fn put_skippy_nodes(&self, nodes: &[(u8, u64, &[u8])]) -> Result<()> {
        let mut batch = WriteBatch::new();
        for (level, node, bytes) in nodes {
            batch.put(Cf::Skippy, &keys::skippy_key(*level, *node), bytes);
        }
        self.backend.write(&batch, true)
    }

    /// The bytes of Skippy node `node` of `level`, if stored.
    pub fn skippy_node(&self, level: u8, node: u64) -> Result<Option<Vec<u8>>> {
        self.backend.get(Cf::Skippy, &keys::skippy_key(level, node))
    }

    /// Every stored node of `level` from node `from` on, in node order.
    pub fn skippy_level(&self, level: u8, from: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let end = keys::prefix_end(&[level]);
        Scan::range(
            &self.backend,
            Cf::Skippy,
            &keys::skippy_key(level, from),
            end,
        )?
        .map(|e| {
            let (k, v) = e?;
            Ok((keys::decode_tagged_u64(&k, level)?, v))
        })
        .collect()
    }

    /// Stores a sealed group: its body and its metadata, atomically and durably.
    pub fn put_group(&self, group: GroupId, meta: &[u8], body: &[u8]) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.put(Cf::Groups, &keys::group_key(group), body);
        batch.put(Cf::Catalog, &keys::group_meta_key(group), meta);
        self.backend.write(&batch, true)
    }

    /// The body of sealed group `group`, if stored.
    pub fn group_body(&self, group: GroupId) -> Result<Option<Vec<u8>>> {
        self.backend.get(Cf::Groups, &keys::group_key(group))
    }

    /// Metadata of every sealed group, in group order.
    pub fn group_metas(&self) -> Result<Vec<(GroupId, Vec<u8>)>> {
        Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_GROUP_META])?
            .map(|e| {
                let (k, v) = e?;
                Ok((
                    GroupId(keys::decode_tagged_u64(&k, keys::TAG_GROUP_META)?),
                    v,
                ))
            })
            .collect()
    }

    /// Deletes a sealed group (body and metadata) durably.
    pub fn delete_group(&self, group: GroupId) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.delete(Cf::Groups, &keys::group_key(group));
        batch.delete(Cf::Catalog, &keys::group_meta_key(group));
        self.backend.write(&batch, true)
    }

    /// Records garbage-collection progress (opaque bytes) durably.
    pub fn put_gc_progress(&self, progress: &[u8]) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.put(Cf::Catalog, keys::GC_PROGRESS_KEY, progress);
        self.backend.write(&batch, true)
    }

    /// The last recorded garbage-collection progress.
    pub fn gc_progress(&self) -> Result<Option<Vec<u8>>> {
        self.backend.get(Cf::Catalog, keys::GC_PROGRESS_KEY)
    }
}
