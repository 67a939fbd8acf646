//! A backend's use of the GSnap index and the image cache: pin the groups holding the
//! snapshots a query reads (the worker loads them into the shared group cache), walk their
//! trees in place to find each block's image, and pin the images in the image cache (asking
//! the worker to load only the ones not there yet).

use crate::error::error;
use crate::ipc::protocol::{self, GroupEntry, Kind, PinnedEntry};
use crate::ipc::{self, Pinned};
use crate::shmem::{self, groups};
use gsnap_core::cache::Extent;
use gsnap_core::{GroupView, IndexError, SnapId};
use gsnap_shmem::cache::CacheKey;
use gsnap_shmem::requests::REPLY_BYTES;
use pgrx::PgSqlErrorCode;
use std::time::Duration;

/// Raises an index error as a PostgreSQL ERROR.
pub fn index_error(e: IndexError) -> ! {
    error(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("gsnap snapshot index: {e}"),
    )
    .raise()
}

/// Groups pinned in the shared group cache for this backend; unpinned when dropped.
pub struct GroupPins {
    entries: Vec<GroupEntry>,
}

impl GroupPins {
    /// Pins the groups holding snapshots `first..=last`. `record` tells the dividing policy
    /// about the access (queries do; internal lookups do not).
    pub fn pin(first: u64, last: u64, record: bool) -> GroupPins {
        let a = ipc::call(
            Kind::IndexPin,
            &[first as i64, last as i64, i64::from(record)],
        );
        GroupPins {
            entries: protocol::decode_groups(&a.reply),
        }
    }

    /// Views of the pinned groups, in snapshot order. They read shared memory that stays
    /// valid while `self` holds the pins: do not use them after dropping `self`.
    pub fn views(&self) -> Vec<GroupView<'static>> {
        let mut v: Vec<GroupView<'static>> = self
            .entries
            .iter()
            .map(|e| {
                let bytes = groups::group_bytes(Extent {
                    offset: e.offset,
                    size: e.size,
                });
                GroupView::new(bytes).unwrap_or_else(|e| index_error(e))
            })
            .collect();
        v.sort_by_key(|g| g.first_snap().unwrap_or(SnapId(0)));
        v
    }

    /// The view of the group holding `snap` (valid while `self` holds the pins).
    pub fn view_of(&self, snap: u64) -> GroupView<'static> {
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

impl Drop for GroupPins {
    fn drop(&mut self) {
        protocol::unpin_groups(&self.entries);
    }
}

/// Images per LoadImages request (the ids travel in the request's reply buffer).
const IDS_PER_REQUEST: usize = REPLY_BYTES / 8;

/// How many images one scan pins at once: a small share of the image cache, so concurrent
/// scans never hold the whole cache between them.
pub fn images_per_batch() -> usize {
    (shmem::cache_capacity() / 8).clamp(1, 256)
}

/// Pins the images `ids` in the image cache; entry `key` is the position in `ids`. `ids`
/// should number at most [`images_per_batch`].
pub fn pin_images(ids: &[u64]) -> Pinned {
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
/// (see [`ipc::prefetch`]): the caller pins them later, when it gets to them.
pub fn prefetch_images(ids: &[u64]) {
    let missing: Vec<u64> = shmem::with_cache(|c| {
        ids.iter()
            .copied()
            .filter(|&id| !c.contains(&CacheKey::image(id)))
            .take(IDS_PER_REQUEST)
            .collect()
    });
    ipc::prefetch(&missing);
}

/// Calls `each(batch, ids, pinned)` for the consecutive batches of `per_batch` items, with
/// the images `ids_of(batch)` pinned; the next batch's images are prefetched while `each`
/// reads the current one.
pub fn for_each_pinned_batch<T>(
    items: &[T],
    per_batch: usize,
    ids_of: impl Fn(&[T]) -> Vec<u64>,
    mut each: impl FnMut(&[T], &[u64], &Pinned),
) {
    let mut batches = items.chunks(per_batch.max(1)).peekable();
    while let Some(batch) = batches.next() {
        let ids = ids_of(batch);
        let pinned = pin_images(&ids);
        if let Some(next) = batches.peek() {
            prefetch_images(&ids_of(next));
        }
        each(batch, &ids, &pinned);
    }
}

/// Pins all of `ids`, or nothing if the cache has no room for the missing ones.
fn try_pin_images(ids: &[u64]) -> Option<Pinned> {
    let mut entries: Vec<PinnedEntry> = Vec::with_capacity(ids.len());
    let mut missing = Vec::new();
    shmem::with_cache(|c| {
        for (i, &id) in ids.iter().enumerate() {
            match c.lookup_pin(&CacheKey::image(id)) {
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
        let chunk = &missing[at..(at + IDS_PER_REQUEST).min(missing.len())];
        let payload: Vec<u8> = chunk.iter().flat_map(|&i| ids[i].to_le_bytes()).collect();
        let answer = ipc::call_with_payload(Kind::LoadImages, &[], &payload);
        // The worker pins a prefix of the chunk, at most its share of the cache per request.
        let got = protocol::decode_pinned(&answer.reply);
        if got.is_empty() {
            return None;
        }
        at += got.len();
        pinned.entries.extend(got.into_iter().map(|e| PinnedEntry {
            key: chunk[e.key as usize] as u32,
            ..e
        }));
    }
    pinned.entries.sort_unstable_by_key(|e| e.key);
    Some(pinned)
}
