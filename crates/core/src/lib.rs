//! gsnap's snapshot index, in pure Rust (no PostgreSQL types).
//!
//! - `types`, `error`, `index`: the vocabulary, the one error type, the `SnapshotIndex` trait;
//! - `radix`, `format`, `builder`, `reader`, `walk`: page tables as radix trees with path copying
//!   (SSI), laid out position-independently in one byte area per group; the active group's
//!   builder, read-only readers over group bytes, and the snapshot-set walks (diff, range);
//! - `dividing`, `gsnap`: group dividing (Algorithm 1) and the GSnap index over groups;
//! - `coverage`, `cache`: which groups a request needs (Algorithm 2), and the group cache
//!   state kept in a caller's byte region (shared memory);
//! - `skippy`: the durable mapping log with Skippy levels;
//! - `reference`, `baselines`: the obviously-correct model, T-index and O-index.

#![forbid(unsafe_code)]

pub mod baselines;
mod builder;
mod bytes;
pub mod cache;
pub mod coverage;
pub mod dividing;
mod error;
mod format;
mod gsnap;
mod index;
mod radix;
mod reader;
pub mod reference;
pub mod skippy;
mod types;
mod walk;

pub use builder::{last_page_table, rebuild_group, GroupBuilder, Published};
pub use error::IndexError;
pub use format::{GROUP_FORMAT_VERSION, GROUP_HEADER_LEN, GROUP_MAGIC, ROOT_RECORD_LEN};
pub use gsnap::{GroupInfo, GsnapIndex, MergeConfig};
pub use index::SnapshotIndex;
pub use reader::{GroupReader, GroupSnapshot, RelationTree, SnapshotTree};
pub use types::{
    validate_batch, BlockNo, ImageId, ImageRun, Mapping, PageDiff, PageKey, RelId, SnapId,
};
pub use walk::{diff, range, WalkStats};
