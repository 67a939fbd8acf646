//! Sealed index groups: each group's body (opaque bytes in `gsnap_core`'s group format, the
//! `groups` column family) and its metadata ([`GroupMeta`], a catalog record with tag `'G'`).
//!
//! A sealed group is a cache of the mapping log: it can always be rebuilt from the log
//! ([`SnapshotStore::build_group`]), which is what the worker does when a body is missing or
//! damaged.
//!
//! Invariants: a group's body and its metadata are written and deleted together, in one
//! synced batch, so each call is atomic and durable when it returns; a metadata record lists
//! at least one snapshot, in strictly ascending order, and is refused (InvalidArgument) when
//! written otherwise and reported as Corrupt when read otherwise.

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::codec::{Dec, Enc};
use crate::error::{Result, StoreError};
use crate::ids::{GroupId, SnapId};
use crate::keys::{self, Cf, Counter};
use crate::records::RECORD_VERSION;
use crate::store::SnapshotStore;

/// What the index keeps about a sealed group: its snapshots, its size, and the budgets the
/// dividing policy (GSnap's Algorithm 1) chose for the group after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMeta {
    /// The group (the record's key, not part of its bytes).
    pub id: GroupId,
    /// The group's snapshots, strictly ascending, at least one.
    pub snaps: Vec<SnapId>,
    /// Pages changed over the group (what the page budget counts).
    pub pages: u64,
    /// Size of the sealed body in bytes.
    pub bytes: u64,
    /// Length budget (snapshots) of the next group, chosen when this one was sealed.
    pub next_length_budget: u32,
    /// Page budget of the next group, chosen when this one was sealed.
    pub next_page_budget: u64,
}

impl GroupMeta {
    /// The group's first snapshot.
    pub fn first(&self) -> SnapId {
        self.snaps.first().copied().unwrap_or_default()
    }

    /// The group's last snapshot.
    pub fn last(&self) -> SnapId {
        self.snaps.last().copied().unwrap_or_default()
    }

    /// The metadata record: `rv` · `u32` n · n × `u64` snapshot · `u64` pages · `u64` bytes ·
    /// `u32` next length budget · `u64` next page budget (big-endian, see `docs/format.md`).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::with_version(RECORD_VERSION);
        e.u32(self.snaps.len() as u32);
        for s in &self.snaps {
            e.u64(s.0);
        }
        e.u64(self.pages)
            .u64(self.bytes)
            .u32(self.next_length_budget)
            .u64(self.next_page_budget)
            .finish()
    }

    /// Decodes the metadata record of group `id`. Corrupt if the bytes are truncated, carry
    /// trailing bytes or an unknown record version, or list no snapshot or snapshots out of
    /// order.
    pub fn decode(id: GroupId, bytes: &[u8]) -> Result<GroupMeta> {
        let mut d = Dec::new(bytes, "group metadata");
        d.version(RECORD_VERSION)?;
        let n = d.u32()? as usize;
        // Never trust the count for an allocation larger than the bytes can hold.
        let mut snaps = Vec::with_capacity(n.min(bytes.len() / 8));
        for _ in 0..n {
            snaps.push(SnapId(d.u64()?));
        }
        let meta = GroupMeta {
            id,
            snaps,
            pages: d.u64()?,
            bytes: d.u64()?,
            next_length_budget: d.u32()?,
            next_page_budget: d.u64()?,
        };
        d.end()?;
        meta.check()
            .map_err(|problem| StoreError::corrupt(format!("metadata of {id}: {problem}")))?;
        Ok(meta)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.snaps.is_empty() {
            return Err("it lists no snapshot".into());
        }
        if self.snaps[0].0 == 0 || self.snaps.windows(2).any(|w| w[0] >= w[1]) {
            return Err("its snapshots are not valid ids in ascending order".into());
        }
        Ok(())
    }
}

impl<B: KvBackend> SnapshotStore<B> {
    /// Stores a sealed group: its body and its metadata, atomically and durably.
    /// InvalidArgument if the metadata lists no snapshot or snapshots out of order.
    pub fn put_group(&self, meta: &GroupMeta, body: &[u8]) -> Result<()> {
        self.replace_groups(&[], &[(meta, body)])
    }

    /// Replaces sealed groups `old` by `new` (metadata and bodies) in one synced batch: a
    /// crash leaves either set, never both. Group ids are never reused (the group cache
    /// keys groups by id): the next free one is [`Self::next_group_id`].
    pub fn replace_groups(&self, old: &[GroupId], new: &[(&GroupMeta, &[u8])]) -> Result<()> {
        for (meta, _) in new {
            meta.check().map_err(|problem| {
                StoreError::invalid(format!("cannot store {}: {problem}", meta.id))
            })?;
        }
        let mut ids = self.lock_ids();
        let mut batch = WriteBatch::new();
        for &g in old {
            batch.delete(Cf::Groups, &keys::group_key(g));
            batch.delete(Cf::Catalog, &keys::group_meta_key(g));
        }
        for (meta, body) in new {
            batch.put(Cf::Groups, &keys::group_key(meta.id), body);
            batch.put(Cf::Catalog, &keys::group_meta_key(meta.id), &meta.encode());
            self.note_used(&mut ids, Counter::Group, meta.id.0, &mut batch);
        }
        self.backend.write(&batch, true)
    }

    /// The lowest group id never used.
    pub fn next_group_id(&self) -> GroupId {
        GroupId(self.next_id(Counter::Group).max(1))
    }

    /// The body of sealed group `group`, if stored.
    pub fn group_body(&self, group: GroupId) -> Result<Option<Vec<u8>>> {
        self.backend.get(Cf::Groups, &keys::group_key(group))
    }

    /// The metadata of every sealed group, in snapshot order (a group rebuilt without
    /// deleted snapshots has a newer id than the groups after it).
    pub fn group_metas(&self) -> Result<Vec<GroupMeta>> {
        let mut metas = Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_GROUP_META])?
            .map(|e| {
                let (k, v) = e?;
                let id = GroupId(keys::decode_tagged_u64(&k, keys::TAG_GROUP_META)?);
                GroupMeta::decode(id, &v).map_err(|e| e.context(self.backend.describe()))
            })
            .collect::<Result<Vec<_>>>()?;
        metas.sort_by_key(GroupMeta::first);
        Ok(metas)
    }

    /// Deletes a sealed group (body and metadata) durably.
    pub fn delete_group(&self, group: GroupId) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.delete(Cf::Groups, &keys::group_key(group));
        batch.delete(Cf::Catalog, &keys::group_meta_key(group));
        self.backend.write(&batch, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use proptest::prelude::*;

    fn meta() -> impl Strategy<Value = GroupMeta> {
        (
            any::<u64>(),
            prop::collection::btree_set(1u64..=u64::MAX, 1..40),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(|(id, snaps, pages, bytes, len, page)| GroupMeta {
                id: GroupId(id),
                snaps: snaps.into_iter().map(SnapId).collect(),
                pages,
                bytes,
                next_length_budget: len,
                next_page_budget: page,
            })
    }

    proptest! {
        #[test]
        fn metadata_round_trips(m in meta()) {
            prop_assert_eq!(GroupMeta::decode(m.id, &m.encode()), Ok(m));
        }

        #[test]
        fn every_prefix_and_any_extension_is_corrupt(m in meta(), extra in 1usize..9) {
            let bytes = m.encode();
            for cut in 0..bytes.len() {
                let e = GroupMeta::decode(m.id, &bytes[..cut]).unwrap_err();
                prop_assert_eq!(e.kind(), ErrorKind::Corrupt);
            }
            let mut longer = bytes.clone();
            longer.resize(bytes.len() + extra, 0);
            prop_assert_eq!(GroupMeta::decode(m.id, &longer).unwrap_err().kind(), ErrorKind::Corrupt);
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            // Whatever decodes is a valid record that encodes back to the same bytes.
            if let Ok(m) = GroupMeta::decode(GroupId(1), &bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }
    }

    #[test]
    fn empty_or_unordered_snapshot_lists_are_refused() {
        let mut m = GroupMeta {
            id: GroupId(2),
            snaps: vec![SnapId(3), SnapId(3)],
            pages: 1,
            bytes: 2,
            next_length_budget: 3,
            next_page_budget: 4,
        };
        let e = GroupMeta::decode(m.id, &m.encode()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("group 2"), "{e}");
        let store = SnapshotStore::open_in_memory(1);
        assert_eq!(
            store.put_group(&m, b"body").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        m.snaps.clear();
        assert_eq!(
            GroupMeta::decode(m.id, &m.encode()).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        assert!(store.group_metas().unwrap().is_empty());
    }

    #[test]
    fn groups_are_stored_listed_and_deleted_whole() {
        let store = SnapshotStore::open_in_memory(1);
        let meta = |id: u64, snaps: &[u64]| GroupMeta {
            id: GroupId(id),
            snaps: snaps.iter().copied().map(SnapId).collect(),
            pages: id * 10,
            bytes: 4,
            next_length_budget: 8,
            next_page_budget: 1000,
        };
        store.put_group(&meta(3, &[7, 9]), b"body3").unwrap();
        store.put_group(&meta(1, &[1, 2, 3]), b"body1").unwrap();
        assert_eq!(
            store.group_body(GroupId(3)).unwrap().as_deref(),
            Some(&b"body3"[..])
        );
        assert_eq!(
            store.group_metas().unwrap(),
            vec![meta(1, &[1, 2, 3]), meta(3, &[7, 9])]
        );
        assert_eq!(meta(3, &[7, 9]).first(), SnapId(7));
        assert_eq!(meta(3, &[7, 9]).last(), SnapId(9));
        store.delete_group(GroupId(1)).unwrap();
        assert_eq!(store.group_body(GroupId(1)).unwrap(), None);
        assert_eq!(store.group_metas().unwrap(), vec![meta(3, &[7, 9])]);
    }
}
