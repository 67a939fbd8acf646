//! Reading content: page images and TOAST values. (Which image a page has at a snapshot is
//! the mapping log's business, `maplog.rs`.)
//!
//! Invariants: every TOAST chunk returned was checked against its BLAKE3 hash, and every
//! image too unless [`SnapshotStore::set_verify_images`] turned that off; a missing record is
//! NotFound, a damaged one Corrupt, never default content.

use crate::backend::KvBackend;
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, Rank, ToastId};
use crate::keys::{self, Cf};
use crate::records::{self, ImageRecord, ImageRecordRef, ToastInfo};
use crate::store::SnapshotStore;
use std::ops::Range;

impl<B: KvBackend> SnapshotStore<B> {
    /// The decompressed view stored as image `id`.
    pub fn image(&self, id: ImageId) -> Result<Vec<u8>> {
        let v = self
            .backend
            .get(Cf::Images(keys::image_rank(id)), &keys::image_key(id))?;
        self.image_content(id, v)
    }

    /// Several images at once (one batched read per rank), in the order of `ids`.
    pub fn images(&self, ids: &[ImageId]) -> Result<Vec<Vec<u8>>> {
        let verify = self
            .verify_images
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut buf = Vec::new();
        self.image_records_in(ids, &mut buf)?
            .into_iter()
            .zip(ids)
            .map(|(r, id)| {
                let mut raw = vec![0; r.len()];
                r.decode_into(&mut raw, verify)
                    .map_err(|e| self.in_store(e, *id))?;
                Ok(raw)
            })
            .collect()
    }

    /// The records of several images (one batched read per rank), in the order of `ids`, to
    /// be decompressed by the caller where the images go ([`ImageRecordRef::decode_into`],
    /// with [`SnapshotStore::verifies_images`]). The records are copied into `buf` (cleared
    /// first), which the caller keeps from one batch to the next: a read then allocates
    /// nothing per record, nor a new buffer per batch.
    pub fn image_records_in<'b>(
        &self,
        ids: &[ImageId],
        buf: &'b mut Vec<u8>,
    ) -> Result<Vec<ImageRecordRef<'b>>> {
        buf.clear();
        let mut spans: Vec<Option<Range<usize>>> = vec![None; ids.len()];
        let mut ranks: Vec<Rank> = ids.iter().map(|&id| keys::image_rank(id)).collect();
        ranks.sort_unstable();
        ranks.dedup();
        for rank in ranks {
            let at: Vec<usize> = (0..ids.len())
                .filter(|&i| keys::image_rank(ids[i]) == rank)
                .collect();
            let keys: Vec<[u8; 8]> = at.iter().map(|&i| keys::image_key(ids[i])).collect();
            visit_in_key_order(&self.backend, Cf::Images(rank), &keys, |k, v| {
                let start = buf.len();
                buf.extend_from_slice(v);
                spans[at[k]] = Some(start..buf.len());
            })?;
        }
        let buf: &'b [u8] = buf;
        ids.iter()
            .zip(spans)
            .map(|(id, span)| match span {
                Some(span) => ImageRecordRef::parse(&buf[span]).map_err(|e| self.in_store(e, *id)),
                None => Err(self.missing(*id)),
            })
            .collect()
    }

    /// The deltas stored with images `ids` ([`crate::Capture::put_delta`]), in the order of
    /// `ids`: None for an image stored without one (or freed). Records to decompress like
    /// images'.
    pub fn deltas(&self, ids: &[ImageId]) -> Result<Vec<Option<ImageRecord>>> {
        let keys: Vec<[u8; 8]> = ids.iter().map(|&id| keys::delta_key(id)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        ids.iter()
            .zip(self.backend.multi_get(Cf::Deltas, &refs)?)
            .map(|(id, v)| {
                v.map(|v| {
                    ImageRecord::parse(v).map_err(|e| e.context(format_args!("the delta of {id}")))
                })
                .transpose()
            })
            .collect()
    }

    /// Whether image reads check each image against its BLAKE3 fingerprint.
    pub fn verifies_images(&self) -> bool {
        self.verify_images
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn in_store(&self, e: StoreError, id: ImageId) -> StoreError {
        e.context(format_args!("{} in {}", id, self.backend.describe()))
    }

    fn missing(&self, id: ImageId) -> StoreError {
        StoreError::not_found(format!(
            "{} in {} does not exist",
            id,
            self.backend.describe()
        ))
    }

    /// Whether image reads check each image against its BLAKE3 fingerprint (on by default).
    /// The backend's own checksums (RocksDB's per-block CRC32c) are checked either way; the
    /// fingerprint adds an end-to-end check that costs a hash of every image read.
    pub fn set_verify_images(&self, on: bool) {
        self.verify_images
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn image_content(&self, id: ImageId, v: Option<Vec<u8>>) -> Result<Vec<u8>> {
        let verify = self
            .verify_images
            .load(std::sync::atomic::Ordering::Relaxed);
        match v {
            Some(v) => records::decode_image(&v, verify).map_err(|e| self.in_store(e, id)),
            None => Err(self.missing(id)),
        }
    }

    /// Length, chunk count and fingerprint of TOAST value `id`.
    pub fn toast_info(&self, id: ToastId) -> Result<ToastInfo> {
        match self.backend.get(Cf::Toast, &keys::toast_header_key(id))? {
            Some(v) => records::decode_toast_header(&v),
            None => Err(StoreError::not_found(format!("{id} does not exist"))),
        }
    }

    /// Chunk `chunk` (0-based) of TOAST value `id`: at most [`crate::TOAST_CHUNK_BYTES`].
    pub fn toast_chunk(&self, id: ToastId, chunk: u32) -> Result<Vec<u8>> {
        let what = format!("chunk {chunk} of {id}");
        match self
            .backend
            .get(Cf::Toast, &keys::toast_chunk_key(id, chunk))?
        {
            Some(v) => records::decode_toast_chunk(&v, &what),
            None => Err(StoreError::not_found(format!("{what} does not exist"))),
        }
    }

    /// The whole TOAST value `id`, checked against its fingerprint.
    pub fn toast_value(&self, id: ToastId) -> Result<Vec<u8>> {
        let info = self.toast_info(id)?;
        let mut value = Vec::with_capacity(usize::try_from(info.len).unwrap_or(0));
        for chunk in 0..info.chunks {
            value.extend_from_slice(&self.toast_chunk(id, chunk)?);
        }
        if value.len() as u64 != info.len || crate::ids::Fingerprint::of(&value) != info.fingerprint
        {
            return Err(StoreError::corrupt(format!(
                "{id} does not match its recorded length and fingerprint (checksum mismatch)"
            )));
        }
        Ok(value)
    }
}

/// Entries a cursor steps over to reach the next key before it seeks instead.
const MAX_STEPS: usize = 16;

/// The values of `keys` of `cf`, in the order of `keys`, read by [`visit_in_key_order`] (the
/// tests compare them with point lookups).
#[cfg(test)]
fn read_in_key_order<B: KvBackend>(
    backend: &B,
    cf: Cf,
    keys: &[[u8; 8]],
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut values: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
    visit_in_key_order(backend, cf, keys, |i, v| values[i] = Some(v.to_vec()))?;
    Ok(values)
}

/// Calls `found(i, value)` for each of `keys` that `cf` holds (`i` its position in `keys`),
/// in key order, walking one cursor that steps from one key to the next when they are near
/// (the images of a scan's batch are mostly consecutive: a capture numbers a table's new
/// images in block order) and seeks otherwise. A point lookup per key searched the family's
/// index and a data block for each one: a third of the worker's CPU serving a sequential AS OF
/// scan. The value is borrowed from the cursor: the caller copies what it keeps.
pub(crate) fn visit_in_key_order<B: KvBackend>(
    backend: &B,
    cf: Cf,
    keys: &[[u8; 8]],
    mut found: impl FnMut(usize, &[u8]),
) -> Result<()> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_unstable_by_key(|&i| keys[i]);
    let Some(&first) = order.first() else {
        return Ok(());
    };
    let mut cursor = backend.cursor(cf)?;
    cursor.seek(&keys[first])?;
    for i in order {
        let key = &keys[i][..];
        // Forward to the first entry >= key (at the end, no later key is stored either).
        let mut steps = 0;
        while let Some((k, _)) = cursor.current() {
            if k >= key {
                break;
            }
            if steps == MAX_STEPS {
                cursor.seek(key)?;
                break;
            }
            cursor.next()?;
            steps += 1;
        }
        if let Some((k, v)) = cursor.current() {
            if k == key {
                found(i, v);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::WriteBatch;
    use crate::mem::MemBackend;
    use crate::rocks::RocksBackend;
    use proptest::prelude::*;

    /// Reading in key order (and a batched read, and the values' sizes) gives what a point
    /// lookup per key gives: keys present and missing, repeated, unsorted, near each other
    /// (steps) and far apart (seeks), before the first entry and past the last, some deleted,
    /// some in the memtable and some flushed.
    fn same_as_point_lookups<B: KvBackend>(
        backend: &B,
        stored: &[u64],
        deleted: &[u64],
        asked: &[u64],
    ) {
        let cf = Cf::Images(Rank(0));
        let mut b = WriteBatch::new();
        for &k in stored {
            b.put(
                cf,
                &k.to_be_bytes(),
                &k.to_le_bytes().repeat((k % 5) as usize + 1),
            );
        }
        backend.write(&b, false).unwrap();
        let mut b = WriteBatch::new();
        for &k in deleted {
            b.delete(cf, &k.to_be_bytes());
        }
        backend.write(&b, false).unwrap();
        let keys: Vec<[u8; 8]> = asked.iter().map(|k| k.to_be_bytes()).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let expected: Vec<Option<Vec<u8>>> =
            refs.iter().map(|k| backend.get(cf, k).unwrap()).collect();
        assert_eq!(read_in_key_order(backend, cf, &keys).unwrap(), expected);
        assert_eq!(backend.multi_get(cf, &refs).unwrap(), expected);
        let sizes: Vec<Option<usize>> = expected.iter().map(|v| v.as_ref().map(Vec::len)).collect();
        assert_eq!(backend.value_sizes(cf, &refs).unwrap(), sizes);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn reading_in_key_order_equals_point_lookups(
            stored in prop::collection::vec(0u64..400, 0..200),
            deleted in prop::collection::vec(0u64..400, 0..40),
            asked in prop::collection::vec(0u64..420, 0..120),
        ) {
            same_as_point_lookups(&MemBackend::new(), &stored, &deleted, &asked);
            let dir = tempfile::tempdir().unwrap();
            let rocks = RocksBackend::open(&dir.path().join("s"), true).unwrap();
            same_as_point_lookups(&rocks, &stored, &deleted, &asked);
        }
    }

    #[test]
    fn a_batch_of_consecutive_images_is_read_across_flushed_files() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksBackend::open(&dir.path().join("s"), true).unwrap();
        let cf = Cf::Images(Rank(0));
        for part in 0..4u64 {
            let mut b = WriteBatch::new();
            for k in (part * 1000)..(part * 1000 + 1000) {
                if k % 7 != 3 {
                    b.put(cf, &k.to_be_bytes(), &k.to_le_bytes());
                }
            }
            rocks.write(&b, false).unwrap();
            // (into table files: a compaction flushes the memtable first)
            let (from, to) = (part * 1000, part * 1000 + 1000);
            rocks
                .compact_range(cf, &from.to_be_bytes(), &to.to_be_bytes())
                .unwrap();
        }
        // the last part stays in the memtable
        let mut b = WriteBatch::new();
        for k in 4000..4100u64 {
            b.put(cf, &k.to_be_bytes(), &k.to_le_bytes());
        }
        rocks.write(&b, false).unwrap();
        let asked: Vec<u64> = (500..4200).rev().chain([0, 3999, 5000]).collect();
        same_as_point_lookups(&rocks, &[], &[], &asked);
    }
}
