//! The request kinds, error codes and answer encodings shared by backends and the worker.

use crate::shmem;
use pgrx::PgSqlErrorCode;

/// What a backend asks the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// Declare a snapshot. Args: wait for durability (0/1), export the MVCC snapshot and
    /// hold it (0/1). Result: the snapshot id; reply: the exported snapshot's name.
    Declare = 1,
    /// Release a snapshot held for export. Args: snapshot.
    ReleaseExport = 2,
    /// The catalog listing (paged). Args: byte offset.
    Snapshots = 3,
    /// One snapshot's tables (paged). Args: snapshot, byte offset.
    SnapshotTables = 4,
    /// The latest readable snapshot taken at or before a time. Args: time (µs since the
    /// Unix epoch). Result: the snapshot.
    ResolveTime = 5,
    /// Begin reading a table at a snapshot (paged). Args: snapshot, table OID, byte offset.
    /// Reply: [`ScanHeader`] then the row type bytes.
    ScanBegin = 6,
    /// The index groups holding snapshots `first..=last`, loaded into the group cache and
    /// pinned for the requester. Args: first, last, record the access for the dividing
    /// policy (0/1). Reply: [`GroupEntry`]s.
    IndexPin = 7,
    /// Chunks of a stored TOAST value, pinned in the cache. Args: value id, first chunk, most
    /// chunks. Result: number of chunks; total: the value's length; reply: pinned entries
    /// keyed by chunk number.
    ToastFetch = 8,
    /// Page images by id, pinned in the image cache. Payload (in the reply buffer): the ids,
    /// u64 each. Reply: pinned entries keyed by the position in the payload.
    LoadImages = 9,
    /// The index groups, for `gsnap_groups()` (paged). Args: byte offset.
    Groups = 10,
    /// Page images by id, loaded into the image cache *without* pinning them: a scan asks for
    /// its next batch while it reads the current one. Payload: the ids, u64 each. No reply.
    Prefetch = 11,
}

impl Kind {
    /// Decodes a request kind.
    pub fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Declare,
            2 => Kind::ReleaseExport,
            3 => Kind::Snapshots,
            4 => Kind::SnapshotTables,
            5 => Kind::ResolveTime,
            6 => Kind::ScanBegin,
            7 => Kind::IndexPin,
            8 => Kind::ToastFetch,
            9 => Kind::LoadImages,
            10 => Kind::Groups,
            11 => Kind::Prefetch,
            _ => return None,
        })
    }

    /// Undoes the pins an answer of this kind holds for its requester (when the requester
    /// gave up on it).
    pub fn release_pins(self, reply: &[u8]) {
        match self {
            Kind::ToastFetch | Kind::LoadImages => unpin_all(&decode_pinned(reply)),
            Kind::IndexPin => unpin_groups(&decode_groups(reply)),
            _ => {}
        }
    }
}

/// Why a request failed; each maps to a SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    /// No such snapshot.
    UnknownSnapshot = 1,
    /// The snapshot exists but cannot be read (failed, deleted, still being captured).
    NotReadable = 2,
    /// The table is not part of the snapshot.
    NotInSnapshot = 3,
    /// The store could not be read or written.
    Io = 4,
    /// The store's disk is full.
    NoSpace = 5,
    /// The store belongs to another cluster or format version.
    Incompatible = 6,
    /// Stored data failed its checks.
    Corrupt = 7,
    /// The operating system refused access to the store.
    PermissionDenied = 8,
    /// A bad argument.
    InvalidArgument = 9,
    /// The worker exited while working on the request.
    WorkerRestarted = 10,
    /// No snapshot at or before the asked time.
    NoSnapshotAtTime = 11,
    /// Too many snapshots wait for their capture.
    Busy = 12,
    /// A bug.
    Internal = 13,
    /// The snapshot is declared and its capture is not durable yet.
    Capturing = 14,
}

impl ErrorCode {
    /// Decodes an error code (unknown codes are internal errors).
    pub fn from_u32(v: u32) -> ErrorCode {
        match v {
            1 => ErrorCode::UnknownSnapshot,
            2 => ErrorCode::NotReadable,
            3 => ErrorCode::NotInSnapshot,
            4 => ErrorCode::Io,
            5 => ErrorCode::NoSpace,
            6 => ErrorCode::Incompatible,
            7 => ErrorCode::Corrupt,
            8 => ErrorCode::PermissionDenied,
            9 => ErrorCode::InvalidArgument,
            10 => ErrorCode::WorkerRestarted,
            11 => ErrorCode::NoSnapshotAtTime,
            12 => ErrorCode::Busy,
            14 => ErrorCode::Capturing,
            _ => ErrorCode::Internal,
        }
    }

    /// The SQLSTATE reported to the client.
    pub fn sqlstate(self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            ErrorCode::UnknownSnapshot | ErrorCode::InvalidArgument => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            ErrorCode::NoSnapshotAtTime => ERRCODE_INVALID_PARAMETER_VALUE,
            ErrorCode::NotReadable
            | ErrorCode::Incompatible
            | ErrorCode::WorkerRestarted
            | ErrorCode::Capturing => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            ErrorCode::NotInSnapshot => ERRCODE_UNDEFINED_TABLE,
            ErrorCode::Io => ERRCODE_IO_ERROR,
            ErrorCode::NoSpace => ERRCODE_DISK_FULL,
            ErrorCode::Corrupt => ERRCODE_DATA_CORRUPTED,
            ErrorCode::PermissionDenied => ERRCODE_INSUFFICIENT_PRIVILEGE,
            ErrorCode::Busy => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            ErrorCode::Internal => ERRCODE_INTERNAL_ERROR,
        }
    }
}

/// A cache slot pinned for the requester: `key` is the block (scans) or chunk (TOAST).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedEntry {
    pub key: u32,
    pub slot: u32,
    pub len: u32,
}

/// Entries that fit one reply.
pub const MAX_PINNED_PER_REPLY: usize = gsnap_shmem::requests::REPLY_BYTES / 12;

/// Encodes pinned entries for a reply.
pub fn encode_pinned(entries: &[PinnedEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 12);
    for e in entries {
        out.extend_from_slice(&e.key.to_le_bytes());
        out.extend_from_slice(&e.slot.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
    }
    out
}

/// Decodes the pinned entries of a reply.
pub fn decode_pinned(bytes: &[u8]) -> Vec<PinnedEntry> {
    bytes
        .chunks_exact(12)
        .map(|c| PinnedEntry {
            key: u32::from_le_bytes(c[0..4].try_into().expect("4")),
            slot: u32::from_le_bytes(c[4..8].try_into().expect("4")),
            len: u32::from_le_bytes(c[8..12].try_into().expect("4")),
        })
        .collect()
}

/// Releases the pins of `entries`.
pub fn unpin_all(entries: &[PinnedEntry]) {
    if entries.is_empty() {
        return;
    }
    shmem::with_cache(|c| {
        for e in entries {
            c.unpin(e.slot as usize);
        }
    });
}

/// A group pinned in the group cache for the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupEntry {
    /// The cache key (a sealed group's id, or a published copy of the active group).
    pub key: u64,
    pub offset: u64,
    pub size: u64,
}

/// Encodes group entries for a reply.
pub fn encode_groups(entries: &[GroupEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 24);
    for e in entries {
        for v in [e.key, e.offset, e.size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Decodes the group entries of a reply.
pub fn decode_groups(bytes: &[u8]) -> Vec<GroupEntry> {
    bytes
        .chunks_exact(24)
        .map(|c| {
            let u = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8"));
            GroupEntry {
                key: u(0),
                offset: u(8),
                size: u(16),
            }
        })
        .collect()
}

/// Releases the group pins of `entries`.
pub fn unpin_groups(entries: &[GroupEntry]) {
    if entries.is_empty() {
        return;
    }
    shmem::groups::with_groups(|c| {
        for e in entries {
            // A group this backend pinned is still there; an error here is a bug.
            c.unpin(e.key).expect("a pinned group is in the cache");
        }
    });
}

/// A row of `gsnap_groups()`.
#[derive(Debug, Clone, Default)]
pub struct GroupRow {
    pub id: u64,
    pub state: String,
    pub first: u64,
    pub last: u64,
    pub snapshots: u64,
    pub pages: u64,
    pub bytes: u64,
    pub loaded: bool,
    pub length_budget: u64,
    pub page_budget: u64,
}

/// Encodes the group listing.
pub fn encode_group_rows(rows: &[GroupRow]) -> Vec<u8> {
    let mut e = Enc(Vec::new());
    for r in rows {
        e.u64(r.id)
            .str(&r.state)
            .u64(r.first)
            .u64(r.last)
            .u64(r.snapshots)
            .u64(r.pages)
            .u64(r.bytes)
            .u64(u64::from(r.loaded))
            .u64(r.length_budget)
            .u64(r.page_budget);
    }
    e.0
}

/// Decodes the group listing.
pub fn decode_group_rows(bytes: &[u8]) -> Vec<GroupRow> {
    let mut d = Dec(bytes);
    let mut rows = Vec::new();
    while !d.0.is_empty() {
        let row = (|| {
            Some(GroupRow {
                id: d.u64()?,
                state: d.str()?,
                first: d.u64()?,
                last: d.u64()?,
                snapshots: d.u64()?,
                pages: d.u64()?,
                bytes: d.u64()?,
                loaded: d.u64()? != 0,
                length_budget: d.u64()?,
                page_budget: d.u64()?,
            })
        })();
        match row {
            Some(r) => rows.push(r),
            None => break,
        }
    }
    rows
}

/// The start of a [`Kind::ScanBegin`] answer.
#[derive(Debug, Clone, Copy)]
pub struct ScanHeader {
    /// The relation incarnation holding the table's pages at the snapshot.
    pub rel: u32,
    /// The table's size in blocks at the snapshot.
    pub nblocks: u32,
}

impl ScanHeader {
    /// Bytes of the header.
    pub const LEN: usize = 8;

    /// Encodes the header followed by `row_type`.
    pub fn encode(&self, row_type: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN + row_type.len());
        out.extend_from_slice(&self.rel.to_le_bytes());
        out.extend_from_slice(&self.nblocks.to_le_bytes());
        out.extend_from_slice(row_type);
        out
    }

    /// Splits an answer into the header and the row type bytes.
    pub fn decode(bytes: &[u8]) -> Option<(ScanHeader, &[u8])> {
        if bytes.len() < Self::LEN {
            return None;
        }
        Some((
            ScanHeader {
                rel: u32::from_le_bytes(bytes[0..4].try_into().ok()?),
                nblocks: u32::from_le_bytes(bytes[4..8].try_into().ok()?),
            },
            &bytes[Self::LEN..],
        ))
    }
}

/// A snapshot as listed by `gsnap_snapshots()`.
#[derive(Debug, Clone, Default)]
pub struct SnapshotRow {
    pub id: u64,
    pub state: String,
    pub taken_at_us: i64,
    pub lsn: u64,
    pub rank: u8,
    pub tables: u32,
    pub pages_captured: u64,
    pub new_images: u64,
    pub bytes_stored: u64,
    pub carried_pages: u64,
    pub failure: Option<String>,
}

/// A table of a snapshot as listed by `gsnap_snapshot_tables()`.
#[derive(Debug, Clone, Default)]
pub struct TableRow {
    pub relid: u32,
    pub rel: u32,
    pub relfilenode: u32,
    pub nblocks: u32,
    pub name: String,
}

struct Enc(Vec<u8>);

impl Enc {
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.0.split_first_chunk::<8>()?;
        self.0 = t;
        Some(u64::from_le_bytes(*h))
    }
    fn str(&mut self) -> Option<String> {
        let n = usize::try_from(self.u64()?).ok()?;
        if n > self.0.len() {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(String::from_utf8_lossy(h).into_owned())
    }
}

/// Encodes the catalog listing.
pub fn encode_snapshots(rows: &[SnapshotRow]) -> Vec<u8> {
    let mut e = Enc(Vec::new());
    for r in rows {
        e.u64(r.id)
            .str(&r.state)
            .u64(r.taken_at_us as u64)
            .u64(r.lsn)
            .u64(u64::from(r.rank))
            .u64(u64::from(r.tables))
            .u64(r.pages_captured)
            .u64(r.new_images)
            .u64(r.bytes_stored)
            .u64(r.carried_pages)
            .str(r.failure.as_deref().unwrap_or(""));
    }
    e.0
}

/// Decodes the catalog listing.
pub fn decode_snapshots(bytes: &[u8]) -> Vec<SnapshotRow> {
    let mut d = Dec(bytes);
    let mut rows = Vec::new();
    while !d.0.is_empty() {
        let row = (|| {
            Some(SnapshotRow {
                id: d.u64()?,
                state: d.str()?,
                taken_at_us: d.u64()? as i64,
                lsn: d.u64()?,
                rank: d.u64()? as u8,
                tables: d.u64()? as u32,
                pages_captured: d.u64()?,
                new_images: d.u64()?,
                bytes_stored: d.u64()?,
                carried_pages: d.u64()?,
                failure: Some(d.str()?).filter(|s| !s.is_empty()),
            })
        })();
        match row {
            Some(r) => rows.push(r),
            None => break,
        }
    }
    rows
}

/// Encodes a snapshot's tables.
pub fn encode_tables(rows: &[TableRow]) -> Vec<u8> {
    let mut e = Enc(Vec::new());
    for r in rows {
        e.u64(u64::from(r.relid))
            .u64(u64::from(r.rel))
            .u64(u64::from(r.relfilenode))
            .u64(u64::from(r.nblocks))
            .str(&r.name);
    }
    e.0
}

/// Decodes a snapshot's tables.
pub fn decode_tables(bytes: &[u8]) -> Vec<TableRow> {
    let mut d = Dec(bytes);
    let mut rows = Vec::new();
    while !d.0.is_empty() {
        let row = (|| {
            Some(TableRow {
                relid: d.u64()? as u32,
                rel: d.u64()? as u32,
                relfilenode: d.u64()? as u32,
                nblocks: d.u64()? as u32,
                name: d.str()?,
            })
        })();
        match row {
            Some(r) => rows.push(r),
            None => break,
        }
    }
    rows
}
