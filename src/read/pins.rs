//! What a backend pins while it reads snapshots: index groups in the shared group cache and
//! page images in the shared image cache. Everything pinned is unpinned when its guard is
//! dropped (also when an ERROR unwinds), and every view of pinned memory borrows its guard,
//! so the compiler checks that nothing reads a group or an image after its pin is gone.
//!
//! Images are read through [`ImageBatches`], the one implementation of "pin a batch, ask the
//! worker to load the next one meanwhile": a scan's decoding and the worker's store reads
//! overlap instead of adding up, and a batch is at most an eighth of the image cache, so
//! concurrent scans never hold all of it between them.
//!
//! A participant of a parallel scan asks for the images' stored records instead
//! ([`ImageBatches::decode_here`]) and decompresses them itself when it pins a batch: one
//! worker decompressing for every participant would make it the scan's bottleneck as
//! participants are added. Each image is decompressed into the slot its record was in (a
//! slot this backend alone pins, turned into the image's own, so later reads find the image),
//! or, when that cannot be (another reader pins the record, or someone else is loading the
//! image), into memory of the batch. A serial scan leaves decompression to the worker, whose
//! decompression of the next batch overlaps the scan's reading of this one.

use crate::error::{corrupt, corrupt_index, error};
use crate::ipc::{self, Pinned, PinnedGroups};
use crate::shmem::{self, groups};
use gsnap_core::cache::Extent;
use gsnap_core::{GroupReader, ImageId, SnapId};
use gsnap_protocol::{PinnedEntry, DELTA_OF, ENCODED, MAX_IDS_PER_REQUEST};
use gsnap_shmem::cache::CacheKey;
use pgrx::PgSqlErrorCode;
use std::collections::VecDeque;
use std::time::Duration;

/// Groups pinned in the shared group cache for this backend; unpinned when dropped.
pub struct GroupPins {
    pins: PinnedGroups,
}

impl GroupPins {
    /// Pins the groups holding snapshots `first..=last`. `record` tells the dividing policy
    /// about the access (queries do; internal lookups do not).
    pub fn pin(first: u64, last: u64, record: bool) -> GroupPins {
        GroupPins {
            pins: ipc::index_pin(SnapId(first), SnapId(last), record),
        }
    }

    /// Readers of the pinned groups, in snapshot order.
    pub fn views(&self) -> Vec<GroupReader<'_>> {
        let mut v: Vec<GroupReader<'_>> = self
            .pins
            .entries
            .iter()
            .map(|e| {
                let extent = Extent {
                    offset: e.offset,
                    size: e.size,
                };
                // SAFETY: this guard holds the group's pin until it is dropped, and the views
                // borrow the guard.
                let bytes = unsafe { groups::group_bytes(extent) };
                GroupReader::new(bytes).unwrap_or_else(|e| corrupt_index(e))
            })
            .collect();
        v.sort_by_key(|g| g.first_snap().unwrap_or(SnapId(0)));
        v
    }

    /// The reader of the group holding `snap`.
    pub fn view_of(&self, snap: u64) -> GroupReader<'_> {
        self.views()
            .into_iter()
            .find(|v| v.contains(SnapId(snap)))
            .unwrap_or_else(|| {
                error(
                    PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!("snapshot {snap} is committed but not in the snapshot index"),
                )
                .raise()
            })
    }
}

/// How many images one scan pins at once: a small share of the image cache.
pub fn images_per_batch() -> usize {
    (shmem::cache_capacity() / 8).clamp(1, 256)
}

/// How many small objects (page deltas) one scan pins at once: the same share of the cache,
/// as many as one answer of the worker can pin (a diff reads thousands of deltas of a few
/// hundred bytes each, and each batch costs a round trip).
pub fn small_objects_per_batch() -> usize {
    (shmem::cache_capacity() / 8).clamp(1, gsnap_protocol::MAX_PINNED_PER_REPLY)
}

/// Page images to read in order, each with the caller's key. [`ImageBatches::next_batch`]
/// pins the next batch (whole groups of images, at most [`images_per_batch`] unless one
/// group is bigger) and asks the worker to load the batch after it without waiting.
pub struct ImageBatches<K> {
    /// (key, image id, first image of its group).
    queued: VecDeque<(K, u64, bool)>,
    /// Images per batch (unless one group is bigger).
    per_batch: usize,
    /// Images are asked for as their stored records and decompressed here.
    decode_here: bool,
}

impl<K: Copy> Default for ImageBatches<K> {
    fn default() -> Self {
        ImageBatches {
            queued: VecDeque::new(),
            per_batch: images_per_batch(),
            decode_here: false,
        }
    }
}

impl<K: Copy> ImageBatches<K> {
    /// Batches of page deltas ([`small_objects_per_batch`] each).
    pub fn of_deltas() -> Self {
        ImageBatches {
            queued: VecDeque::new(),
            per_batch: small_objects_per_batch(),
            decode_here: false,
        }
    }

    /// From now on this backend decompresses the images it reads (a participant of a
    /// parallel scan): the worker only reads their records into the cache. Deltas are still
    /// decoded by the worker (they are small).
    pub fn decode_here(&mut self) {
        self.decode_here = true;
    }

    /// Whether [`ImageBatches::decode_here`] was called.
    pub fn decodes_here(&self) -> bool {
        self.decode_here
    }

    /// The id to ask the worker and the cache for: an image's record when this backend
    /// decompresses images.
    fn asked(&self, id: u64) -> u64 {
        if self.decode_here && id & DELTA_OF == 0 {
            id | ENCODED
        } else {
            id
        }
    }

    /// Queues one image.
    pub fn push(&mut self, key: K, image: u64) {
        self.queued.push_back((key, image, true));
    }

    /// Queues images that must be pinned together (the two sides of a page of a diff).
    pub fn push_group(&mut self, images: &[(K, u64)]) {
        for (i, &(key, image)) in images.iter().enumerate() {
            self.queued.push_back((key, image, i == 0));
        }
    }

    /// Puts `groups` (each: loads pinned together) back at the front of the queue, in this
    /// order, before everything queued.
    pub fn requeue_front(&mut self, groups: &[Vec<(K, u64)>]) {
        for group in groups.iter().rev() {
            for (i, &(key, image)) in group.iter().enumerate().rev() {
                self.queued.push_front((key, image, i == 0));
            }
        }
    }

    /// Images per batch (unless one group is bigger).
    pub fn per_batch(&self) -> usize {
        self.per_batch
    }

    /// Images queued and not pinned yet.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The number of queued images the next batch takes: whole groups, up to `limit` images
    /// (more only if the first group alone is bigger).
    fn batch_len(&self, limit: usize) -> usize {
        let mut n = 0;
        for (i, &(_, _, first)) in self.queued.iter().enumerate() {
            if first && n >= limit {
                break;
            }
            n = i + 1;
        }
        n
    }

    /// Pins the next batch and prefetches the one after it; None when nothing is queued.
    pub fn next_batch(&mut self) -> Option<PinnedBatch<K>> {
        if self.queued.is_empty() {
            return None;
        }
        let limit = self.per_batch;
        let n = self.batch_len(limit);
        let batch: Vec<(K, u64, bool)> = self.queued.drain(..n).collect();
        let ids: Vec<u64> = batch.iter().map(|&(_, id, _)| self.asked(id)).collect();
        let mut pins = pin_images(&ids);
        let own = if self.decode_here {
            decompress_records(&mut pins, &ids)
        } else {
            Vec::new()
        };
        let next = self.batch_len(limit);
        let upcoming: Vec<u64> = self
            .queued
            .iter()
            .take(next)
            .map(|&(_, id, _)| self.asked(id))
            .collect();
        prefetch_images(&upcoming);
        // Images decompressed into this batch's memory stand for their records.
        let mut own_at = own.iter().map(|(i, image)| (*i, image)).peekable();
        let mut images = Vec::with_capacity(pins.entries.len());
        for (i, (e, &(key, _, _))) in pins.entries.iter().zip(&batch).enumerate() {
            let bytes = match own_at.next_if(|&(at, _)| at == i) {
                Some((_, image)) => image.as_slice(),
                None => pins.bytes(e),
            };
            images.push((key, bytes.as_ptr(), bytes.len()));
        }
        Some(PinnedBatch {
            _pins: pins,
            _own: own.into_iter().map(|(_, image)| image).collect(),
            images,
        })
    }
}

/// A batch of pinned images; unpinned when dropped.
pub struct PinnedBatch<K> {
    /// Holds the pins the slices below rely on.
    _pins: Pinned,
    /// Images decompressed into memory of the batch, which slices below may point into.
    _own: Vec<Vec<u8>>,
    /// Per image (in queue order): its key, and where its bytes are: in the image cache or
    /// in `_own` (looked up once, when the batch is pinned: scans read them once per row).
    images: Vec<(K, *const u8, usize)>,
}

impl<K: Copy> PinnedBatch<K> {
    /// Images in the batch.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// Image `i` of the batch (in queue order) and its key.
    pub fn get(&self, i: usize) -> (K, &[u8]) {
        let (key, at, len) = self.images[i];
        // SAFETY: `at..at+len` is the pinned slot of image i (from `Pinned::bytes`) or an
        // image in `self._own`; the pin lives as long as `self._pins` and the image as long
        // as `self._own`, and the returned slice borrows both with `self`.
        (key, unsafe { std::slice::from_raw_parts(at, len) })
    }
}

/// Decompresses the images of `pins` whose slots hold their stored records (`ids[i]` was
/// asked for entry `i`; the slot's key says whether it holds the record or, for a record
/// larger than a slot or an image found decompressed, the image itself). A slot this backend
/// alone pins becomes the image's own slot, the image written over its record, so the next
/// reader finds the image; the others are decompressed into memory, returned by entry.
/// Images are checked against their fingerprints when `gsnap.verify_images` says so, as the
/// worker checks those it decompresses. A damaged record is an ERROR, the slots turned over
/// to images not written yet given back.
fn decompress_records(pins: &mut Pinned, ids: &[u64]) -> Vec<(usize, Vec<u8>)> {
    // (entry, whether its slot now loads the image) of the entries holding records.
    let records: Vec<(usize, bool)> = shmem::with_cache(|c| {
        let mut records = Vec::new();
        for (i, e) in pins.entries.iter().enumerate() {
            let slot = e.slot as usize;
            if c.key_of(slot).id & ENCODED != 0 {
                let image = CacheKey::image(ids[e.key as usize] & !ENCODED);
                records.push((i, c.rekey_loading(slot, image)));
            }
        }
        records
    });
    if records.is_empty() {
        return Vec::new();
    }
    let verify = crate::gucs::VERIFY_IMAGES.get();
    let mut own = Vec::new();
    let mut image = Vec::new();
    // The first record that did not decompress (by its position in `records`), and why.
    let mut failure = None;
    for (k, &(i, in_place)) in records.iter().enumerate() {
        let e = pins.entries[i];
        let decoded = gsnap_store::ImageRecordRef::parse(pins.bytes(&e)).and_then(|r| {
            image.resize(r.len(), 0);
            r.decode_into(&mut image, verify)
        });
        if let Err(err) = decoded {
            failure = Some((k, err));
            break;
        }
        shmem::count_reader_decode();
        if in_place {
            // SAFETY: the slot is loading for this backend alone (rekeyed while pinned by
            // it only): no lookup finds it and nothing evicts it until it is finished, and
            // an image fits a slot (`MAX_VIEW_BYTES` = `CACHE_SLOT_BYTES`).
            let slot = unsafe {
                std::slice::from_raw_parts_mut(shmem::cache_slot_ptr(e.slot as usize), image.len())
            };
            slot.copy_from_slice(&image);
            pins.entries[i].len = image.len() as u32;
        } else {
            own.push((i, std::mem::take(&mut image)));
        }
    }
    // The slots written hold their images from now on; on a failure, the others go back.
    let written = failure.as_ref().map_or(records.len(), |(k, _)| *k);
    shmem::with_cache(|c| {
        for (k, &(i, in_place)) in records.iter().enumerate() {
            let e = pins.entries[i];
            match (in_place, k < written) {
                (false, _) => {}
                (true, true) => c.finish_loading_as(e.slot as usize, e.len as usize),
                (true, false) => c.discard(e.slot as usize),
            }
        }
    });
    if let Some((k, err)) = failure {
        let id = ImageId(ids[pins.entries[records[k].0].key as usize] & !ENCODED);
        // The slots given back are no longer this backend's to unpin.
        let gone: Vec<usize> = records[k..]
            .iter()
            .filter(|&&(_, in_place)| in_place)
            .map(|&(i, _)| i)
            .collect();
        let entries = std::mem::take(&mut pins.entries);
        pins.entries = entries
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, e)| e)
            .collect();
        corrupt(format_args!("{id} in the image cache: {err}"));
    }
    own
}

/// Pins the images `ids` (entry `i` is `ids[i]`), waiting while the cache is full.
fn pin_images(ids: &[u64]) -> Pinned {
    let mut backoff = Duration::from_millis(1);
    loop {
        if let Some(pinned) = try_pin_images(ids) {
            return pinned;
        }
        // The cache is full of pages other queries hold. Holding part of a batch while
        // waiting for the rest could deadlock with a scan doing the same, so nothing is held
        // while we wait (cancellably) for them to move on.
        ipc::wait_latch(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(50));
    }
}

/// Asks the worker to load those of `ids` that are not in the image cache, without waiting
/// (see [`ipc::prefetch`]).
fn prefetch_images(ids: &[u64]) {
    let missing: Vec<ImageId> = shmem::with_cache(|c| {
        ids.iter()
            .copied()
            .filter(|&id| {
                !c.contains(&CacheKey::image(id)) && !c.contains(&CacheKey::image(id & !ENCODED))
            })
            .take(MAX_IDS_PER_REQUEST)
            .map(ImageId)
            .collect()
    });
    ipc::prefetch(&missing);
}

/// Pins all of `ids`, or nothing if the cache has no room for the missing ones.
fn try_pin_images(ids: &[u64]) -> Option<Pinned> {
    let mut entries: Vec<PinnedEntry> = Vec::with_capacity(ids.len());
    let mut missing = Vec::new();
    shmem::with_cache(|c| {
        for (i, &id) in ids.iter().enumerate() {
            // A record asked for: the image itself does better if it is cached decompressed.
            let image = CacheKey::image(id & !ENCODED);
            let key = if id & ENCODED != 0 && c.contains(&image) {
                image
            } else {
                CacheKey::image(id)
            };
            match c.lookup_pin(&key) {
                Some((slot, len)) => entries.push(PinnedEntry {
                    key: i as u32,
                    slot: slot as u32,
                    len: len as u32,
                }),
                None => missing.push(i),
            }
        }
    });
    // Dropping `pinned` unpins, on an error as on giving up.
    let mut pinned = Pinned { entries };
    let mut at = 0;
    while at < missing.len() {
        let chunk = &missing[at..(at + MAX_IDS_PER_REQUEST).min(missing.len())];
        // The worker pins a prefix of the chunk, at most its share of the cache per request.
        let mut got = ipc::load_images(chunk.iter().map(|&i| ImageId(ids[i])).collect());
        if got.entries.is_empty() {
            return None;
        }
        at += got.entries.len();
        // The pins move to `pinned`, rekeyed from the chunk's positions to the batch's.
        pinned.entries.extend(
            std::mem::take(&mut got.entries)
                .into_iter()
                .map(|e| PinnedEntry {
                    key: chunk[e.key as usize] as u32,
                    ..e
                }),
        );
    }
    pinned.entries.sort_unstable_by_key(|e| e.key);
    Some(pinned)
}
