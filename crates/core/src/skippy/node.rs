//! A Skippy log node and its byte encoding (what the store keeps per (level, number)).
//!
//! Encoding (little-endian): magic "GSKN" u32 | version u8 | level u8 | flags u8 (bit 0:
//! uplink present, bit 1: in-link present) | reserved u8 | number u64 | start u64 | uplink u64
//! | inlink u64 | count u32 | count x (rel u32, block u32, snap u64, image u64) | checksum u64
//! of everything before it.

use crate::bytes::{read_u32, read_u64, Checksum};
use crate::error::IndexError;
use crate::types::{ImageId, Mapping, PageKey, RelId, SnapId};

const MAGIC: u32 = u32::from_le_bytes(*b"GSKN");
const VERSION: u8 = 1;
const FIXED: usize = 4 + 4 + 8 * 4 + 4;
const ENTRY: usize = 24;

/// One node of one level of the mapping log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogNode {
    pub level: u8,
    /// The node's number within its level (0 = oldest).
    pub number: u64,
    /// The position, within the level's log, of the node's first entry.
    pub start: u64,
    /// Levels below the top: the position in level+1 where this node's FEM segment begins.
    pub uplink: Option<u64>,
    /// The top level: the next older node of the same level.
    pub inlink: Option<u64>,
    /// The mappings, in log order (at levels above 0, one per page per FEM segment).
    pub entries: Vec<Mapping>,
}

impl LogNode {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED + ENTRY * self.entries.len() + 8);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        let flags = u8::from(self.uplink.is_some()) | (u8::from(self.inlink.is_some()) << 1);
        out.extend_from_slice(&[VERSION, self.level, flags, 0]);
        for v in [
            self.number,
            self.start,
            self.uplink.unwrap_or(0),
            self.inlink.unwrap_or(0),
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for m in &self.entries {
            out.extend_from_slice(&m.page.rel.0.to_le_bytes());
            out.extend_from_slice(&m.page.block.to_le_bytes());
            out.extend_from_slice(&m.snap.0.to_le_bytes());
            out.extend_from_slice(&m.image.0.to_le_bytes());
        }
        let mut c = Checksum::new();
        c.update(&out);
        out.extend_from_slice(&c.finish().to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<LogNode, IndexError> {
        if bytes.len() < FIXED || read_u32(bytes, 0, "log node magic")? != MAGIC {
            return Err(IndexError::corrupt("log node magic", 0));
        }
        let version = bytes[4];
        if version != VERSION {
            return Err(IndexError::UnsupportedVersion {
                what: "log node",
                found: u32::from(version),
            });
        }
        let (level, flags) = (bytes[5], bytes[6]);
        let count = read_u32(bytes, FIXED - 4, "log node count")? as usize;
        let body = FIXED + ENTRY * count;
        if bytes.len() != body + 8 || flags & !3 != 0 {
            return Err(IndexError::corrupt("log node length", bytes.len()));
        }
        let mut c = Checksum::new();
        c.update(&bytes[..body]);
        if c.finish() != read_u64(bytes, body, "log node checksum")? {
            return Err(IndexError::corrupt("log node checksum", body));
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let at = FIXED + ENTRY * i;
            entries.push(Mapping {
                page: PageKey {
                    rel: RelId(read_u32(bytes, at, "rel")?),
                    block: read_u32(bytes, at + 4, "block")?,
                },
                snap: SnapId(read_u64(bytes, at + 8, "snap")?),
                image: ImageId(read_u64(bytes, at + 16, "image")?),
            });
        }
        Ok(LogNode {
            level,
            number: read_u64(bytes, 8, "number")?,
            start: read_u64(bytes, 16, "start")?,
            uplink: (flags & 1 != 0).then_some(read_u64(bytes, 24, "uplink")?),
            inlink: (flags & 2 != 0).then_some(read_u64(bytes, 32, "inlink")?),
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_round_trip_and_damage_is_detected() {
        let n = LogNode {
            level: 2,
            number: 7,
            start: 700,
            uplink: Some(33),
            inlink: None,
            entries: vec![Mapping::new(PageKey::new(3, 9), SnapId(4), ImageId(5))],
        };
        let bytes = n.encode();
        assert_eq!(LogNode::decode(&bytes), Ok(n));
        for i in [0, 4, 9, 50, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(LogNode::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(LogNode::decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(LogNode::decode(&[]).is_err());
        assert!(LogNode::decode(b"GSKN").is_err());
    }
}
