//! The byte format of a group: header, node area, root table. One sealed group is one byte
//! string, position independent (offsets, never pointers), stored as one unit and walked in
//! place from any address (shared memory, a store buffer).
//!
//! ```text
//! sealed group = header (64 bytes) | node area (nodes_len bytes) | root table (count x 24)
//!
//! header:  0 magic "GSNAPGRP"      8 version u32 (=1)     12 header_len u32 (=64)
//!         16 nodes_len u64        24 root_count u32      28 root_record_len u32 (=24)
//!         32 first_snap u64       40 last_snap u64       48 checksum u64   56 reserved u64 (=0)
//! node area: "GSNODES1" then radix nodes (see `radix`); offsets are relative to its start
//! root record (one per snapshot, ascending snapshot id):
//!          0 snap u64   8 dir_root u32   12 node_end u32   16 dir_height u8   17 flags u8
//!         18 reserved [u8; 6] (=0)
//! ```
//! `dir_root`/`dir_height` locate the snapshot's relation directory (height 0: no relation);
//! `node_end` is the node-area length once the snapshot's nodes were appended, so every node
//! of the snapshot lies below it. `flags` bit 0 marks a deleted snapshot; it is the only byte
//! that changes after publication and the checksum skips it. The checksum covers the node area
//! and the root table (flags zeroed); all integers are little-endian.
//!
//! The active group is published as two append-only parts, the node area and the root table,
//! each growing at its end; `GroupReader::from_parts` reads any published prefix of both.

use crate::bytes::{put_u32, put_u64, read_u32, read_u64, Checksum};
use crate::error::IndexError;
use crate::radix::{MAX_HEIGHT, NODE_AREA_MAGIC};
use crate::types::SnapId;

pub const GROUP_MAGIC: [u8; 8] = *b"GSNAPGRP";
pub const GROUP_FORMAT_VERSION: u32 = 1;
pub const GROUP_HEADER_LEN: usize = 64;
pub const ROOT_RECORD_LEN: usize = 24;
pub(crate) const FLAG_DELETED: u8 = 1;
const FLAGS_AT: usize = 17;

/// One snapshot's entry in a group's root table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RootRecord {
    pub snap: SnapId,
    pub dir_root: u32,
    pub node_end: u32,
    pub dir_height: u8,
    pub flags: u8,
}

impl RootRecord {
    pub(crate) fn deleted(&self) -> bool {
        self.flags & FLAG_DELETED != 0
    }

    pub(crate) fn encode(&self) -> [u8; ROOT_RECORD_LEN] {
        let mut b = [0u8; ROOT_RECORD_LEN];
        put_u64(&mut b, 0, self.snap.0);
        put_u32(&mut b, 8, self.dir_root);
        put_u32(&mut b, 12, self.node_end);
        b[16] = self.dir_height;
        b[FLAGS_AT] = self.flags;
        b
    }

    /// Decodes record `i` of a root table, checking it against a node area of `nodes_len`.
    pub(crate) fn decode(
        roots: &[u8],
        i: usize,
        nodes_len: usize,
    ) -> Result<RootRecord, IndexError> {
        let at = i.saturating_mul(ROOT_RECORD_LEN);
        let b = roots
            .get(at..at.saturating_add(ROOT_RECORD_LEN))
            .ok_or(IndexError::corrupt("root record out of bounds", at))?;
        let r = RootRecord {
            snap: SnapId(read_u64(b, 0, "root snap")?),
            dir_root: read_u32(b, 8, "root dir")?,
            node_end: read_u32(b, 12, "root node end")?,
            dir_height: b[16],
            flags: b[FLAGS_AT],
        };
        let ok = r.node_end as usize <= nodes_len
            && r.dir_height <= MAX_HEIGHT
            && r.flags & !FLAG_DELETED == 0
            && b[18..].iter().all(|&x| x == 0)
            && if r.dir_height == 0 {
                r.dir_root == 0
            } else {
                r.dir_root < r.node_end
            };
        if !ok {
            return Err(IndexError::corrupt("root record", at));
        }
        Ok(r)
    }
}

/// Checks a root table: records valid, snapshot ids strictly increasing, node ends
/// non-decreasing. Returns the number of records.
pub(crate) fn validate_roots(roots: &[u8], nodes_len: usize) -> Result<usize, IndexError> {
    if !roots.len().is_multiple_of(ROOT_RECORD_LEN) {
        return Err(IndexError::corrupt("root table length", roots.len()));
    }
    let count = roots.len() / ROOT_RECORD_LEN;
    let mut prev: Option<RootRecord> = None;
    for i in 0..count {
        let r = RootRecord::decode(roots, i, nodes_len)?;
        if let Some(p) = prev {
            if r.snap <= p.snap || r.node_end < p.node_end {
                return Err(IndexError::corrupt("root table order", i * ROOT_RECORD_LEN));
            }
        }
        prev = Some(r);
    }
    Ok(count)
}

/// Checks the node-area preamble (magic and version).
pub(crate) fn validate_node_area(nodes: &[u8]) -> Result<(), IndexError> {
    match nodes.get(..NODE_AREA_MAGIC.len()) {
        Some(m) if m == NODE_AREA_MAGIC => Ok(()),
        Some(m) if m[..7] == NODE_AREA_MAGIC[..7] => Err(IndexError::UnsupportedVersion {
            what: "group node area",
            found: u32::from(m[7]),
        }),
        _ => Err(IndexError::corrupt("node area magic", 0)),
    }
}

/// The parts of a sealed group's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealedLayout {
    pub nodes: (usize, usize),
    pub roots: (usize, usize),
    pub checksum: u64,
}

/// Parses and checks a sealed group's header and the sizes of its parts.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<SealedLayout, IndexError> {
    if bytes.len() < GROUP_HEADER_LEN || bytes[..8] != GROUP_MAGIC {
        return Err(IndexError::corrupt("group magic", 0));
    }
    let version = read_u32(bytes, 8, "group version")?;
    if version != GROUP_FORMAT_VERSION {
        return Err(IndexError::UnsupportedVersion {
            what: "group",
            found: version,
        });
    }
    let header_len = read_u32(bytes, 12, "group header len")? as usize;
    let nodes_len = read_u64(bytes, 16, "group nodes len")?;
    let count = read_u32(bytes, 24, "group root count")? as u64;
    let record_len = read_u32(bytes, 28, "group root record len")? as usize;
    if header_len != GROUP_HEADER_LEN
        || record_len != ROOT_RECORD_LEN
        || read_u64(bytes, 56, "reserved")? != 0
    {
        return Err(IndexError::corrupt("group header fields", 12));
    }
    let total = (GROUP_HEADER_LEN as u64)
        .checked_add(nodes_len)
        .and_then(|t| t.checked_add(count * ROOT_RECORD_LEN as u64));
    if total != Some(bytes.len() as u64) || nodes_len > u64::from(u32::MAX) {
        return Err(IndexError::corrupt("group length", bytes.len()));
    }
    let nodes_end = GROUP_HEADER_LEN + nodes_len as usize;
    Ok(SealedLayout {
        nodes: (GROUP_HEADER_LEN, nodes_end),
        roots: (nodes_end, bytes.len()),
        checksum: read_u64(bytes, 48, "group checksum")?,
    })
}

/// The checksum of a group's node area and root table (with the flags bytes zeroed).
pub(crate) fn checksum(nodes: &[u8], roots: &[u8]) -> u64 {
    let mut c = Checksum::new();
    c.update(nodes);
    for rec in roots.chunks(ROOT_RECORD_LEN) {
        let mut r = [0u8; ROOT_RECORD_LEN];
        r[..rec.len()].copy_from_slice(rec);
        if rec.len() > FLAGS_AT {
            r[FLAGS_AT] = 0;
        }
        c.update(&r);
    }
    c.finish()
}

/// Assembles sealed bytes from a node area and a root table.
pub(crate) fn seal(nodes: &[u8], roots: &[u8]) -> Vec<u8> {
    let count = roots.len() / ROOT_RECORD_LEN;
    let snap_of = |i: usize| read_u64(roots, i * ROOT_RECORD_LEN, "snap").unwrap_or(0);
    let mut out = Vec::with_capacity(GROUP_HEADER_LEN + nodes.len() + roots.len());
    out.extend_from_slice(&GROUP_MAGIC);
    out.extend_from_slice(&GROUP_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(GROUP_HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(nodes.len() as u64).to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&(ROOT_RECORD_LEN as u32).to_le_bytes());
    out.extend_from_slice(&snap_of(0).to_le_bytes());
    out.extend_from_slice(&snap_of(count.saturating_sub(1)).to_le_bytes());
    out.extend_from_slice(&checksum(nodes, roots).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(nodes);
    out.extend_from_slice(roots);
    out
}

/// Sets or clears the deleted flag of root record `i` in place (sealed bytes or a root table).
pub(crate) fn set_deleted(roots: &mut [u8], i: usize, deleted: bool) -> Result<(), IndexError> {
    let at = i.saturating_mul(ROOT_RECORD_LEN).saturating_add(FLAGS_AT);
    let flags = roots
        .get_mut(at)
        .ok_or(IndexError::corrupt("root record out of bounds", at))?;
    if deleted {
        *flags |= FLAG_DELETED;
    } else {
        *flags &= !FLAG_DELETED;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(snap: u64, node_end: u32) -> RootRecord {
        RootRecord {
            snap: SnapId(snap),
            dir_root: 8,
            node_end,
            dir_height: 1,
            flags: 0,
        }
    }

    #[test]
    fn root_records_round_trip_and_are_checked() {
        let mut roots = Vec::new();
        roots.extend_from_slice(&rec(3, 40).encode());
        roots.extend_from_slice(&rec(5, 40).encode());
        assert_eq!(validate_roots(&roots, 40), Ok(2));
        assert_eq!(RootRecord::decode(&roots, 1, 40), Ok(rec(5, 40)));
        assert!(
            validate_roots(&roots, 39).is_err(),
            "node_end beyond the node area"
        );
        let mut swapped = rec(5, 40).encode().to_vec();
        swapped.extend_from_slice(&rec(3, 40).encode());
        assert!(
            validate_roots(&swapped, 40).is_err(),
            "snapshots must increase"
        );
        assert!(validate_roots(&roots[..30], 40).is_err());
        set_deleted(&mut roots, 1, true).unwrap();
        assert!(RootRecord::decode(&roots, 1, 40).unwrap().deleted());
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let mut nodes = NODE_AREA_MAGIC.to_vec();
        nodes.extend_from_slice(&[0u8; 32]);
        let roots = rec(9, 40).encode();
        let sealed = seal(&nodes, &roots);
        let layout = parse_header(&sealed).unwrap();
        assert_eq!(layout.nodes, (64, 104));
        assert_eq!(layout.checksum, checksum(&nodes, &roots));
        let mut v2 = sealed.clone();
        v2[8] = 2;
        assert_eq!(
            parse_header(&v2),
            Err(IndexError::UnsupportedVersion {
                what: "group",
                found: 2
            })
        );
        assert!(parse_header(&sealed[..sealed.len() - 1]).is_err());
        let mut long = sealed.clone();
        long[16] = 0xFF;
        assert!(parse_header(&long).is_err());
    }
}
