//! [`SnapshotStore`]: opening (format and identity checks), id allocation, and crash recovery.
//!
//! The operations live in sibling modules: `capture.rs` (writing a snapshot), `read.rs`
//! (images, TOAST values), `maplog.rs` (the mapping log: mappings, page tables, group
//! rebuilds), `catalog.rs` (snapshot listing, deletion, carried pages, row types, relation
//! incarnations, GC progress) and `groups.rs` (sealed index groups and their metadata).
//!
//! Invariants kept here:
//! - a store is used only after its format record was checked: right magic, right format
//!   version, right cluster (PostgreSQL system identifier);
//! - after `open` returns, no snapshot is in the capturing state: every capture that never
//!   committed has had its carried pages removed and is marked failed (its mappings never
//!   reached the mapping log, which only a commit writes);
//! - every id the store hands out is below the persisted counter of its kind, durably, before
//!   it is handed out (ids of snapshots, images and TOAST values through a synced lease, the
//!   others through the synced batch that records them), so no id is ever handed out twice,
//!   crash or not. A clean close gives back what is left of the snapshot ids' lease
//!   (`give_back_leases`), so snapshot ids run on without a gap across clean restarts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::SnapId;
use crate::keys::{self, Cf, Counter};
use crate::mem::MemBackend;
use crate::openkeys::OpenKeyCache;
use crate::recent::RecentImages;
use crate::records::{
    self, SnapshotDecl, SnapshotInfo, SnapshotState, StoreIdentity, FORMAT_VERSION,
};
use crate::rocks::RocksBackend;
use gsnap_core::skippy::SkippyConfig;

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL's system identifier of the cluster opening the store. A store created by
    /// another cluster is refused.
    pub system_identifier: u64,
    /// Create the store if the directory (or backend) is missing or empty.
    pub create: bool,
    /// A capture writes its images, TOAST chunks and carried pages in unsynced batches of
    /// about this many bytes before the final synced commit (bounds the writer's memory).
    pub max_batch_bytes: usize,
    /// How many image or TOAST ids one synced counter update reserves.
    pub id_lease: u64,
    /// How many snapshot ids one synced counter update reserves (a declaration's own write
    /// is not synced: see [`SnapshotStore::declare`]). After a crash the rest of the lease
    /// is skipped, as PostgreSQL's sequences skip their cached values.
    pub snap_id_lease: u64,
    /// The version of what the caller stores in images, row types and groups (opaque to the
    /// store). Recorded when the store is created; opening a store recorded with another
    /// version is refused (Incompatible), unless it is an older one the caller still reads
    /// (`oldest_content_version`): the record is then raised to this version, so that the
    /// build that wrote it refuses the store once newer content may be in it. 0: no check.
    pub content_version: u32,
    /// The oldest content version the caller reads (0: only `content_version`).
    pub oldest_content_version: u32,
    /// The shape of a new store's mapping log: entries per node and Skippy levels above
    /// level 0. Used only when the store is created (it is then recorded in the format
    /// record, and an existing store keeps its own).
    pub mapping_log: SkippyConfig,
    /// RocksDB's block cache for [`SnapshotStore::open_dir`], in bytes (None: the backend's
    /// default, [`RocksConfig`]).
    pub block_cache_bytes: Option<usize>,
    /// Memory for the open key entries of the blocks the last captures recorded, so that the
    /// next capture does not read them from the store (`openkeys.rs`); 0: none kept.
    pub open_key_cache_bytes: usize,
    /// Memory for the records of the images the last committed captures stored, which the
    /// next ones read as the bases of their page deltas (`recent.rs`); 0: none kept.
    pub recent_image_cache_bytes: usize,
}

impl StoreOptions {
    /// Options for the cluster `system_identifier`, creating the store if needed, with the
    /// default batch size (4 MiB) and id leases (65536 images or TOAST values, 32
    /// snapshots).
    pub fn new(system_identifier: u64) -> Self {
        StoreOptions {
            system_identifier,
            create: true,
            max_batch_bytes: 4 << 20,
            id_lease: 1 << 16,
            snap_id_lease: 32,
            content_version: 0,
            oldest_content_version: 0,
            mapping_log: SkippyConfig::default(),
            block_cache_bytes: None,
            open_key_cache_bytes: 64 << 20,
            recent_image_cache_bytes: 64 << 20,
        }
    }
}

/// Next ids, and for leased kinds the persisted upper bound.
#[derive(Debug)]
pub(crate) struct IdAllocator {
    next: [u64; 6],
    durable: [u64; 6],
}

const COUNTERS: [Counter; 6] = [
    Counter::Snap,
    Counter::Image,
    Counter::Toast,
    Counter::Rel,
    Counter::RowType,
    Counter::Group,
];

fn slot(c: Counter) -> usize {
    match c {
        Counter::Snap => 0,
        Counter::Image => 1,
        Counter::Toast => 2,
        Counter::Rel => 3,
        Counter::RowType => 4,
        Counter::Group => 5,
    }
}

/// What the store keeps in memory about each snapshot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SnapSummary {
    pub state: SnapshotState,
    pub declared_at_us: i64,
}

#[derive(Debug, Default)]
pub(crate) struct CatalogState {
    pub snaps: BTreeMap<SnapId, SnapSummary>,
    /// The snapshot being captured, if any (at most one at a time).
    pub active: Option<SnapId>,
    /// A capture was abandoned and its removal failed: recover before the next capture.
    pub needs_recovery: bool,
}

/// gsnap's snapshot store over a [`KvBackend`]: a cheap handle (cloning it shares the one
/// open store, which closes when the last handle is dropped), so a capture or an index can
/// own a handle instead of borrowing. `Send + Sync`: reads take `&self` and may run on helper
/// threads while the worker captures.
pub struct SnapshotStore<B: KvBackend>(Arc<StoreState<B>>);

impl<B: KvBackend> Clone for SnapshotStore<B> {
    fn clone(&self) -> Self {
        SnapshotStore(Arc::clone(&self.0))
    }
}

impl<B: KvBackend> std::ops::Deref for SnapshotStore<B> {
    type Target = StoreState<B>;

    fn deref(&self) -> &StoreState<B> {
        &self.0
    }
}

/// What a [`SnapshotStore`] handle shares: the backend and the store's state in memory.
pub struct StoreState<B: KvBackend> {
    pub(crate) backend: B,
    pub(crate) identity: StoreIdentity,
    pub(crate) options: StoreOptions,
    pub(crate) ids: Mutex<IdAllocator>,
    pub(crate) catalog: RwLock<CatalogState>,
    /// Check images read against their fingerprints (see `set_verify_images`).
    pub(crate) verify_images: std::sync::atomic::AtomicBool,
    /// The mapping log rewrite begun last (`maplog.rs`; 0: none since the store was opened).
    pub(crate) log_rewrite: std::sync::atomic::AtomicU64,
    /// The open key entries the last captures left on the blocks they recorded.
    pub(crate) open_keys: Mutex<OpenKeyCache>,
    /// The records of the images the last committed captures stored.
    pub(crate) recent: Mutex<RecentImages>,
    /// Batches written that forgot the kept estimates (`estimates.rs`); held while such a
    /// batch, or kept estimates, are written.
    pub(crate) estimates_epoch: Mutex<u64>,
}

impl SnapshotStore<RocksBackend> {
    /// Opens (or, with `options.create`, creates) the RocksDB store in `path`.
    pub fn open_dir(path: &std::path::Path, options: StoreOptions) -> Result<Self> {
        let mut config = crate::RocksConfig::default();
        if let Some(bytes) = options.block_cache_bytes {
            config.block_cache_bytes = bytes;
        }
        let backend = RocksBackend::open_with(path, options.create, &config)?;
        let store = Self::open(backend, options)?;
        store.backend.finish_creation()?;
        Ok(store)
    }
}

impl SnapshotStore<MemBackend> {
    /// A new, empty in-memory store (for tests, here and in other crates).
    pub fn open_in_memory(system_identifier: u64) -> Self {
        Self::open(MemBackend::new(), StoreOptions::new(system_identifier))
            .expect("an empty in-memory store always opens")
    }
}

impl<B: KvBackend> SnapshotStore<B> {
    /// Opens the store held by `backend`: checks (or, if the backend is empty and
    /// `options.create`, writes) the format record, loads the catalog and recovers captures
    /// that never committed.
    pub fn open(backend: B, options: StoreOptions) -> Result<Self> {
        let where_ = backend.describe();
        let identity = match backend.get(Cf::Meta, keys::FORMAT_KEY)? {
            Some(v) => records::decode_format(&v, &where_)?,
            None => initialize(&backend, &options, &where_)?,
        };
        if identity.system_identifier != options.system_identifier {
            return Err(StoreError::incompatible(format!(
                "{where_} belongs to another PostgreSQL cluster (system identifier {}, this \
                 cluster's is {}); each cluster needs its own store: point gsnap at a new \
                 directory, or move this one back to its cluster",
                identity.system_identifier, options.system_identifier
            )));
        }
        check_content_version(&backend, &options, &where_)?;
        let ids = load_counters(&backend)?;
        let mut catalog = CatalogState::default();
        for entry in Scan::prefix(&backend, Cf::Catalog, &[keys::TAG_SNAPSHOT])? {
            let (k, v) = entry?;
            let id = SnapId(keys::decode_tagged_u64(&k, keys::TAG_SNAPSHOT)?);
            let info = records::decode_snapshot(id, &v).map_err(|e| e.context(&where_))?;
            catalog.snaps.insert(
                id,
                SnapSummary {
                    state: info.state,
                    declared_at_us: info.decl.declared_at_us,
                },
            );
        }
        let store = SnapshotStore(Arc::new(StoreState {
            backend,
            identity,
            ids: Mutex::new(ids),
            catalog: RwLock::new(catalog),
            verify_images: std::sync::atomic::AtomicBool::new(true),
            log_rewrite: std::sync::atomic::AtomicU64::new(0),
            open_keys: Mutex::new(OpenKeyCache::new(options.open_key_cache_bytes)),
            recent: Mutex::new(RecentImages::new(options.recent_image_cache_bytes)),
            estimates_epoch: Mutex::new(0),
            options,
        }));
        store.recover()?;
        Ok(store)
    }

    /// Who the store belongs to.
    pub fn identity(&self) -> StoreIdentity {
        self.identity
    }

    /// The backend (for tests and maintenance tools).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Writes a consistent copy of the store into the directory `dir` (which must not exist),
    /// for a backup that keeps the snapshots; returns the newest snapshot committed in it.
    /// The copy is the store at one moment: opened later (by the same cluster, or a copy of
    /// its data directory), a capture that was in flight is failed, as after a crash.
    pub fn copy_to(&self, dir: &std::path::Path) -> Result<Option<SnapId>> {
        // Read before the copy: a capture another thread committed meanwhile would be in the
        // copy too (the worker commits on the thread that asks for copies, so none does).
        let newest = self.latest_committed();
        self.backend.copy_to(dir)?;
        Ok(newest)
    }

    /// Gives back the snapshot ids leased and not handed out: the counter is written down to
    /// the next id (synced), so that the next open goes on from there instead of skipping the
    /// lease. Safe at any time (nothing at or above that id was handed out, and the next
    /// declaration leases again); the worker calls it when it stops cleanly. Errors: the
    /// backend's (the lease is then skipped after a restart, as after a crash).
    pub fn give_back_leases(&self) -> Result<()> {
        let mut ids = self.lock_ids();
        let i = slot(Counter::Snap);
        if ids.next[i] < ids.durable[i] {
            let mut b = WriteBatch::new();
            b.put(
                Cf::Meta,
                &keys::counter_key(Counter::Snap),
                &ids.next[i].to_be_bytes(),
            );
            self.backend.write(&b, true)?;
            ids.durable[i] = ids.next[i];
        }
        Ok(())
    }

    /// Closes the store (giving back its snapshot id lease if it can), returning its backend.
    /// Panics if another handle of the store is still alive (every capture and log reader
    /// holds one).
    pub fn into_backend(self) -> B {
        let _ = self.give_back_leases();
        match Arc::try_unwrap(self.0) {
            Ok(state) => state.backend,
            Err(_) => panic!("the store is closed while other handles of it are alive"),
        }
    }

    /// Marks failed every capture that never committed (a crash, or an abandoned capture
    /// whose clean-up failed) and removes its carried pages. Run by `open`; safe to run again
    /// (idempotent, and itself crash-safe).
    ///
    /// Refused (InvalidArgument) while a capture is open and alive: recovering would fail
    /// the snapshot it is capturing.
    pub fn recover(&self) -> Result<()> {
        {
            let cat = self.catalog();
            if let (Some(active), false) = (cat.active, cat.needs_recovery) {
                return Err(StoreError::invalid(format!(
                    "cannot recover while the capture of snapshot {} is open",
                    active.0
                )));
            }
        }
        let mut interrupted = Vec::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_CAPTURING])? {
            let (k, _) = entry?;
            interrupted.push(SnapId(keys::decode_tagged_u64(&k, keys::TAG_CAPTURING)?));
        }
        for snap in interrupted {
            self.remove_capture(
                snap,
                "capture interrupted (server crash or worker exit before commit)",
            )?;
        }
        self.catalog_mut().needs_recovery = false;
        Ok(())
    }

    /// Removes every carried page of the uncommitted snapshot `snap`, and the images and TOAST
    /// values its capture stored (in bounded unsynced batches), then marks it failed with
    /// `reason` and drops its capturing marker in one synced batch. Until that last batch is
    /// durable the marker stays, so recovery redoes the removal after a crash. There are no
    /// mappings to remove: only the commit batch writes a snapshot's mappings.
    pub(crate) fn remove_capture(&self, snap: SnapId, reason: &str) -> Result<()> {
        let mut batch = WriteBatch::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &keys::carried_prefix(snap))? {
            batch.delete(Cf::Catalog, &entry?.0);
            self.flush_if_full(&mut batch)?;
        }
        if let Some(marker) = self.backend.get(Cf::Catalog, &keys::capturing_key(snap))? {
            if let Some(m) = records::decode_capture_marker(&marker)? {
                self.remove_capture_content(&m, &mut batch)?;
            }
        }
        let mut info = match self.backend.get(Cf::Catalog, &keys::snapshot_key(snap))? {
            Some(v) => records::decode_snapshot(snap, &v)?,
            None => SnapshotInfo {
                id: snap,
                state: SnapshotState::Failed,
                decl: SnapshotDecl::default(),
                stats: Default::default(),
                failure_reason: None,
                explicit_rank: Default::default(),
                pins: Vec::new(),
                deleted_at_us: None,
            },
        };
        info.state = SnapshotState::Failed;
        info.failure_reason = Some(reason.to_string());
        batch.put(
            Cf::Catalog,
            &keys::snapshot_key(snap),
            &records::encode_snapshot(&info),
        );
        batch.delete(Cf::Catalog, &keys::capturing_key(snap));
        self.backend.write(&batch, true)?;
        let mut cat = self.catalog_mut();
        cat.snaps.insert(
            snap,
            SnapSummary {
                state: SnapshotState::Failed,
                declared_at_us: info.decl.declared_at_us,
            },
        );
        if cat.active == Some(snap) {
            cat.active = None;
        }
        Ok(())
    }

    /// Puts into `batch` (flushing it when full) the removal of the images and TOAST values
    /// an uncommitted capture stored: every image from `m.first_image_seq` on (in any rank's
    /// family) and every TOAST value from `m.first_toast` on, with their dedup entries, deltas
    /// and TOAST lists. Nothing else can refer to them: one capture runs at a time, and only its
    /// commit would have counted them.
    fn remove_capture_content(
        &self,
        m: &records::CaptureMarker,
        batch: &mut WriteBatch,
    ) -> Result<()> {
        for r in 0..keys::IMAGE_RANKS {
            let rank = crate::ids::Rank(r);
            let from = keys::image_key(keys::image_id(rank, m.first_image_seq));
            let to = keys::image_key(keys::image_id(rank, (1 << keys::IMAGE_RANK_SHIFT) - 1));
            batch.delete_range(Cf::Deltas, &from, &to);
            for entry in Scan::range(&self.backend, Cf::Images(rank), &from, Some(to.to_vec()))? {
                let (k, v) = entry?;
                let fp = records::image_fingerprint(&v)?;
                let id = keys::decode_image_key(&k)?;
                batch.delete(Cf::Images(rank), &k);
                batch.delete(Cf::Dedup, &keys::dedup_key(keys::DedupKind::Image, &fp));
                batch.delete(Cf::Refs, &keys::image_toasts_key(id));
                self.flush_if_full(batch)?;
            }
        }
        let from = keys::toast_header_key(crate::ids::ToastId(m.first_toast));
        for entry in Scan::range(&self.backend, Cf::Toast, &from, None)? {
            let (k, v) = entry?;
            if k.len() == from.len() {
                let info = records::decode_toast_header(&v)?;
                batch.delete(
                    Cf::Dedup,
                    &keys::dedup_key(keys::DedupKind::Toast, &info.fingerprint),
                );
            }
            batch.delete(Cf::Toast, &k);
            self.flush_if_full(batch)?;
        }
        Ok(())
    }

    /// Writes `batch` unsynced and empties it if it reached the batch size limit.
    pub(crate) fn flush_if_full(&self, batch: &mut WriteBatch) -> Result<()> {
        if batch.size_bytes() >= self.options.max_batch_bytes {
            self.backend.write(batch, false)?;
            *batch = WriteBatch::new();
        }
        Ok(())
    }

    pub(crate) fn lock_ids(&self) -> MutexGuard<'_, IdAllocator> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn catalog(&self) -> RwLockReadGuard<'_, CatalogState> {
        self.catalog.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn catalog_mut(&self) -> RwLockWriteGuard<'_, CatalogState> {
        self.catalog.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn open_keys(&self) -> MutexGuard<'_, OpenKeyCache> {
        match self.open_keys.lock() {
            Ok(cache) => cache,
            Err(poisoned) => {
                // A panic while it was being changed: what it holds cannot be trusted.
                let mut cache = poisoned.into_inner();
                *cache = OpenKeyCache::new(self.options.open_key_cache_bytes);
                self.open_keys.clear_poison();
                cache
            }
        }
    }

    pub(crate) fn recent(&self) -> MutexGuard<'_, RecentImages> {
        // A panic while it was changed leaves whole records (each is moved in or out in one
        // step), each the one stored under its id (at worst the byte count is off).
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether captures keep the records of the images they store for the next captures'
    /// deltas (`StoreOptions::recent_image_cache_bytes`; on when the store is opened). Off,
    /// what is held is forgotten and captures that begin after keep nothing (a caller that
    /// stores no deltas has no use for them).
    pub fn keep_recent_images(&self, on: bool) {
        let budget = if on {
            self.options.recent_image_cache_bytes
        } else {
            0
        };
        self.recent().set_budget(budget);
    }

    /// The records of the images the last committed captures stored, kept for the next
    /// captures' deltas: (records held, their bytes, records a capture took since the store
    /// was opened).
    pub fn recent_image_cache_stats(&self) -> (usize, usize, u64) {
        self.recent().stats()
    }

    /// The cache of blocks' open key entries: (blocks held, bytes counted against
    /// `StoreOptions::open_key_cache_bytes`, blocks a capture took from it since the store
    /// was opened).
    pub fn open_key_cache_stats(&self) -> (usize, usize, u64) {
        self.open_keys().stats()
    }

    /// Allocates a snapshot, image or TOAST id. If the id is not yet covered by the persisted
    /// counter, first persists (synced) a counter a lease further (`snap_id_lease` for
    /// snapshots, `id_lease` for the others).
    pub(crate) fn alloc_leased(&self, ids: &mut IdAllocator, c: Counter) -> Result<u64> {
        let i = slot(c);
        if ids.next[i] >= ids.durable[i] {
            let lease = match c {
                Counter::Snap => self.options.snap_id_lease,
                _ => self.options.id_lease,
            };
            let limit = ids.next[i] + lease.max(1);
            let mut b = WriteBatch::new();
            b.put(Cf::Meta, &keys::counter_key(c), &limit.to_be_bytes());
            self.backend.write(&b, true)?;
            ids.durable[i] = limit;
        }
        let id = ids.next[i];
        ids.next[i] += 1;
        Ok(id)
    }

    /// Allocates a relation or row type id and adds the updated counter to
    /// `batch`, which the caller must write synced (while still holding `ids`) before handing
    /// the id out.
    pub(crate) fn alloc_in_batch(
        &self,
        ids: &mut IdAllocator,
        c: Counter,
        batch: &mut WriteBatch,
    ) -> u64 {
        let i = slot(c);
        let id = ids.next[i];
        ids.next[i] += 1;
        batch.put(Cf::Meta, &keys::counter_key(c), &ids.next[i].to_be_bytes());
        id
    }

    /// Notes in `batch` that ids of kind `c` below `id + 1` are used (ids handed out by the
    /// caller, like group ids); the caller writes `batch` synced while holding `ids`.
    pub(crate) fn note_used(
        &self,
        ids: &mut IdAllocator,
        c: Counter,
        id: u64,
        batch: &mut WriteBatch,
    ) {
        let i = slot(c);
        if id >= ids.next[i] {
            ids.next[i] = id + 1;
            batch.put(Cf::Meta, &keys::counter_key(c), &ids.next[i].to_be_bytes());
        }
    }

    /// The next id of kind `c` that would be handed out (for tests and diagnostics).
    pub fn next_id(&self, c: Counter) -> u64 {
        self.lock_ids().next[slot(c)]
    }
}

/// Writes the format record and initial counters into an empty backend.
/// Records (first time) or checks the caller's content version, raising an older one the
/// caller reads to its own.
fn check_content_version<B: KvBackend>(
    backend: &B,
    options: &StoreOptions,
    where_: &str,
) -> Result<()> {
    let wanted = options.content_version;
    if wanted == 0 {
        return Ok(());
    }
    let oldest = match options.oldest_content_version {
        0 => wanted,
        v => v.min(wanted),
    };
    let found = match backend.get(Cf::Meta, keys::CONTENT_VERSION_KEY)? {
        Some(v) => Some(
            v.as_slice()
                .try_into()
                .map(u32::from_be_bytes)
                .map_err(|_| StoreError::corrupt(format!("{where_}: content version record")))?,
        ),
        None => None,
    };
    match found {
        Some(found) if found == wanted => Ok(()),
        Some(found) if !(oldest..=wanted).contains(&found) => {
            let reads = if oldest == wanted {
                format!("format {wanted}")
            } else {
                format!("formats {oldest} to {wanted}")
            };
            Err(StoreError::incompatible(format!(
                "{where_} holds snapshots written in content format {found}, and this gsnap \
                 reads {reads}: keep it with the gsnap version that wrote it, or move it \
                 aside to start a new store"
            )))
        }
        _ => {
            let mut b = WriteBatch::new();
            b.put(Cf::Meta, keys::CONTENT_VERSION_KEY, &wanted.to_be_bytes());
            backend.write(&b, true)
        }
    }
}

fn initialize<B: KvBackend>(
    backend: &B,
    options: &StoreOptions,
    where_: &str,
) -> Result<StoreIdentity> {
    for cf in Cf::all() {
        if let Some(entry) = Scan::range(backend, cf, &[], None)?.next() {
            let (k, _) = entry?;
            return Err(StoreError::incompatible(format!(
                "{where_} holds data (key {k:02x?} in column family {}) but no gsnap format \
                 record: it is not a gsnap store, or a damaged one; point gsnap at an empty or \
                 missing directory",
                cf.name()
            )));
        }
    }
    if !options.create {
        return Err(StoreError::not_found(format!(
            "{where_} is empty: no gsnap store was created there yet"
        )));
    }
    records::check_log_shape(options.mapping_log)?;
    let identity = StoreIdentity {
        store_id: random_id(),
        system_identifier: options.system_identifier,
        created_at_us: now_us(),
        format_version: FORMAT_VERSION,
        mapping_log: options.mapping_log,
    };
    let mut b = WriteBatch::new();
    for c in COUNTERS {
        b.put(Cf::Meta, &keys::counter_key(c), &1u64.to_be_bytes());
    }
    // The format record goes last in the batch only for readability: the batch is atomic.
    b.put(
        Cf::Meta,
        keys::FORMAT_KEY,
        &records::encode_format(&identity),
    );
    backend.write(&b, true)?;
    Ok(identity)
}

/// Reads the persisted counters and raises each above the largest id present (a defence:
/// the write protocol already guarantees it).
fn load_counters<B: KvBackend>(backend: &B) -> Result<IdAllocator> {
    let mut ids = IdAllocator {
        next: [1; 6],
        durable: [1; 6],
    };
    for c in COUNTERS {
        let v = backend
            .get(Cf::Meta, &keys::counter_key(c))?
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "{}: id counter {c:?} is missing",
                    backend.describe()
                ))
            })?;
        let persisted = keys::decode_u64_value(&v, "id counter")?;
        let present = max_present(backend, c)?.map_or(1, |m| m + 1);
        ids.next[slot(c)] = persisted.max(present);
        ids.durable[slot(c)] = persisted;
    }
    Ok(ids)
}

fn max_present<B: KvBackend>(backend: &B, c: Counter) -> Result<Option<u64>> {
    let tagged = |tag: u8| -> Result<Option<u64>> {
        match backend.last_in_range(Cf::Catalog, &[tag], &[tag + 1])? {
            Some((k, _)) if k.len() == 9 => Ok(Some(keys::decode_tagged_u64(&k, tag)?)),
            Some((k, _)) if k.len() == 5 => Ok(Some(u64::from(keys::decode_rel_key(&k)?.0))),
            Some((k, _)) => Err(StoreError::corrupt(format!(
                "malformed catalog key {k:02x?}"
            ))),
            None => Ok(None),
        }
    };
    let first8 = |cf: Cf| -> Result<Option<u64>> {
        match backend.last_in_range(cf, &[], &[0xff; 13])? {
            Some((k, _)) if k.len() >= 8 => Ok(Some(keys::decode_u64_value(&k[..8], "key")?)),
            Some((k, _)) => Err(StoreError::corrupt(format!(
                "malformed key {k:02x?} in {}",
                cf.name()
            ))),
            None => Ok(None),
        }
    };
    match c {
        Counter::Snap => tagged(keys::TAG_SNAPSHOT),
        Counter::Rel => tagged(keys::TAG_REL),
        Counter::RowType => tagged(keys::TAG_ROW_TYPE),
        Counter::Group => tagged(keys::TAG_GROUP_META),
        Counter::Toast => first8(Cf::Toast),
        Counter::Image => {
            // The highest sequence number over the ranks (an id's top byte is its rank).
            let mut max = None;
            for r in 0..keys::IMAGE_RANKS {
                let last = first8(Cf::Images(crate::ids::Rank(r)))?;
                max = max.max(last.map(|id| keys::image_seq(crate::ids::ImageId(id))));
            }
            Ok(max)
        }
    }
}

/// Microseconds since the Unix epoch.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// 16 random bytes from the OS, or (if /dev/urandom cannot be read) a hash of the time, the
/// process id and an address: unique enough for a store identity.
fn random_id() -> [u8; 16] {
    use std::io::Read;
    let mut id = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .is_ok()
    {
        return id;
    }
    let mut h = blake3::Hasher::new();
    h.update(&now_us().to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&(&id as *const _ as usize).to_le_bytes());
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    id
}
