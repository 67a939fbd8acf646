//! The `SnapshotIndex` trait: what every snapshot index (GSnap groups, the baselines, the
//! reference model) offers, so tests and benchmarks treat them alike.
//!
//! Contract shared by all implementations:
//! - `add_snapshot(v, mappings)`: v is newer than every snapshot added before (deleted ones
//!   included), the mappings all carry v, sorted by page, no duplicates (`validate_batch`);
//! - SPT(v) = SPT(v-1) overridden by v's mappings; mappings of deleted snapshots still count;
//! - `lookup`/`scan` of an unknown snapshot give `UnknownSnapshot`, of a deleted one
//!   `DeletedSnapshot`;
//! - `delete_snapshot` is sparse: any subset, later snapshots keep their page tables.

use crate::error::IndexError;
use crate::types::{ImageId, Mapping, PageKey, RelId, SnapId};
use std::ops::Range;

pub trait SnapshotIndex: Send {
    /// A short name for reports ("gsnap", "t-index", "o-index", "reference").
    fn name(&self) -> &'static str;

    /// Adds snapshot `snap` whose page table is its predecessor's overridden by `mappings`.
    fn add_snapshot(&mut self, snap: SnapId, mappings: &[Mapping]) -> Result<(), IndexError>;

    /// The image of `page` in SPT(`snap`), `None` if the page has no mapping at or before it.
    fn lookup(&self, snap: SnapId, page: PageKey) -> Result<Option<ImageId>, IndexError>;

    /// Calls `f(block, image)` for every mapped block of `rel` in `blocks` at `snap`, in block
    /// order.
    fn scan(
        &self,
        snap: SnapId,
        rel: RelId,
        blocks: Range<u32>,
        f: &mut dyn FnMut(u32, ImageId),
    ) -> Result<(), IndexError>;

    /// Removes `snap` from the queryable snapshots (its mappings still count for later ones).
    fn delete_snapshot(&mut self, snap: SnapId) -> Result<(), IndexError>;

    /// The retained (not deleted) snapshots, ascending.
    fn snapshots(&self) -> Vec<SnapId>;

    /// Bytes allocated for the index's nodes and tables.
    fn memory_bytes(&self) -> usize;
}
