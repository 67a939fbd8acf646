//! Key maps: for a relation incarnation, which (block, image) pairs hold a row whose key
//! hashes to a given value, so that a lookup by key AS OF a snapshot reads only the pages
//! that can hold it.
//!
//! The store knows nothing of keys: the caller hashes a row's key (its own definition, kept
//! opaque in the key map record) and records, per page image, the hashes of its rows with
//! [`Capture::add_keys`](crate::Capture::add_keys). An entry `(rel, hash, block, image)` is
//! a fact about the image's content at that block, true for every snapshot that maps the
//! block to the image; the caller decides which snapshots the map is complete for (the
//! record's start: the capture that recorded the keys of every page of the relation, every
//! later capture recording those of every image it maps).
//!
//! Entries are deleted with their image (`free_image_keys`), through the `'F'` record that
//! lists the hashes recorded for it.

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, RelId, SnapId};
use crate::keys::{self, Cf};
use crate::store::SnapshotStore;

/// The hash that stands for "a row whose key could not be hashed": an image recorded with
/// it is a candidate for every key.
pub const WILDCARD_KEY: u64 = u64::MAX;

/// A key hash as recorded: any hash but [`WILDCARD_KEY`] (which is moved next to it).
pub fn settle_key_hash(hash: u64) -> u64 {
    hash.min(WILDCARD_KEY - 1)
}

/// A relation incarnation's key map: complete from snapshot `start` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMap {
    pub start: SnapId,
    /// The caller's definition of the key, as given to `start_key_map`.
    pub definition: Vec<u8>,
}

impl<B: KvBackend> SnapshotStore<B> {
    /// The key map of relation incarnation `rel`, if one was started and not ended.
    pub fn key_map(&self, rel: RelId) -> Result<Option<KeyMap>> {
        let Some(v) = self.backend().get(Cf::Catalog, &keys::key_map_key(rel))? else {
            return Ok(None);
        };
        if v.len() < 8 {
            return Err(StoreError::corrupt(format!(
                "the key map record of {rel} has {} bytes",
                v.len()
            )));
        }
        Ok(Some(KeyMap {
            start: SnapId(u64::from_be_bytes(v[..8].try_into().expect("8 bytes"))),
            definition: v[8..].to_vec(),
        }))
    }

    /// The (block, image) pairs of `rel` recorded with one of `hashes` or with
    /// [`WILDCARD_KEY`], sorted by block then image, each once.
    pub fn key_candidates(&self, rel: RelId, hashes: &[u64]) -> Result<Vec<(u32, ImageId)>> {
        let mut wanted: Vec<u64> = hashes.iter().map(|&h| settle_key_hash(h)).collect();
        wanted.push(WILDCARD_KEY);
        wanted.sort_unstable();
        wanted.dedup();
        let mut found = Vec::new();
        for h in wanted {
            for entry in Scan::prefix(self.backend(), Cf::Keys, &keys::key_entry_prefix(rel, h))? {
                let (k, _) = entry?;
                found.push(keys::decode_key_entry_key(&k)?);
            }
        }
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// Puts into `batch` the removal of every key entry recorded for image `id`.
    pub(crate) fn free_image_keys(&self, id: ImageId, batch: &mut WriteBatch) -> Result<()> {
        for entry in Scan::prefix(self.backend(), Cf::Keys, &keys::image_keys_prefix(id))? {
            let (k, v) = entry?;
            let (_, block) = keys::decode_image_keys_key(&k)?;
            if v.len() < 4 || (v.len() - 4) % 8 != 0 {
                return Err(StoreError::corrupt(format!(
                    "the key list of {id} at block {block} has {} bytes",
                    v.len()
                )));
            }
            let rel = RelId(u32::from_be_bytes(v[..4].try_into().expect("4 bytes")));
            for h in v[4..].chunks_exact(8) {
                let h = u64::from_be_bytes(h.try_into().expect("8 bytes"));
                batch.delete(Cf::Keys, &keys::key_entry_key(rel, h, block, id));
            }
            batch.delete(Cf::Keys, &k);
        }
        Ok(())
    }
}
