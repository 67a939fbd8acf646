//! Putting index groups where backends read them: the shared group cache.
//!
//! A request for snapshots `first..=last` is planned with GSnap's Algorithm 2
//! (`gsnap_core::coverage::plan_load`): exactly the groups holding those snapshots are pinned
//! for the requester, loading the missing ones from the store (evicting least recently used
//! unpinned groups). The active group changes with every snapshot, so it is published as a
//! copy under a new cache key each time it changed; copies no longer current are removed as
//! soon as no reader pins them.

use super::index::ACTIVE_KEY;
use super::Worker;
use crate::ipc;
use crate::shmem::groups::{self, with_groups};
use gsnap_core::cache::Probe;
use gsnap_core::coverage::{plan_load, GroupSpan};
use gsnap_core::{IndexError, SnapId};
use gsnap_protocol::listing::{self, GroupRow, GroupState};
use gsnap_protocol::{ErrorCode, GroupEntry, Reply, WorkerError, MAX_GROUPS_PER_REPLY};
use gsnap_store::GroupMeta;

fn index_failure(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::new(ErrorCode::Corrupt, format!("snapshot index: {e}"))
}

/// A page budget as `gsnap_groups()` shows it: None when unlimited.
fn page_budget(budget: u64) -> Option<u64> {
    (budget != u64::MAX).then_some(budget)
}

/// One group a request needs.
enum Needed {
    Sealed(GroupMeta),
    Active,
}

impl Worker {
    /// Answers an IndexPin request: pins the groups holding snapshots `first..=last`.
    pub(super) fn index_pin(
        &mut self,
        first: SnapId,
        last: SnapId,
        record_access: bool,
    ) -> Result<Reply, WorkerError> {
        let (first, last) = (first.0, last.0);
        let index = self.index.as_mut().ok_or_else(|| {
            WorkerError::new(
                ErrorCode::Io,
                "the snapshot index is not available; see the server log",
            )
        })?;
        if record_access && first <= last {
            index.dividing.record_access(SnapId(first), SnapId(last));
        }
        let mut spans: Vec<GroupSpan> = index
            .sealed
            .iter()
            .map(|m| GroupSpan {
                first: m.first(),
                last: m.last(),
            })
            .collect();
        let active = index.active_span();
        if let Some((f, l)) = active {
            spans.push(GroupSpan {
                first: SnapId(f),
                last: SnapId(l),
            });
        }
        let plan = plan_load(&spans, &|_| false, SnapId(first), SnapId(last.max(first)))
            .map_err(index_failure)?;
        let needed: Vec<Needed> = plan
            .groups
            .map(|i| match index.sealed.get(i) {
                Some(m) => Needed::Sealed(m.clone()),
                None => Needed::Active,
            })
            .collect();
        let mut entries = Vec::with_capacity(needed.len());
        for n in needed {
            match self.pin_group(n) {
                Ok(e) => entries.push(e),
                Err(f) => {
                    ipc::unpin_groups(&entries);
                    return Err(f);
                }
            }
        }
        if entries.len() > MAX_GROUPS_PER_REPLY {
            ipc::unpin_groups(&entries);
            return Err(WorkerError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "snapshots {first} to {last} span {} index groups; ask for fewer",
                    entries.len()
                ),
            ));
        }
        Ok(Reply::GroupsPinned { groups: entries })
    }

    /// Pins one group in the cache for the requester, loading it if needed.
    fn pin_group(&mut self, needed: Needed) -> Result<GroupEntry, WorkerError> {
        let index = self.index.as_ref().expect("checked by the caller");
        let (key, span) = match &needed {
            Needed::Sealed(m) => (m.id.0, (m.first().0, m.last().0)),
            Needed::Active => (
                ACTIVE_KEY | index.active_version,
                index
                    .active_span()
                    .expect("the plan named the active group"),
            ),
        };
        self.group_spans.insert(key, span);
        if let Probe::Hit(extent) = with_groups(|c| c.pin(key)).map_err(index_failure)? {
            return Ok(GroupEntry {
                key,
                offset: extent.offset,
                size: extent.size,
            });
        }
        let bytes = match &needed {
            Needed::Sealed(m) => index.group_bytes(m).map_err(index_failure)?,
            Needed::Active => index
                .active_bytes()
                .expect("the plan named the active group"),
        };
        let reservation =
            with_groups(|c| c.reserve(key, bytes.len() as u64)).map_err(|e| match e {
                IndexError::CacheFull {
                    needed, capacity, ..
                } => WorkerError::new(
                    ErrorCode::Busy,
                    format!(
                        "the index cache cannot hold a group of {needed} bytes next to the groups \
                         in use (gsnap.index_cache_size is {capacity} bytes)"
                    ),
                )
                .with_hint("raise gsnap.index_cache_size, or read fewer snapshots at once"),
                e => index_failure(e),
            })?;
        groups::write_group(reservation.extent, &bytes);
        with_groups(|c| c.finish_load(key)).map_err(index_failure)?;
        if let Needed::Active = needed {
            self.active_copies.push(key);
        }
        Ok(GroupEntry {
            key,
            offset: reservation.extent.offset,
            size: reservation.extent.size,
        })
    }

    /// Removes published copies of the active group that are no longer current and that no
    /// reader pins.
    pub(super) fn retire_active_copies(&mut self) {
        let current = self.index.as_ref().map(|i| ACTIVE_KEY | i.active_version);
        if self.active_copies.iter().all(|&k| Some(k) == current) {
            return;
        }
        let mut keep = Vec::new();
        with_groups(|c| {
            for &k in &self.active_copies {
                if Some(k) == current || !c.remove(k).unwrap_or(false) {
                    keep.push(k);
                }
            }
        });
        // A copy that could not be removed is pinned; it is retried at the next snapshot (or
        // evicted, least recently used, when room is needed).
        self.active_copies = keep;
    }

    /// The listing behind `gsnap_groups()`.
    pub(super) fn group_rows(&self) -> Result<Vec<u8>, WorkerError> {
        let encode = |rows: &[GroupRow]| {
            listing::encode_groups(rows).map_err(|e| {
                WorkerError::new(
                    ErrorCode::Internal,
                    format!("the group listing cannot be encoded: {e}"),
                )
            })
        };
        let Some(index) = self.index.as_ref() else {
            return encode(&[]);
        };
        let loaded: Vec<u64> = with_groups(|c| c.entries())
            .map(|e| e.iter().filter(|e| !e.loading).map(|e| e.group).collect())
            .unwrap_or_default();
        let mut rows: Vec<GroupRow> = index
            .sealed
            .iter()
            .map(|m| GroupRow {
                id: m.id.0,
                state: GroupState::Sealed,
                first: m.first(),
                last: m.last(),
                snapshots: m.snaps.len() as u64,
                pages: m.pages,
                bytes: m.bytes,
                loaded: loaded.contains(&m.id.0),
                length_budget: 0,
                page_budget: None,
            })
            .collect();
        // The budgets each group was given are the ones its predecessor's split computed.
        for i in (1..rows.len()).rev() {
            rows[i].length_budget = u64::from(index.sealed[i - 1].next_length_budget);
            rows[i].page_budget = page_budget(index.sealed[i - 1].next_page_budget);
        }
        if let Some(first) = rows.first_mut() {
            first.length_budget = u64::from(index.dividing.config().initial_length);
            first.page_budget = None;
        }
        if let Some((f, l)) = index.active_span() {
            let (length_budget, budget) = index.dividing.budgets();
            rows.push(GroupRow {
                id: index.sealed.last().map_or(1, |m| m.id.0 + 1),
                state: GroupState::Active,
                first: SnapId(f),
                last: SnapId(l),
                snapshots: index.builder.len() as u64,
                pages: index.builder.pages_changed(),
                bytes: (index.builder.node_area().len() + index.builder.root_table().len()) as u64,
                loaded: loaded.contains(&(ACTIVE_KEY | index.active_version)),
                length_budget: u64::from(length_budget),
                page_budget: page_budget(budget),
            });
        }
        encode(&rows)
    }
}
