//! The worker's side of the GSnap index (docs/design.md, The index): the active group being built,
//! the sealed groups in the store, and the dividing policy.
//!
//! The store's mapping log is the truth: a snapshot's commit writes its mappings there (with
//! their Skippy levels) in the same atomic batch as the snapshot itself. Each committed
//! snapshot's mappings are then read back from the log and added to the active group by path
//! copying; the dividing policy (GSnap Algorithm 1) decides when the active group is sealed:
//! its bytes are then stored as one unit and the next snapshot starts a new group with a
//! complete tree. Backends read groups from the shared group cache (`crate::shmem::groups`);
//! the worker loads them there on request (Algorithm 2 decides which).
//!
//! Invariants: snapshot ids in the index are exactly the committed snapshots, in order, and
//! each one's mappings are the log's; the newest sealed group's bytes are kept in memory while
//! the active group is empty (its last page table is the base of the next group's first
//! tree); after a restart the active group is rebuilt from the mapping log and a missing or
//! damaged sealed group from the log too, so nothing here depends on memory that a crash
//! loses.

use super::Store;
use gsnap_core::dividing::{Decision, DividingConfig, GroupDividing};
use gsnap_core::{
    last_page_table, GroupBuilder, GroupReader, ImageId, IndexError, Mapping, PageKey,
};
use gsnap_store::{GroupId, GroupMeta, SnapId, SnapshotState, StoreError};

/// Cache keys of published copies of the active group (sealed groups use their id).
pub const ACTIVE_KEY: u64 = 1 << 63;

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
    store: Store,
    pub builder: GroupBuilder,
    pub dividing: GroupDividing,
    pub sealed: Vec<GroupMeta>,
    /// Bytes of the newest sealed group (kept while the active group is empty).
    last_sealed: Option<Vec<u8>>,
    /// Bumped whenever the active group changes: the cache key of its published copy.
    pub active_version: u64,
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
    /// Opens the index of `store`: sealed groups from their metadata, the active group
    /// rebuilt from the mapping log.
    pub fn open(store: Store) -> Result<IndexState, IndexFailure> {
        let sealed = store.group_metas()?;
        let dividing = match sealed.last() {
            Some(m) => {
                GroupDividing::resume(dividing_config(), m.next_length_budget, m.next_page_budget)
            }
            None => GroupDividing::new(dividing_config()),
        };
        let after = sealed.last().map_or(SnapId(0), GroupMeta::last);
        let active: Vec<SnapId> = store
            .snapshots()?
            .into_iter()
            .filter(|s| {
                s.id > after && matches!(s.state, SnapshotState::Committed | SnapshotState::Deleted)
            })
            .map(|s| s.id)
            .collect();
        let mut state = IndexState {
            store,
            builder: GroupBuilder::new(),
            dividing,
            last_sealed: None,
            active_version: crate::shmem::next_active_version(),
            sealed,
        };
        if let Some(last) = state.sealed.last().cloned() {
            state.last_sealed = Some(state.group_bytes(&last)?);
        }
        let span = active.first().copied().zip(active.last().copied());
        if let Some((first, last)) = span {
            let log = state.store.mapping_log(first, last)?;
            // The log is in snapshot order: each snapshot's mappings are one run of it.
            let mut rest = log.as_slice();
            for snap in active {
                let n = rest.partition_point(|m| m.snap <= snap);
                let (mine, later) = rest.split_at(n);
                state.add_to_active(snap, mine)?;
                rest = later;
            }
        }
        Ok(state)
    }

    /// The bytes of sealed group `meta`, verified; rebuilt from the mapping log if they are
    /// missing or damaged (and stored again).
    pub fn group_bytes(&self, meta: &GroupMeta) -> Result<Vec<u8>, IndexFailure> {
        if let Some(bytes) = self.store.group_body(meta.id)? {
            if GroupReader::new_verified(&bytes).is_ok() {
                return Ok(bytes);
            }
            pgrx::warning!(
                "gsnap: index group {} is damaged; rebuilding it from the mapping log",
                meta.id.0
            );
        } else {
            pgrx::warning!(
                "gsnap: index group {} is missing; rebuilding it from the mapping log",
                meta.id.0
            );
        }
        let bytes = self.store.build_group(&meta.snaps)?.seal();
        self.store.put_group(meta, &bytes)?;
        Ok(bytes)
    }

    /// Adds committed snapshot `snap` to the active group with its mappings, read from the
    /// mapping log; seals the group when the policy says so.
    pub fn add_snapshot(&mut self, snap: SnapId) -> Result<(), IndexFailure> {
        let mappings = self.store.mapping_log(snap, snap)?;
        self.add_to_active(snap, &mappings)
    }

    /// Adds `snap` with its mappings (sorted by page) to the active group.
    fn add_to_active(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexFailure> {
        if self.builder.is_empty() {
            let base = match &self.last_sealed {
                Some(bytes) => last_page_table(&GroupReader::new(bytes)?)?,
                None => Vec::new(),
            };
            self.builder
                .add_first_snapshot(snap, &mut base.into_iter(), mappings)?;
        } else {
            self.builder.add_snapshot(snap, mappings)?;
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
        let snaps: Vec<SnapId> = GroupReader::new(&bytes)?
            .snapshots()?
            .into_iter()
            .map(|s| s.snap)
            .collect();
        let outcome = self
            .dividing
            .split(snaps.len() as u32, self.builder.pages_changed());
        let id = GroupId(self.sealed.last().map_or(1, |m| m.id.0 + 1));
        let meta = GroupMeta {
            id,
            snaps,
            pages: self.builder.pages_changed(),
            bytes: bytes.len() as u64,
            next_length_budget: outcome.next_length_budget,
            next_page_budget: outcome.next_page_budget,
        };
        self.store.put_group(&meta, &bytes)?;
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
                let view = GroupReader::new(bytes)?;
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
}
