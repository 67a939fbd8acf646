//! Record types stored as values, and their byte layouts.
//!
//! Public records (snapshot declarations and catalog entries, relation incarnations, TOAST
//! value info, the store identity) are what callers pass in and read back; internal records
//! (format, image, TOAST header and chunk, row type) are private to the crate. Each layout is
//! written out in `docs/format.md`; the two must change together.
//!
//! Invariants: every structured value except the format record starts with a record version
//! byte ([`RECORD_VERSION`]); decoding checks it, checks lengths and refuses trailing bytes;
//! stored content (images, TOAST chunks, row types) carries its BLAKE3 hash, verified on every
//! read, so a damaged value is reported as corrupt instead of being returned.

use crate::codec::{self, Dec, Enc};
use crate::error::{Result, StoreError};
use crate::ids::{Fingerprint, Rank, RelId, RowTypeId, SnapId};
use gsnap_core::skippy::SkippyConfig;

/// Version byte that starts every structured record (1 in format version 3; snapshot records
/// are version [`SNAPSHOT_RECORD_VERSION`]).
pub const RECORD_VERSION: u8 = 1;

/// Version byte of snapshot records written (2: with label, explicit rank, pins and deletion
/// time; 3: and the WAL timeline at declaration). Version 2 records are read too (timeline 0,
/// unknown).
pub const SNAPSHOT_RECORD_VERSION: u8 = 3;

/// The format version this build reads and writes. A store of another version is refused.
///
/// Version 5 names page images by their stored (compressed) form ([`STORED_FINGERPRINT`]); a
/// version 3 or 4 store is read as is (its images are named by their content, as the flag says) and
/// becomes version 5 with its first capture, so that an older build refuses it instead of failing
/// on the flag. Version 4 lets the mapping log live in either of two key generations (a rewrite
/// writes the other, then switches: `maplog.rs`); a version 3 store is read as is (its log is
/// generation 0, the same keys) and becomes version 4 when its log is first rewritten, so that an
/// older build refuses it instead of reading an empty log. Version 3 adds lifetimes: images in one
/// column family per rank (the rank in the image id's top byte), reference counts (`refs`),
/// snapshot labels, explicit ranks, pins and deletion times, and reclamation progress. Version 2
/// keeps each mapping once, in the Skippy mapping log written in its snapshot's commit batch;
/// version 1 also kept the `page_versions` column family and a separate mapping log written during
/// the capture.
pub const FORMAT_VERSION: u32 = 5;

/// The oldest format version this build reads (see [`FORMAT_VERSION`]).
pub const OLDEST_READABLE_FORMAT: u32 = 3;

/// The largest mapping log node size a store accepts (entries per node).
pub const MAX_LOG_NODE_SIZE: usize = 1 << 20;

/// The greatest mapping log height a store accepts (levels above level 0).
pub const MAX_LOG_HEIGHT: u8 = 16;

/// The first 8 bytes of the format record: what makes a key-value database a gsnap store.
pub const FORMAT_MAGIC: &[u8; 8] = b"GSNAPSTO";

// ---- identity ------------------------------------------------------------------------------

/// Who a store belongs to, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreIdentity {
    /// Random id chosen when the store was created (lets the PostgreSQL side notice that the
    /// store directory was swapped for another one).
    pub store_id: [u8; 16],
    /// PostgreSQL's system identifier (`pg_control_system()`) of the owning cluster.
    pub system_identifier: u64,
    /// Creation time, microseconds since the Unix epoch.
    pub created_at_us: i64,
    /// Format version of the store.
    pub format_version: u32,
    /// The shape of the mapping log (entries per node, levels above level 0), fixed at
    /// creation: every reader and writer of the log must cut it the same way.
    pub mapping_log: SkippyConfig,
}

pub(crate) fn encode_format(id: &StoreIdentity) -> Vec<u8> {
    Enc::raw()
        .fixed(FORMAT_MAGIC)
        .u32(id.format_version)
        .fixed(&id.store_id)
        .u64(id.system_identifier)
        .i64(id.created_at_us)
        .u32(id.mapping_log.node_size as u32)
        .u8(id.mapping_log.height)
        .finish()
}

/// Checks a mapping log shape: a positive node size and a height within bounds.
pub(crate) fn check_log_shape(shape: SkippyConfig) -> Result<()> {
    if shape.node_size == 0 || shape.node_size > MAX_LOG_NODE_SIZE || shape.height > MAX_LOG_HEIGHT
    {
        return Err(StoreError::invalid(format!(
            "mapping log shape {} entries per node, height {}: the node size must be 1 to \
             {MAX_LOG_NODE_SIZE} and the height at most {MAX_LOG_HEIGHT}",
            shape.node_size, shape.height
        )));
    }
    Ok(())
}

/// Decodes the format record. `where_` names the store in messages.
pub(crate) fn decode_format(v: &[u8], where_: &str) -> Result<StoreIdentity> {
    if v.len() < 12 || &v[..8] != FORMAT_MAGIC {
        return Err(StoreError::incompatible(format!(
            "{where_} is not a gsnap store (its format record has no gsnap signature); point \
             gsnap at an empty or missing directory"
        )));
    }
    let mut d = Dec::new(v, "format");
    d.take(8)?;
    let format_version = d.u32()?;
    if !(OLDEST_READABLE_FORMAT..=FORMAT_VERSION).contains(&format_version) {
        return Err(StoreError::incompatible(format!(
            "{where_} has store format version {format_version}, but this gsnap build reads only \
             versions {OLDEST_READABLE_FORMAT} to {FORMAT_VERSION}; install the gsnap version that created it, or move the \
             directory aside to start an empty store"
        )));
    }
    let store_id = d.array()?;
    let system_identifier = d.u64()?;
    let created_at_us = d.i64()?;
    let mapping_log = SkippyConfig {
        node_size: d.u32()? as usize,
        height: d.u8()?,
    };
    d.end()?;
    check_log_shape(mapping_log)
        .map_err(|e| StoreError::corrupt(format!("{where_}: format record: {}", e.message())))?;
    Ok(StoreIdentity {
        store_id,
        system_identifier,
        created_at_us,
        format_version,
        mapping_log,
    })
}

// ---- snapshots -----------------------------------------------------------------------------

/// One gsnap relation as declared in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationSnapshot {
    /// PostgreSQL's OID of the table.
    pub pg_relid: u32,
    /// The relation incarnation whose pages this snapshot maps.
    pub rel: RelId,
    /// The storage identity (relfilenode) at declaration.
    pub relfilenode: u32,
    /// Size in blocks at declaration.
    pub nblocks: u32,
    /// Row type of the table at declaration.
    pub row_type: RowTypeId,
    /// Qualified table name at declaration (for listings; not an identity).
    pub name: String,
}

/// What the worker declares when it begins a capture.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotDecl {
    /// Declaration time, microseconds since the Unix epoch.
    pub declared_at_us: i64,
    /// WAL insert LSN at declaration.
    pub wal_lsn: u64,
    /// The server's WAL timeline at declaration (0: unknown). With the LSN it tells whether
    /// the pages read later continue the history this snapshot saw (see the worker's restart).
    pub timeline: u32,
    /// Thresher rank known at declaration (higher ranks live longer).
    pub rank: Rank,
    /// The user's label, if any.
    pub label: Option<String>,
    /// Every gsnap relation at declaration.
    pub relations: Vec<RelationSnapshot>,
}

/// Where a snapshot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotState {
    /// Being captured: not readable; removed (marked failed) by recovery if the capture never
    /// commits.
    Capturing,
    /// Complete and readable.
    Committed,
    /// The capture was aborted or interrupted: listed with its reason, never readable.
    Failed,
    /// Deleted by the user or by retention: listed, not readable; its space is being
    /// reclaimed.
    Deleted,
    /// Deleted, and the space only it used is reclaimed: listed, not readable.
    Reclaimed,
}

impl SnapshotState {
    fn code(self) -> u8 {
        match self {
            SnapshotState::Capturing => 1,
            SnapshotState::Committed => 2,
            SnapshotState::Failed => 3,
            SnapshotState::Deleted => 4,
            SnapshotState::Reclaimed => 5,
        }
    }

    fn from_code(c: u8) -> Result<Self> {
        Ok(match c {
            1 => SnapshotState::Capturing,
            2 => SnapshotState::Committed,
            3 => SnapshotState::Failed,
            4 => SnapshotState::Deleted,
            5 => SnapshotState::Reclaimed,
            _ => {
                return Err(StoreError::corrupt(format!(
                    "snapshot record has unknown state {c}"
                )))
            }
        })
    }

    /// Lower-case name for listings ("capturing", "committed", "failed", "deleted",
    /// "reclaimed").
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Capturing => "capturing",
            SnapshotState::Committed => "committed",
            SnapshotState::Failed => "failed",
            SnapshotState::Deleted => "deleted",
            SnapshotState::Reclaimed => "reclaimed",
        }
    }

    /// True for a snapshot whose mappings are in the mapping log (it committed once).
    pub fn in_log(self) -> bool {
        matches!(
            self,
            SnapshotState::Committed | SnapshotState::Deleted | SnapshotState::Reclaimed
        )
    }
}

/// What a capture stored, counted by the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaptureStats {
    /// Mappings added (pages captured).
    pub pages_captured: u64,
    /// Images stored for the first time by this capture.
    pub new_images: u64,
    /// Views that matched an existing image (deduplicated).
    pub dedup_hits: u64,
    /// Uncompressed bytes of the new images.
    pub image_bytes_raw: u64,
    /// Bytes of the new image records as stored (after compression), their deltas included.
    pub image_bytes_stored: u64,
    /// TOAST values stored for the first time.
    pub new_toast_values: u64,
    /// Bytes of the new TOAST chunk records as stored.
    pub toast_bytes_stored: u64,
    /// Pages carried (unsettled) into the next span.
    pub carried_pages: u64,
}

impl CaptureStats {
    /// Bytes this capture added to the store (images and TOAST chunks, as stored).
    pub fn bytes_stored(&self) -> u64 {
        self.image_bytes_stored + self.toast_bytes_stored
    }
}

/// A pin: while it holds, the snapshot is deleted neither by retention nor by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// Who pinned it, and why (unique per snapshot).
    pub tag: String,
    /// Until when (microseconds since the Unix epoch; `i64::MAX`: for ever).
    pub until_us: i64,
}

/// A snapshot's catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The snapshot.
    pub id: SnapId,
    /// Its state.
    pub state: SnapshotState,
    /// What was declared (`decl.rank` is the rank known at declaration).
    pub decl: SnapshotDecl,
    /// What its capture stored (zero until committed).
    pub stats: CaptureStats,
    /// Why the capture failed (only for [`SnapshotState::Failed`]).
    pub failure_reason: Option<String>,
    /// A rank given later by the user (lazy ranking; 0: none). The snapshot's rank is the
    /// higher of this and `decl.rank`.
    pub explicit_rank: Rank,
    /// Its pins.
    pub pins: Vec<Pin>,
    /// When it was deleted (microseconds since the Unix epoch).
    pub deleted_at_us: Option<i64>,
}

impl SnapshotInfo {
    /// The declared entry of relation `pg_relid`, if it was a gsnap table at this snapshot.
    pub fn relation(&self, pg_relid: u32) -> Option<&RelationSnapshot> {
        self.decl.relations.iter().find(|r| r.pg_relid == pg_relid)
    }
}

pub(crate) fn encode_snapshot(s: &SnapshotInfo) -> Vec<u8> {
    let mut e = Enc::with_version(SNAPSHOT_RECORD_VERSION);
    e.u8(s.state.code())
        .i64(s.decl.declared_at_us)
        .u64(s.decl.wal_lsn)
        .u8(s.decl.rank.0);
    e.u32(s.decl.relations.len() as u32);
    for r in &s.decl.relations {
        e.u32(r.pg_relid)
            .u32(r.rel.0)
            .u32(r.relfilenode)
            .u32(r.nblocks)
            .u64(r.row_type.0);
        e.str(&r.name);
    }
    let st = &s.stats;
    for n in [
        st.pages_captured,
        st.new_images,
        st.dedup_hits,
        st.image_bytes_raw,
        st.image_bytes_stored,
        st.new_toast_values,
        st.toast_bytes_stored,
        st.carried_pages,
    ] {
        e.u64(n);
    }
    e.str(s.failure_reason.as_deref().unwrap_or(""));
    e.str(s.decl.label.as_deref().unwrap_or(""));
    e.u8(s.explicit_rank.0);
    e.u32(s.pins.len() as u32);
    for p in &s.pins {
        e.str(&p.tag).i64(p.until_us);
    }
    e.i64(s.deleted_at_us.unwrap_or(i64::MIN));
    e.u32(s.decl.timeline);
    e.finish()
}

pub(crate) fn decode_snapshot(id: SnapId, v: &[u8]) -> Result<SnapshotInfo> {
    let mut d = Dec::new(v, "snapshot");
    let version = d.version_in(2..=SNAPSHOT_RECORD_VERSION)?;
    let state = SnapshotState::from_code(d.u8()?)?;
    let declared_at_us = d.i64()?;
    let wal_lsn = d.u64()?;
    let rank = Rank(d.u8()?);
    let n = d.u32()?;
    let mut relations = Vec::with_capacity(n.min(4096) as usize);
    for _ in 0..n {
        relations.push(RelationSnapshot {
            pg_relid: d.u32()?,
            rel: RelId(d.u32()?),
            relfilenode: d.u32()?,
            nblocks: d.u32()?,
            row_type: RowTypeId(d.u64()?),
            name: d.str()?,
        });
    }
    let stats = CaptureStats {
        pages_captured: d.u64()?,
        new_images: d.u64()?,
        dedup_hits: d.u64()?,
        image_bytes_raw: d.u64()?,
        image_bytes_stored: d.u64()?,
        new_toast_values: d.u64()?,
        toast_bytes_stored: d.u64()?,
        carried_pages: d.u64()?,
    };
    let reason = d.str()?;
    let label = d.str()?;
    let explicit_rank = Rank(d.u8()?);
    let n = d.u32()?;
    let mut pins = Vec::with_capacity(n.min(64) as usize);
    for _ in 0..n {
        pins.push(Pin {
            tag: d.str()?,
            until_us: d.i64()?,
        });
    }
    let deleted_at_us = Some(d.i64()?).filter(|&t| t != i64::MIN);
    let timeline = if version >= 3 { d.u32()? } else { 0 };
    d.end()?;
    Ok(SnapshotInfo {
        id,
        state,
        decl: SnapshotDecl {
            declared_at_us,
            wal_lsn,
            timeline,
            rank,
            label: Some(label).filter(|l| !l.is_empty()),
            relations,
        },
        stats,
        failure_reason: (state == SnapshotState::Failed).then_some(reason),
        explicit_rank,
        pins,
        deleted_at_us,
    })
}

// ---- relation incarnations -----------------------------------------------------------------

/// What the store remembers about a relation incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelIncarnation {
    /// PostgreSQL's OID of the table.
    pub pg_relid: u32,
    /// Its storage (relfilenode) when the incarnation was allocated.
    pub relfilenode: u32,
    /// Table name when the incarnation was allocated (for listings).
    pub name: String,
}

pub(crate) fn encode_rel(r: &RelIncarnation) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .u32(r.pg_relid)
        .u32(r.relfilenode)
        .str(&r.name)
        .finish()
}

pub(crate) fn decode_rel(v: &[u8]) -> Result<RelIncarnation> {
    let mut d = Dec::new(v, "relation incarnation");
    d.version(RECORD_VERSION)?;
    let r = RelIncarnation {
        pg_relid: d.u32()?,
        relfilenode: d.u32()?,
        name: d.str()?,
    };
    d.end()?;
    Ok(r)
}

// ---- content records: images, TOAST, row types ---------------------------------------------

/// Encodes an image record: version, codec, raw length, fingerprint, payload.
pub(crate) fn encode_image(raw: &[u8], fp: &Fingerprint) -> Vec<u8> {
    codec::with_compressed(raw, |codec, payload| {
        encode_stored(codec, raw.len(), fp, payload)
    })
}

/// The record in one allocation of its exact size (it is kept as is: in the write batch, and
/// in the cache of recent images).
fn encode_stored(codec: u8, raw_len: usize, fp: &Fingerprint, payload: &[u8]) -> Vec<u8> {
    Enc::with_version_and_room(RECORD_VERSION, 1 + 4 + fp.0.len() + payload.len())
        .u8(codec)
        .u32(raw_len as u32)
        .fixed(&fp.0)
        .fixed(payload)
        .finish()
}

/// The flag of a content record's codec byte saying that its fingerprint is that of the
/// stored form ([`stored_fingerprint`]), not of the uncompressed content. Page images are
/// stored so since this flag exists; records without it (older images, deltas, TOAST
/// chunks) carry the fingerprint of their uncompressed content.
pub(crate) const STORED_FINGERPRINT: u8 = 0x80;

/// The fingerprint of a record's stored form: BLAKE3 of its codec byte, uncompressed length
/// and payload. Compression is deterministic, so equal views give equal stored forms, and
/// decompression is a function, so equal stored forms are equal views: as a dedup key it
/// resists crafted collisions exactly as BLAKE3 of the view does, while hashing the
/// compressed bytes (a pgbench page: ~1 KB instead of 8 KB, 5 us of a capture's ~25 us per
/// page here).
fn stored_fingerprint(codec: u8, raw_len: usize, payload: &[u8]) -> Fingerprint {
    let mut h = blake3::Hasher::new();
    h.update(&[codec]);
    h.update(&(raw_len as u32).to_be_bytes());
    h.update(payload);
    Fingerprint(*h.finalize().as_bytes())
}

/// A page view's image record, with its fingerprint (the dedup key).
pub(crate) struct SealedImage {
    pub fp: Fingerprint,
    pub record: Vec<u8>,
}

/// Compresses `view`, fingerprints its stored form and builds its record.
pub(crate) fn seal_image(view: &[u8]) -> SealedImage {
    codec::with_compressed(view, |codec, payload| {
        let codec = codec | STORED_FINGERPRINT;
        let fp = stored_fingerprint(codec, view.len(), payload);
        SealedImage {
            record: encode_stored(codec, view.len(), &fp, payload),
            fp,
        }
    })
}

/// The fingerprint an image record carries (read from its header, nothing decompressed).
pub(crate) fn image_fingerprint(v: &[u8]) -> Result<Fingerprint> {
    let mut d = Dec::new(v, "image");
    d.version(RECORD_VERSION)?;
    d.u8()?;
    d.u32()?;
    Ok(Fingerprint(d.array()?))
}

/// Decodes an image record and, if `check_fingerprint`, checks the content against its
/// fingerprint (the length is always checked). Errors name the image only in the caller's
/// context, so a read that succeeds formats nothing.
pub(crate) fn decode_image(v: &[u8], check_fingerprint: bool) -> Result<Vec<u8>> {
    decode_content(v, "image", "content", check_fingerprint)
}

/// A stored image record, not yet decompressed: its length is known, and it decompresses
/// straight into the caller's buffer (a cache slot) without an intermediate copy.
#[derive(Debug, Clone)]
pub struct ImageRecord {
    record: Vec<u8>,
    raw_len: usize,
}

impl ImageRecord {
    /// Checks the record's header (Corrupt if it is damaged).
    pub(crate) fn parse(record: Vec<u8>) -> Result<ImageRecord> {
        let raw_len = ImageRecordRef::parse(&record)?.raw_len;
        Ok(ImageRecord { record, raw_len })
    }

    /// The record, borrowed.
    pub fn as_ref(&self) -> ImageRecordRef<'_> {
        ImageRecordRef {
            record: &self.record,
            raw_len: self.raw_len,
        }
    }

    /// The length of the image.
    pub fn len(&self) -> usize {
        self.raw_len
    }

    /// True for an empty image.
    pub fn is_empty(&self) -> bool {
        self.raw_len == 0
    }

    /// Decompresses the image into `out` (of [`ImageRecord::len`] bytes), checking it
    /// against its BLAKE3 fingerprint if `check_fingerprint`.
    pub fn decode_into(&self, out: &mut [u8], check_fingerprint: bool) -> Result<()> {
        self.as_ref().decode_into(out, check_fingerprint)
    }
}

/// A stored image record borrowed from a buffer the caller keeps (a batch of records read
/// together, [`crate::SnapshotStore::image_records_in`]): an [`ImageRecord`] without an
/// allocation of its own.
#[derive(Debug, Clone, Copy)]
pub struct ImageRecordRef<'a> {
    record: &'a [u8],
    raw_len: usize,
}

impl<'a> ImageRecordRef<'a> {
    /// Checks the record's header (Corrupt if it is damaged): a record as the store keeps it
    /// ([`ImageRecordRef::stored`]), for example one a backend finds in a cache slot.
    pub fn parse(record: &'a [u8]) -> Result<ImageRecordRef<'a>> {
        let (_, raw_len, _, _) = content_header(record, "image")?;
        Ok(ImageRecordRef { record, raw_len })
    }

    /// The length of the image.
    pub fn len(&self) -> usize {
        self.raw_len
    }

    /// True for an empty image.
    pub fn is_empty(&self) -> bool {
        self.raw_len == 0
    }

    /// The record as stored (compressed, with its header and fingerprint).
    pub fn stored(&self) -> &'a [u8] {
        self.record
    }

    /// Decompresses the image into `out` (of [`ImageRecordRef::len`] bytes), checking it
    /// against its BLAKE3 fingerprint if `check_fingerprint`.
    pub fn decode_into(&self, out: &mut [u8], check_fingerprint: bool) -> Result<()> {
        let (codec, raw_len, fp, payload) = content_header(self.record, "image")?;
        if out.len() != raw_len {
            return Err(StoreError::invalid(format!(
                "an image of {raw_len} bytes cannot be decoded into {} bytes",
                out.len()
            )));
        }
        decode_payload_into(codec, &fp, payload, out, check_fingerprint, "content")
    }
}

/// Information about a stored TOAST value, enough to read it chunk by chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToastInfo {
    /// Total length of the value in bytes.
    pub len: u64,
    /// Number of chunks (chunk numbers are `0..chunks`).
    pub chunks: u32,
    /// Length of every chunk but the last (the last holds the rest).
    pub chunk_size: u32,
    /// BLAKE3 hash of the whole value.
    pub fingerprint: Fingerprint,
}

pub(crate) fn encode_toast_header(t: &ToastInfo) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .u64(t.len)
        .u32(t.chunks)
        .u32(t.chunk_size)
        .fixed(&t.fingerprint.0)
        .finish()
}

pub(crate) fn decode_toast_header(v: &[u8]) -> Result<ToastInfo> {
    let mut d = Dec::new(v, "TOAST header");
    d.version(RECORD_VERSION)?;
    let t = ToastInfo {
        len: d.u64()?,
        chunks: d.u32()?,
        chunk_size: d.u32()?,
        fingerprint: Fingerprint(d.array()?),
    };
    d.end()?;
    Ok(t)
}

/// Encodes a TOAST chunk record: same layout as an image record, the hash being the chunk's.
pub(crate) fn encode_toast_chunk(raw: &[u8]) -> Vec<u8> {
    encode_image(raw, &Fingerprint::of(raw))
}

pub(crate) fn decode_toast_chunk(v: &[u8], what: &str) -> Result<Vec<u8>> {
    decode_content(v, "TOAST chunk", what, true)
}

pub(crate) fn encode_row_type(bytes: &[u8], fp: &Fingerprint) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .fixed(&fp.0)
        .fixed(bytes)
        .finish()
}

pub(crate) fn decode_row_type(v: &[u8], what: &str) -> Result<(Vec<u8>, Fingerprint)> {
    let mut d = Dec::new(v, "row type");
    d.version(RECORD_VERSION)?;
    let fp = Fingerprint(d.array()?);
    let bytes = d.rest().to_vec();
    verify(&bytes, &fp, what)?;
    Ok((bytes, fp))
}

/// The header of a content record (codec, uncompressed length, fingerprint) and its payload.
fn content_header<'a>(
    v: &'a [u8],
    kind: &'static str,
) -> Result<(u8, usize, Fingerprint, &'a [u8])> {
    let mut d = Dec::new(v, kind);
    d.version(RECORD_VERSION)?;
    let codec = d.u8()?;
    let raw_len = d.u32()? as usize;
    let fp = Fingerprint(d.array()?);
    Ok((codec, raw_len, fp, d.rest()))
}

/// Decompresses a content record, checking it against its fingerprint if `check`.
fn decode_content(v: &[u8], kind: &'static str, what: &str, check: bool) -> Result<Vec<u8>> {
    let (codec, raw_len, fp, payload) = content_header(v, kind)?;
    let mut raw = codec::output_for(payload, raw_len, what)?;
    decode_payload_into(codec, &fp, payload, &mut raw, check, what)?;
    Ok(raw)
}

/// Decompresses a content record's `payload` into `out` (of its recorded length), checking it
/// against its fingerprint `fp` if `check`: its stored form before decompression, or its
/// content after, as the codec byte's [`STORED_FINGERPRINT`] flag says.
fn decode_payload_into(
    codec: u8,
    fp: &Fingerprint,
    payload: &[u8],
    out: &mut [u8],
    check: bool,
    what: &str,
) -> Result<()> {
    let stored = codec & STORED_FINGERPRINT != 0;
    if check && stored {
        verify_stored(codec, out.len(), payload, fp, what)?;
    }
    codec::decompress_into(codec & !STORED_FINGERPRINT, payload, out, what)?;
    if check && !stored {
        verify(out, fp, what)?;
    }
    Ok(())
}

fn verify(raw: &[u8], fp: &Fingerprint, what: &str) -> Result<()> {
    if Fingerprint::of(raw) != *fp {
        return Err(mismatch(what));
    }
    Ok(())
}

fn verify_stored(
    codec: u8,
    raw_len: usize,
    payload: &[u8],
    fp: &Fingerprint,
    what: &str,
) -> Result<()> {
    if stored_fingerprint(codec, raw_len, payload) != *fp {
        return Err(mismatch(what));
    }
    Ok(())
}

fn mismatch(what: &str) -> StoreError {
    StoreError::corrupt(format!(
        "{what}: content does not match its BLAKE3 fingerprint (checksum mismatch)"
    ))
}

// ---- capture markers -----------------------------------------------------------------------

/// What a capturing marker holds once the capture has begun: where the content it stores
/// starts (one capture runs at a time, so every image and TOAST value from there on is its
/// own until it commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CaptureMarker {
    /// The first image sequence number the capture may use.
    pub first_image_seq: u64,
    /// The first TOAST value id the capture may use.
    pub first_toast: u64,
}

pub(crate) fn encode_capture_marker(m: &CaptureMarker) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .u64(m.first_image_seq)
        .u64(m.first_toast)
        .finish()
}

/// Decodes a capturing marker: None for the empty marker of a snapshot whose capture never
/// began.
pub(crate) fn decode_capture_marker(v: &[u8]) -> Result<Option<CaptureMarker>> {
    if v.is_empty() {
        return Ok(None);
    }
    let mut d = Dec::new(v, "capturing marker");
    d.version(RECORD_VERSION)?;
    let m = CaptureMarker {
        first_image_seq: d.u64()?,
        first_toast: d.u64()?,
    };
    d.end()?;
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn info(timeline: u32) -> SnapshotInfo {
        SnapshotInfo {
            id: SnapId(7),
            state: SnapshotState::Committed,
            decl: SnapshotDecl {
                declared_at_us: 1_700_000_000_000_000,
                wal_lsn: 0x1_6000_0028,
                timeline,
                rank: Rank(3),
                label: Some("before deploy".into()),
                relations: vec![RelationSnapshot {
                    pg_relid: 16384,
                    rel: RelId(2),
                    relfilenode: 16390,
                    nblocks: 12,
                    row_type: RowTypeId(5),
                    name: "public.t".into(),
                }],
            },
            stats: CaptureStats::default(),
            failure_reason: None,
            explicit_rank: Rank(0),
            pins: vec![Pin {
                tag: "audit".into(),
                until_us: i64::MAX,
            }],
            deleted_at_us: None,
        }
    }

    #[test]
    fn snapshot_records_keep_the_timeline_and_version_2_reads_as_unknown() {
        let s = info(4);
        let bytes = encode_snapshot(&s);
        assert_eq!(bytes[0], SNAPSHOT_RECORD_VERSION);
        assert_eq!(decode_snapshot(SnapId(7), &bytes).unwrap(), s);
        // A version 2 record: the same without the trailing timeline.
        let mut v2 = bytes[..bytes.len() - 4].to_vec();
        v2[0] = 2;
        assert_eq!(decode_snapshot(SnapId(7), &v2).unwrap(), info(0));
        // Other versions are refused, by name.
        let mut v9 = bytes.clone();
        v9[0] = 9;
        let e = decode_snapshot(SnapId(7), &v9).unwrap_err();
        assert!(e.message().contains("version 9"), "{}", e.message());
        // A version 3 record cut short is corrupt, not read with a made-up timeline.
        assert!(decode_snapshot(SnapId(7), &bytes[..bytes.len() - 2]).is_err());
    }

    /// A page-like view: runs of a row pattern with a varying number (compressible).
    fn page(n: u32) -> Vec<u8> {
        (0..200)
            .flat_map(|i| format!("row {i:05} of page {n}: aaaaaaaaaaaa|").into_bytes())
            .collect()
    }

    fn decoded(record: &[u8], check: bool) -> Result<Vec<u8>> {
        let r = ImageRecord::parse(record.to_vec())?;
        let mut out = vec![0; r.len()];
        r.decode_into(&mut out, check)?;
        assert_eq!(decode_image(record, check)?, out, "both decoders agree");
        Ok(out)
    }

    fn flipped(record: &[u8], at: usize) -> Vec<u8> {
        let mut v = record.to_vec();
        v[at] ^= 0x04;
        v
    }

    #[test]
    fn images_are_named_by_their_stored_form() {
        let (a, b) = (page(1), page(2));
        let sealed = seal_image(&a);
        assert_eq!(sealed.fp, seal_image(&a).fp, "the same view, the same name");
        assert_ne!(sealed.fp, seal_image(&b).fp);
        assert_eq!(Fingerprint::of_image(&a), sealed.fp);
        assert_ne!(sealed.fp, Fingerprint::of(&a), "not the view's own hash");
        let record = sealed.record.clone();
        assert!(record.len() < a.len() / 2, "compressed");
        assert_eq!(image_fingerprint(&record).unwrap(), sealed.fp);
        assert_eq!(decoded(&record, true).unwrap(), a);
        // Damage anywhere in the payload, or to the codec byte's flag, fails the check.
        for at in [record.len() - 1, 1 + 1 + 4 + 32 + 3] {
            let bad = flipped(&record, at);
            assert_eq!(decoded(&bad, true).unwrap_err().kind(), ErrorKind::Corrupt);
        }
        let mut unflagged = record.clone();
        unflagged[1] &= !STORED_FINGERPRINT;
        assert_eq!(
            decoded(&unflagged, true).unwrap_err().kind(),
            ErrorKind::Corrupt,
            "read as a record named by its content, the name does not match"
        );
        assert_eq!(decoded(&unflagged, false).unwrap(), a);
        // An incompressible view is stored raw, and named the same way.
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        let noise: Vec<u8> = (0..4000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let raw = seal_image(&noise);
        assert_eq!(raw.record[1], codec::CODEC_RAW | STORED_FINGERPRINT);
        assert_eq!(decoded(&raw.record, true).unwrap(), noise);
    }

    #[test]
    fn images_named_by_their_content_still_read_and_verify() {
        // The records of earlier stores, and deltas: the fingerprint of the uncompressed bytes.
        let a = page(3);
        let record = encode_image(&a, &Fingerprint::of(&a));
        assert_eq!(record[1] & STORED_FINGERPRINT, 0);
        assert_eq!(decoded(&record, true).unwrap(), a);
        let bad = flipped(&record, record.len() - 1);
        assert_eq!(decoded(&bad, true).unwrap_err().kind(), ErrorKind::Corrupt);
        let mut flagged = record.clone();
        flagged[1] |= STORED_FINGERPRINT;
        assert_eq!(
            decoded(&flagged, true).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }
}
