//! Reading: images, TOAST values, page lookups ("latest mapping at or before v"), per-relation
//! page-table scans and the mapping log.
//!
//! This is the simple SnapshotIndex (issue 3) served straight from the `page_versions` column
//! family; the in-memory GSnap index replaces the lookups later and is rebuilt from
//! [`SnapshotStore::mapping_log`].
//!
//! Invariants: lookups and scans answer only for committed snapshots; the mapping log never
//! yields a mapping of the snapshot being captured; every TOAST chunk returned was checked
//! against its BLAKE3 hash, and every image too unless [`SnapshotStore::set_verify_images`]
//! turned that off.

use crate::backend::{KvBackend, KvCursor, Scan};
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, PageId, Rank, RelId, SnapId, ToastId};
use crate::keys::{self, Cf};
use crate::records::{self, SnapshotState, ToastInfo};
use crate::store::SnapshotStore;

/// One mapping of the mapping log: at snapshot `snap`, page `page` has image `image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mapping {
    /// The snapshot that captured the page.
    pub snap: SnapId,
    /// The page.
    pub page: PageId,
    /// Its image at that snapshot.
    pub image: ImageId,
}

impl<B: KvBackend> SnapshotStore<B> {
    /// The decompressed view stored as image `id`.
    pub fn image(&self, id: ImageId) -> Result<Vec<u8>> {
        let v = self
            .backend
            .get(Cf::Images(Rank(0)), &keys::image_key(id))?;
        self.image_content(id, v)
    }

    /// Several images at once (one batched read), in the order of `ids`.
    pub fn images(&self, ids: &[ImageId]) -> Result<Vec<Vec<u8>>> {
        let keys: Vec<[u8; 8]> = ids.iter().map(|id| keys::image_key(*id)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let values = self.backend.multi_get(Cf::Images(Rank(0)), &refs)?;
        ids.iter()
            .zip(values)
            .map(|(id, v)| self.image_content(*id, v))
            .collect()
    }

    /// Whether image reads check each image against its BLAKE3 fingerprint (on by default).
    /// The backend's own checksums (RocksDB's per-block CRC32c) are checked either way; the
    /// fingerprint adds an end-to-end check that costs a hash of every image read.
    pub fn set_verify_images(&self, on: bool) {
        self.verify_images
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn image_content(&self, id: ImageId, v: Option<Vec<u8>>) -> Result<Vec<u8>> {
        let verify = self
            .verify_images
            .load(std::sync::atomic::Ordering::Relaxed);
        match v {
            Some(v) => records::decode_image(&v, verify)
                .map_err(|e| e.context(format_args!("{} in {}", id, self.backend.describe()))),
            None => Err(StoreError::not_found(format!(
                "{} in {} does not exist",
                id,
                self.backend.describe()
            ))),
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

    /// The image of `page` in snapshot `snap`'s page table: its latest mapping at or before
    /// `snap` (None: the page was never captured up to `snap`). `snap` must be committed.
    pub fn lookup(&self, page: PageId, snap: SnapId) -> Result<Option<ImageId>> {
        self.check_readable(snap)?;
        let mut cursor = self.backend.cursor(Cf::PageVersions)?;
        cursor.seek(&keys::page_versions_key(page, snap))?;
        match cursor.current() {
            Some((k, v)) => {
                let (found, _) = keys::decode_page_versions_key(k)?;
                if found != page {
                    return Ok(None);
                }
                Ok(Some(ImageId(keys::decode_u64_value(v, "mapping")?)))
            }
            None => Ok(None),
        }
    }

    /// Snapshot `snap`'s page table for relation incarnation `rel`: for each block that has a
    /// mapping at or before `snap`, in block order, (block, image). Blocks at or beyond the
    /// relation's size at `snap` may appear (the relation shrank): the caller stops at the
    /// declared `nblocks`.
    pub fn scan_relation(&self, rel: RelId, snap: SnapId) -> Result<RelationScan<'_>> {
        self.scan_relation_from(rel, snap, 0)
    }

    /// [`SnapshotStore::scan_relation`] starting at block `first`.
    pub fn scan_relation_from(
        &self,
        rel: RelId,
        snap: SnapId,
        first: u32,
    ) -> Result<RelationScan<'_>> {
        self.check_readable(snap)?;
        Ok(RelationScan {
            cursor: self.backend.cursor(Cf::PageVersions)?,
            rel,
            snap,
            next_block: Some(first),
        })
    }

    /// The mapping log of snapshots `first..=last` in log order (snapshot, then relation,
    /// then block). Mappings of the snapshot being captured are never included; failed
    /// snapshots have none. Deleted snapshots' mappings are included (later page tables are
    /// built on them).
    pub fn mapping_log(&self, first: SnapId, last: SnapId) -> Result<MappingLog<'_, B>> {
        let last = match self.catalog().active {
            Some(active) if active <= last => SnapId(active.0.saturating_sub(1)),
            _ => last,
        };
        let end = keys::prefix_end(&keys::maplog_prefix(last));
        let scan = if first <= last {
            Some(Scan::range(
                &self.backend,
                Cf::MapLog,
                &keys::maplog_prefix(first),
                end,
            )?)
        } else {
            None
        };
        Ok(MappingLog {
            store: self,
            scan,
            current: None,
        })
    }
}

/// Iterator over one relation's page table at one snapshot; see
/// [`SnapshotStore::scan_relation`]. Each step is one seek in `page_versions`.
pub struct RelationScan<'a> {
    cursor: Box<dyn KvCursor + 'a>,
    rel: RelId,
    snap: SnapId,
    next_block: Option<u32>,
}

impl RelationScan<'_> {
    fn step(&mut self) -> Result<Option<(u32, ImageId)>> {
        let Some(mut block) = self.next_block else {
            return Ok(None);
        };
        loop {
            self.cursor.seek(&keys::page_versions_key(
                PageId::new(self.rel, block),
                self.snap,
            ))?;
            let Some((k, v)) = self.cursor.current() else {
                self.next_block = None;
                return Ok(None);
            };
            let (page, snap) = keys::decode_page_versions_key(k)?;
            if page.rel != self.rel {
                self.next_block = None;
                return Ok(None);
            }
            if snap <= self.snap {
                let image = ImageId(keys::decode_u64_value(v, "mapping")?);
                self.next_block = page.block.checked_add(1);
                return Ok(Some((page.block, image)));
            }
            // A mapping of page.block by a later snapshot: seek that block's latest version
            // at or before self.snap. That key sorts after this entry, so the scan advances.
            block = page.block;
        }
    }
}

impl Iterator for RelationScan<'_> {
    type Item = Result<(u32, ImageId)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(Some(x)) => Some(Ok(x)),
            Ok(None) => None,
            Err(e) => {
                self.next_block = None;
                Some(Err(e))
            }
        }
    }
}

/// Iterator over the mapping log; see [`SnapshotStore::mapping_log`].
pub struct MappingLog<'a, B: KvBackend> {
    store: &'a SnapshotStore<B>,
    scan: Option<Scan<'a>>,
    /// The snapshot of the last entry and whether its mappings are part of the log.
    current: Option<(SnapId, bool)>,
}

impl<B: KvBackend> Iterator for MappingLog<'_, B> {
    type Item = Result<Mapping>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (k, v) = match self.scan.as_mut()?.next()? {
                Ok(e) => e,
                Err(e) => return Some(Err(e)),
            };
            let decoded = keys::decode_maplog_key(&k)
                .and_then(|(snap, page)| Ok((snap, page, keys::decode_u64_value(&v, "mapping")?)));
            let (snap, page, image) = match decoded {
                Ok(x) => x,
                Err(e) => return Some(Err(e)),
            };
            let visible = match self.current {
                Some((s, vis)) if s == snap => vis,
                _ => {
                    let state = self.store.snapshot_state(snap);
                    let vis = matches!(
                        state,
                        Some(SnapshotState::Committed | SnapshotState::Deleted)
                    );
                    self.current = Some((snap, vis));
                    vis
                }
            };
            if visible {
                return Some(Ok(Mapping {
                    snap,
                    page,
                    image: ImageId(image),
                }));
            }
        }
    }
}
