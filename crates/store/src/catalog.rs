//! The catalog: snapshot listing and resolution, snapshot deletion, carried pages, row types,
//! relation incarnations and garbage-collection progress.
//!
//! Invariants: only committed snapshots are *readable* ([`SnapshotStore::check_readable`]);
//! row types are deduplicated by their full BLAKE3 fingerprint and, like relation
//! incarnations, written in a synced batch together with their id counter before their id is
//! returned.

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{Fingerprint, PageKey, RelId, RowTypeId, SnapId};
use crate::keys::{self, Cf, Counter, DedupKind};
use crate::records::{self, RelIncarnation, SnapshotInfo, SnapshotState};
use crate::store::{SnapSummary, SnapshotStore};

impl<B: KvBackend> SnapshotStore<B> {
    /// Every snapshot the store knows, in id order, whatever its state.
    pub fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let mut out = Vec::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_SNAPSHOT])? {
            let (k, v) = entry?;
            let id = SnapId(keys::decode_tagged_u64(&k, keys::TAG_SNAPSHOT)?);
            out.push(records::decode_snapshot(id, &v)?);
        }
        Ok(out)
    }

    /// The catalog entry of `snap` (in any state). NotFound if the store never had it.
    pub fn snapshot(&self, snap: SnapId) -> Result<SnapshotInfo> {
        match self.backend.get(Cf::Catalog, &keys::snapshot_key(snap))? {
            Some(v) => records::decode_snapshot(snap, &v),
            None => Err(StoreError::not_found(format!(
                "snapshot {} does not exist",
                snap.0
            ))),
        }
    }

    /// The state of `snap`, from memory (None: unknown snapshot).
    pub fn snapshot_state(&self, snap: SnapId) -> Option<SnapshotState> {
        self.catalog().snaps.get(&snap).map(|s| s.state)
    }

    /// When the newest snapshot that did not fail was declared (microseconds since the Unix
    /// epoch), if there is one.
    pub fn latest_declared_at_us(&self) -> Option<i64> {
        self.catalog()
            .snaps
            .values()
            .filter(|s| s.state != SnapshotState::Failed)
            .map(|s| s.declared_at_us)
            .max()
    }

    /// The newest snapshot that did not fail, with its state, if any: the one whose page
    /// table a new capture compares against when it is committed.
    pub fn latest_not_failed(&self) -> Option<(SnapId, SnapshotState)> {
        self.catalog()
            .snaps
            .iter()
            .rev()
            .find(|(_, s)| s.state != SnapshotState::Failed)
            .map(|(id, s)| (*id, s.state))
    }

    /// The committed snapshots of `from..=to`, ascending.
    pub fn committed_in(&self, from: SnapId, to: SnapId) -> Vec<SnapId> {
        if from > to {
            return Vec::new();
        }
        self.catalog()
            .snaps
            .range(from..=to)
            .filter(|(_, s)| s.state == SnapshotState::Committed)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The latest committed snapshot, if any.
    pub fn latest_committed(&self) -> Option<SnapId> {
        let cat = self.catalog();
        cat.snaps
            .iter()
            .rev()
            .find(|(_, s)| s.state == SnapshotState::Committed)
            .map(|(id, _)| *id)
    }

    /// The latest committed snapshot declared at or before `time_us` (microseconds since the
    /// Unix epoch), for AS OF a time.
    pub fn committed_at_or_before(&self, time_us: i64) -> Option<SnapId> {
        let cat = self.catalog();
        cat.snaps
            .iter()
            .rev()
            .find(|(_, s)| s.state == SnapshotState::Committed && s.declared_at_us <= time_us)
            .map(|(id, _)| *id)
    }

    /// Ok if `snap` is committed; NotFound (with the reason) otherwise.
    pub fn check_readable(&self, snap: SnapId) -> Result<()> {
        match self.catalog().snaps.get(&snap).map(|s| s.state) {
            Some(SnapshotState::Committed) => Ok(()),
            Some(state) => Err(StoreError::not_found(format!(
                "snapshot {} cannot be read: it is {}",
                snap.0,
                state.as_str()
            ))),
            None => Err(StoreError::not_found(format!(
                "snapshot {} does not exist",
                snap.0
            ))),
        }
    }

    /// The pages snapshot `snap` carried (unsettled) into the next span, in page order.
    pub fn carried_pages(&self, snap: SnapId) -> Result<Vec<PageKey>> {
        self.check_readable(snap)?;
        let mut out = Vec::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &keys::carried_prefix(snap))? {
            out.push(keys::decode_carried_key(&entry?.0)?.1);
        }
        Ok(out)
    }

    /// Marks a committed or failed snapshot deleted (durably); see [`Self::delete_snapshots`].
    pub fn delete_snapshot(&self, snap: SnapId) -> Result<()> {
        self.delete_snapshots(&[snap], crate::store::now_us())
    }

    /// Marks snapshots deleted at `at_us`, all in one synced batch (all or none): they stay
    /// listed and are no longer readable. A committed snapshot becomes *deleted* (its space is
    /// reclaimed later, `reclaim.rs`); a failed one, which has no mappings and never was in
    /// the mapping log, stays *failed* with its deletion time (nothing to reclaim). Already
    /// deleted ones are left as they are. InvalidArgument for a
    /// snapshot being captured, NotFound for an unknown one; nothing changes then.
    pub fn delete_snapshots(&self, snaps: &[SnapId], at_us: i64) -> Result<()> {
        let mut batch = WriteBatch::new();
        let mut changed = Vec::new();
        for &snap in snaps {
            let mut info = self.snapshot(snap)?;
            info.state = match info.state {
                SnapshotState::Deleted | SnapshotState::Reclaimed => continue,
                SnapshotState::Failed if info.deleted_at_us.is_some() => continue,
                SnapshotState::Capturing => {
                    return Err(StoreError::invalid(format!(
                        "snapshot {} is being captured; it can be deleted once its capture ends",
                        snap.0
                    )))
                }
                SnapshotState::Committed => SnapshotState::Deleted,
                SnapshotState::Failed => SnapshotState::Failed,
            };
            info.deleted_at_us = Some(at_us);
            batch.put(
                Cf::Catalog,
                &keys::snapshot_key(snap),
                &records::encode_snapshot(&info),
            );
            changed.push((snap, info.state, info.decl.declared_at_us));
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.backend.write(&batch, true)?;
        let mut cat = self.catalog_mut();
        for (snap, state, declared_at_us) in changed {
            cat.snaps.insert(
                snap,
                SnapSummary {
                    state,
                    declared_at_us,
                },
            );
        }
        Ok(())
    }

    /// Replaces snapshot `snap`'s pins (durably).
    pub fn set_pins(&self, snap: SnapId, pins: Vec<records::Pin>) -> Result<()> {
        self.update_snapshot(snap, |info| info.pins = pins)
    }

    /// Gives snapshot `snap` a rank later (lazy ranking; durably).
    pub fn set_explicit_rank(&self, snap: SnapId, rank: crate::ids::Rank) -> Result<()> {
        self.update_snapshot(snap, |info| info.explicit_rank = rank)
    }

    fn update_snapshot(&self, snap: SnapId, change: impl FnOnce(&mut SnapshotInfo)) -> Result<()> {
        let mut info = self.snapshot(snap)?;
        change(&mut info);
        let mut batch = WriteBatch::new();
        batch.put(
            Cf::Catalog,
            &keys::snapshot_key(snap),
            &records::encode_snapshot(&info),
        );
        self.backend.write(&batch, true)
    }

    /// Replaces the recorded reason of a failed snapshot (durably), e.g. with the storage
    /// error that made its capture fail when recovery could only say it was interrupted.
    /// InvalidArgument unless `snap` is failed.
    pub fn set_failure_reason(&self, snap: SnapId, reason: &str) -> Result<()> {
        let mut info = self.snapshot(snap)?;
        if info.state != SnapshotState::Failed {
            return Err(StoreError::invalid(format!(
                "snapshot {} is {}, not failed",
                snap.0,
                info.state.as_str()
            )));
        }
        info.failure_reason = Some(reason.to_string());
        let mut batch = WriteBatch::new();
        batch.put(
            Cf::Catalog,
            &keys::snapshot_key(snap),
            &records::encode_snapshot(&info),
        );
        self.backend.write(&batch, true)
    }

    /// Stores a row type description (opaque bytes) and returns its id; identical bytes get
    /// the same id. Durable when it returns.
    pub fn put_row_type(&self, bytes: &[u8]) -> Result<RowTypeId> {
        let fp = Fingerprint::of(bytes);
        let dedup = keys::dedup_key(DedupKind::RowType, &fp);
        // The id lock serializes row type creation, so two callers never create two ids for
        // the same bytes.
        let mut ids = self.lock_ids();
        if let Some(v) = self.backend.get(Cf::Dedup, &dedup)? {
            return Ok(RowTypeId(keys::decode_u64_value(&v, "dedup entry")?));
        }
        let mut batch = WriteBatch::new();
        let id = RowTypeId(self.alloc_in_batch(&mut ids, Counter::RowType, &mut batch));
        batch.put(
            Cf::Catalog,
            &keys::row_type_key(id),
            &records::encode_row_type(bytes, &fp),
        );
        batch.put(Cf::Dedup, &dedup, &id.0.to_be_bytes());
        self.backend.write(&batch, true)?;
        Ok(id)
    }

    /// The bytes of row type `id`.
    pub fn row_type(&self, id: RowTypeId) -> Result<Vec<u8>> {
        let what = format!("row type {}", id.0);
        match self.backend.get(Cf::Catalog, &keys::row_type_key(id))? {
            Some(v) => Ok(records::decode_row_type(&v, &what)?.0),
            None => Err(StoreError::not_found(format!("{what} does not exist"))),
        }
    }

    /// Allocates a new relation incarnation for a table (at its first snapshot, and whenever
    /// its storage is replaced). Durable when it returns.
    pub fn allocate_rel(&self, incarnation: &RelIncarnation) -> Result<RelId> {
        let mut ids = self.lock_ids();
        let mut batch = WriteBatch::new();
        let n = self.alloc_in_batch(&mut ids, Counter::Rel, &mut batch);
        let rel = RelId(u32::try_from(n).map_err(|_| {
            StoreError::invalid("all 2^32 relation incarnation ids are used up".to_string())
        })?);
        batch.put(
            Cf::Catalog,
            &keys::rel_key(rel),
            &records::encode_rel(incarnation),
        );
        self.backend.write(&batch, true)?;
        Ok(rel)
    }

    /// What the store recorded about relation incarnation `rel`.
    pub fn rel(&self, rel: RelId) -> Result<RelIncarnation> {
        match self.backend.get(Cf::Catalog, &keys::rel_key(rel))? {
            Some(v) => records::decode_rel(&v),
            None => Err(StoreError::not_found(format!(
                "relation incarnation {} does not exist",
                rel.0
            ))),
        }
    }

    /// Every relation incarnation, in id order.
    pub fn rels(&self) -> Result<Vec<(RelId, RelIncarnation)>> {
        let mut out = Vec::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_REL])? {
            let (k, v) = entry?;
            out.push((keys::decode_rel_key(&k)?, records::decode_rel(&v)?));
        }
        Ok(out)
    }
}
