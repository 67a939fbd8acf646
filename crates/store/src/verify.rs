//! Checking every reference count against the mapping log, and repairing what disagrees
//! (seed 004's periodic leak repair), and what the store takes in space.
//!
//! The expected count of an image is the number of live mappings naming it (`reclaim.rs`:
//! a mapping is live while a snapshot not reclaimed yet lies in its interval), found by one
//! pass over the whole log in snapshot order; the expected count of a TOAST value is the
//! number of stored images with a positive expected count that name it. Content with an
//! expected count of zero is *leaked* (e.g. written by a capture whose clean-up was lost);
//! a live mapping naming content that is not stored is *missing* (corruption: nothing can
//! bring it back). Repair frees leaked content and rewrites wrong counts, in bounded
//! batches; it never touches content the capture in progress may name (`keep`).
//!
//! The pass holds the expected counts in memory: one entry per page of the log and one per
//! image named, so it is meant to run now and then (`gsnap_verify()`), not on every change.

use std::collections::{HashMap, HashSet};

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::estimates::Forget;
use crate::ids::{ImageId, PageKey, Rank, SnapId, ToastId};
use crate::keys::{self, Cf};
use crate::records::{self, SnapshotState};
use crate::refs::Freed;
use crate::store::SnapshotStore;

/// What a verification found (and, with repair, fixed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Images stored.
    pub images: u64,
    /// TOAST values stored.
    pub toast_values: u64,
    /// Live mappings in the log.
    pub live_mappings: u64,
    /// Bytes of the content live mappings name (images and their TOAST values, as stored):
    /// what the retained and not yet reclaimed snapshots need.
    pub content_bytes: u64,
    /// Stored images nothing live names (freed with repair).
    pub leaked_images: u64,
    /// Stored TOAST values no live image names (freed with repair).
    pub leaked_toast_values: u64,
    /// Deltas of images that are not stored (deleted with repair; a build before deltas
    /// freed images without them).
    pub leaked_deltas: u64,
    /// Bytes of the leaked content (deltas included).
    pub leaked_bytes: u64,
    /// Images live mappings name that are not stored (corruption).
    pub missing_images: Vec<ImageId>,
    /// TOAST values live images name that are not stored (corruption).
    pub missing_toast_values: Vec<ToastId>,
    /// Counts that differed from the recount (rewritten with repair).
    pub wrong_counts: u64,
    /// Whether the repairs were made.
    pub repaired: bool,
}

/// What the store takes in space, without reading its content: the backend's estimates
/// (exact for the in-memory backend; for RocksDB, exact once compaction has dropped deleted
/// entries). [`SnapshotStore::verify`] counts exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceReport {
    /// Bytes of stored images and TOAST values (as stored, compressed).
    pub content_bytes: u64,
    /// Images stored.
    pub images: u64,
    /// Bytes the backend takes on disk, everything included (0 if it cannot say).
    pub disk_bytes: u64,
    /// Snapshots deleted whose space is not reclaimed yet.
    pub deleted_unreclaimed: u64,
    /// Entries of the key maps (their `'E'` and `'O'` entries), and their bytes.
    pub key_map_entries: u64,
    pub key_map_bytes: u64,
    /// Deltas of images stored (for diffs), and their bytes.
    pub delta_entries: u64,
    pub delta_bytes: u64,
}

impl<B: KvBackend> SnapshotStore<B> {
    /// Recounts every reference (see the module comment); with `repair`, frees leaked content
    /// and fixes wrong counts, except images `keep` names. Refused (InvalidArgument) while a
    /// capture is open: its new content is counted only by its commit, so it would look
    /// leaked.
    pub fn verify(&self, repair: bool, keep: &dyn Fn(ImageId) -> bool) -> Result<VerifyReport> {
        if let Some(snap) = self.catalog().active {
            return Err(StoreError::invalid(format!(
                "the store cannot be verified while the capture of snapshot {} is open (its \
                 content is counted when it commits)",
                snap.0
            )));
        }
        let mut report = VerifyReport {
            repaired: repair,
            ..Default::default()
        };
        let expected = self.expected_image_counts(&mut report)?;
        let mut batch = WriteBatch::new();
        let mut freed = Freed::default();
        let mut live_images: HashSet<ImageId> = HashSet::new();
        let mut stored_images: HashSet<ImageId> = HashSet::new();
        for r in 0..keys::IMAGE_RANKS {
            for entry in Scan::prefix(&self.backend, Cf::Images(Rank(r)), &[])? {
                let (k, v) = entry?;
                let id = keys::decode_image_key(&k)?;
                stored_images.insert(id);
                report.images += 1;
                let want = expected.get(&id).copied().unwrap_or(0);
                let have = self.image_refs(id)?;
                if want == 0 && !keep(id) {
                    report.leaked_images += 1;
                    report.leaked_bytes += v.len() as u64;
                    if repair {
                        let mut ignored = HashMap::new();
                        freed.add(self.free_image(id, &mut batch, &mut ignored)?);
                    }
                    continue;
                }
                live_images.insert(id);
                report.content_bytes += v.len() as u64;
                if have != Some(want) && want > 0 {
                    report.wrong_counts += 1;
                    if repair {
                        batch.put(Cf::Refs, &keys::image_refs_key(id), &want.to_be_bytes());
                    }
                }
                if repair {
                    self.flush_if_full(&mut batch)?;
                }
            }
        }
        // Deltas go with their images; one whose image is not stored is leaked. (With repair,
        // those of the leaked images went with them above.)
        for entry in Scan::prefix(&self.backend, Cf::Deltas, &[])? {
            let (k, v) = entry?;
            let id = keys::decode_image_key(&k)?;
            if !stored_images.contains(&id) {
                report.leaked_deltas += 1;
                report.leaked_bytes += v.len() as u64;
                if repair {
                    batch.delete(Cf::Deltas, &k);
                    self.flush_if_full(&mut batch)?;
                }
            }
        }
        report.missing_images = expected
            .keys()
            .filter(|id| !live_images.contains(id))
            .copied()
            .collect();
        report.missing_images.sort_unstable();
        // TOAST values: named by the images that stay.
        let mut toast_expected: HashMap<ToastId, u64> = HashMap::new();
        for &id in &live_images {
            for t in self.image_toasts(id)? {
                *toast_expected.entry(t).or_default() += 1;
            }
        }
        // TOAST values kept with count zero while a capture was open, which `release_kept`
        // frees (or keeps, if the capture reused them): not leaks.
        let mut kept_toasts = HashSet::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_KEPT_TOAST])? {
            let (k, _) = entry?;
            kept_toasts.insert(ToastId(keys::decode_tagged_u64(&k, keys::TAG_KEPT_TOAST)?));
        }
        let mut stored_toasts = HashSet::new();
        for entry in Scan::prefix(&self.backend, Cf::Toast, &[])? {
            let (k, v) = entry?;
            if k.len() != 8 {
                continue; // a chunk; the header (8-byte key) stands for the value
            }
            let id = ToastId(keys::decode_u64_value(&k, "TOAST key")?);
            stored_toasts.insert(id);
            report.toast_values += 1;
            let want = toast_expected.get(&id).copied().unwrap_or(0);
            if want == 0 && kept_toasts.contains(&id) {
                continue;
            }
            if want == 0 {
                report.leaked_toast_values += 1;
                report.leaked_bytes += v.len() as u64 + records::decode_toast_header(&v)?.len;
                if repair {
                    freed.add(self.free_toast(id, &mut batch)?);
                    self.flush_if_full(&mut batch)?;
                }
                continue;
            }
            report.content_bytes += v.len() as u64 + records::decode_toast_header(&v)?.len;
            if self.toast_refs(id)? != Some(want) {
                report.wrong_counts += 1;
                if repair {
                    batch.put(Cf::Refs, &keys::toast_refs_key(id), &want.to_be_bytes());
                }
            }
        }
        report.missing_toast_values = toast_expected
            .keys()
            .filter(|id| !stored_toasts.contains(id))
            .copied()
            .collect();
        report.missing_toast_values.sort_unstable();
        if repair && !batch.is_empty() {
            self.write_forgetting_estimates(&mut batch, true, Forget::All)?;
        }
        Ok(report)
    }

    /// The expected count of every image named by a live mapping.
    fn expected_image_counts(&self, report: &mut VerifyReport) -> Result<HashMap<ImageId, u64>> {
        let r: Vec<SnapId> = {
            let cat = self.catalog();
            cat.snaps
                .iter()
                .filter(|(_, s)| {
                    matches!(s.state, SnapshotState::Committed | SnapshotState::Deleted)
                })
                .map(|(id, _)| *id)
                .collect()
        };
        // A member of r in [from, to) (to = None: unbounded)?
        let live = |from: SnapId, to: Option<SnapId>| {
            let i = r.partition_point(|&s| s < from);
            r.get(i).is_some_and(|&s| to.is_none_or(|t| s < t))
        };
        let Some(&newest) = self
            .catalog()
            .snaps
            .iter()
            .rev()
            .find(|(_, s)| s.state.in_log())
            .map(|(id, _)| id)
        else {
            return Ok(HashMap::new());
        };
        let mut last: HashMap<PageKey, (SnapId, ImageId)> = HashMap::new();
        let mut counts: HashMap<ImageId, u64> = HashMap::new();
        for m in self.mapping_log(SnapId(1), newest)? {
            if let Some((v, image)) = last.insert(m.page, (m.snap, m.image)) {
                if live(v, Some(m.snap)) {
                    *counts.entry(image).or_default() += 1;
                }
            }
        }
        for (_, (v, image)) in last {
            if live(v, None) {
                *counts.entry(image).or_default() += 1;
            }
        }
        report.live_mappings = counts.values().sum();
        Ok(counts)
    }

    /// What the store takes in space, from the backend's estimates (see [`SpaceReport`]).
    pub fn space(&self) -> Result<SpaceReport> {
        let mut s = SpaceReport {
            disk_bytes: self.disk_bytes()?,
            deleted_unreclaimed: self.deleted_unreclaimed().len() as u64,
            ..Default::default()
        };
        for r in 0..keys::IMAGE_RANKS {
            let e = self.backend.estimate(Cf::Images(Rank(r)))?;
            s.images += e.entries;
            s.content_bytes += e.bytes;
        }
        s.content_bytes += self.backend.estimate(Cf::Toast)?.bytes;
        let keys = self.backend.estimate(Cf::Keys)?;
        (s.key_map_entries, s.key_map_bytes) = (keys.entries, keys.bytes);
        let deltas = self.backend.estimate(Cf::Deltas)?;
        (s.delta_entries, s.delta_bytes) = (deltas.entries, deltas.bytes);
        Ok(s)
    }

    /// The store's size on disk as the backend reports it.
    pub fn disk_bytes(&self) -> Result<u64> {
        self.backend.disk_bytes()
    }

    /// Compacts the key range of images `from..=to` of one rank (after reclamation freed
    /// images there), so the space returns to the file system.
    pub fn compact_images(&self, from: ImageId, to: ImageId) -> Result<()> {
        let rank = keys::image_rank(from);
        let end = ImageId(to.0.saturating_add(1));
        self.backend.compact_range(
            Cf::Images(rank),
            &keys::image_key(from),
            &keys::image_key(end),
        )
    }
}
