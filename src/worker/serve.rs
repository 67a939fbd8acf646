//! Answering backends' requests: catalog listings, snapshot resolution, and the page images
//! and TOAST chunks of scans, which are loaded into the shared cache pinned for the asking
//! backend (see `crate::ipc`).

use super::declare::PendingDeclare;
use super::{code_of, Store, Worker};
use crate::ipc::protocol::{
    self, encode_pinned, ErrorCode, Kind, PinnedEntry, ScanHeader, SnapshotRow, TableRow,
};
use crate::shmem::{self, CACHE_SLOT_BYTES};
use gsnap_shmem::cache::{CacheError, CacheKey};
use gsnap_shmem::requests::RequestBody;
use gsnap_store::{ImageId, SnapId, SnapshotState, StoreError, ToastId};
use std::rc::Rc;

/// A request's failure: code and message.
type Failure = (ErrorCode, String);

fn fail(e: StoreError) -> Failure {
    (code_of(&e), e.message().to_string())
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
            let kind = Kind::from_u32(body.kind);
            if kind == Some(Kind::Declare) {
                self.pending.push(PendingDeclare {
                    slot: Some(i),
                    wait: body.args[0] != 0,
                    export: body.args[1] != 0,
                    periodic: false,
                });
                continue;
            }
            let requester = body.requester;
            if let Err((code, message)) = self.answer(kind, body) {
                body.set_error(code as u32, &message);
            }
            slot.finish(|b| {
                if let (Some(k), 0) = (kind, b.error) {
                    k.release_pins(b.reply());
                }
            });
            crate::ipc::set_latch_of(requester as usize);
        }
    }

    fn answer(&mut self, kind: Option<Kind>, body: &mut RequestBody) -> Result<(), Failure> {
        let kind = kind.ok_or((
            ErrorCode::Internal,
            format!("unknown request kind {}", body.kind),
        ))?;
        if kind == Kind::ReleaseExport {
            let snap = body.args[0] as u64;
            self.exports.retain(|&s| s != snap);
            return Ok(());
        }
        let store = self.store.ok_or_else(|| {
            self.store_problem
                .clone()
                .unwrap_or((ErrorCode::Io, "the gsnap store is not open".into()))
        })?;
        let a = body.args;
        match kind {
            Kind::Snapshots => {
                let blob = self.cached(kind as u32, 0, || listing(store))?;
                page_out(body, &blob, a[0]);
            }
            Kind::SnapshotTables => {
                let blob = self.cached(kind as u32, a[0], || tables(store, a[0] as u64))?;
                page_out(body, &blob, a[1]);
            }
            Kind::ResolveTime => body.result = resolve_time(store, a[0])? as i64,
            Kind::ScanBegin => scan_begin(store, body)?,
            Kind::IndexPin => self.index_pin(body)?,
            Kind::LoadImages => load_images(store, body)?,
            Kind::Prefetch => {
                load_images(store, body)?;
                // Left in the cache for the scan's next LoadImages, but not pinned.
                protocol::unpin_all(&protocol::decode_pinned(body.reply()));
                body.set_reply(&[]);
            }
            Kind::Groups => {
                if !self.answers.contains_key(&(kind as u32, 0)) {
                    let rows = Rc::new(self.group_rows());
                    self.answers.insert((kind as u32, 0), rows);
                }
                let blob = Rc::clone(&self.answers[&(kind as u32, 0)]);
                page_out(body, &blob, a[0]);
            }
            Kind::ToastFetch => toast_fetch(store, body)?,
            Kind::Declare | Kind::ReleaseExport => unreachable!("handled above"),
        }
        Ok(())
    }

    fn cached(
        &mut self,
        kind: u32,
        key: i64,
        build: impl FnOnce() -> Result<Vec<u8>, Failure>,
    ) -> Result<Rc<Vec<u8>>, Failure> {
        if let Some(b) = self.answers.get(&(kind, key)) {
            return Ok(Rc::clone(b));
        }
        let b = Rc::new(build()?);
        self.answers.insert((kind, key), Rc::clone(&b));
        Ok(b)
    }
}

fn page_out(body: &mut RequestBody, blob: &[u8], offset: i64) {
    let from = usize::try_from(offset).unwrap_or(0).min(blob.len());
    body.total = blob.len() as u64;
    body.set_reply(&blob[from..]);
}

fn listing(store: &Store) -> Result<Vec<u8>, Failure> {
    let rows: Vec<SnapshotRow> = store
        .snapshots()
        .map_err(fail)?
        .into_iter()
        .map(|s| SnapshotRow {
            id: s.id.0,
            state: s.state.as_str().to_string(),
            taken_at_us: s.decl.declared_at_us,
            lsn: s.decl.wal_lsn,
            rank: s.decl.rank.0,
            tables: s.decl.relations.len() as u32,
            pages_captured: s.stats.pages_captured,
            new_images: s.stats.new_images,
            bytes_stored: s.stats.bytes_stored(),
            carried_pages: s.stats.carried_pages,
            failure: s.failure_reason,
        })
        .collect();
    Ok(protocol::encode_snapshots(&rows))
}

fn tables(store: &Store, snap: u64) -> Result<Vec<u8>, Failure> {
    let info = store.snapshot(SnapId(snap)).map_err(|_| unknown(snap))?;
    let rows: Vec<TableRow> = info
        .decl
        .relations
        .iter()
        .map(|r| TableRow {
            relid: r.pg_relid,
            rel: r.rel.0,
            relfilenode: r.relfilenode,
            nblocks: r.nblocks,
            name: r.name.clone(),
        })
        .collect();
    Ok(protocol::encode_tables(&rows))
}

fn unknown(snap: u64) -> Failure {
    (
        ErrorCode::UnknownSnapshot,
        format!("snapshot {snap} does not exist"),
    )
}

/// Ok if `snap` can be read; otherwise the error that says why not.
fn readable(store: &Store, snap: u64) -> Result<(), Failure> {
    let state = store
        .snapshot_state(SnapId(snap))
        .ok_or_else(|| unknown(snap))?;
    let why = match state {
        SnapshotState::Committed => return Ok(()),
        SnapshotState::Capturing => {
            return Err((
                ErrorCode::Capturing,
                format!("snapshot {snap} is still being captured"),
            ))
        }
        SnapshotState::Deleted => format!("snapshot {snap} was deleted"),
        SnapshotState::Failed => {
            let reason = store
                .snapshot(SnapId(snap))
                .ok()
                .and_then(|i| i.failure_reason)
                .unwrap_or_default();
            format!("snapshot {snap} failed and cannot be read: {reason}")
        }
    };
    Err((ErrorCode::NotReadable, why))
}

fn resolve_time(store: &Store, time_us: i64) -> Result<u64, Failure> {
    if let Some(s) = store.committed_at_or_before(time_us) {
        return Ok(s.0);
    }
    let first = store
        .snapshots()
        .map_err(fail)?
        .into_iter()
        .find(|s| s.state == SnapshotState::Committed);
    Err((
        ErrorCode::NoSnapshotAtTime,
        match first {
            Some(f) => format!(
                "no snapshot was taken at or before that time\nHINT: the first readable \
                 snapshot, {}, was taken at {} (Unix time in microseconds)",
                f.id.0, f.decl.declared_at_us
            ),
            None => "no snapshot was taken at or before that time\nHINT: no readable snapshot \
                     exists yet; take one with gsnap_snapshot()"
                .to_string(),
        },
    ))
}

fn scan_begin(store: &Store, body: &mut RequestBody) -> Result<(), Failure> {
    let [snap, relid, offset, ..] = body.args;
    readable(store, snap as u64)?;
    let info = store.snapshot(SnapId(snap as u64)).map_err(fail)?;
    let Some(r) = info.relation(relid as u32) else {
        body.result = 1; // not in the snapshot: the backend says so with the table's name
        return Ok(());
    };
    let row_type = store.row_type(r.row_type).map_err(fail)?;
    let blob = ScanHeader {
        rel: r.rel.0,
        nblocks: r.nblocks,
    }
    .encode(&row_type);
    page_out(body, &blob, offset);
    Ok(())
}

/// Most entries one answer pins: bounded by the reply and by a share of the cache, so that
/// concurrent scans cannot pin all of it.
fn pin_budget(asked: i64) -> usize {
    let share = (shmem::cache_capacity() / 8).max(1);
    usize::try_from(asked)
        .unwrap_or(1)
        .clamp(1, protocol::MAX_PINNED_PER_REPLY)
        .min(share)
}

fn load_images(store: &Store, body: &mut RequestBody) -> Result<(), Failure> {
    let ids: Vec<u64> = body
        .reply()
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect();
    let budget = pin_budget(ids.len() as i64);
    let wanted: Vec<(u32, CacheKey)> = ids
        .iter()
        .take(budget)
        .enumerate()
        .map(|(i, &id)| (i as u32, CacheKey::image(id)))
        .collect();
    store.set_verify_images(crate::gucs::VERIFY_IMAGES.get());
    let (entries, _) = pin(&wanted, |keys| {
        let ids: Vec<ImageId> = keys.iter().map(|k| ImageId(k.id)).collect();
        store.images(&ids)
    })
    .map_err(fail)?;
    body.set_reply(&encode_pinned(&entries));
    Ok(())
}

fn toast_fetch(store: &Store, body: &mut RequestBody) -> Result<(), Failure> {
    let [id, first, max, ..] = body.args;
    let id = ToastId(id as u64);
    let info = store.toast_info(id).map_err(fail)?;
    let first = first as u32;
    let last = first
        .saturating_add(pin_budget(max) as u32)
        .min(info.chunks);
    let wanted: Vec<(u32, CacheKey)> = (first..last)
        .map(|c| (c, CacheKey::toast_chunk(id.0, c)))
        .collect();
    let (entries, _) = pin(&wanted, |keys| {
        keys.iter()
            .map(|k| store.toast_chunk(id, k.sub - 1))
            .collect()
    })
    .map_err(fail)?;
    body.result = i64::from(info.chunks);
    body.total = info.len;
    body.set_reply(&encode_pinned(&entries));
    Ok(())
}

/// Pins the cached objects `wanted` (in key order) for the requester, loading misses with
/// `load`. Returns the pinned entries of a prefix of `wanted`, and, if the cache could not
/// take all of them, the key to resume at.
fn pin(
    wanted: &[(u32, CacheKey)],
    load: impl FnOnce(&[CacheKey]) -> Result<Vec<Vec<u8>>, StoreError>,
) -> Result<(Vec<PinnedEntry>, Option<u32>), StoreError> {
    let mut got: Vec<Option<PinnedEntry>> = vec![None; wanted.len()];
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
        let loaded = load(&keys);
        let loaded = match loaded {
            Ok(l) => l,
            Err(e) => {
                protocol::unpin_all(&got.iter().flatten().copied().collect::<Vec<_>>());
                return Err(e);
            }
        };
        shmem::with_cache(|c| {
            for (&i, bytes) in misses.iter().zip(&loaded) {
                assert!(bytes.len() <= CACHE_SLOT_BYTES, "cached objects fit a slot");
                match c.insert_pinned(wanted[i].1, bytes.len()) {
                    Ok((slot, fresh)) => {
                        if fresh {
                            // SAFETY: the slot is pinned by us and we hold the cache lock, so
                            // nobody reads it before these bytes are complete.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    bytes.as_ptr(),
                                    shmem::cache_slot_ptr(slot),
                                    bytes.len(),
                                )
                            };
                        }
                        got[i] = Some(PinnedEntry {
                            key: wanted[i].0,
                            slot: slot as u32,
                            len: bytes.len() as u32,
                        });
                    }
                    Err(CacheError::AllPinned) => break,
                }
            }
        });
    }
    // Deliver the longest prefix that is complete; unpin anything after a gap.
    let gap = got.iter().position(Option::is_none);
    let (entries, resume) = match gap {
        None => (got.into_iter().flatten().collect(), None),
        Some(g) => {
            let after: Vec<PinnedEntry> = got[g..].iter().flatten().copied().collect();
            protocol::unpin_all(&after);
            (
                got[..g].iter().flatten().copied().collect(),
                Some(wanted[g].0),
            )
        }
    };
    Ok((entries, resume))
}
