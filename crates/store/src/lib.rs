//! gsnap's snapshot store: page images, TOAST values, mappings and the snapshot catalog, kept
//! in one RocksDB database per PostgreSQL cluster.
//!
//! The layers, bottom up:
//! - [`KvBackend`] (`backend.rs`): column families, point reads, cursors, atomic write
//!   batches with a sync flag. Implemented by [`RocksBackend`], [`MemBackend`] (tests, also in
//!   other crates) and [`FaultyBackend`] (injects write errors and crashes);
//! - the key schema (`keys.rs`) and value layouts (`records.rs`, `codec.rs`), described byte by
//!   byte in `docs/format.md`;
//! - [`SnapshotStore`]: open with format and cluster checks and crash recovery (`store.rs`),
//!   capture (`capture.rs`), content reads (`read.rs`), the mapping log (`maplog.rs`), the
//!   catalog (`catalog.rs`) and sealed index groups (`groups.rs`).
//!
//! The crate knows nothing of PostgreSQL: views, row types and group bodies are opaque bytes.
//! It shares its vocabulary with `gsnap-core` ([`SnapId`], [`RelId`], [`ImageId`],
//! [`PageKey`], [`Mapping`] are that crate's types, re-exported here), whose Skippy log is
//! the format of the mapping log.
//!
//! A capture, in short:
//! ```
//! use gsnap_store::*;
//! let store = SnapshotStore::open_in_memory(7);
//! let rel = store.allocate_rel(&RelIncarnation { pg_relid: 16384, relfilenode: 16384, name: "public.t".into() })?;
//! let row_type = store.put_row_type(b"opaque row type")?;
//! let decl = SnapshotDecl {
//!     declared_at_us: 1, wal_lsn: 0x1000, timeline: 1, rank: Rank(0), label: None,
//!     relations: vec![RelationSnapshot { pg_relid: 16384, rel, relfilenode: 16384, nblocks: 1, row_type, name: "public.t".into() }],
//! };
//! let mut capture = store.declare_and_begin(decl)?;
//! let image = capture.put_image(b"the v-view of block 0", &[])?;
//! let page = PageKey { rel, block: 0 };
//! capture.add_mapping(page, image)?;
//! let snap = capture.commit()?.id;
//! assert_eq!(store.mapping_log(snap, snap)?, vec![Mapping::new(page, snap, image)]);
//! assert_eq!(store.page_table(snap)?, vec![(page, image)]);
//! assert_eq!(store.image(image)?, b"the v-view of block 0");
//! # Ok::<(), StoreError>(())
//! ```

#![forbid(unsafe_code)]

mod backend;
mod capture;
mod catalog;
mod codec;
mod error;
mod estimates;
mod faulty;
mod groups;
mod ids;
mod keymap;
pub mod keys;
mod maplog;
mod mem;
mod openkeys;
mod read;
mod recent;
mod reclaim;
mod records;
mod refs;
mod rocks;
mod store;
mod verify;

pub use backend::{BatchOp, CfEstimate, KvBackend, KvCursor, Scan, WriteBatch};
pub use capture::{Capture, SealedView, MAX_TOAST_BYTES, MAX_VIEW_BYTES, TOAST_CHUNK_BYTES};
pub use error::{ErrorKind, Result, StoreError};
pub use faulty::{Fault, FaultyBackend};
pub use groups::GroupMeta;
pub use gsnap_core::skippy::SkippyConfig;
pub use gsnap_core::Mapping;
pub use ids::{Fingerprint, GroupId, ImageId, PageKey, Rank, RelId, RowTypeId, SnapId, ToastId};
pub use keymap::{key_sweep_due, settle_key_hash, KeyMap, SMALL_KEY_MAP, WILDCARD_KEY};
pub use maplog::LogRewrite;
pub use mem::MemBackend;
pub use reclaim::ReclaimJob;
pub use records::{
    CaptureStats, ImageRecord, ImageRecordRef, Pin, RelIncarnation, RelationSnapshot, SnapshotDecl,
    SnapshotInfo, SnapshotState, StoreIdentity, ToastInfo, FORMAT_VERSION,
};
pub use refs::Freed;
pub use rocks::{RocksBackend, RocksConfig};
pub use store::{SnapshotStore, StoreOptions};
pub use verify::{SpaceReport, VerifyReport};

/// Compile-time check that the store can be shared with helper threads.
#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SnapshotStore<RocksBackend>>();
    is::<SnapshotStore<MemBackend>>();
    is::<SnapshotStore<FaultyBackend>>();
}
