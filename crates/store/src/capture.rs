//! Writing a snapshot: [`Capture`], from `begin_capture` to `commit` or `abort`.
//!
//! The protocol (see `docs/format.md`, "Commit protocol"):
//! 1. `declare` allocates the snapshot id and writes, in one synced batch, the snapshot
//!    record in state *capturing*, its capturing marker and the snapshot counter; several
//!    snapshots may be declared before their captures run, and `begin_capture` opens them one
//!    at a time, oldest first;
//! 2. images, TOAST values and carried pages accumulate in a batch that is written *unsynced*
//!    whenever it reaches `max_batch_bytes` (bounded memory for any table size); the mappings
//!    are kept in memory (16 bytes per page whose image changed);
//! 3. `commit` writes the rest, the snapshot's mappings appended to the mapping log (the log
//!    nodes they change), the record in state *committed* and the marker's deletion in one
//!    synced batch: only then is the snapshot visible, and its mappings with it;
//! 4. `abort` (or dropping an unfinished capture) removes the carried pages written so far
//!    and the images and TOAST values the capture stored (every id from the first sequence
//!    numbers recorded in its capturing marker when it began: one capture at a time), and
//!    marks the snapshot failed; after a crash, `open` does the same for every marker left.
//!
//! Reference counts (`refs`): the commit batch adds one to an image's count per mapping of
//! the snapshot that names it, and one to a TOAST value's count per new image naming it;
//! reclamation takes them off again (`reclaim.rs`). New images go to the column family of
//! the snapshot's rank, their ids tagged with it (`keys::image_id`).
//!
//! Invariants: at most one capture is open per store; a capture whose write failed accepts
//! nothing but `abort` (its flushed state is incomplete); a dedup entry is written in the same
//! batch as the content it names, after all of a TOAST value's chunks, so it never points at
//! missing or different content; the mapping log holds the mappings of committed snapshots
//! only, because nothing but a commit batch writes it.

use std::collections::{HashMap, HashSet};

use crate::backend::{KvBackend, KvCursor, WriteBatch};
use crate::error::{Result, StoreError};
use crate::estimates::Forget;
use crate::ids::{Fingerprint, ImageId, PageKey, Rank, RelId, SnapId, ToastId};
use crate::keys::{self, Cf, Counter, DedupKind};
use crate::openkeys::{self, OpenEntries};
use crate::recent::Gathered;
use crate::records::{self, CaptureStats, SnapshotDecl, SnapshotInfo, SnapshotState, ToastInfo};
use crate::store::{SnapSummary, SnapshotStore};
use gsnap_core::Mapping;

/// Largest page view accepted (one PostgreSQL block).
pub const MAX_VIEW_BYTES: usize = 8192;
/// Largest TOAST value accepted (PostgreSQL's varlena limit).
pub const MAX_TOAST_BYTES: usize = 1 << 30;
/// TOAST values are stored in chunks of this many bytes (the last one may be shorter), so a
/// chunk fits an 8 KB cache slot.
pub const TOAST_CHUNK_BYTES: usize = 8000;

/// An open capture of one snapshot. Finish it with [`Capture::commit`] or
/// [`Capture::abort`]; dropping it unfinished aborts it.
pub struct Capture<B: KvBackend> {
    store: SnapshotStore<B>,
    info: SnapshotInfo,
    rels: HashSet<RelId>,
    /// The mappings added, in the order added (sorted, last one per page kept, at commit).
    mappings: Vec<(PageKey, ImageId)>,
    /// The pages mapped so far (each at most once).
    mapped: HashSet<PageKey>,
    batch: WriteBatch,
    pending_images: HashMap<Fingerprint, ImageId>,
    pending_toast: HashMap<Fingerprint, ToastId>,
    /// How many of its batches the capture has written so far: the pending entries above are
    /// forgotten at each (the store has them then), so a view sealed ahead
    /// ([`Capture::seal_views`]) trusts the dedup index's miss only if no batch was written
    /// since it was looked up.
    batches_written: u64,
    /// Images stored before this capture that it maps (a dedup hit): reclamation must not
    /// free one even if its count drops to zero meanwhile (the commit adds to it).
    existing: HashSet<ImageId>,
    /// How many new images name each TOAST value (added to its count at commit).
    toast_refs: HashMap<ToastId, u64>,
    /// The sequence number of the first image this capture may store.
    first_image_seq: u64,
    /// Key maps this capture starts (Some: the definition) or ends (None), written at commit.
    key_maps: Vec<(RelId, Option<Vec<u8>>)>,
    /// Blocks' open key entries (hash, from) read ahead ([`Capture::prefetch_block_keys`]),
    /// taken by [`Capture::record_keys`].
    prefetched: HashMap<PageKey, OpenEntries>,
    /// The open key entries this capture leaves on the blocks it recorded, by (page, map),
    /// given to the store's cache when the commit is written (`openkeys.rs`); at most
    /// `recorded_bytes` of them (the cache's bound).
    recorded: HashMap<(PageKey, SnapId), OpenEntries>,
    recorded_bytes: usize,
    /// The new images given a delta.
    deltas: HashSet<ImageId>,
    /// The records of new images, for the store's cache of recent images at commit.
    gathered: Gathered,
    failed: Option<StoreError>,
    finished: bool,
}

impl<B: KvBackend> SnapshotStore<B> {
    /// Declares a snapshot; its capture is begun later with [`SnapshotStore::begin_capture`].
    ///
    /// The declaration is written without waiting for the disk: it becomes durable with the
    /// next synced write (at the latest its capture's commit, or any deletion, pin or
    /// declaration lease), so a declaration never waits for the capture data written before
    /// it to reach the disk. A crash before that loses the snapshot (it is absent, never half
    /// present), and its id, taken from a synced lease, is never handed out again.
    ///
    /// Errors: InvalidArgument if the declaration names an unknown relation incarnation or
    /// row type, or the same relation twice.
    pub fn declare(&self, decl: SnapshotDecl) -> Result<SnapId> {
        if self.catalog().needs_recovery && self.catalog().active.is_none() {
            self.recover()?;
        }
        let mut ids = self.lock_ids();
        let mut rels = HashSet::new();
        let mut oids = HashSet::new();
        for r in &decl.relations {
            if !rels.insert(r.rel) || !oids.insert(r.pg_relid) {
                return Err(StoreError::invalid(format!(
                    "snapshot declaration lists relation {} (incarnation {}) twice",
                    r.pg_relid, r.rel.0
                )));
            }
            if self
                .backend
                .get(Cf::Catalog, &keys::rel_key(r.rel))?
                .is_none()
            {
                return Err(StoreError::invalid(format!(
                    "snapshot declaration names unknown relation incarnation {} (table {})",
                    r.rel.0, r.name
                )));
            }
            if self
                .backend
                .get(Cf::Catalog, &keys::row_type_key(r.row_type))?
                .is_none()
            {
                return Err(StoreError::invalid(format!(
                    "snapshot declaration names unknown row type {} (table {})",
                    r.row_type.0, r.name
                )));
            }
        }
        let snap = SnapId(self.alloc_leased(&mut ids, Counter::Snap)?);
        let mut batch = WriteBatch::new();
        let info = SnapshotInfo {
            id: snap,
            state: SnapshotState::Capturing,
            decl,
            stats: CaptureStats::default(),
            failure_reason: None,
            explicit_rank: Rank(0),
            pins: Vec::new(),
            deleted_at_us: None,
        };
        batch.put(
            Cf::Catalog,
            &keys::snapshot_key(snap),
            &records::encode_snapshot(&info),
        );
        batch.put(Cf::Catalog, &keys::capturing_key(snap), &[]);
        self.backend.write(&batch, false)?;
        let mut cat = self.catalog_mut();
        cat.snaps.insert(
            snap,
            SnapSummary {
                state: SnapshotState::Capturing,
                declared_at_us: info.decl.declared_at_us,
            },
        );
        drop(cat);
        drop(ids);
        Ok(snap)
    }

    /// Opens the capture of declared snapshot `snap`. Captures run one at a time, in the
    /// order the snapshots were declared.
    ///
    /// Errors: InvalidArgument if a capture is open, or `snap` is not the oldest declared
    /// snapshot whose capture has not run.
    pub fn begin_capture(&self, snap: SnapId) -> Result<Capture<B>> {
        let oldest = {
            let cat = self.catalog();
            if let Some(active) = cat.active {
                return Err(StoreError::invalid(format!(
                    "cannot begin a capture: the capture of snapshot {} is still open",
                    active.0
                )));
            }
            cat.snaps
                .iter()
                .find(|(_, s)| s.state == SnapshotState::Capturing)
                .map(|(id, _)| *id)
        };
        if oldest != Some(snap) {
            return Err(StoreError::invalid(format!(
                "cannot begin the capture of snapshot {}: {}",
                snap.0,
                match oldest {
                    Some(o) => format!(
                        "snapshot {} was declared before it and is not captured",
                        o.0
                    ),
                    None => "it is not a declared snapshot awaiting capture".to_string(),
                }
            )));
        }
        let v = self
            .backend
            .get(Cf::Catalog, &keys::snapshot_key(snap))?
            .ok_or_else(|| {
                StoreError::corrupt(format!("declared snapshot {} has no record", snap.0))
            })?;
        let info = records::decode_snapshot(snap, &v)?;
        if info.decl.rank.0 >= keys::IMAGE_RANKS {
            return Err(StoreError::invalid(format!(
                "snapshot {} has rank {}; ranks go up to {}",
                snap.0,
                info.decl.rank.0,
                keys::IMAGE_RANKS - 1
            )));
        }
        let rels = info.decl.relations.iter().map(|r| r.rel).collect();
        // What this capture will store starts at the counters' next values: recorded in the
        // marker, so that an abort or recovery removes exactly this capture's content. The
        // marker goes into the capture's first batch: batches reach the disk in order, so
        // the marker is there before any content (a marker left empty means none).
        let marker = records::CaptureMarker {
            first_image_seq: self.next_id(Counter::Image),
            first_toast: self.next_id(Counter::Toast),
        };
        let mut batch = WriteBatch::new();
        batch.put(
            Cf::Catalog,
            &keys::capturing_key(snap),
            &records::encode_capture_marker(&marker),
        );
        if self.identity.format_version < records::FORMAT_VERSION {
            // A store of an older format becomes the current one before this capture's first
            // image (named by its stored form) can reach the disk: older builds refuse it.
            let identity = records::StoreIdentity {
                format_version: records::FORMAT_VERSION,
                ..self.identity
            };
            batch.put(
                Cf::Meta,
                keys::FORMAT_KEY,
                &records::encode_format(&identity),
            );
        }
        self.catalog_mut().active = Some(snap);
        Ok(Capture {
            store: self.clone(),
            info,
            rels,
            mappings: Vec::new(),
            mapped: HashSet::new(),
            batch,
            pending_images: HashMap::new(),
            pending_toast: HashMap::new(),
            batches_written: 0,
            existing: HashSet::new(),
            toast_refs: HashMap::new(),
            first_image_seq: marker.first_image_seq,
            key_maps: Vec::new(),
            prefetched: HashMap::new(),
            recorded: HashMap::new(),
            recorded_bytes: 0,
            deltas: HashSet::new(),
            gathered: Gathered::new(self.recent().budget()),
            failed: None,
            finished: false,
        })
    }
    /// [`SnapshotStore::declare`] then [`SnapshotStore::begin_capture`], for callers that
    /// never queue declarations.
    pub fn declare_and_begin(&self, decl: SnapshotDecl) -> Result<Capture<B>> {
        let snap = self.declare(decl)?;
        self.begin_capture(snap)
    }

    /// Gives up a declared snapshot whose capture was never begun: recorded as failed with
    /// `reason` (listed, never readable).
    pub fn abandon(&self, snap: SnapId, reason: &str) -> Result<()> {
        {
            let cat = self.catalog();
            if cat.active == Some(snap)
                || cat.snaps.get(&snap).map(|s| s.state) != Some(SnapshotState::Capturing)
            {
                return Err(StoreError::invalid(format!(
                    "snapshot {} is not a declared snapshot awaiting capture",
                    snap.0
                )));
            }
        }
        self.remove_capture(snap, reason)
    }
}

impl<B: KvBackend> Capture<B> {
    /// The snapshot being captured.
    pub fn snapshot(&self) -> SnapId {
        self.info.id
    }

    /// What the capture stored so far.
    pub fn stats(&self) -> CaptureStats {
        self.info.stats
    }

    /// True if image `id` was stored by this capture (not found by its content among older
    /// images).
    pub fn stored_image(&self, id: ImageId) -> bool {
        let seq = keys::image_seq(id);
        seq >= self.first_new_image_seq() && seq < self.store.next_id(Counter::Image)
    }

    /// How many of the new images were given a delta.
    pub fn deltas(&self) -> usize {
        self.deltas.len()
    }

    fn first_new_image_seq(&self) -> u64 {
        self.first_image_seq
    }

    /// True if the capture adds a reference to content stored before it: a mapping to an
    /// older image, or any TOAST value named by its new images (the value may be older). Only
    /// then does committing it change what deleting an older snapshot would free, besides the
    /// snapshot newest before it ([`SnapshotStore::would_free`]).
    pub fn shares_older_content(&self) -> bool {
        self.names_toast_values() || !self.older_images_mapped().is_empty()
    }

    /// True if the capture's new images name TOAST values.
    pub fn names_toast_values(&self) -> bool {
        !self.toast_refs.is_empty()
    }

    /// The images stored before this capture that it maps (each once).
    pub fn older_images_mapped(&self) -> HashSet<ImageId> {
        self.mappings
            .iter()
            .map(|&(_, image)| image)
            .filter(|&image| keys::image_seq(image) < self.first_new_image_seq())
            .collect()
    }

    /// The store the capture writes to.
    pub fn store(&self) -> &SnapshotStore<B> {
        &self.store
    }

    /// Images stored before this capture that it maps (reclamation must keep them).
    pub fn existing_images(&self) -> &HashSet<ImageId> {
        &self.existing
    }

    /// Stores the view of one page (at most [`MAX_VIEW_BYTES`]) whose tuples name the stored
    /// TOAST values `toasts`, and returns its image id: the id of an identical view stored
    /// earlier (by any capture) if there is one.
    pub fn put_image(&mut self, view: &[u8], toasts: &[ToastId]) -> Result<ImageId> {
        self.usable()?;
        check_view(view)?;
        let sealed = SealedView {
            sealed: records::seal_image(view),
            raw_len: view.len(),
            found: Probe::NotYet,
            capture: self.info.id,
        };
        self.put_sealed(sealed, toasts)
    }

    /// Seals page views ahead of their [`Capture::put_sealed`] (at most [`MAX_VIEW_BYTES`]
    /// each): compresses and fingerprints each, and looks all their fingerprints up in the
    /// dedup index with one batched read instead of one read per view (phase two seals its
    /// pages a chunk at a time). The views may be stored in any order, or not at all.
    pub fn seal_views(&mut self, views: &[&[u8]]) -> Result<Vec<SealedView>> {
        self.usable()?;
        for view in views {
            check_view(view)?;
        }
        let sealed: Vec<records::SealedImage> =
            views.iter().map(|v| records::seal_image(v)).collect();
        let keys: Vec<_> = sealed
            .iter()
            .map(|s| keys::dedup_key(DedupKind::Image, &s.fp))
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let found = self.store.backend.multi_get(Cf::Dedup, &refs)?;
        let written = self.batches_written;
        sealed
            .into_iter()
            .zip(views)
            .zip(found)
            .map(|((sealed, view), found)| {
                let found = match found {
                    Some(v) => Probe::Found(keys::decode_u64_value(&v, "dedup entry")?),
                    None => Probe::Missing { written },
                };
                Ok(SealedView {
                    sealed,
                    raw_len: view.len(),
                    found,
                    capture: self.info.id,
                })
            })
            .collect()
    }

    /// Stores a view sealed by [`Capture::seal_views`] as [`Capture::put_image`] stores the
    /// view itself. InvalidArgument if another capture sealed it (what the dedup index said
    /// then is not this capture's to trust).
    pub fn put_sealed(&mut self, view: SealedView, toasts: &[ToastId]) -> Result<ImageId> {
        self.usable()?;
        let SealedView {
            sealed,
            raw_len,
            found,
            capture,
        } = view;
        if capture != self.info.id {
            return Err(StoreError::invalid(format!(
                "a page view sealed by the capture of snapshot {}, stored by that of snapshot {}",
                capture.0, self.info.id.0
            )));
        }
        let fp = sealed.fp;
        let known = match (self.pending_images.get(&fp), found) {
            (Some(id), _) => Some(id.0),
            (None, Probe::Found(id)) => Some(id),
            (None, Probe::Missing { written }) if written == self.batches_written => None,
            (None, _) => self.find(DedupKind::Image, &fp)?,
        };
        if let Some(id) = known {
            self.info.stats.dedup_hits += 1;
            let id = ImageId(id);
            if keys::image_seq(id) < self.first_new_image_seq() {
                self.existing.insert(id);
            }
            return Ok(id);
        }
        let rank = self.info.decl.rank;
        let id = keys::image_id(rank, self.alloc(Counter::Image)?);
        let record = sealed.record;
        let st = &mut self.info.stats;
        st.new_images += 1;
        st.image_bytes_raw += raw_len as u64;
        st.image_bytes_stored += record.len() as u64;
        self.batch
            .put(Cf::Images(rank), &keys::image_key(id), &record);
        let mut named: Vec<ToastId> = toasts.to_vec();
        named.sort_unstable();
        named.dedup();
        if !named.is_empty() {
            let list: Vec<u8> = named.iter().flat_map(|t| t.0.to_be_bytes()).collect();
            self.batch.put(Cf::Refs, &keys::image_toasts_key(id), &list);
            for t in named {
                *self.toast_refs.entry(t).or_default() += 1;
            }
        }
        self.batch.put(
            Cf::Dedup,
            &keys::dedup_key(DedupKind::Image, &fp),
            &id.0.to_be_bytes(),
        );
        self.pending_images.insert(fp, id);
        self.gathered.offer(id, record);
        self.flush_if_full()?;
        Ok(id)
    }

    /// Stores the delta of image `image`, which this capture stored (InvalidArgument if it did
    /// not): opaque bytes (at most [`MAX_VIEW_BYTES`]) saying what changed from the image its
    /// block held before. Kept until the image is freed; read with
    /// [`SnapshotStore::deltas`]. An image has at most one delta: the first one given (two
    /// pages of a capture may reach the same new content from different bases).
    pub fn put_delta(&mut self, image: ImageId, delta: &[u8]) -> Result<()> {
        self.usable()?;
        if !self.stored_image(image) {
            return Err(StoreError::invalid(format!(
                "a delta of {image}, which the capture of snapshot {} did not store",
                self.info.id.0
            )));
        }
        if delta.len() > MAX_VIEW_BYTES {
            return Err(StoreError::invalid(format!(
                "delta of {} bytes is larger than the {MAX_VIEW_BYTES}-byte maximum",
                delta.len()
            )));
        }
        if !self.deltas.insert(image) {
            return Ok(());
        }
        let record = records::encode_image(delta, &Fingerprint::of(delta));
        // Counted with the images they describe.
        self.info.stats.image_bytes_stored += record.len() as u64;
        self.batch.put(Cf::Deltas, &keys::delta_key(image), &record);
        self.flush_if_full()
    }

    /// Stores a TOAST value (at most [`MAX_TOAST_BYTES`]) in chunks of
    /// [`TOAST_CHUNK_BYTES`] and returns its id: the id of an identical value stored earlier
    /// if there is one.
    pub fn put_toast(&mut self, value: &[u8]) -> Result<ToastId> {
        self.usable()?;
        if value.len() > MAX_TOAST_BYTES {
            return Err(StoreError::invalid(format!(
                "TOAST value of {} bytes is larger than the {MAX_TOAST_BYTES}-byte maximum",
                value.len()
            )));
        }
        let fp = Fingerprint::of(value);
        if let Some(id) = self.find(DedupKind::Toast, &fp)? {
            return Ok(ToastId(id));
        }
        let id = ToastId(self.alloc(Counter::Toast)?);
        let mut chunks = 0u32;
        for (no, chunk) in value.chunks(TOAST_CHUNK_BYTES).enumerate() {
            let record = records::encode_toast_chunk(chunk);
            self.info.stats.toast_bytes_stored += record.len() as u64;
            self.batch
                .put(Cf::Toast, &keys::toast_chunk_key(id, no as u32), &record);
            chunks += 1;
            self.flush_if_full()?;
        }
        // Header and dedup entry after every chunk: a crash keeps a prefix of the batches, so
        // whoever sees the header (or the dedup entry) sees the whole value.
        let header = ToastInfo {
            len: value.len() as u64,
            chunks,
            chunk_size: TOAST_CHUNK_BYTES as u32,
            fingerprint: fp,
        };
        self.batch.put(
            Cf::Toast,
            &keys::toast_header_key(id),
            &records::encode_toast_header(&header),
        );
        self.batch.put(
            Cf::Dedup,
            &keys::dedup_key(DedupKind::Toast, &fp),
            &id.0.to_be_bytes(),
        );
        self.info.stats.new_toast_values += 1;
        self.pending_toast.insert(fp, id);
        self.flush_if_full()?;
        Ok(id)
    }

    /// Adds the mapping (page, this snapshot) -> image. The page's relation must be in the
    /// declaration, and a page is mapped at most once per capture (InvalidArgument: a second
    /// mapping would leave the first one's new image counted by nothing). Mappings stay in
    /// memory until the commit writes them to the mapping log.
    pub fn add_mapping(&mut self, page: PageKey, image: ImageId) -> Result<()> {
        self.usable()?;
        self.check_page(page)?;
        let next = self.store.next_id(Counter::Image);
        let seq = keys::image_seq(image);
        if seq == 0 || seq >= next || keys::image_rank(image).0 >= keys::IMAGE_RANKS {
            return Err(StoreError::invalid(format!(
                "mapping of {page} names {image}, which was never allocated"
            )));
        }
        if !self.mapped.insert(page) {
            return Err(StoreError::invalid(format!(
                "{page} is mapped twice in the capture of snapshot {}",
                self.info.id.0
            )));
        }
        self.mappings.push((page, image));
        self.info.stats.pages_captured += 1;
        Ok(())
    }

    /// Records that `page`, as this capture stores it, holds rows whose keys hash to
    /// `hashes` under key map `map` (its start snapshot; see `keymap.rs`): hashes made with
    /// [`crate::settle_key_hash`], or [`crate::WILDCARD_KEY`] for a row whose key could not be
    /// hashed. Compared with what the block held at its last recording: an entry begins for
    /// each hash it gains, the entry of each hash it lost ends at this snapshot. Every page
    /// this capture stores must be recorded, changed or not (a failed capture may have
    /// recorded another content).
    pub fn record_keys(&mut self, page: PageKey, map: SnapId, hashes: &[u64]) -> Result<()> {
        self.usable()?;
        self.check_page(page)?;
        let mut now: Vec<u64> = hashes.to_vec();
        now.sort_unstable();
        now.dedup();
        let before = match self.prefetched.remove(&page) {
            Some(held) => held,
            None => match self.cached_open_entries(page, map) {
                Some(held) => held,
                None => {
                    let mut cursor = self.store.backend.cursor(Cf::Keys)?;
                    open_entries(cursor.as_mut(), page, map)?
                }
            },
        };
        let snap = self.info.id;
        let (rel, block) = (page.rel, page.block);
        let mut after: OpenEntries = Vec::with_capacity(now.len());
        let (mut i, mut j) = (0, 0);
        while i < before.len() || j < now.len() {
            match (before.get(i).copied(), now.get(j).copied()) {
                (Some((h, from)), Some(n)) if h == n => {
                    after.push((h, from));
                    i += 1;
                    j += 1;
                }
                (Some((h, from)), n) if n.is_none_or(|n| h < n) => {
                    // Gone: its entry ends here.
                    let k = keys::key_entry_key(rel, map, h, block, SnapId(from));
                    self.batch.put(Cf::Keys, &k, &snap.0.to_be_bytes());
                    self.batch
                        .delete(Cf::Keys, &keys::open_key_key(rel, map, block, h));
                    i += 1;
                }
                (_, n) => {
                    // New: an entry begins here.
                    let n = n.expect("the other arms take every old hash not below it");
                    let k = keys::key_entry_key(rel, map, n, block, snap);
                    self.batch.put(Cf::Keys, &k, &u64::MAX.to_be_bytes());
                    self.batch.put(
                        Cf::Keys,
                        &keys::open_key_key(rel, map, block, n),
                        &snap.0.to_be_bytes(),
                    );
                    after.push((n, snap.0));
                    j += 1;
                }
            }
        }
        let cost = openkeys::cost(&after);
        if self.recorded_bytes + cost <= self.store.options.open_key_cache_bytes {
            self.recorded_bytes += cost;
            if let Some(old) = self.recorded.insert((page, map), after) {
                self.recorded_bytes -= openkeys::cost(&old);
            }
        }
        self.flush_if_full()
    }

    /// The open entries of `page` under `map` as this capture left them, if it recorded the
    /// page already, else as the last committed capture left them, if the store's cache
    /// still has them (taken out of it: see `openkeys.rs`).
    fn cached_open_entries(&mut self, page: PageKey, map: SnapId) -> Option<OpenEntries> {
        if let Some(held) = self.recorded.get(&(page, map)) {
            return Some(held.clone());
        }
        self.store.open_keys().take(page, map)
    }

    /// Reads the open key entries of `pages` (each with its key map) ahead, with one cursor,
    /// for the [`Capture::record_keys`] of each; those the store's cache holds are taken
    /// from it instead. A page is recorded once per capture, so nothing read ahead goes
    /// stale.
    pub fn prefetch_block_keys(&mut self, pages: &[(PageKey, SnapId)]) -> Result<()> {
        self.usable()?;
        let mut wanted: Vec<(PageKey, SnapId)> = pages
            .iter()
            .filter(|(p, _)| !self.prefetched.contains_key(p))
            .copied()
            .collect();
        wanted.sort_unstable_by_key(|&(p, m)| (p.rel, m, p.block));
        wanted.dedup();
        let store = self.store.clone();
        let mut cursor = None;
        for (page, map) in wanted {
            let held = match self.cached_open_entries(page, map) {
                Some(held) => held,
                None => {
                    let cursor = match &mut cursor {
                        Some(c) => c,
                        None => cursor.insert(store.backend.cursor(Cf::Keys)?),
                    };
                    open_entries(cursor.as_mut(), page, map)?
                }
            };
            self.prefetched.insert(page, held);
        }
        Ok(())
    }

    /// The content of image `id`, stored earlier (the base of a delta): from the store's
    /// memory of the images the last committed captures stored if it holds it (taken out:
    /// the page is being given a newer image), else read from the store.
    pub fn base_image(&mut self, id: ImageId) -> Result<Vec<u8>> {
        let cached = self.store.recent().take(id);
        match cached {
            Some(record) => self.store.image_content(id, Some(record)),
            None => self.store.image(id),
        }
    }

    /// Starts the key map of relation incarnation `rel` at this snapshot, with the caller's
    /// definition of the key (`def`, opaque): written at commit. The capture must record the
    /// keys of every page of the relation (mapped or not) with [`Capture::add_keys`].
    pub fn start_key_map(&mut self, rel: RelId, def: &[u8]) -> Result<()> {
        self.usable()?;
        self.check_rel(rel)?;
        self.key_maps.push((rel, Some(def.to_vec())));
        Ok(())
    }

    /// Ends the key map of `rel` at this snapshot (its record is removed at commit; the
    /// entries stay until their images are freed).
    pub fn end_key_map(&mut self, rel: RelId) -> Result<()> {
        self.usable()?;
        self.check_rel(rel)?;
        self.key_maps.push((rel, None));
        Ok(())
    }

    /// Records that `page` is unsettled at this snapshot and carried into the next span.
    pub fn carry(&mut self, page: PageKey) -> Result<()> {
        self.usable()?;
        self.check_page(page)?;
        self.batch
            .put(Cf::Catalog, &keys::carried_key(self.info.id, page), &[]);
        self.info.stats.carried_pages += 1;
        self.flush_if_full()
    }

    /// Makes the snapshot durable and visible: the remaining images, the snapshot's mappings
    /// appended to the mapping log, the committed catalog entry and the removal of the
    /// capturing marker, in one synced batch. On error the capture is aborted (as by dropping
    /// it).
    pub fn commit(mut self) -> Result<SnapshotInfo> {
        self.usable()?;
        let mut info = self.info.clone();
        info.state = SnapshotState::Committed;
        let snap = info.id;
        // Counts of older content change: the kept estimates of what deleting a snapshot
        // would free go in the same batch (`estimates.rs`).
        let shares_older = self.shares_older_content();
        let mappings = sorted_mappings(snap, std::mem::take(&mut self.mappings));
        info.stats.pages_captured = mappings.len() as u64;
        let r = self.store.append_to_log(snap, &mappings, &mut self.batch);
        self.poison_on_error(r)?;
        let r = self.add_references(&mappings);
        self.poison_on_error(r)?;
        self.batch.put(
            Cf::Catalog,
            &keys::snapshot_key(snap),
            &records::encode_snapshot(&info),
        );
        self.batch.delete(Cf::Catalog, &keys::capturing_key(snap));
        let remapped: Vec<RelId> = self.key_maps.iter().map(|(rel, _)| *rel).collect();
        for (rel, def) in std::mem::take(&mut self.key_maps) {
            let r = self.end_entries(rel);
            self.poison_on_error(r)?;
            let key = keys::key_map_key(rel);
            match def {
                Some(def) => {
                    let mut value = snap.0.to_be_bytes().to_vec();
                    value.extend_from_slice(&def);
                    self.batch.put(Cf::Catalog, &key, &value);
                }
                None => {
                    self.batch.delete(Cf::Catalog, &key);
                    for from in keys::KEY_MAP_TAGS.map(|tag| keys::key_rel_prefix(tag, rel)) {
                        let to = keys::prefix_end(&from).expect("a tagged prefix has an end");
                        self.batch.delete_range(Cf::Keys, &from, &to);
                    }
                }
            }
        }
        let mut batch = std::mem::take(&mut self.batch);
        let written = if shares_older {
            self.store
                .write_forgetting_estimates(&mut batch, true, Forget::All)
        } else {
            self.store.backend.write(&batch, true)
        };
        if let Err(e) = written {
            self.failed = Some(e.clone());
            return Err(e);
        }
        self.finished = true;
        {
            let mut cache = self.store.open_keys();
            for rel in remapped {
                cache.forget_rel(rel);
            }
            cache.put_all(std::mem::take(&mut self.recorded));
        }
        self.store.recent().add(std::mem::take(&mut self.gathered));
        let mut cat = self.store.catalog_mut();
        cat.snaps.insert(
            snap,
            SnapSummary {
                state: SnapshotState::Committed,
                declared_at_us: info.decl.declared_at_us,
            },
        );
        cat.active = None;
        Ok(info)
    }

    /// Abandons the capture: the snapshot is recorded as failed with `reason` (listed, never
    /// readable) and the carried pages written so far are removed; its mappings were never
    /// written. Images and TOAST values already written stay (they are content-addressed;
    /// garbage collection reclaims them).
    pub fn abort(mut self, reason: &str) -> Result<()> {
        self.abort_inner(reason)
    }

    fn abort_inner(&mut self, reason: &str) -> Result<()> {
        self.finished = true;
        self.batch = WriteBatch::new();
        let result = self.store.remove_capture(self.info.id, reason);
        if result.is_err() {
            self.store.catalog_mut().needs_recovery = true;
        }
        result
    }

    /// Puts into the commit batch the reference counts the snapshot adds: one per mapping to
    /// its image, one per new image to each TOAST value it names. An image this capture
    /// stored has no count yet (image ids are never reused, and nothing but a commit writes
    /// an image's count), so only the counts of older images and of TOAST values are read:
    /// under pgbench nearly every mapping names a new image, and reading their counts was
    /// a tenth of the worker's main thread.
    fn add_references(&mut self, mappings: &[Mapping]) -> Result<()> {
        let mut images: HashMap<ImageId, u64> = HashMap::new();
        for m in mappings {
            *images.entry(m.image).or_default() += 1;
        }
        let mut older: Vec<(u64, [u8; 9])> = Vec::new();
        for (id, n) in images {
            if self.stored_image(id) {
                self.batch
                    .put(Cf::Refs, &keys::image_refs_key(id), &n.to_be_bytes());
            } else {
                older.push((n, keys::image_refs_key(id)));
            }
        }
        let toasts: Vec<(u64, [u8; 9])> = std::mem::take(&mut self.toast_refs)
            .into_iter()
            .map(|(id, n)| (n, keys::toast_refs_key(id)))
            .collect();
        for (n, key, count) in self.store.counts(older.iter().chain(&toasts))? {
            self.batch.put(Cf::Refs, &key, &(count + n).to_be_bytes());
        }
        Ok(())
    }

    fn usable(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(StoreError::new(
                e.kind(),
                format!(
                    "the capture of snapshot {} cannot continue after an earlier error ({}); \
                     abort it",
                    self.info.id.0,
                    e.message()
                ),
            )),
        }
    }

    fn check_page(&self, page: PageKey) -> Result<()> {
        if !self.rels.contains(&page.rel) {
            return Err(StoreError::invalid(format!(
                "{page} is not in snapshot {}'s declaration",
                self.info.id.0
            )));
        }
        Ok(())
    }

    /// Puts into the batch the removal of the entries of `rel`'s current key map (it ends or
    /// starts again).
    fn end_entries(&mut self, rel: RelId) -> Result<()> {
        if let Some(old) = self.store.key_map(rel)? {
            for from in keys::KEY_MAP_TAGS.map(|tag| keys::key_map_prefix(tag, rel, old.start)) {
                let to = keys::prefix_end(&from).expect("a tagged prefix has an end");
                self.batch.delete_range(Cf::Keys, &from, &to);
            }
        }
        Ok(())
    }

    fn check_rel(&self, rel: RelId) -> Result<()> {
        self.check_page(PageKey { rel, block: 0 })
    }

    /// Looks a fingerprint up among this batch's new content, then in the dedup index.
    fn find(&self, kind: DedupKind, fp: &Fingerprint) -> Result<Option<u64>> {
        let pending = match kind {
            DedupKind::Image => self.pending_images.get(fp).map(|i| i.0),
            DedupKind::Toast => self.pending_toast.get(fp).map(|i| i.0),
            DedupKind::RowType => None,
        };
        if pending.is_some() {
            return Ok(pending);
        }
        match self
            .store
            .backend
            .get(Cf::Dedup, &keys::dedup_key(kind, fp))?
        {
            Some(v) => Ok(Some(keys::decode_u64_value(&v, "dedup entry")?)),
            None => Ok(None),
        }
    }

    fn alloc(&mut self, c: Counter) -> Result<u64> {
        let mut ids = self.store.lock_ids();
        let r = self.store.alloc_leased(&mut ids, c);
        drop(ids);
        self.poison_on_error(r)
    }

    fn flush_if_full(&mut self) -> Result<()> {
        if self.batch.size_bytes() < self.store.options.max_batch_bytes {
            return Ok(());
        }
        let r = self.store.backend.write(&self.batch, false);
        self.batch.clear();
        self.poison_on_error(r)?;
        self.batches_written += 1;
        self.pending_images.clear();
        self.pending_toast.clear();
        Ok(())
    }

    fn poison_on_error<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }
}

/// A page view sealed ahead of its storing ([`Capture::seal_views`]): its record, its
/// fingerprint and what the dedup index said of it.
pub struct SealedView {
    sealed: records::SealedImage,
    raw_len: usize,
    found: Probe,
    /// The snapshot whose capture sealed it (only that capture may store it).
    capture: SnapId,
}

/// What the dedup index held for a sealed view's fingerprint when it was looked up.
#[derive(Clone, Copy)]
enum Probe {
    /// Not looked up yet.
    NotYet,
    /// An image with that content.
    Found(u64),
    /// Nothing, when the capture had written `written` batches.
    Missing { written: u64 },
}

fn check_view(view: &[u8]) -> Result<()> {
    if view.len() > MAX_VIEW_BYTES {
        return Err(StoreError::invalid(format!(
            "page view of {} bytes is larger than the {MAX_VIEW_BYTES}-byte maximum",
            view.len()
        )));
    }
    Ok(())
}

/// The open key entries (hash, from) of `page` under key map `map`, ascending by hash, read
/// with `cursor`.
fn open_entries(cursor: &mut dyn KvCursor, page: PageKey, map: SnapId) -> Result<Vec<(u64, u64)>> {
    let prefix = keys::open_keys_prefix(page.rel, map, page.block);
    cursor.seek(&prefix)?;
    let mut held = Vec::new();
    while let Some((k, v)) = cursor.current() {
        if !k.starts_with(&prefix) {
            break;
        }
        held.push((
            keys::decode_open_key(k)?.2,
            keys::decode_u64_value(v, "open key entry")?,
        ));
        cursor.next()?;
    }
    Ok(held)
}

/// A capture's mappings as the log takes them: sorted by page, the last one added for each
/// page.
fn sorted_mappings(snap: SnapId, mut added: Vec<(PageKey, ImageId)>) -> Vec<Mapping> {
    // A stable sort keeps the pages' mappings in the order they were added.
    added.sort_by_key(|(page, _)| *page);
    let mut out: Vec<Mapping> = Vec::with_capacity(added.len());
    for (page, image) in added {
        match out.last_mut() {
            Some(last) if last.page == page => last.image = image,
            _ => out.push(Mapping { page, snap, image }),
        }
    }
    out
}

impl<B: KvBackend> Drop for Capture<B> {
    fn drop(&mut self) {
        if !self.finished {
            // Errors cannot be reported from drop; a failed clean-up sets needs_recovery and
            // the next capture (or the next open) finishes it.
            let _ = self.abort_inner(
                "capture abandoned before commit (the worker raised an error or stopped)",
            );
        }
    }
}
