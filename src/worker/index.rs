//! The worker's side of the GSnap index (DESIGN.md, The index): the active group being built,
//! the sealed groups in the store, the dividing policy, and the Skippy mapping log.
//!
//! Every committed snapshot's mappings are appended to the Skippy log (durable, the truth any
//! group can be rebuilt from) and added to the active group by path copying; the dividing
//! policy (GSnap Algorithm 1) decides when the active group is sealed: its bytes are then
//! stored as one unit and the next snapshot starts a new group with a complete tree.
//! Backends read groups from the shared group cache (`crate::shmem::groups`); the worker
//! loads them there on request (Algorithm 2 decides which).
//!
//! Invariants: snapshot ids in the index are exactly the committed snapshots, in order; the
//! newest sealed group's bytes are kept in memory while the active group is empty (its last
//! page table is the base of the next group's first tree); after a restart the active group
//! is rebuilt from the mapping log, so nothing here depends on memory that a crash loses.

use super::Store;
use gsnap_core::dividing::{Decision, DividingConfig, GroupDividing};
use gsnap_core::skippy::{SkippyConfig, SkippyLog, StopWhen};
use gsnap_core::{
    last_page_table, GroupBuilder, GroupView, ImageId, IndexError, Mapping, PageKey, RelId, SnapId,
};
use gsnap_store::{GroupId, RocksBackend, StoreError, StoreLogStore};

/// Cache keys of published copies of the active group (sealed groups use their id).
pub const ACTIVE_KEY: u64 = 1 << 63;

/// What the worker remembers about a sealed group (also stored as the group's metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMeta {
    pub id: u64,
    pub snaps: Vec<u64>,
    pub pages: u64,
    pub bytes: u64,
    pub next_length_budget: u32,
    pub next_page_budget: u64,
}

impl GroupMeta {
    pub fn first(&self) -> u64 {
        self.snaps.first().copied().unwrap_or(0)
    }

    pub fn last(&self) -> u64 {
        self.snaps.last().copied().unwrap_or(0)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![1u8];
        out.extend_from_slice(&(self.snaps.len() as u32).to_le_bytes());
        for s in &self.snaps {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&self.pages.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out.extend_from_slice(&self.next_length_budget.to_le_bytes());
        out.extend_from_slice(&self.next_page_budget.to_le_bytes());
        out
    }

    fn decode(id: u64, b: &[u8]) -> Option<GroupMeta> {
        let (&version, mut rest) = b.split_first()?;
        if version != 1 {
            return None;
        }
        let mut take = |n: usize| -> Option<&[u8]> {
            let (h, t) = rest.split_at_checked(n)?;
            rest = t;
            Some(h)
        };
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let mut snaps = Vec::with_capacity(n);
        for _ in 0..n {
            snaps.push(u64::from_le_bytes(take(8)?.try_into().ok()?));
        }
        Some(GroupMeta {
            id,
            snaps,
            pages: u64::from_le_bytes(take(8)?.try_into().ok()?),
            bytes: u64::from_le_bytes(take(8)?.try_into().ok()?),
            next_length_budget: u32::from_le_bytes(take(4)?.try_into().ok()?),
            next_page_budget: u64::from_le_bytes(take(8)?.try_into().ok()?),
        })
    }
}

/// Why the index could not do something.
#[derive(Debug)]
pub enum IndexFailure {
    Store(StoreError),
    Index(IndexError),
}

impl From<StoreError> for IndexFailure {
    fn from(e: StoreError) -> Self {
        IndexFailure::Store(e)
    }
}

impl From<IndexError> for IndexFailure {
    fn from(e: IndexError) -> Self {
        IndexFailure::Index(e)
    }
}

impl std::fmt::Display for IndexFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexFailure::Store(e) => write!(f, "{}", e.message()),
            IndexFailure::Index(e) => write!(f, "snapshot index: {e}"),
        }
    }
}

/// The index as the worker holds it.
pub struct IndexState {
    store: &'static Store,
    pub builder: GroupBuilder,
    pub dividing: GroupDividing,
    pub sealed: Vec<GroupMeta>,
    /// Bytes of the newest sealed group (kept while the active group is empty).
    last_sealed: Option<Vec<u8>>,
    /// Bumped whenever the active group changes: the cache key of its published copy.
    pub active_version: u64,
    skippy: SkippyLog<StoreLogStore<'static, RocksBackend>>,
}

/// The dividing policy's settings.
pub fn dividing_config() -> DividingConfig {
    DividingConfig {
        initial_length: crate::gucs::GROUP_LENGTH.get() as u32,
        punish_factor: crate::gucs::GROUP_PUNISH_FACTOR.get(),
        // A group must fit the group cache with room to spare.
        max_group_bytes: crate::shmem::groups::data_capacity() / 4,
        ..DividingConfig::default()
    }
}

impl IndexState {
    /// Opens the index of `store`: sealed groups from their metadata, the Skippy log caught
    /// up with the mapping log, the active group rebuilt from the mapping log.
    pub fn open(store: &'static Store) -> Result<IndexState, IndexFailure> {
        let mut sealed = Vec::new();
        for (id, meta) in store.group_metas()? {
            match GroupMeta::decode(id.0, &meta) {
                Some(m) => sealed.push(m),
                None => {
                    return Err(IndexFailure::Index(IndexError::Corrupt {
                        what: "group metadata",
                        offset: id.0,
                    }))
                }
            }
        }
        let dividing = match sealed.last() {
            Some(m) => {
                GroupDividing::resume(dividing_config(), m.next_length_budget, m.next_page_budget)
            }
            None => GroupDividing::new(dividing_config()),
        };
        let mut skippy = SkippyLog::open(StoreLogStore::new(store), SkippyConfig::default())?;
        let committed: Vec<u64> = store
            .snapshots()?
            .into_iter()
            .filter(|s| {
                matches!(
                    s.state,
                    gsnap_store::SnapshotState::Committed | gsnap_store::SnapshotState::Deleted
                )
            })
            .map(|s| s.id.0)
            .collect();
        // Catch the Skippy log up with the mapping log (an append after a commit may have been
        // lost in a crash).
        let logged = skippy.last_snap().map_or(0, |s| s.0);
        for &s in committed.iter().filter(|&&s| s > logged) {
            let m = mappings_of(store, s)?;
            skippy.append_snapshot(SnapId(s), &m)?;
        }
        let mut state = IndexState {
            store,
            builder: GroupBuilder::new(),
            dividing,
            last_sealed: None,
            active_version: crate::shmem::next_active_version(),
            sealed,
            skippy,
        };
        if let Some(last) = state.sealed.last().cloned() {
            state.last_sealed = Some(state.group_bytes(&last)?);
        }
        let after = state.sealed.last().map_or(0, GroupMeta::last);
        for &s in committed.iter().filter(|&&s| s > after) {
            let m = mappings_of(store, s)?;
            state.add_to_active(s, &m)?;
        }
        Ok(state)
    }

    /// The bytes of sealed group `meta`, verified; rebuilt from the Skippy log if they are
    /// missing or damaged (and stored again).
    pub fn group_bytes(&self, meta: &GroupMeta) -> Result<Vec<u8>, IndexFailure> {
        if let Some(bytes) = self.store.group_body(GroupId(meta.id))? {
            if GroupView::new_verified(&bytes).is_ok() {
                return Ok(bytes);
            }
            pgrx::warning!(
                "gsnap: index group {} is damaged; rebuilding it from the mapping log",
                meta.id
            );
        } else {
            pgrx::warning!(
                "gsnap: index group {} is missing; rebuilding it from the mapping log",
                meta.id
            );
        }
        let snaps: Vec<SnapId> = meta.snaps.iter().map(|&s| SnapId(s)).collect();
        let bytes = self.skippy.build_group(&snaps, StopWhen::LogStart)?.seal();
        self.store
            .put_group(GroupId(meta.id), &meta.encode(), &bytes)?;
        Ok(bytes)
    }

    /// Adds committed snapshot `snap` with its mappings (sorted by page): to the Skippy log,
    /// then to the active group; seals the group when the policy says so.
    pub fn add_snapshot(&mut self, snap: u64, mappings: &[Mapping]) -> Result<(), IndexFailure> {
        self.skippy.append_snapshot(SnapId(snap), mappings)?;
        self.add_to_active(snap, mappings)
    }

    fn add_to_active(&mut self, snap: u64, mappings: &[Mapping]) -> Result<(), IndexFailure> {
        if self.builder.is_empty() {
            let base = match &self.last_sealed {
                Some(bytes) => last_page_table(&GroupView::new(bytes)?)?,
                None => Vec::new(),
            };
            self.builder
                .add_first_snapshot(SnapId(snap), &mut base.into_iter(), mappings)?;
        } else {
            self.builder.add_snapshot(SnapId(snap), mappings)?;
        }
        self.active_version = crate::shmem::next_active_version();
        let len = self.builder.len() as u32;
        let decision = self.dividing.after_snapshot(
            len,
            self.builder.pages_changed(),
            self.builder.node_area().len(),
        );
        if decision == Decision::Seal {
            self.seal()?;
        }
        Ok(())
    }

    /// Seals the active group: stores it as one unit and starts a new one.
    fn seal(&mut self) -> Result<(), IndexFailure> {
        let bytes = self.builder.seal();
        let snaps: Vec<u64> = GroupView::new(&bytes)?
            .snapshots()?
            .into_iter()
            .map(|s| s.snap.0)
            .collect();
        let outcome = self
            .dividing
            .split(snaps.len() as u32, self.builder.pages_changed());
        let id = self.sealed.last().map_or(1, |m| m.id + 1);
        let meta = GroupMeta {
            id,
            snaps,
            pages: self.builder.pages_changed(),
            bytes: bytes.len() as u64,
            next_length_budget: outcome.next_length_budget,
            next_page_budget: outcome.next_page_budget,
        };
        self.store.put_group(GroupId(id), &meta.encode(), &bytes)?;
        self.sealed.push(meta);
        self.last_sealed = Some(bytes);
        self.builder = GroupBuilder::new();
        self.active_version = crate::shmem::next_active_version();
        Ok(())
    }

    /// The image of `page` in the newest page table (the previous snapshot's, while a capture
    /// runs): what a new view is compared with.
    pub fn latest_image(&self, page: PageKey) -> Result<Option<ImageId>, IndexError> {
        if let Some(last) = self.builder.last_snap() {
            return self.builder.view().lookup(last, page);
        }
        match &self.last_sealed {
            Some(bytes) => {
                let view = GroupView::new(bytes)?;
                view.lookup(view.last_snap()?, page)
            }
            None => Ok(None),
        }
    }

    /// The sealed bytes of the active group (what is published to the group cache).
    pub fn active_bytes(&self) -> Option<Vec<u8>> {
        (!self.builder.is_empty()).then(|| self.builder.seal())
    }

    /// Snapshots of the active group.
    pub fn active_span(&self) -> Option<(u64, u64)> {
        Some((self.builder.first_snap()?.0, self.builder.last_snap()?.0))
    }

    /// The Skippy log (for rebuilds and statistics).
    #[allow(dead_code)]
    pub fn skippy(&self) -> &SkippyLog<StoreLogStore<'static, RocksBackend>> {
        &self.skippy
    }
}

/// The mappings of committed snapshot `snap`, sorted by page, from the mapping log.
pub fn mappings_of(store: &Store, snap: u64) -> Result<Vec<Mapping>, StoreError> {
    store
        .mapping_log(gsnap_store::SnapId(snap), gsnap_store::SnapId(snap))?
        .map(|m| {
            m.map(|m| {
                Mapping::new(
                    PageKey {
                        rel: RelId(m.page.rel.0),
                        block: m.page.block,
                    },
                    SnapId(snap),
                    ImageId(m.image.0),
                )
            })
        })
        .collect()
}
