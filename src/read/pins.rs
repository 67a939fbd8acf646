//! What a backend pins while it reads snapshots: index groups in the shared group cache and
//! page images in the shared image cache. Everything pinned is unpinned when its guard is
//! dropped (also when an ERROR unwinds), and every view of pinned memory borrows its guard,
//! so the compiler checks that nothing reads a group or an image after its pin is gone.
//!
//! Images are read through [`ImageBatches`], the one implementation of "pin a batch, ask the
//! worker to load the next one meanwhile": a scan's decoding and the worker's store reads
//! overlap instead of adding up, and a batch is at most an eighth of the image cache, so
//! that several scans hold theirs at once (a scan that finds no room waits holding nothing).
//!
//! In a parallel query, a process may wait for another while it holds a batch: a worker for
//! its leader to take its rows (through a queue of bounded size), a leader for its workers'
//! rows. Had each kept a batch of the usual size pinned, a leader waiting for room in the
//! cache while its workers waited for it, holding their batches, would wait forever. So
//! a process in a parallel query (its scans together, the leader's and the workers',
//! parallel-aware or not) keeps at most a share of the cache pinned that all the server's
//! backends can hold at once with room left ([`parallel_batch`]); beyond it, or where that
//! share is too small to be worth a request, a scan copies each batch out of the cache into
//! its own memory and unpins it at once. Such a scan
//! also asks for the images' stored records and decompresses them itself: one worker
//! decompressing for every participant would make it the scan's bottleneck as participants
//! are added. A record's slot that this backend alone pins becomes the image's own slot, the
//! image written over the record, so the next reader finds the image. A scan outside
//! parallel queries reads batches of the usual size in place (pinned while it returns their
//! rows, to a client nothing else waits for) and leaves decompression to the worker, whose
//! decompression of the next batch overlaps the scan's reading of this one.

use crate::error::{corrupt, corrupt_index, error};
use crate::ipc::{self, Pinned, PinnedGroups};
use crate::shmem::{self, groups};
use gsnap_core::cache::Extent;
use gsnap_core::{GroupReader, ImageId, SnapId};
use gsnap_protocol::{PinnedEntry, DELTA_OF, ENCODED, MAX_IDS_PER_REQUEST};
use gsnap_shmem::cache::CacheKey;
use pgrx::PgSqlErrorCode;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ops::Range;
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
}

impl<K: Copy> Default for ImageBatches<K> {
    fn default() -> Self {
        ImageBatches {
            queued: VecDeque::new(),
            per_batch: images_per_batch(),
        }
    }
}

impl<K: Copy> ImageBatches<K> {
    /// Batches of page deltas ([`small_objects_per_batch`] each).
    pub fn of_deltas() -> Self {
        ImageBatches {
            queued: VecDeque::new(),
            per_batch: small_objects_per_batch(),
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

    /// Pins the next batch and prefetches the one after it; None when nothing is queued. In
    /// a parallel query the batch is smaller, or copied out of the cache and unpinned at
    /// once, and its images are decompressed here (see the module comment).
    pub fn next_batch(&mut self) -> Option<PinnedBatch<K>> {
        if self.queued.is_empty() {
            return None;
        }
        // SAFETY: reads the current transaction's state.
        let parallel = unsafe { pgrx::pg_sys::IsInParallelMode() };
        // The id to ask the worker and the cache for: a record to decompress here, or the
        // image (or delta: small, always decoded by the worker).
        let asked = |id: u64| {
            if parallel && id & DELTA_OF == 0 {
                id | ENCODED
            } else {
                id
            }
        };
        let (limit, copy_out) = if parallel {
            parallel_batch(self.per_batch)
        } else {
            (self.per_batch, false)
        };
        let n = self.batch_len(limit);
        let batch: Vec<(K, u64, bool)> = self.queued.drain(..n).collect();
        let ids: Vec<u64> = batch.iter().map(|&(_, id, _)| asked(id)).collect();
        let pins = pin_images(&ids);
        let (pins, own) = if parallel {
            take_images(pins, &ids, copy_out)
        } else {
            (Some(pins), CopiedOut::default())
        };
        let next = self.batch_len(limit);
        let upcoming: Vec<u64> = self
            .queued
            .iter()
            .take(next)
            .map(|&(_, id, _)| asked(id))
            .collect();
        prefetch_images(&upcoming);
        let images = batch
            .iter()
            .enumerate()
            .map(|(i, &(key, _, _))| {
                let bytes = match (own.spans.get(i).cloned().flatten(), &pins) {
                    (Some(span), _) => &own.bytes[span],
                    (None, Some(pins)) => pins.bytes(&pins.entries[i]),
                    (None, None) => unreachable!("a batch copied out has every image"),
                };
                (key, bytes.as_ptr(), bytes.len())
            })
            .collect();
        // Pinned in place by a scan of a parallel query: counted against its share.
        let held = if parallel && !copy_out { n } else { 0 };
        HELD_IN_PARALLEL.with(|h| h.set(h.get() + held));
        Some(PinnedBatch {
            _pins: pins,
            own,
            held,
            images,
        })
    }
}

/// Below this many images per batch a scan in a parallel query copies its batches out of the
/// cache rather than pin them while it returns their rows.
const MIN_PINNED_IN_PLACE: usize = 16;

thread_local! {
    /// Images this process keeps pinned in place for scans of a parallel query (all its scans
    /// together: a join may read two snapshots at once).
    static HELD_IN_PARALLEL: Cell<usize> = const { Cell::new(0) };
}

/// The next batch of a scan in a parallel query: how many images (at most `per_batch`), and
/// whether to copy it out. A process keeps at most a share of the cache pinned in place, one
/// that every backend of the server can hold at once with that much room left, so that a
/// process waiting for room never waits for processes that wait for it (a worker for its
/// leader to take its rows, a leader for its workers). Beyond its share, or where the share
/// is too small to be worth a request, batches are copied out (no bigger than the share, or
/// than 16 images: pinned only while they are copied, waiting for nobody).
fn parallel_batch(per_batch: usize) -> (usize, bool) {
    // SAFETY: set at postmaster start, read-only afterwards.
    let backends = usize::try_from(unsafe { pgrx::pg_sys::MaxBackends }).unwrap_or(0);
    let share = shmem::cache_capacity() / (backends + 1);
    let room = share.saturating_sub(HELD_IN_PARALLEL.with(Cell::get));
    if share < MIN_PINNED_IN_PLACE {
        (MIN_PINNED_IN_PLACE.min(per_batch), true)
    } else if room < MIN_PINNED_IN_PLACE {
        (share.min(per_batch), true)
    } else {
        (room.min(per_batch), false)
    }
}

/// The images of a batch decompressed or copied into this backend's memory: one after
/// another in `bytes`, image `i` at `spans[i]` (None: read in place from its pinned slot).
#[derive(Default)]
struct CopiedOut {
    bytes: Vec<u8>,
    spans: Vec<Option<Range<usize>>>,
}

thread_local! {
    /// The memory of the last batch copied out and let go, for the next one: a batch is up to
    /// a few MB, and memory freshly mapped for each would cost more page faults than the copy.
    static SPARE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A batch of images, pinned in the image cache (unpinned when dropped) or copied out of it.
pub struct PinnedBatch<K> {
    /// Holds the pins the slices below rely on (None: the batch was copied out).
    _pins: Option<Pinned>,
    /// The images copied out of the cache, which the slices below point into.
    own: CopiedOut,
    /// Images pinned in place counted in `HELD_IN_PARALLEL`.
    held: usize,
    /// Per image (in queue order): its key, and where its bytes are: in the image cache or
    /// in `own` (looked up once, when the batch is pinned: scans read them once per row).
    images: Vec<(K, *const u8, usize)>,
}

impl<K> Drop for PinnedBatch<K> {
    fn drop(&mut self) {
        HELD_IN_PARALLEL.with(|h| h.set(h.get().saturating_sub(self.held)));
        let bytes = std::mem::take(&mut self.own.bytes);
        if bytes.capacity() > 0 {
            SPARE.with(|spare| {
                let mut spare = spare.borrow_mut();
                if bytes.capacity() > spare.capacity() {
                    *spare = bytes;
                }
            });
        }
    }
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
        // image in `self.own` (whose bytes never move while the batch lives); the pin lives
        // as long as `self._pins` and the image as long as `self.own`, and the returned slice
        // borrows both with `self`.
        (key, unsafe { std::slice::from_raw_parts(at, len) })
    }
}

/// Decompresses the images of the batch `pins` (entry `i` asked for `ids[i]`) whose slots
/// hold their stored records (the slot's key says so; a record larger than a slot, or an
/// image found decompressed, is the image itself), checked against their fingerprints when
/// `gsnap.verify_images` says so, as the worker checks those it decompresses. A record's slot
/// that only this backend pins becomes the image's own slot, the image written over the
/// record, so the next reader finds the image; another record is decompressed into this
/// backend's memory. With `copy_all`, every image is copied into that memory and the batch
/// unpinned (None). A damaged record is an ERROR; the slots turned over to images not
/// written yet are given back.
fn take_images(mut pins: Pinned, ids: &[u64], copy_all: bool) -> (Option<Pinned>, CopiedOut) {
    // Per entry: None for an image, Some(whether its slot now loads the image) for a record.
    let records: Vec<Option<bool>> = shmem::with_cache(|c| {
        let mut records = Vec::with_capacity(pins.entries.len());
        for e in &pins.entries {
            let slot = e.slot as usize;
            records.push((c.key_of(slot).id & ENCODED != 0).then(|| {
                let image = CacheKey::image(ids[e.key as usize] & !ENCODED);
                c.rekey_loading(slot, image)
            }));
        }
        records
    });
    // Each record's header, read once; where each image copied here goes, and each image's
    // length: the slot's, or the one its record's header says (none for a damaged header,
    // which fails below when the record is to be decompressed).
    let parsed: Vec<_> = pins
        .entries
        .iter()
        .zip(&records)
        .map(|(e, record)| record.map(|_| gsnap_store::ImageRecordRef::parse(pins.bytes(e))))
        .collect();
    let mut spans = Vec::with_capacity(pins.entries.len());
    let mut lens = Vec::with_capacity(pins.entries.len());
    let mut end = 0;
    for ((e, record), header) in pins.entries.iter().zip(&records).zip(&parsed) {
        let len = match header {
            None => e.len as usize,
            Some(header) => header.as_ref().map_or(0, |r| r.len()),
        };
        lens.push(len);
        let here = copy_all || *record == Some(false);
        spans.push(here.then(|| end..end + len));
        end += if here { len } else { 0 };
    }
    let mut bytes = SPARE.with(|spare| std::mem::take(&mut *spare.borrow_mut()));
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    let mut scratch = Vec::new();
    let verify = crate::gucs::VERIFY_IMAGES.get();
    // The first entry whose record did not decompress, and why; the records decompressed.
    let mut failure = None;
    let mut decoded_here = 0;
    for (i, ((e, record), header)) in pins.entries.iter().zip(&records).zip(parsed).enumerate() {
        let (Some(in_place), Some(header)) = (*record, header) else {
            // An image: copied out, or read in place from its slot.
            if let Some(span) = &spans[i] {
                bytes[span.clone()].copy_from_slice(pins.bytes(e));
            }
            continue;
        };
        // A record: decompressed into the batch's memory (and from there copied over its
        // record, when the slot is turned over to the image), or, when the image is written
        // over its record and not copied out, the record (a few kB) copied into scratch
        // memory first and decompressed from there straight into the slot.
        let decoded = match &spans[i] {
            Some(span) => header
                .and_then(|r| r.decode_into(&mut bytes[span.clone()], verify))
                .map(|()| {
                    if in_place {
                        // SAFETY: turned over to this backend's image above; the header that
                        // borrowed the slot is gone.
                        unsafe { loading_slot(e, span.len()) }
                            .copy_from_slice(&bytes[span.clone()]);
                    }
                }),
            None => {
                scratch.clear();
                scratch.extend_from_slice(pins.bytes(e));
                // (The header read in the slot is dropped here, before the slot is written.)
                header
                    .and_then(|_| gsnap_store::ImageRecordRef::parse(&scratch))
                    // SAFETY: turned over to this backend's image above; nothing borrows
                    // the slot's bytes any more (the record is decompressed from its copy).
                    .and_then(|r| r.decode_into(unsafe { loading_slot(e, lens[i]) }, verify))
            }
        };
        if let Err(err) = decoded {
            failure = Some((i, err));
            break;
        }
        decoded_here += 1;
    }
    shmem::count_reader_decodes(decoded_here);
    // The slots written hold their images from now on; on a failure, the others go back and
    // are no longer this backend's to unpin.
    let written = failure.as_ref().map_or(records.len(), |(i, _)| *i);
    let mut given_back = Vec::new();
    shmem::with_cache(|c| {
        for (i, (e, record)) in pins.entries.iter().zip(&records).enumerate() {
            if *record == Some(true) {
                if i < written {
                    c.finish_loading_as(e.slot as usize, lens[i]);
                } else {
                    c.discard(e.slot as usize);
                    given_back.push(i);
                }
            }
        }
    });
    for &i in &given_back {
        Pinned::discarded(pins.entries[i].slot);
    }
    if let Some((i, err)) = failure {
        let id = ImageId(ids[pins.entries[i].key as usize] & !ENCODED);
        let entries = std::mem::take(&mut pins.entries);
        pins.entries = entries
            .into_iter()
            .enumerate()
            .filter(|(k, _)| !given_back.contains(k))
            .map(|(_, e)| e)
            .collect();
        drop(pins);
        corrupt(format_args!("{id} in the image cache: {err}"));
    }
    // A slot turned over to its image now holds that many bytes.
    for ((e, record), len) in pins.entries.iter_mut().zip(&records).zip(&lens) {
        if *record == Some(true) {
            e.len = *len as u32;
        }
    }
    let own = CopiedOut { bytes, spans };
    if copy_all {
        drop(pins);
        (None, own)
    } else {
        (Some(pins), own)
    }
}

/// The first `len` bytes of the slot of `e`, to write its image into.
///
/// # Safety
///
/// The slot must be one this backend turned over to its image (`CacheIndex::rekey_loading`
/// while pinned by it alone): loading, so no lookup finds it and nothing evicts it until it
/// is finished, and written by this backend only. Nothing may borrow its bytes while the
/// returned slice lives, and `len` is at most a slot (an image fits one: `MAX_VIEW_BYTES` =
/// `CACHE_SLOT_BYTES`).
unsafe fn loading_slot<'a>(e: &PinnedEntry, len: usize) -> &'a mut [u8] {
    // SAFETY: the caller's promise above.
    unsafe { std::slice::from_raw_parts_mut(shmem::cache_slot_ptr(e.slot as usize), len) }
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
    let mut pinned = Pinned::adopt(entries);
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
