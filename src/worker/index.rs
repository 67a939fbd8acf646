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
use gsnap_store::{GroupId, GroupMeta, SnapId, StoreError};

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
            .filter(|s| s.id > after && s.state.in_log())
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
        let id = self.store.next_group_id();
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

    /// Rebuilds the sealed groups holding snapshots `deleted` names without them (GSnap 4.5),
    /// and merges a group left with few snapshots into the group before it (4.6: when its
    /// k partial trees are at most a fifth of the former group's length budget, and the
    /// former group has room for them). A group left without snapshots is dropped. The
    /// newest sealed group stays as it is (its last page table is the base of the active
    /// group). Each replacement is one atomic store batch; replaced groups get new ids.
    /// Returns the ids of the groups replaced (their cache entries are stale).
    pub fn drop_deleted(
        &mut self,
        deleted: &dyn Fn(SnapId) -> bool,
    ) -> Result<Vec<GroupId>, IndexFailure> {
        let Some((_, older)) = self.sealed.split_last() else {
            return Ok(Vec::new());
        };
        if !older.iter().any(|m| m.snaps.iter().any(|&s| deleted(s))) {
            return Ok(Vec::new());
        }
        let config = self.dividing.config().clone();
        let newest = self.sealed.len() - 1;
        let mut replaced = Vec::new();
        let mut kept: Vec<GroupMeta> = Vec::with_capacity(self.sealed.len());
        for (i, meta) in std::mem::take(&mut self.sealed).into_iter().enumerate() {
            let retained: Vec<SnapId> = meta
                .snaps
                .iter()
                .copied()
                .filter(|&s| !deleted(s))
                .collect();
            if i == newest || retained.len() == meta.snaps.len() {
                kept.push(meta);
                continue;
            }
            if retained.is_empty() {
                self.store.replace_groups(&[meta.id], &[])?;
                replaced.push(meta.id);
                continue;
            }
            // The former group's length budget is the one its predecessor's split gave it.
            let budget = match kept.len() {
                n if n >= 2 => kept[n - 2].next_length_budget,
                _ => config.initial_length,
            };
            let k = retained.len() - 1;
            if let Some(former) = kept.last().filter(|f| {
                k <= (budget / 5) as usize && f.snaps.len() + retained.len() <= budget as usize
            }) {
                let snaps: Vec<SnapId> = former.snaps.iter().chain(&retained).copied().collect();
                let (merged, bytes) = self.rebuild(snaps, &meta)?;
                if merged.bytes <= config.max_group_bytes as u64 {
                    let former = kept.pop().expect("matched above");
                    self.store
                        .replace_groups(&[former.id, meta.id], &[(&merged, &bytes)])?;
                    replaced.extend([former.id, meta.id]);
                    kept.push(merged);
                    continue;
                }
            }
            let (new, bytes) = self.rebuild(retained, &meta)?;
            self.store.replace_groups(&[meta.id], &[(&new, &bytes)])?;
            replaced.push(meta.id);
            kept.push(new);
        }
        self.sealed = kept;
        Ok(replaced)
    }

    /// A new group of `snaps` built from the mapping log, with `like`'s budgets for the
    /// group after it.
    fn rebuild(
        &self,
        snaps: Vec<SnapId>,
        like: &GroupMeta,
    ) -> Result<(GroupMeta, Vec<u8>), IndexFailure> {
        let builder = self.store.build_group(&snaps)?;
        let bytes = builder.seal();
        let meta = GroupMeta {
            id: self.store.next_group_id(),
            snaps,
            pages: builder.pages_changed(),
            bytes: bytes.len() as u64,
            next_length_budget: like.next_length_budget,
            next_page_budget: like.next_page_budget,
        };
        Ok((meta, bytes))
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

    /// True if the newest page table maps some page to each of `images`.
    pub fn latest_names_all(
        &self,
        images: &std::collections::HashSet<ImageId>,
    ) -> Result<bool, IndexError> {
        let mut missing = images.clone();
        let mut scan = |view: &GroupReader<'_>| -> Result<(), IndexError> {
            if !view.is_empty() {
                view.scan_all(view.last_snap()?, &mut |_, image| {
                    missing.remove(&image);
                })?;
            }
            Ok(())
        };
        if self.builder.last_snap().is_some() {
            scan(&self.builder.view())?;
        } else if let Some(bytes) = &self.last_sealed {
            scan(&GroupReader::new(bytes)?)?;
        }
        Ok(missing.is_empty())
    }

    /// The sealed bytes of the group that holds the newest page table (the one
    /// [`IndexState::latest_image`] reads), for a reader off the worker's thread; None if the
    /// index is empty.
    pub fn latest_table(&self) -> Result<Option<Vec<u8>>, IndexError> {
        if self.builder.last_snap().is_some() {
            return Ok(Some(self.builder.seal()));
        }
        Ok(self.last_sealed.clone())
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
