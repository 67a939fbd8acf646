//! Answering backends' requests: catalog listings, snapshot resolution, and the page images
//! and TOAST chunks of scans, which are loaded into the shared cache pinned for the asking
//! backend (see `crate::ipc`).
//!
//! Each request is decoded from its slot and answered with one typed [`Reply`] or a
//! [`WorkerError`], encoded here ([`encode_answer`]); a reply whose pins the backend will
//! never see (it cannot be encoded, or the backend gave the request up) has them released
//! before the slot is let go.

use super::declare::PendingDeclare;
use super::{code_of, Store, Worker};
use crate::ipc;
use crate::shmem::{self, CACHE_SLOT_BYTES};
use gsnap_format::rowtype::RowType;
use gsnap_protocol::listing::{self, ScanHeader, SnapshotRow, TableRow};
use gsnap_protocol::{
    ErrorCode, Kind, Page, PinnedEntry, Reply, Request, WorkerError, DELTA_OF, ENCODED,
    MAX_PINNED_PER_REPLY,
};
use gsnap_shmem::cache::{CacheError, CacheKey};
use gsnap_store::{
    ErrorKind, ImageId, ImageRecord, ImageRecordRef, RelId, SnapId, SnapshotState, StoreError,
    ToastId,
};
use std::collections::HashMap;
use std::rc::Rc;

fn fail(e: StoreError) -> WorkerError {
    WorkerError::new(code_of(&e), e.message())
}

/// A failure to load content a snapshot names (a page image, a TOAST value): missing is
/// corruption, not an unknown snapshot.
fn load_failure(e: StoreError) -> WorkerError {
    match e.kind() {
        ErrorKind::NotFound => WorkerError::new(ErrorCode::Corrupt, e.message()),
        _ => fail(e),
    }
}

/// A listing that cannot be encoded (a bug: its counts are far below the limits).
pub(super) fn unencodable(what: &str, e: gsnap_protocol::EncodeError) -> WorkerError {
    WorkerError::new(
        ErrorCode::Internal,
        format!("the {what} cannot be encoded: {e}"),
    )
}

/// The answer bytes for a request of kind `kind`. A reply that cannot be encoded has its
/// pins released and becomes an internal error.
pub(super) fn encode_answer(kind: Kind, answer: Result<Reply, WorkerError>) -> Vec<u8> {
    let error = match answer {
        Ok(reply) => match reply.encode(kind) {
            Ok(bytes) => return bytes,
            Err(e) => {
                ipc::release(&reply);
                WorkerError::new(
                    ErrorCode::Internal,
                    format!("the gsnap worker cannot answer a {kind:?} request: {e}"),
                )
            }
        },
        Err(e) => e,
    };
    error.encode()
}

/// The key of a cached listing: the request kind and what it lists (a snapshot, or 0).
pub(super) fn answer_key(kind: Kind, key: u64) -> (u32, i64) {
    (kind.tag(), key as i64)
}

impl Worker {
    /// Takes every submitted request; declarations join the pending list, the rest are
    /// answered at once.
    pub(super) fn serve_requests(&mut self) {
        for i in 0..shmem::request_slot_count() {
            let slot = shmem::request_slot(i);
            if !slot.is_submitted() {
                continue;
            }
            let Some(body) = slot.take() else { continue };
            let requester = body.requester;
            let answer = match Request::decode(body.kind, body.message()) {
                Ok(Request::Declare {
                    wait,
                    export,
                    label,
                    rank,
                }) => {
                    self.pending.push(PendingDeclare {
                        slot: Some(i),
                        wait,
                        export,
                        periodic: false,
                        label,
                        rank,
                    });
                    continue;
                }
                Ok(request) => {
                    let kind = request.kind();
                    encode_answer(kind, self.answer(request))
                }
                Err(e) => WorkerError::new(
                    ErrorCode::Internal,
                    format!("the gsnap worker cannot decode a request: {e}"),
                )
                .encode(),
            };
            body.set_message(&answer);
            slot.finish(|b| ipc::release_answer(b.kind, b.message()));
            ipc::set_latch_of(requester as usize);
        }
    }

    fn answer(&mut self, request: Request) -> Result<Reply, WorkerError> {
        if let Request::ReleaseExport { snap } = request {
            self.exports.retain(|&s| s != snap.0);
            return Ok(Reply::Done);
        }
        let store = &self
            .store
            .clone()
            .ok_or_else(|| match self.store_problem.clone() {
                Some((code, message)) => WorkerError::new(code, message),
                None => WorkerError::new(ErrorCode::Io, "the gsnap store is not open"),
            })?;
        match request {
            Request::Snapshots { offset } => {
                self.frees_wanted();
                let frees = self.frees_known();
                let blob =
                    self.cached(answer_key(Kind::Snapshots, 0), || listing(store, &frees))?;
                page(&blob, offset)
            }
            Request::SnapshotTables { snap, offset } => {
                let key = answer_key(Kind::SnapshotTables, snap.0);
                let blob = self.cached(key, || tables(store, snap))?;
                page(&blob, offset)
            }
            Request::ResolveTime { unix_us } => Ok(Reply::Resolved {
                snap: resolve_time(store, unix_us)?,
            }),
            Request::ScanBegin {
                snap,
                relid,
                offset,
            } => {
                let begun = scan_begin(store, snap, relid, offset);
                if begun
                    .as_ref()
                    .is_err_and(|e| e.code == ErrorCode::Capturing)
                {
                    // A reader waits for a capture (it asks again every 20 ms): phase two
                    // stops pacing.
                    self.capture_awaited = Some(snap.0);
                }
                begun
            }
            Request::IndexPin {
                first,
                last,
                record_access,
            } => self.index_pin(first, last, record_access),
            Request::LoadImages { ids } => Ok(Reply::ImagesPinned {
                entries: load_images(store, &ids, &mut self.read_buffer)?,
            }),
            Request::Prefetch { ids } => {
                // Left in the cache for the scan's next LoadImages, but not pinned.
                ipc::unpin_images(&load_images(store, &ids, &mut self.read_buffer)?);
                Ok(Reply::Done)
            }
            Request::Groups { offset } => {
                let key = answer_key(Kind::Groups, 0);
                if !self.answers.contains_key(&key) {
                    let rows = Rc::new(self.group_rows()?);
                    self.answers.insert(key, rows);
                }
                let blob = Rc::clone(&self.answers[&key]);
                page(&blob, offset)
            }
            Request::ToastFetch {
                value,
                first_chunk,
                max_chunks,
            } => toast_fetch(store, ToastId(value), first_chunk, max_chunks),
            Request::KeyCandidates {
                rel,
                definition,
                hashes,
                from,
                to,
            } => key_candidates(store, RelId(rel), &definition, &hashes, (from, to)),
            Request::ScanRange {
                relid,
                from,
                to,
                offset,
            } => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(&(relid, from.0, to.0), &mut h);
                let key = answer_key(Kind::ScanRange, std::hash::Hasher::finish(&h));
                let blob = self.cached(key, || scan_range(store, relid, from, to))?;
                page(&blob, offset)
            }
            request @ (Request::Delete { .. }
            | Request::Pin { .. }
            | Request::Unpin { .. }
            | Request::SetRank { .. }
            | Request::RetentionPreview { .. }
            | Request::Verify { .. }
            | Request::StoreStats { .. }
            | Request::CopyStore { .. }) => self.answer_lifetimes(store, request),
            Request::Declare { .. } | Request::ReleaseExport { .. } => {
                unreachable!("handled by the caller and above")
            }
        }
    }

    fn cached(
        &mut self,
        key: (u32, i64),
        build: impl FnOnce() -> Result<Vec<u8>, WorkerError>,
    ) -> Result<Rc<Vec<u8>>, WorkerError> {
        if let Some(b) = self.answers.get(&key) {
            return Ok(Rc::clone(b));
        }
        let b = Rc::new(build()?);
        self.answers.insert(key, Rc::clone(&b));
        Ok(b)
    }
}

/// The page of listing `blob` from byte `offset`; an offset past its end is an error (the
/// backend then reads the listing again, which changed).
pub(super) fn page(blob: &[u8], offset: u64) -> Result<Reply, WorkerError> {
    Page::slice(blob, offset).map(Reply::Page).ok_or_else(|| {
        WorkerError::new(
            ErrorCode::InvalidArgument,
            format!(
                "offset {offset} is past the end of a {}-byte listing",
                blob.len()
            ),
        )
    })
}

fn listing(store: &Store, frees: &HashMap<u64, u64>) -> Result<Vec<u8>, WorkerError> {
    let rows: Vec<SnapshotRow> = store
        .snapshots()
        .map_err(fail)?
        .into_iter()
        .map(|s| SnapshotRow {
            id: s.id,
            state: listed_state(s.state, s.deleted_at_us.is_some()),
            taken_at_us: s.decl.declared_at_us,
            lsn: s.decl.wal_lsn,
            rank: s.decl.rank.0,
            explicit_rank: s.explicit_rank.0,
            label: s.decl.label.clone(),
            pins: s.pins.iter().map(|p| (p.tag.clone(), p.until_us)).collect(),
            deleted_at_us: s.deleted_at_us,
            tables: s.decl.relations.len() as u32,
            pages_captured: s.stats.pages_captured,
            new_images: s.stats.new_images,
            bytes_stored: s.stats.bytes_stored(),
            carried_pages: s.stats.carried_pages,
            frees_bytes: matches!(s.state, SnapshotState::Committed | SnapshotState::Deleted)
                .then(|| frees.get(&s.id.0).copied())
                .flatten(),
            failure: s.failure_reason,
        })
        .collect();
    listing::encode_snapshots(&rows).map_err(|e| unencodable("snapshot listing", e))
}

/// A store snapshot state as the listing carries it.
/// A store snapshot state as the listing carries it; a deleted failed snapshot (which had
/// nothing in the log to reclaim) is listed as reclaimed.
fn listed_state(state: SnapshotState, deleted: bool) -> listing::SnapshotState {
    match state {
        SnapshotState::Failed if deleted => listing::SnapshotState::Reclaimed,
        SnapshotState::Capturing => listing::SnapshotState::Capturing,
        SnapshotState::Committed => listing::SnapshotState::Committed,
        SnapshotState::Failed => listing::SnapshotState::Failed,
        SnapshotState::Deleted => listing::SnapshotState::Deleted,
        SnapshotState::Reclaimed => listing::SnapshotState::Reclaimed,
    }
}

fn tables(store: &Store, snap: SnapId) -> Result<Vec<u8>, WorkerError> {
    let info = store.snapshot(snap).map_err(|_| unknown(snap))?;
    // A partition's ancestors are in its row type's definition; row types are shared.
    let mut ancestors_of: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut rows = Vec::with_capacity(info.decl.relations.len());
    for r in &info.decl.relations {
        let ancestors = match ancestors_of.get(&r.row_type.0) {
            Some(a) => a.clone(),
            None => {
                let bytes = store.row_type(r.row_type).map_err(fail)?;
                let a: Vec<u32> = RowType::decode(&bytes)
                    .ok()
                    .and_then(|t| t.definition)
                    .and_then(|d| d.partition)
                    .map(|p| p.ancestors.iter().map(|a| a.relid).collect())
                    .unwrap_or_default();
                ancestors_of.insert(r.row_type.0, a.clone());
                a
            }
        };
        rows.push(TableRow {
            relid: r.pg_relid,
            rel: r.rel,
            relfilenode: r.relfilenode,
            nblocks: r.nblocks,
            name: r.name.clone(),
            ancestors,
        });
    }
    listing::encode_tables(&rows).map_err(|e| unencodable("table listing", e))
}

fn unknown(snap: SnapId) -> WorkerError {
    WorkerError::new(
        ErrorCode::UnknownSnapshot,
        format!("snapshot {} does not exist", snap.0),
    )
}

/// Ok if `snap` can be read; otherwise the error that says why not.
fn readable(store: &Store, snap: SnapId) -> Result<(), WorkerError> {
    let state = store.snapshot_state(snap).ok_or_else(|| unknown(snap))?;
    let n = snap.0;
    let why = match state {
        SnapshotState::Committed => return Ok(()),
        SnapshotState::Capturing => {
            return Err(WorkerError::new(
                ErrorCode::Capturing,
                format!("snapshot {n} is still being captured"),
            ))
        }
        SnapshotState::Deleted | SnapshotState::Reclaimed => format!("snapshot {n} was deleted"),
        SnapshotState::Failed => {
            let reason = store
                .snapshot(snap)
                .ok()
                .and_then(|i| i.failure_reason)
                .unwrap_or_default();
            format!("snapshot {n} failed and cannot be read: {reason}")
        }
    };
    Err(WorkerError::new(ErrorCode::NotReadable, why))
}

fn resolve_time(store: &Store, time_us: i64) -> Result<SnapId, WorkerError> {
    // The hint (the first snapshot and its time, in the session's time zone) is the
    // backend's: `ipc::resolve_time`.
    store.committed_at_or_before(time_us).ok_or_else(|| {
        WorkerError::new(
            ErrorCode::NoSnapshotAtTime,
            "no snapshot was taken at or before that time",
        )
    })
}

/// The blocks of `rel` that may hold the keys hashed to `hashes` at a snapshot of
/// `from..=to`, if its key map was started with `definition` (`keymap.rs`).
fn key_candidates(
    store: &Store,
    rel: RelId,
    definition: &[u8],
    hashes: &[u64],
    (from, to): (SnapId, SnapId),
) -> Result<Reply, WorkerError> {
    let Some(map) = store
        .key_map(rel)
        .map_err(fail)?
        .filter(|m| m.definition == definition)
    else {
        return Ok(Reply::KeyCandidates {
            start: None,
            complete: true,
            blocks: Vec::new(),
        });
    };
    let mut blocks = store
        .key_candidates(rel, map.start, hashes, from, to)
        .map_err(fail)?;
    let complete = blocks.len() <= gsnap_protocol::MAX_KEY_CANDIDATES;
    if !complete {
        blocks.clear();
    }
    Ok(Reply::KeyCandidates {
        start: Some(map.start),
        complete,
        blocks,
    })
}

/// What the readable snapshots of `from..=to` hold of table `relid` (each one's incarnation,
/// size and row type, as `scan_begin` gives them one by one), as a listing.
fn scan_range(store: &Store, relid: u32, from: SnapId, to: SnapId) -> Result<Vec<u8>, WorkerError> {
    let readable = store.committed_in(from, to);
    let mut range = listing::ScanRange {
        readable: readable.len() as u32,
        ..Default::default()
    };
    let mut row_types: HashMap<gsnap_store::RowTypeId, u32> = HashMap::new();
    for snap in readable {
        let info = store.snapshot(snap).map_err(fail)?;
        let Some(r) = info.relation(relid) else {
            continue;
        };
        let index = match row_types.get(&r.row_type) {
            Some(&i) => i,
            None => {
                let i = range.row_types.len() as u32;
                range
                    .row_types
                    .push(store.row_type(r.row_type).map_err(fail)?);
                row_types.insert(r.row_type, i);
                i
            }
        };
        let header = ScanHeader {
            rel: r.rel,
            nblocks: r.nblocks,
        };
        range.snapshots.push((snap, header, index));
    }
    listing::encode_scan_range(&range).map_err(|e| unencodable("beginning of a range scan", e))
}

fn scan_begin(store: &Store, snap: SnapId, relid: u32, offset: u64) -> Result<Reply, WorkerError> {
    readable(store, snap)?;
    let info = store.snapshot(snap).map_err(fail)?;
    let Some(r) = info.relation(relid) else {
        // Not in the snapshot: the backend says so with the table's name.
        return Ok(Reply::TableAbsent);
    };
    let row_type = store.row_type(r.row_type).map_err(fail)?;
    let header = ScanHeader {
        rel: r.rel,
        nblocks: r.nblocks,
    };
    let blob = listing::encode_scan(&header, &row_type)
        .map_err(|e| unencodable("beginning of a scan", e))?;
    page(&blob, offset)
}

/// Most entries one answer pins: bounded by the reply and by a share of the cache, so that
/// concurrent scans cannot pin all of it.
fn pin_budget(asked: usize) -> usize {
    let share = (shmem::cache_capacity() / 8).max(1);
    asked.clamp(1, MAX_PINNED_PER_REPLY).min(share)
}

/// Loads images `ids` into the cache and pins them for the requester. Their records are read
/// into `buf`, which the worker keeps from one request to the next.
fn load_images(
    store: &Store,
    ids: &[ImageId],
    buf: &mut Vec<u8>,
) -> Result<Vec<PinnedEntry>, WorkerError> {
    let budget = pin_budget(ids.len());
    let wanted: Vec<(u32, CacheKey)> = ids
        .iter()
        .take(budget)
        .enumerate()
        .map(|(i, id)| (i as u32, CacheKey::image(id.0)))
        .collect();
    // (`gsnap.verify_images`, applied to the store when it is opened and on each reload)
    let verify = store.verifies_images();
    let (entries, _) = pin(&wanted, |keys| {
        // Images (decompressed here, or their records: ids with ENCODED) in one batch, and
        // deltas (ids with DELTA_OF) in another.
        let (deltas, images): (Vec<usize>, Vec<usize>) =
            (0..keys.len()).partition(|&i| keys[i].id & DELTA_OF != 0);
        let ids = |at: &[usize], bit: u64| -> Vec<ImageId> {
            at.iter().map(|&i| ImageId(keys[i].id & !bit)).collect()
        };
        let mut out: Vec<Option<Image>> = (0..keys.len()).map(|_| None).collect();
        for (i, r) in images
            .iter()
            .zip(store.image_records_in(&ids(&images, ENCODED), buf)?)
        {
            let encoded = keys[*i].id & ENCODED != 0;
            out[*i] = Some(if encoded && r.stored().len() <= CACHE_SLOT_BYTES {
                Image::Encoded(r)
            } else {
                Image::Stored(r, verify)
            });
        }
        for (i, r) in deltas.iter().zip(store.deltas(&ids(&deltas, DELTA_OF))?) {
            out[*i] = Some(match r {
                Some(r) => Image::Record(r, verify),
                None => Image::Absent(gsnap_format::delta::absent()),
            });
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every key read"))
            .collect())
    })
    .map_err(load_failure)?;
    Ok(entries)
}

fn toast_fetch(
    store: &Store,
    id: ToastId,
    first: u32,
    max_chunks: u32,
) -> Result<Reply, WorkerError> {
    let info = store.toast_info(id).map_err(load_failure)?;
    let last = first
        .saturating_add(pin_budget(max_chunks as usize) as u32)
        .min(info.chunks);
    let wanted: Vec<(u32, CacheKey)> = (first..last)
        .map(|c| (c, CacheKey::toast_chunk(id.0, c)))
        .collect();
    let (entries, _) = pin(&wanted, |keys| {
        keys.iter()
            .map(|k| store.toast_chunk(id, k.sub - 1))
            .collect()
    })
    .map_err(load_failure)?;
    Ok(Reply::ToastPinned {
        chunks: info.chunks,
        len: info.len,
        entries,
    })
}

/// An object read from the store, to be written into its cache slot.
trait Loaded {
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Writes it into `out` (of `len()` bytes).
    fn write_into(&self, out: &mut [u8]) -> Result<(), StoreError>;
    /// The key it is cached under when `asked` was asked for.
    fn key(&self, asked: CacheKey) -> CacheKey {
        asked
    }
}

impl Loaded for Vec<u8> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn write_into(&self, out: &mut [u8]) -> Result<(), StoreError> {
        out.copy_from_slice(self);
        Ok(())
    }
}

/// A stored page image (its record in the worker's read buffer) or delta, decompressed
/// straight into its slot (checked against its fingerprint when the flag says so), an image's
/// record copied as it is (the requester decompresses it), or what stands for a delta that
/// was not stored.
enum Image<'a> {
    Stored(ImageRecordRef<'a>, bool),
    Encoded(ImageRecordRef<'a>),
    Record(ImageRecord, bool),
    Absent(Vec<u8>),
}

impl Loaded for Image<'_> {
    fn len(&self) -> usize {
        match self {
            Image::Stored(r, _) => r.len(),
            Image::Encoded(r) => r.stored().len(),
            Image::Record(r, _) => r.len(),
            Image::Absent(bytes) => bytes.len(),
        }
    }

    fn write_into(&self, out: &mut [u8]) -> Result<(), StoreError> {
        match self {
            Image::Stored(r, verify) => r.decode_into(out, *verify),
            Image::Encoded(r) => {
                out.copy_from_slice(r.stored());
                Ok(())
            }
            Image::Record(r, verify) => r.decode_into(out, *verify),
            Image::Absent(bytes) => bytes.write_into(out),
        }
    }

    /// A record asked for but decompressed here (larger than a slot) is cached as the image.
    fn key(&self, asked: CacheKey) -> CacheKey {
        match self {
            Image::Stored(..) => CacheKey::image(asked.id & !ENCODED),
            _ => asked,
        }
    }
}

/// Pins the cached objects `wanted` (in key order) for the requester, loading misses with
/// `load`. Returns the pinned entries of a prefix of `wanted`, and, if the cache could not
/// take all of them, the key to resume at.
///
/// Misses are read from the store without the cache lock, get slots reserved as *loading*
/// under it, are written (decompressed) into their slots without it, and are made visible
/// under it again: backends pinning and unpinning other slots wait for none of the store
/// reads or the decompression, and no lookup sees a half-written slot.
fn pin<L: Loaded>(
    wanted: &[(u32, CacheKey)],
    load: impl FnOnce(&[CacheKey]) -> Result<Vec<L>, StoreError>,
) -> Result<(Vec<PinnedEntry>, Option<u32>), StoreError> {
    let mut got: Vec<Option<PinnedEntry>> = vec![None; wanted.len()];
    // On an error, the pins this call took for the requester are given back.
    let give_back = |got: &[Option<PinnedEntry>]| {
        ipc::unpin_images(&got.iter().flatten().copied().collect::<Vec<_>>())
    };
    let mut misses = Vec::new();
    shmem::with_cache(|c| {
        for (i, (key, ck)) in wanted.iter().enumerate() {
            match c.lookup_pin(ck) {
                Some((slot, len)) => {
                    got[i] = Some(PinnedEntry {
                        key: *key,
                        slot: slot as u32,
                        len: len as u32,
                    })
                }
                None => misses.push(i),
            }
        }
    });
    if !misses.is_empty() {
        let keys: Vec<CacheKey> = misses.iter().map(|&i| wanted[i].1).collect();
        let loaded = match load(&keys) {
            Ok(l) => l,
            Err(e) => {
                give_back(&got);
                return Err(e);
            }
        };
        if let Some(l) = loaded.iter().find(|l| l.len() > CACHE_SLOT_BYTES) {
            give_back(&got);
            return Err(StoreError::new(
                ErrorKind::Corrupt,
                format!(
                    "a stored object says it is {} bytes long, more than a cache slot",
                    l.len()
                ),
            ));
        }
        // Slots for the misses, as many as the cache can give: (position, slot, to write).
        let mut reserved = Vec::with_capacity(misses.len());
        shmem::with_cache(|c| {
            for (&i, l) in misses.iter().zip(&loaded) {
                match c.insert_loading(l.key(wanted[i].1), l.len()) {
                    Ok((slot, fresh)) => reserved.push((i, slot, fresh)),
                    // A full cache, or an image a backend is decompressing into its slot
                    // (`read::pins`): the requester gets the prefix and asks again.
                    Err(CacheError::AllPinned | CacheError::Loading) => break,
                }
            }
        });
        let mut failure = None;
        for (&(_, slot, fresh), l) in reserved.iter().zip(&loaded) {
            if fresh {
                // SAFETY: the slot is reserved as loading and pinned by this process: no
                // lookup finds it and nothing evicts it until finish_loading, so these are
                // the only writes to its `len()` bytes.
                let out =
                    unsafe { std::slice::from_raw_parts_mut(shmem::cache_slot_ptr(slot), l.len()) };
                if let Err(e) = l.write_into(out) {
                    failure = Some(e);
                    break;
                }
            }
        }
        shmem::with_cache(|c| {
            for (&(i, slot, fresh), l) in reserved.iter().zip(&loaded) {
                match (&failure, fresh) {
                    (Some(_), true) => c.discard(slot),
                    (Some(_), false) => c.unpin(slot),
                    (None, _) => {
                        if fresh {
                            c.finish_loading(slot);
                        }
                        got[i] = Some(PinnedEntry {
                            key: wanted[i].0,
                            slot: slot as u32,
                            len: l.len() as u32,
                        });
                    }
                }
            }
        });
        if let Some(e) = failure {
            give_back(&got);
            return Err(e);
        }
    }
    // Deliver the longest prefix that is complete; unpin anything after a gap.
    let gap = got.iter().position(Option::is_none);
    let (entries, resume) = match gap {
        None => (got.into_iter().flatten().collect(), None),
        Some(g) => {
            let after: Vec<PinnedEntry> = got[g..].iter().flatten().copied().collect();
            ipc::unpin_images(&after);
            (
                got[..g].iter().flatten().copied().collect(),
                Some(wanted[g].0),
            )
        }
    };
    Ok((entries, resume))
}
