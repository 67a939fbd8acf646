//! The vocabulary of the index: snapshot ids, relations, pages, images and mappings.
//!
//! These are plain value types shared by every module. Invariants kept here:
//! - `PageKey` orders by relation, then block, which is the order of every scan and of the
//!   mappings handed to `add_snapshot`;
//! - a batch of mappings for snapshot v is valid only if every mapping carries v, pages are
//!   strictly increasing (sorted, no duplicates) and v is greater than every snapshot added
//!   before (see [`validate_batch`]).

use crate::error::IndexError;
use std::fmt;

/// A snapshot id. Ids grow strictly with each declared snapshot; deletion leaves gaps.
///
/// This and the other id types here ([`RelId`], [`ImageId`]) are the whole workspace's: the
/// store (`gsnap-store`) allocates them and re-exports these types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SnapId(pub u64);

/// A relation *incarnation*: an internal relation number, one per table storage (a table
/// whose storage is replaced by TRUNCATE, VACUUM FULL, ... gets a new one), so pages of
/// different storages never share ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RelId(pub u32);

/// A block number inside a relation.
pub type BlockNo = u32;

/// A page: one block of one relation. Ordered by relation, then block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PageKey {
    pub rel: RelId,
    pub block: BlockNo,
}

impl PageKey {
    pub fn new(rel: u32, block: u32) -> Self {
        PageKey {
            rel: RelId(rel),
            block,
        }
    }
}

/// The id of a stored page image (content-addressed by the store: identical views share one
/// id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ImageId(pub u64);

impl fmt::Display for SnapId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot {}", self.0)
    }
}

impl fmt::Display for RelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "relation incarnation {}", self.0)
    }
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {} of {}", self.block, self.rel)
    }
}

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "image {}", self.0)
    }
}

/// One entry of the mapping log: at snapshot `snap`, `page` is held by `image`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub page: PageKey,
    pub snap: SnapId,
    pub image: ImageId,
}

impl Mapping {
    pub fn new(page: PageKey, snap: SnapId, image: ImageId) -> Self {
        Mapping { page, snap, image }
    }
}

/// One maximal run of retained snapshots in which a block keeps the same image (`range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageRun {
    pub block: BlockNo,
    pub image: ImageId,
    pub first: SnapId,
    pub last: SnapId,
}

/// One block whose image differs between two page tables (`diff`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageDiff {
    pub block: BlockNo,
    pub before: Option<ImageId>,
    pub after: Option<ImageId>,
}

/// Checks a batch handed to `add_snapshot`: `snap` is newer than `last`, every mapping carries
/// `snap`, pages are strictly increasing.
pub fn validate_batch(
    last: Option<SnapId>,
    snap: SnapId,
    mappings: &[Mapping],
) -> Result<(), IndexError> {
    if let Some(last) = last {
        if snap <= last {
            return Err(IndexError::SnapshotOutOfOrder { snap, last });
        }
    }
    for (i, m) in mappings.iter().enumerate() {
        if m.snap != snap {
            return Err(IndexError::MappingSnapMismatch {
                snap,
                found: m.snap,
            });
        }
        if i > 0 && mappings[i - 1].page >= m.page {
            return Err(IndexError::MappingsNotSorted { page: m.page });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rel: u32, block: u32, snap: u64) -> Mapping {
        Mapping::new(PageKey::new(rel, block), SnapId(snap), ImageId(1))
    }

    #[test]
    fn page_keys_order_by_relation_then_block() {
        assert!(PageKey::new(1, 900) < PageKey::new(2, 0));
        assert!(PageKey::new(2, 0) < PageKey::new(2, 1));
    }

    #[test]
    fn ids_display_in_the_vocabulary_of_the_design() {
        assert_eq!(SnapId(7).to_string(), "snapshot 7");
        assert_eq!(ImageId(9).to_string(), "image 9");
        assert_eq!(
            PageKey::new(3, 12).to_string(),
            "block 12 of relation incarnation 3"
        );
    }

    #[test]
    fn batch_validation_rejects_each_kind_of_bad_batch() {
        assert!(validate_batch(None, SnapId(1), &[m(1, 0, 1), m(1, 1, 1)]).is_ok());
        assert_eq!(
            validate_batch(Some(SnapId(5)), SnapId(5), &[]),
            Err(IndexError::SnapshotOutOfOrder {
                snap: SnapId(5),
                last: SnapId(5)
            })
        );
        assert_eq!(
            validate_batch(None, SnapId(2), &[m(1, 0, 3)]),
            Err(IndexError::MappingSnapMismatch {
                snap: SnapId(2),
                found: SnapId(3)
            })
        );
        assert_eq!(
            validate_batch(None, SnapId(2), &[m(1, 4, 2), m(1, 4, 2)]),
            Err(IndexError::MappingsNotSorted {
                page: PageKey::new(1, 4)
            })
        );
        assert!(validate_batch(None, SnapId(2), &[m(2, 0, 2), m(1, 9, 2)]).is_err());
    }
}
