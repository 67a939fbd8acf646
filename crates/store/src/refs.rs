//! Reference counts of stored content, and freeing content nothing refers to.
//!
//! An image's count (`refs`, `'I' image`) is the number of live mappings in the mapping log
//! that name it: a capture's commit adds one per mapping of its snapshot, reclamation takes
//! one off per mapping that died (`reclaim.rs`). A TOAST value's count (`'T' toast`) is the
//! number of stored images that name it (`'L' image` lists them): a new image adds one,
//! freeing the image takes it off.
//!
//! Invariants: content is freed only in the batch that brings its count to zero, together
//! with its dedup entry (so no later capture can deduplicate onto freed content) and its
//! count; a count never goes below zero (a decrement past zero is reported as corruption
//! and leaves the count at zero); an image whose count reaches zero while the capture in
//! progress maps it is kept, with count zero, and listed (`'Z'` in the catalog) so that it
//! is freed later if that capture does not commit.

use std::collections::HashMap;

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, ToastId};
use crate::keys::{self, Cf, DedupKind};
use crate::records;
use crate::store::SnapshotStore;

/// Images (or counts) an estimate of what deleting a snapshot would free reads at once; it
/// asks whether to stop before each such read.
pub(crate) const ESTIMATE_BATCH: usize = 512;

/// What freeing content released.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freed {
    /// Images freed.
    pub images: u64,
    /// TOAST values freed.
    pub toast_values: u64,
    /// Bytes of the freed records as stored.
    pub bytes: u64,
}

/// What taking decrements off TOAST values' counts did.
pub(crate) struct Released {
    pub freed: Freed,
    /// A value decremented is still named by other images (which other snapshots' estimates
    /// may count).
    pub still_named: bool,
}

impl Freed {
    pub fn add(&mut self, other: Freed) {
        self.images += other.images;
        self.toast_values += other.toast_values;
        self.bytes += other.bytes;
    }
}

impl<B: KvBackend> SnapshotStore<B> {
    /// The current counts behind `items` (a missing count reads 0), with what the caller
    /// attached to each.
    pub(crate) fn counts<'a, T: Copy + 'a>(
        &self,
        items: impl IntoIterator<Item = &'a (T, [u8; 9])>,
    ) -> Result<Vec<(T, [u8; 9], u64)>> {
        let items: Vec<&(T, [u8; 9])> = items.into_iter().collect();
        let keys: Vec<&[u8]> = items.iter().map(|(_, k)| k.as_slice()).collect();
        let values = self.backend.multi_get(Cf::Refs, &keys)?;
        items
            .into_iter()
            .zip(values)
            .map(|(&(t, key), v)| {
                let count = match v {
                    Some(v) => keys::decode_u64_value(&v, "reference count")?,
                    None => 0,
                };
                Ok((t, key, count))
            })
            .collect()
    }

    /// The reference count of image `id` (None: it has none, e.g. never committed).
    pub fn image_refs(&self, id: ImageId) -> Result<Option<u64>> {
        self.count(&keys::image_refs_key(id))
    }

    /// The reference count of TOAST value `id`.
    pub fn toast_refs(&self, id: ToastId) -> Result<Option<u64>> {
        self.count(&keys::toast_refs_key(id))
    }

    fn count(&self, key: &[u8]) -> Result<Option<u64>> {
        self.backend
            .get(Cf::Refs, key)?
            .map(|v| keys::decode_u64_value(&v, "reference count"))
            .transpose()
    }

    /// The TOAST values image `id` names.
    pub(crate) fn image_toasts(&self, id: ImageId) -> Result<Vec<ToastId>> {
        let v = self.backend.get(Cf::Refs, &keys::image_toasts_key(id))?;
        decode_toast_list(id, v.as_deref().unwrap_or_default())
    }

    /// Puts into `batch` the removal of image `id` (record, dedup entry, count, TOAST list)
    /// and adds one to `toast_decrements` per TOAST value it names. A missing image frees
    /// nothing (it was freed before).
    pub(crate) fn free_image(
        &self,
        id: ImageId,
        batch: &mut WriteBatch,
        toast_decrements: &mut HashMap<ToastId, u64>,
    ) -> Result<Freed> {
        let cf = Cf::Images(keys::image_rank(id));
        let key = keys::image_key(id);
        let Some(record) = self.backend.get(cf, &key)? else {
            batch.delete(Cf::Refs, &keys::image_refs_key(id));
            return Ok(Freed::default());
        };
        let fp =
            records::image_fingerprint(&record).map_err(|e| e.context(format_args!("{id}")))?;
        batch.delete(cf, &key);
        batch.delete(Cf::Deltas, &keys::delta_key(id));
        batch.delete(Cf::Dedup, &keys::dedup_key(DedupKind::Image, &fp));
        batch.delete(Cf::Refs, &keys::image_refs_key(id));
        for t in self.image_toasts(id)? {
            *toast_decrements.entry(t).or_default() += 1;
        }
        batch.delete(Cf::Refs, &keys::image_toasts_key(id));
        Ok(Freed {
            images: 1,
            toast_values: 0,
            bytes: record.len() as u64,
        })
    }

    /// What freeing images `ids` would free, without freeing anything: the sizes of their
    /// records, and the TOAST values they name counted into `toast_decrements`, as
    /// [`Self::free_image`] counts them (a missing record frees nothing). Reads the records
    /// and lists many at a time: the estimates of what deleting a snapshot would free
    /// (`reclaim.rs`, `would_free`) ask this for every page a capture changed. None if
    /// `stop` said so before one of those reads.
    pub(crate) fn would_free_images(
        &self,
        ids: &[ImageId],
        toast_decrements: &mut HashMap<ToastId, u64>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Freed>> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        let mut freed = Freed::default();
        for run in ids.chunk_by(|a, b| keys::image_rank(*a) == keys::image_rank(*b)) {
            let cf = Cf::Images(keys::image_rank(run[0]));
            for part in run.chunks(ESTIMATE_BATCH) {
                if stop() {
                    return Ok(None);
                }
                let image_keys: Vec<[u8; 8]> = part.iter().map(|&i| keys::image_key(i)).collect();
                let refs: Vec<&[u8]> = image_keys.iter().map(|k| k.as_slice()).collect();
                let sizes = self.backend.value_sizes(cf, &refs)?;
                let present: Vec<ImageId> = part
                    .iter()
                    .zip(&sizes)
                    .filter_map(|(&id, size)| {
                        let len = (*size)? as u64;
                        freed.add(Freed {
                            images: 1,
                            toast_values: 0,
                            bytes: len,
                        });
                        Some(id)
                    })
                    .collect();
                let list_keys: Vec<_> =
                    present.iter().map(|&i| keys::image_toasts_key(i)).collect();
                let refs: Vec<&[u8]> = list_keys.iter().map(|k| k.as_slice()).collect();
                for (id, list) in present.iter().zip(self.backend.multi_get(Cf::Refs, &refs)?) {
                    for t in decode_toast_list(*id, list.as_deref().unwrap_or_default())? {
                        *toast_decrements.entry(t).or_default() += 1;
                    }
                }
            }
        }
        Ok(Some(freed))
    }

    /// Puts into `batch` the removal of TOAST value `id` (header, chunks, dedup entry,
    /// count). A missing value frees nothing.
    pub(crate) fn free_toast(&self, id: ToastId, batch: &mut WriteBatch) -> Result<Freed> {
        let header_key = keys::toast_header_key(id);
        let Some(header) = self.backend.get(Cf::Toast, &header_key)? else {
            batch.delete(Cf::Refs, &keys::toast_refs_key(id));
            return Ok(Freed::default());
        };
        let info = records::decode_toast_header(&header)?;
        let mut bytes = header.len() as u64;
        let next = keys::toast_header_key(ToastId(id.0 + 1));
        for entry in Scan::range(&self.backend, Cf::Toast, &header_key, Some(next.to_vec()))? {
            let (k, v) = entry?;
            bytes += if k.len() == header_key.len() {
                0
            } else {
                v.len() as u64
            };
            batch.delete(Cf::Toast, &k);
        }
        batch.delete(
            Cf::Dedup,
            &keys::dedup_key(DedupKind::Toast, &info.fingerprint),
        );
        batch.delete(Cf::Refs, &keys::toast_refs_key(id));
        Ok(Freed {
            images: 0,
            toast_values: 1,
            bytes,
        })
    }

    /// Takes `toast_decrements` off the TOAST values' counts (into `batch`), freeing those
    /// that reach zero. While a capture is open, one that reaches zero is kept instead (count
    /// zero, listed under `keys::TAG_KEPT_TOAST`): the capture may have reused it by content,
    /// and its commit counts the reuse only then. `release_kept` frees it after the capture if
    /// its count is still zero.
    pub(crate) fn release_toasts(
        &self,
        toast_decrements: HashMap<ToastId, u64>,
        batch: &mut WriteBatch,
    ) -> Result<Released> {
        let capture_open = self.catalog().active.is_some();
        self.release_toasts_keeping(toast_decrements, batch, capture_open)
    }

    /// [`Self::release_toasts`], keeping the values that reach zero if `capture_open` (an
    /// estimate counts them as freed whether a capture is open or not: a kept value is freed
    /// after the capture unless the capture reused it, and a reuse is a commit that forgets
    /// the kept estimates, `estimates.rs`).
    pub(crate) fn release_toasts_keeping(
        &self,
        toast_decrements: HashMap<ToastId, u64>,
        batch: &mut WriteBatch,
        capture_open: bool,
    ) -> Result<Released> {
        let items: Vec<(ToastId, [u8; 9])> = toast_decrements
            .keys()
            .map(|&t| (t, keys::toast_refs_key(t)))
            .collect();
        let mut freed = Freed::default();
        let mut still_named = false;
        for (t, key, count) in self.counts(&items)? {
            let dec = toast_decrements[&t];
            match count.checked_sub(dec) {
                Some(0) | None if capture_open => {
                    batch.put(Cf::Refs, &key, &0u64.to_be_bytes());
                    batch.put(
                        Cf::Catalog,
                        &keys::tagged_u64(keys::TAG_KEPT_TOAST, t.0),
                        &[],
                    );
                }
                Some(0) | None => freed.add(self.free_toast(t, batch)?),
                Some(left) => {
                    still_named = true;
                    batch.put(Cf::Refs, &key, &left.to_be_bytes())
                }
            }
        }
        Ok(Released { freed, still_named })
    }
}

/// The TOAST values image `id`'s list names (an image without a list names none).
fn decode_toast_list(id: ImageId, v: &[u8]) -> Result<Vec<ToastId>> {
    if !v.len().is_multiple_of(8) {
        return Err(StoreError::corrupt(format!(
            "the TOAST list of {id} has {} bytes, not a multiple of 8",
            v.len()
        )));
    }
    Ok(v.chunks_exact(8)
        .map(|c| ToastId(u64::from_be_bytes(c.try_into().expect("8 bytes"))))
        .collect())
}
