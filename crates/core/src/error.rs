//! The one error type of the crate.
//!
//! Every fallible operation returns `IndexError`. Corrupt bytes (a group, a log node, a cache
//! region) always surface as `Corrupt`/`UnsupportedVersion`, never as a panic.

use crate::types::{PageKey, SnapId};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// `add_snapshot` got a snapshot not newer than the last one added.
    SnapshotOutOfOrder { snap: SnapId, last: SnapId },
    /// A mapping in a batch carries another snapshot id than the batch.
    MappingSnapMismatch { snap: SnapId, found: SnapId },
    /// A batch is not sorted by page or repeats a page.
    MappingsNotSorted { page: PageKey },
    /// The snapshot was never added to this index.
    UnknownSnapshot(SnapId),
    /// The snapshot was deleted; its page table is no longer queryable.
    DeletedSnapshot(SnapId),
    /// Bytes (a group, a log node, a cache region) failed validation.
    Corrupt { what: &'static str, offset: u64 },
    /// Bytes written by another format version.
    UnsupportedVersion { what: &'static str, found: u32 },
    /// A group's node area would exceed what 32-bit offsets address.
    GroupTooLarge { bytes: u64 },
    /// The group cache cannot place a group even after evicting every unpinned group.
    CacheFull {
        needed: u64,
        free: u64,
        capacity: u64,
    },
    /// The group cache has no such group, or the operation does not fit its state.
    CacheState(&'static str),
    /// A caller-supplied argument is outside what the operation accepts.
    InvalidArgument(&'static str),
    /// The mapping log's node store failed.
    Storage(String),
}

impl IndexError {
    pub(crate) fn corrupt(what: &'static str, offset: usize) -> Self {
        IndexError::Corrupt {
            what,
            offset: offset as u64,
        }
    }
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::SnapshotOutOfOrder { snap, last } => {
                write!(
                    f,
                    "snapshot {} is not newer than the last snapshot {}",
                    snap.0, last.0
                )
            }
            IndexError::MappingSnapMismatch { snap, found } => {
                write!(
                    f,
                    "a mapping of snapshot {} was given for snapshot {}",
                    found.0, snap.0
                )
            }
            IndexError::MappingsNotSorted { page } => write!(
                f,
                "mappings are not sorted by page or repeat page ({}, {})",
                page.rel.0, page.block
            ),
            IndexError::UnknownSnapshot(s) => write!(f, "snapshot {} does not exist", s.0),
            IndexError::DeletedSnapshot(s) => write!(f, "snapshot {} was deleted", s.0),
            IndexError::Corrupt { what, offset } => {
                write!(f, "corrupt index bytes: {what} at offset {offset}")
            }
            IndexError::UnsupportedVersion { what, found } => {
                write!(f, "unsupported {what} format version {found}")
            }
            IndexError::GroupTooLarge { bytes } => {
                write!(
                    f,
                    "group index would grow to {bytes} bytes, beyond 32-bit offsets"
                )
            }
            IndexError::CacheFull {
                needed,
                free,
                capacity,
            } => write!(
                f,
                "group cache cannot fit {needed} bytes: {free} of {capacity} bytes can be freed \
                 (the rest is pinned); raise the cache size or query fewer snapshots at once"
            ),
            IndexError::CacheState(what) => write!(f, "group cache: {what}"),
            IndexError::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            IndexError::Storage(msg) => write!(f, "mapping log storage failed: {msg}"),
        }
    }
}

impl std::error::Error for IndexError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_snapshot_and_the_remedy() {
        assert_eq!(
            IndexError::DeletedSnapshot(SnapId(7)).to_string(),
            "snapshot 7 was deleted"
        );
        let full = IndexError::CacheFull {
            needed: 10,
            free: 4,
            capacity: 8,
        }
        .to_string();
        assert!(
            full.contains("10 bytes") && full.contains("raise the cache size"),
            "{full}"
        );
    }
}
