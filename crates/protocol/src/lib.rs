//! The wire format between PostgreSQL backends and the gsnap worker: one typed [`Request`]
//! per thing a backend asks, answered by one typed [`Reply`] or a [`WorkerError`], encoded and
//! decoded only here.
//!
//! The transport (a backend's request slot in shared memory) carries a request's kind tag
//! ([`Kind::tag`]) beside one buffer of [`MAX_MESSAGE_BYTES`], which holds the request bytes
//! and then the answer bytes. This crate knows nothing of it: it turns values into bytes and
//! back. A round trip:
//!
//! ```text
//! backend: req.kind().tag(), req.encode()  ──▶  worker: Request::decode(tag, bytes)
//! backend: decode_answer(kind, bytes)      ◀──  worker: reply.encode(kind) | error.encode()
//! ```
//!
//! # Invariants
//! - Every request and answer fits [`MAX_MESSAGE_BYTES`], or encoding it fails with
//!   [`EncodeError::TooLarge`]; an error answer always fits (its texts are shortened).
//! - Decoding is total: truncated bytes, trailing bytes, an unknown tag or version, a length
//!   beyond the buffer, invalid UTF-8, a bool or option byte other than 0 or 1 are each a
//!   [`DecodeError`]. Nothing panics, and no more is allocated than the bytes can hold.
//! - A reply answers the request kinds [`Kind::accepts`] lists and no other: the worker cannot
//!   encode, nor the backend decode, a reply of another shape.
//! - Listings longer than one message (and a scan's start) are one blob cut into [`Page`]s at
//!   byte offsets; [`Pages`] joins them and checks each page against the blob's total.
//!
//! # Byte layout
//! Integers are little-endian and fixed width. `bool` is a byte 0 or 1; `opt<T>` is a byte 0
//! (none) or 1 followed by T; `str` is a u32 byte length followed by UTF-8; `vec<T>` is a u32
//! count followed by the items; `bytes` is `vec<u8>`. Snapshot and image ids are u64,
//! relation incarnations, OIDs and block counts u32.
//!
//! ```text
//! request := VERSION:u8 kind:u8 fields          (kind equals the transport's tag)
//!    1 Declare         wait:bool export:bool label:opt<str> rank:opt<u8>
//!    2 ReleaseExport   snap:u64
//!    3 Snapshots       offset:u64
//!    4 SnapshotTables  snap:u64 offset:u64
//!    5 ResolveTime     unix_us:i64
//!    6 ScanBegin       snap:u64 relid:u32 offset:u64
//!    7 IndexPin        first:u64 last:u64 record_access:bool
//!    8 ToastFetch      value:u64 first_chunk:u32 max_chunks:u32
//!    9 LoadImages      ids:vec<u64>
//!   10 Groups          offset:u64
//!   11 Prefetch        ids:vec<u64>
//!   12 Delete          force:bool snaps:vec<u64>
//!   13 Pin             snap:u64 tag:str until_us:i64
//!   14 Unpin           snap:u64 tag:str
//!   15 SetRank         snap:u64 rank:u8
//!   16 RetentionPreview policy:opt<str> offset:u64
//!   17 Verify          repair:bool offset:u64
//!   18 StoreStats      offset:u64
//!   19 KeyCandidates   rel:u32 from:u64 to:u64 definition:bytes hashes:vec<u64>
//!   20 ScanRange       relid:u32 from:u64 to:u64 offset:u64
//!   21 CopyStore       directory:str
//!
//! answer  := VERSION:u8 0:u8 reply | VERSION:u8 1:u8 error
//! reply   := tag:u8 fields
//!    1 Declared        snap:u64 exported:opt<str>
//!    2 Done
//!    3 Page            total:u64 bytes
//!    4 TableAbsent
//!    5 Resolved        snap:u64
//!    6 GroupsPinned    vec<key:u64 offset:u64 size:u64>
//!    7 ImagesPinned    vec<pinned>
//!    8 ToastPinned     chunks:u32 len:u64 vec<pinned>
//!    9 KeyCandidates   start:u64 (0: no map) complete:bool blocks:vec<u32>
//!   pinned := key:u32 slot:u32 len:u32
//! error   := code:u8 message:str hint:opt<str> detail:opt<str>
//!
//! blob (joined pages) := tag:u8 body
//!    1 snapshots  vec<id:u64 state:u8 taken_at_us:i64 lsn:u64 rank:u8 tables:u32
//!                     pages_captured:u64 new_images:u64 bytes_stored:u64 carried_pages:u64
//!                     failure:opt<str>>
//!    2 tables     vec<relid:u32 rel:u32 relfilenode:u32 nblocks:u32 name:str>
//!    3 groups     vec<id:u64 state:u8 first:u64 last:u64 snapshots:u64 pages:u64 bytes:u64
//!                     loaded:bool length_budget:u64 page_budget:opt<u64>>
//!    4 scan       rel:u32 nblocks:u32 row_type:bytes
//!    7 scan range readable:u32 vec<snap:u64 rel:u32 nblocks:u32 row_type:u32>
//!                 row_types:vec<bytes>
//! ```
//!
//! The ids of LoadImages and Prefetch are image ids, or, with the top bit set
//! ([`DELTA_OF`]), the image's delta: the worker answers it with the delta's bytes, or with
//! `gsnap_format::delta::absent()` for an image stored without one (an image id's top byte is
//! its rank, at most 6, so the bit is never part of one), or, with bit 62 set ([`ENCODED`]),
//! the image's stored record, which the requester decompresses itself.
//!
//! Error codes are the tags of [`ErrorCode`] (1 to 14), snapshot states those of
//! [`SnapshotState`] (1 to 4, as in the store), group states 1 sealed and 2 active. A new
//! tag (a state, a reply shape) can be added without changing [`VERSION`]; a changed field
//! layout changes it.
#![forbid(unsafe_code)]

mod error;
pub mod listing;
mod reply;
mod request;
mod wire;

pub use error::{ErrorCode, WorkerError};
pub use gsnap_core::{ImageId, RelId, SnapId};
pub use listing::{GroupRow, GroupState, ScanHeader, SnapshotRow, SnapshotState, TableRow};
pub use reply::{
    decode_answer, GroupEntry, Page, Pages, PinnedEntry, Pins, Reply, MAX_GROUPS_PER_REPLY,
    MAX_KEY_CANDIDATES, MAX_PINNED_PER_REPLY,
};
pub use request::{Kind, Request, MAX_IDS_PER_REQUEST, MAX_KEY_HASHES};
pub use wire::{DecodeError, EncodeError};

/// The bit that turns an image id into the id of the image's delta in LoadImages and
/// Prefetch requests, and in the image cache.
pub const DELTA_OF: u64 = 1 << 63;

/// The bit that turns an image id into the id of the image's *stored record* (compressed) in
/// LoadImages and Prefetch requests, and in the image cache: the participants of a parallel
/// scan decompress the images they read themselves, so that decompression is spread over
/// them instead of falling to the one worker. The worker answers with the slot of the record,
/// or, for a record larger than a cache slot, with the slot of the decompressed image (under
/// the image's own id: the slot's key says which).
pub const ENCODED: u64 = 1 << 62;

/// The protocol version, the first byte of every request and answer.
pub const VERSION: u8 = 1;

/// The most bytes of one request or answer: the size of a request slot's buffer
/// (`gsnap_shmem::requests::REPLY_BYTES`, which the extension checks equals this).
pub const MAX_MESSAGE_BYTES: usize = 8192;
