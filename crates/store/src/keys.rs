//! The whole key schema of the store: column families and the byte layout of every key.
//!
//! Invariants:
//! - every integer in a key is big-endian, so the byte order of keys is their logical order
//!   (snapshot, relation, block, ...) and prefix scans return records in that order;
//! - within a column family that holds several kinds of record, the first byte of the key is a
//!   tag naming the kind (the `TAG_*` constants), so kinds never collide;
//! - this file is the only place that builds or parses keys; `docs/format.md` describes the
//!   same layout and must change with it.
//!
//! Value layouts are in `records.rs` (structured records) and `groups.rs` (group metadata);
//! the mapping log's nodes are `gsnap_core`'s encoding. All are documented there and in
//! `docs/format.md`.

use std::borrow::Cow;

use crate::error::{Result, StoreError};
use crate::ids::{Fingerprint, GroupId, ImageId, PageKey, Rank, RelId, RowTypeId, SnapId, ToastId};

/// How many image rank levels have a column family (Thresher's ranked segregation): rank 0
/// (no retention level) to 6 (yearly), as `gsnap_lifetimes` numbers them. An image lives in
/// the family of the rank of the snapshot that first stored it, so images that die together
/// share files, and reclaiming short-lived ones does not rewrite long-lived ones.
pub const IMAGE_RANKS: u8 = 7;

/// Where an image id keeps its rank: the top byte; the low 56 bits are its sequence number
/// from the image counter. An image's column family is known from its id alone.
pub const IMAGE_RANK_SHIFT: u32 = 56;

/// The id of the image with sequence number `seq` stored at rank `rank`.
pub fn image_id(rank: Rank, seq: u64) -> ImageId {
    debug_assert!(seq < 1 << IMAGE_RANK_SHIFT && rank.0 < IMAGE_RANKS);
    ImageId(u64::from(rank.0) << IMAGE_RANK_SHIFT | seq)
}

/// The rank (column family) of image `id`.
pub fn image_rank(id: ImageId) -> Rank {
    Rank((id.0 >> IMAGE_RANK_SHIFT) as u8)
}

/// The sequence number of image `id`.
pub fn image_seq(id: ImageId) -> u64 {
    id.0 & ((1 << IMAGE_RANK_SHIFT) - 1)
}

/// A column family: a separately stored, separately compacted key space. Families separate
/// what has different lifetimes (see docs/design.md, "The store").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cf {
    /// Format record and id counters.
    Meta,
    /// Snapshots, capturing markers, carried pages, relation incarnations, row types, group
    /// metadata, GC progress.
    Catalog,
    /// Content fingerprint -> id, for images, TOAST values and row types.
    Dedup,
    /// Page images of one rank level: image id -> image record.
    Images(Rank),
    /// TOAST values: header and chunks.
    Toast,
    /// The mapping log and its Skippy levels: (level, node number) -> log node. Level 0 is
    /// the mapping log itself, the only copy of the mappings.
    MapLog,
    /// Sealed index groups: group id -> opaque bytes.
    Groups,
    /// Reference counts of images and TOAST values, and the TOAST values each image names.
    Refs,
    /// Key maps: which (block, image) pairs hold a row with a given key hash, and the hashes
    /// each image was recorded with (`keymap.rs`).
    Keys,
    /// Deltas of images: image id -> what changed from the image its block held before
    /// (opaque bytes from the extension, in an image record), deleted with the image.
    Deltas,
}

impl Cf {
    /// Every column family this version of the store uses, in a fixed order.
    pub fn all() -> Vec<Cf> {
        let mut all = vec![Cf::Meta, Cf::Catalog, Cf::Dedup];
        all.extend((0..IMAGE_RANKS).map(|r| Cf::Images(Rank(r))));
        all.extend([
            Cf::Toast,
            Cf::MapLog,
            Cf::Groups,
            Cf::Refs,
            Cf::Keys,
            Cf::Deltas,
        ]);
        all
    }

    /// The column family's name on disk.
    pub fn name(self) -> Cow<'static, str> {
        match self {
            Cf::Meta => "meta".into(),
            Cf::Catalog => "catalog".into(),
            Cf::Dedup => "dedup".into(),
            Cf::Images(Rank(r)) => format!("images_r{r}").into(),
            Cf::Toast => "toast".into(),
            Cf::MapLog => "maplog".into(),
            Cf::Groups => "groups".into(),
            Cf::Refs => "refs".into(),
            Cf::Keys => "keys".into(),
            Cf::Deltas => "deltas".into(),
        }
    }
}

// ---- meta ----------------------------------------------------------------------------------

/// `meta`: the format record (the first thing written to a new store).
pub const FORMAT_KEY: &[u8] = b"F";

/// `meta`: the version of the content the caller stores (page views, row types, sealed group
/// bodies), a u32 big-endian; see `StoreOptions::content_version`.
pub const CONTENT_VERSION_KEY: &[u8] = b"V";

/// Which id counter a `meta` counter key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Next [`SnapId`].
    Snap,
    /// Next [`ImageId`].
    Image,
    /// Next [`ToastId`].
    Toast,
    /// Next [`RelId`].
    Rel,
    /// Next [`RowTypeId`].
    RowType,
    /// Next [`crate::GroupId`] (never reused: the group cache keys groups by id).
    Group,
}

/// `meta`: `'N' counter-tag` -> next id (u64 BE).
pub fn counter_key(counter: Counter) -> [u8; 2] {
    let tag = match counter {
        Counter::Snap => b'S',
        Counter::Image => b'I',
        Counter::Toast => b'T',
        Counter::Rel => b'R',
        Counter::RowType => b'Y',
        Counter::Group => b'G',
    };
    [b'N', tag]
}

// ---- catalog -------------------------------------------------------------------------------

/// `catalog`: `'S' snap` -> snapshot record.
pub const TAG_SNAPSHOT: u8 = b'S';
/// `catalog`: `'K' snap` -> empty: snapshot `snap` is being captured (capturing marker).
pub const TAG_CAPTURING: u8 = b'K';
/// `catalog`: `'C' snap rel block` -> empty: page carried (unsettled) by snapshot `snap`.
pub const TAG_CARRIED: u8 = b'C';
/// `catalog`: `'R' rel` -> relation incarnation record.
pub const TAG_REL: u8 = b'R';
/// `catalog`: `'T' rowtype` -> row type record.
pub const TAG_ROW_TYPE: u8 = b'T';
/// `catalog`: `'G' group` -> group metadata record.
pub const TAG_GROUP_META: u8 = b'G';
/// `catalog`: `'P'` -> GC progress (opaque bytes).
pub const GC_PROGRESS_KEY: &[u8] = b"P";
/// `catalog`: `'L'` -> the generation (one byte, 0 or 1) of the `maplog` keys that hold the
/// mapping log, then how many snapshots were reclaimed when the log was last rewritten (u64
/// BE); absent: generation 0, never rewritten.
pub const LOG_GENERATION_KEY: &[u8] = b"L";
/// `catalog`: `'Z' image` -> empty: an image whose count reached zero while a capture was
/// open that maps it (kept for it, `reclaim.rs`).
pub const TAG_KEPT_IMAGE: u8 = b'Z';
/// `catalog`: `'W' toast` -> empty: a TOAST value whose count reached zero while a capture
/// was open (which may have reused it: kept until the capture ends, `refs.rs`).
pub const TAG_KEPT_TOAST: u8 = b'W';
/// `catalog`: `'Y' rel` -> key map record: the snapshot it starts at (u64 BE), then the
/// caller's definition of the key (opaque bytes).
pub const TAG_KEY_MAP: u8 = b'Y';
/// `catalog`: `'E' snap` -> what deleting snapshot `snap` would free, as last computed, with
/// the neighbours it was computed against (`estimates.rs`).
pub const TAG_ESTIMATE: u8 = b'E';

pub(crate) fn tagged_u64(tag: u8, n: u64) -> [u8; 9] {
    let mut k = [0; 9];
    k[0] = tag;
    k[1..].copy_from_slice(&n.to_be_bytes());
    k
}

/// `catalog` key of snapshot `snap`'s record.
pub fn snapshot_key(snap: SnapId) -> [u8; 9] {
    tagged_u64(TAG_SNAPSHOT, snap.0)
}

/// `catalog` key of snapshot `snap`'s capturing marker.
pub fn capturing_key(snap: SnapId) -> [u8; 9] {
    tagged_u64(TAG_CAPTURING, snap.0)
}

/// `catalog` key of the kept estimate of what deleting snapshot `snap` would free.
pub fn estimate_key(snap: SnapId) -> [u8; 9] {
    tagged_u64(TAG_ESTIMATE, snap.0)
}

/// `catalog` key of a page carried by snapshot `snap`.
pub fn carried_key(snap: SnapId, page: PageKey) -> [u8; 17] {
    let mut k = [0; 17];
    k[..9].copy_from_slice(&tagged_u64(TAG_CARRIED, snap.0));
    k[9..13].copy_from_slice(&page.rel.0.to_be_bytes());
    k[13..].copy_from_slice(&page.block.to_be_bytes());
    k
}

/// Prefix of every carried-page key of snapshot `snap`.
pub fn carried_prefix(snap: SnapId) -> [u8; 9] {
    tagged_u64(TAG_CARRIED, snap.0)
}

/// `catalog` key of a relation incarnation.
pub fn rel_key(rel: RelId) -> [u8; 5] {
    let mut k = [TAG_REL, 0, 0, 0, 0];
    k[1..].copy_from_slice(&rel.0.to_be_bytes());
    k
}

/// `catalog` key of a row type.
pub fn row_type_key(id: RowTypeId) -> [u8; 9] {
    tagged_u64(TAG_ROW_TYPE, id.0)
}

/// `catalog` key of a group's metadata.
pub fn group_meta_key(group: GroupId) -> [u8; 9] {
    tagged_u64(TAG_GROUP_META, group.0)
}

/// Decodes the big-endian u64 after a one-byte tag (snapshot, capturing, row type, group keys).
pub fn decode_tagged_u64(key: &[u8], tag: u8) -> Result<u64> {
    match key {
        [t, rest @ ..] if *t == tag && rest.len() == 8 => Ok(be_u64(rest)),
        _ => Err(bad_key("catalog", key)),
    }
}

/// Decodes a carried-page key.
pub fn decode_carried_key(key: &[u8]) -> Result<(SnapId, PageKey)> {
    if key.len() != 17 || key[0] != TAG_CARRIED {
        return Err(bad_key("catalog", key));
    }
    let page = PageKey {
        rel: RelId(be_u32(&key[9..13])),
        block: be_u32(&key[13..]),
    };
    Ok((SnapId(be_u64(&key[1..9])), page))
}

/// Decodes a relation incarnation key.
pub fn decode_rel_key(key: &[u8]) -> Result<RelId> {
    match key {
        [TAG_REL, rest @ ..] if rest.len() == 4 => Ok(RelId(be_u32(rest))),
        _ => Err(bad_key("catalog", key)),
    }
}

// ---- dedup ---------------------------------------------------------------------------------

/// What a `dedup` entry's fingerprint identifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupKind {
    /// A page image (value: [`ImageId`]).
    Image,
    /// A TOAST value (value: [`ToastId`]).
    Toast,
    /// A row type (value: [`RowTypeId`]).
    RowType,
}

/// `dedup`: `kind-tag fingerprint[32]` -> id (u64 BE).
pub fn dedup_key(kind: DedupKind, fp: &Fingerprint) -> [u8; 33] {
    let mut k = [0; 33];
    k[0] = match kind {
        DedupKind::Image => b'I',
        DedupKind::Toast => b'T',
        DedupKind::RowType => b'R',
    };
    k[1..].copy_from_slice(&fp.0);
    k
}

/// Decodes a dedup key.
pub fn decode_dedup_key(key: &[u8]) -> Result<(DedupKind, Fingerprint)> {
    if key.len() != 33 {
        return Err(bad_key("dedup", key));
    }
    let kind = match key[0] {
        b'I' => DedupKind::Image,
        b'T' => DedupKind::Toast,
        b'R' => DedupKind::RowType,
        _ => return Err(bad_key("dedup", key)),
    };
    let mut fp = [0; 32];
    fp.copy_from_slice(&key[1..]);
    Ok((kind, Fingerprint(fp)))
}

// ---- images and toast ----------------------------------------------------------------------

/// `images_rN`: image id (u64 BE) -> image record.
pub fn image_key(id: ImageId) -> [u8; 8] {
    id.0.to_be_bytes()
}

/// `deltas`: image id (u64 BE) -> delta record (an image record holding the delta's bytes).
pub fn delta_key(id: ImageId) -> [u8; 8] {
    image_key(id)
}

/// Decodes an image key.
pub fn decode_image_key(key: &[u8]) -> Result<ImageId> {
    exact::<8>(key, "images").map(|k| ImageId(u64::from_be_bytes(k)))
}

/// `toast`: toast id (u64 BE) -> TOAST header record. Sorts before the value's chunks.
pub fn toast_header_key(id: ToastId) -> [u8; 8] {
    id.0.to_be_bytes()
}

/// `toast`: toast id (u64 BE), chunk number (u32 BE) -> TOAST chunk record.
pub fn toast_chunk_key(id: ToastId, chunk: u32) -> [u8; 12] {
    let mut k = [0; 12];
    k[..8].copy_from_slice(&id.0.to_be_bytes());
    k[8..].copy_from_slice(&chunk.to_be_bytes());
    k
}

// ---- the mapping log -----------------------------------------------------------------------

/// `maplog`: generation and level (one byte: level + 32 x generation), node number (u64 BE)
/// -> a Skippy log node (`gsnap_core`'s `LogNode` encoding). Keys sort by generation, then
/// level, then node number. The log lives in one of two generations ([`LOG_GENERATION_KEY`]
/// says which): a rewrite writes the other one, then switches (`maplog.rs`). Generation 0's
/// keys are those of format version 3 (the level alone).
pub fn log_node_key(generation: u8, level: u8, node: u64) -> [u8; 9] {
    tagged_u64(log_tag(generation, level), node)
}

/// Levels per generation in the `maplog` key space (the log's height is at most 16).
const LOG_LEVELS_PER_GENERATION: u8 = 32;

fn log_tag(generation: u8, level: u8) -> u8 {
    debug_assert!(generation < 2 && level < LOG_LEVELS_PER_GENERATION);
    generation * LOG_LEVELS_PER_GENERATION + level
}

/// The `maplog` keys of level `level` of `generation`: `[start, end)`.
pub fn log_level_range(generation: u8, level: u8) -> ([u8; 1], [u8; 1]) {
    let tag = log_tag(generation, level);
    ([tag], [tag + 1])
}

/// Every `maplog` key of `generation`: `[start, end)`.
pub fn log_generation_range(generation: u8) -> ([u8; 1], [u8; 1]) {
    let first = log_tag(generation, 0);
    ([first], [first + LOG_LEVELS_PER_GENERATION])
}

/// Decodes a `maplog` key into (generation, level, node number).
pub fn decode_log_node_key(key: &[u8]) -> Result<(u8, u8, u64)> {
    match key {
        [tag, rest @ ..] if rest.len() == 8 && *tag < 2 * LOG_LEVELS_PER_GENERATION => Ok((
            tag / LOG_LEVELS_PER_GENERATION,
            tag % LOG_LEVELS_PER_GENERATION,
            be_u64(rest),
        )),
        _ => Err(bad_key("maplog", key)),
    }
}

// ---- sealed groups -------------------------------------------------------------------------

/// `groups`: group id (u64 BE) -> opaque sealed group bytes.
pub fn group_key(group: GroupId) -> [u8; 8] {
    group.0.to_be_bytes()
}

// ---- helpers -------------------------------------------------------------------------------

/// Decodes an 8-byte id value (dedup values, counters).
pub fn decode_u64_value(value: &[u8], what: &str) -> Result<u64> {
    match <[u8; 8]>::try_from(value) {
        Ok(b) => Ok(u64::from_be_bytes(b)),
        Err(_) => Err(StoreError::corrupt(format!(
            "{what}: expected an 8-byte value, found {} bytes",
            value.len()
        ))),
    }
}

/// The smallest key greater than every key starting with `prefix` (None: no such key, the
/// prefix is all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

fn exact<const N: usize>(key: &[u8], cf: &str) -> Result<[u8; N]> {
    <[u8; N]>::try_from(key).map_err(|_| bad_key(cf, key))
}

fn bad_key(cf: &str, key: &[u8]) -> StoreError {
    StoreError::corrupt(format!("malformed key {key:02x?} in column family {cf}"))
}

// ---- reference counts ----------------------------------------------------------------------

/// `refs`: `'I' image` -> u64 BE: how many live mappings of the mapping log name the image
/// (written by the commit of the capture that maps it; decremented by reclamation).
pub fn image_refs_key(id: ImageId) -> [u8; 9] {
    tagged_u64(b'I', id.0)
}

/// `refs`: `'T' toast` -> u64 BE: how many stored images name the TOAST value.
pub fn toast_refs_key(id: ToastId) -> [u8; 9] {
    tagged_u64(b'T', id.0)
}

/// `refs`: `'L' image` -> the TOAST values the image names (u64 BE each; absent: none).
pub fn image_toasts_key(id: ImageId) -> [u8; 9] {
    tagged_u64(b'L', id.0)
}

// ---- key maps ------------------------------------------------------------------------------

/// `keys`: `'E' rel map hash block from` -> `to` (u64 BE; `u64::MAX`: still there): from
/// snapshot `from` until before snapshot `to`, block `block` of `rel` held a row whose key
/// hashes to `hash`, by key map `map` (its start snapshot).
pub fn key_entry_key(rel: RelId, map: SnapId, hash: u64, block: u32, from: SnapId) -> [u8; 33] {
    let mut k = [0; 33];
    k[..21].copy_from_slice(&key_entry_prefix(rel, map, hash));
    k[21..25].copy_from_slice(&block.to_be_bytes());
    k[25..].copy_from_slice(&from.0.to_be_bytes());
    k
}

/// The prefix of the `keys` entries of `rel`'s key map `map` for key hash `hash`.
pub fn key_entry_prefix(rel: RelId, map: SnapId, hash: u64) -> [u8; 21] {
    let mut k = [0; 21];
    k[..13].copy_from_slice(&key_map_prefix(b'E', rel, map));
    k[13..].copy_from_slice(&hash.to_be_bytes());
    k
}

/// The two kinds of `keys` records of a relation's key map: its entries (`'E'`) and its
/// blocks' open entries (`'O'`). Each starts with `tag rel map`.
pub const KEY_MAP_TAGS: [u8; 2] = [b'E', b'O'];

/// The prefix of the records of kind `tag` (one of [`KEY_MAP_TAGS`]) of `rel`'s key map
/// `map`.
pub fn key_map_prefix(tag: u8, rel: RelId, map: SnapId) -> [u8; 13] {
    let mut k = [0; 13];
    k[..5].copy_from_slice(&key_rel_prefix(tag, rel));
    k[5..].copy_from_slice(&map.0.to_be_bytes());
    k
}

/// The prefix of the records of kind `tag` (one of [`KEY_MAP_TAGS`]) of `rel`, whatever the
/// map.
pub fn key_rel_prefix(tag: u8, rel: RelId) -> [u8; 5] {
    let mut k = [tag, 0, 0, 0, 0];
    k[1..].copy_from_slice(&rel.0.to_be_bytes());
    k
}

/// A decoded `keys` entry key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    pub rel: RelId,
    pub map: SnapId,
    pub hash: u64,
    pub block: u32,
    pub from: SnapId,
}

/// Decodes a `keys` entry key.
pub fn decode_key_entry_key(key: &[u8]) -> Result<KeyEntry> {
    match key {
        [b'E', rest @ ..] if rest.len() == 32 => Ok(KeyEntry {
            rel: RelId(be_u32(&rest[..4])),
            map: SnapId(be_u64(&rest[4..12])),
            hash: be_u64(&rest[12..20]),
            block: be_u32(&rest[20..24]),
            from: SnapId(be_u64(&rest[24..])),
        }),
        _ => Err(bad_key("keys", key)),
    }
}

/// `keys`: `'O' rel map block hash` -> `from` (u64 BE): the open entries of block `block` of
/// `rel` under key map `map` (what the block holds by its last recording, and the snapshot
/// each entry began at): what the next capture of the block compares with.
pub fn open_key_key(rel: RelId, map: SnapId, block: u32, hash: u64) -> [u8; 25] {
    let mut k = [0; 25];
    k[..17].copy_from_slice(&open_keys_prefix(rel, map, block));
    k[17..].copy_from_slice(&hash.to_be_bytes());
    k
}

/// The prefix of the open entries of one block.
pub fn open_keys_prefix(rel: RelId, map: SnapId, block: u32) -> [u8; 17] {
    let mut k = [0; 17];
    k[..13].copy_from_slice(&key_map_prefix(b'O', rel, map));
    k[13..].copy_from_slice(&block.to_be_bytes());
    k
}

/// An `'O'` key's relation, map and hash.
pub fn decode_open_key(key: &[u8]) -> Result<(RelId, SnapId, u64)> {
    match key {
        [b'O', rest @ ..] if rest.len() == 24 => Ok((
            RelId(be_u32(&rest[..4])),
            SnapId(be_u64(&rest[4..12])),
            be_u64(&rest[16..]),
        )),
        _ => Err(bad_key("keys", key)),
    }
}

/// `catalog` key of the key map record of relation incarnation `rel`.
pub fn key_map_key(rel: RelId) -> [u8; 5] {
    let mut k = [TAG_KEY_MAP, 0, 0, 0, 0];
    k[1..].copy_from_slice(&rel.0.to_be_bytes());
    k
}

/// Decodes a `refs` key: its tag and id.
pub fn decode_refs_key(key: &[u8]) -> Result<(u8, u64)> {
    match key {
        [tag @ (b'I' | b'T' | b'L'), rest @ ..] if rest.len() == 8 => Ok((*tag, be_u64(rest))),
        _ => Err(bad_key("refs", key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_nodes_order_by_generation_then_level_then_number() {
        let a = log_node_key(0, 0, u64::MAX);
        let b = log_node_key(0, 1, 0);
        let c = log_node_key(0, 1, 1);
        let d = log_node_key(0, 16, u64::MAX);
        let e = log_node_key(1, 0, 0);
        let f = log_node_key(1, 16, 3);
        assert!(a < b && b < c && c < d && d < e && e < f);
        assert_eq!(decode_log_node_key(&c).unwrap(), (0, 1, 1));
        assert_eq!(decode_log_node_key(&f).unwrap(), (1, 16, 3));
        assert!(decode_log_node_key(&c[..8]).is_err());
        assert!(decode_log_node_key(&tagged_u64(64, 0)).is_err());
        // Generation 0 keeps format 3's keys: the level alone.
        assert_eq!(log_node_key(0, 2, 7), tagged_u64(2, 7));
        for generation in 0..2 {
            let (start, end) = log_generation_range(generation);
            for level in 0..=16 {
                let k = log_node_key(generation, level, 9);
                assert!(start.as_slice() <= k.as_slice() && k.as_slice() < end.as_slice());
                let (ls, le) = log_level_range(generation, level);
                assert!(ls.as_slice() <= k.as_slice() && k.as_slice() < le.as_slice());
            }
            let other = log_node_key(1 - generation, 0, 0);
            assert!(!(start.as_slice() <= other.as_slice() && other.as_slice() < end.as_slice()));
        }
    }

    #[test]
    fn catalog_keys_round_trip_and_do_not_collide() {
        let s = snapshot_key(SnapId(42));
        assert_eq!(decode_tagged_u64(&s, TAG_SNAPSHOT).unwrap(), 42);
        assert!(decode_tagged_u64(&s, TAG_CAPTURING).is_err());
        let c = carried_key(SnapId(4), PageKey::new(2, 7));
        assert!(c.starts_with(&carried_prefix(SnapId(4))));
        assert_eq!(
            decode_carried_key(&c).unwrap(),
            (SnapId(4), PageKey::new(2, 7))
        );
        assert_eq!(decode_rel_key(&rel_key(RelId(77))).unwrap(), RelId(77));
        let tags = [
            TAG_SNAPSHOT,
            TAG_CAPTURING,
            TAG_CARRIED,
            TAG_REL,
            TAG_ROW_TYPE,
            TAG_GROUP_META,
            TAG_KEPT_IMAGE,
            TAG_KEPT_TOAST,
            TAG_KEY_MAP,
        ];
        let mut sorted = tags.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), tags.len());
        assert!(!tags.contains(&GC_PROGRESS_KEY[0]));
        assert!(!tags.contains(&LOG_GENERATION_KEY[0]));
    }

    #[test]
    fn dedup_keys_round_trip() {
        let fp = Fingerprint::of(b"view");
        for kind in [DedupKind::Image, DedupKind::Toast, DedupKind::RowType] {
            assert_eq!(decode_dedup_key(&dedup_key(kind, &fp)).unwrap(), (kind, fp));
        }
    }

    #[test]
    fn toast_header_sorts_before_chunks() {
        let h = toast_header_key(ToastId(5));
        let c0 = toast_chunk_key(ToastId(5), 0);
        let next = toast_header_key(ToastId(6));
        assert!(h.as_slice() < c0.as_slice() && c0.as_slice() < next.as_slice());
    }

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }

    #[test]
    fn column_family_names_are_distinct() {
        let names: Vec<_> = Cf::all().iter().map(|c| c.name()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names.len(), sorted.len());
        assert!(names.iter().all(|n| n != "default"));
    }
}
