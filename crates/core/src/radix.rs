//! Radix-tree nodes over 32-bit keys with 64-bit values, in a position-independent byte arena,
//! and the path-copying insert that builds a new tree sharing every unchanged subtree (SSI,
//! GSnap section 4.1).
//!
//! The same tree shape serves twice in a group: a relation directory (key: `RelId`, value: the
//! relation's block-tree root and height) and one block tree per relation (key: block number,
//! value: `ImageId`).
//!
//! Node format (little-endian, 4-byte aligned, addressed by its byte offset in the node area):
//! ```text
//! u32 header = bitmap (bits 0..16) | level (bits 16..24) | tag 0xA7 (bits 24..32)
//! level >= 2: popcount(bitmap) x u32   child offsets, in digit order (bitmap: 16 bits)
//! level == 1: popcount(bitmap) x u64   values (leaf), in digit order (bitmap: 4 bits)
//! ```
//! A leaf consumes 2 bits of the key (4 values), each internal level 4 bits (16 children); a
//! tree of height h holds keys below 2^(2 + 4(h-1)), and 9 levels hold any u32. Small leaves
//! keep path copying cheap when updates are spread out (any change copies its whole leaf). Invariants: a node is written after all its children (post-order, append-only), so
//! an arena prefix is always a complete set of trees; a child is one level below its parent,
//! which every reader checks, so a walk takes at most `MAX_HEIGHT` steps even over corrupt
//! bytes; offset 0..8 is the node-area preamble, never a node.

use crate::bytes::{read_u32, read_u64};
use crate::error::IndexError;

/// Array size for a node's slots (internal fanout; leaves use the first `1 << LEAF_BITS`).
pub(crate) const FANOUT: usize = 16;
/// Key bits a leaf consumes: 4 values per leaf, so that a path copy under uniformly spread
/// updates copies few unchanged values (a leaf is copied whole when any of its pages changes).
pub(crate) const LEAF_BITS: u32 = 2;
/// Key bits an internal node consumes: 16 children.
pub(crate) const INNER_BITS: u32 = 4;
/// 2 + 4 x 8 = 34 bits >= 32.
pub(crate) const MAX_HEIGHT: u8 = 9;
const NODE_TAG: u32 = 0xA7;
/// The first 8 bytes of every node area: magic and format version.
pub(crate) const NODE_AREA_MAGIC: [u8; 8] = *b"GSNODES1";
pub(crate) const NODE_AREA_START: usize = NODE_AREA_MAGIC.len();

/// Key bits consumed below a node of `level` (by its descendants).
#[inline]
fn bits_below(level: u8) -> u32 {
    if level <= 1 {
        0
    } else {
        LEAF_BITS + INNER_BITS * (u32::from(level) - 2)
    }
}

/// Key bits a node of `level` consumes itself.
#[inline]
fn bits_at(level: u8) -> u32 {
    if level <= 1 {
        LEAF_BITS
    } else {
        INNER_BITS
    }
}

/// Whether `key` fits a tree of `height`.
#[inline]
pub(crate) fn fits(key: u32, height: u8) -> bool {
    let bits = bits_below(height) + bits_at(height);
    bits >= 32 || (key >> bits) == 0
}

/// The smallest height whose trees hold `max_key`.
pub(crate) fn height_for(max_key: u32) -> u8 {
    let mut h = 1u8;
    while h < MAX_HEIGHT && !fits(max_key, h) {
        h += 1;
    }
    h
}

/// The number of keys one child of a node at `level` covers.
#[inline]
pub(crate) fn child_span(level: u8) -> u64 {
    1u64 << bits_below(level)
}

#[inline]
pub(crate) fn digit(key: u32, level: u8) -> usize {
    ((u64::from(key) >> bits_below(level)) & ((1u64 << bits_at(level)) - 1)) as usize
}

/// A decoded node header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub off: u32,
    pub level: u8,
    pub bitmap: u16,
}

impl Node {
    /// Reads and checks the header at `off`: tag, expected level, whole body in bounds.
    pub(crate) fn read(nodes: &[u8], off: u32, level: u8) -> Result<Node, IndexError> {
        let at = off as usize;
        if at < NODE_AREA_START || level == 0 || level > MAX_HEIGHT {
            return Err(IndexError::corrupt("node offset or level", at));
        }
        let h = read_u32(nodes, at, "node header")?;
        if h >> 24 != NODE_TAG
            || ((h >> 16) & 0xFF) as u8 != level
            || (h & 0xFFFF) >> (1 << bits_at(level)) != 0
        {
            return Err(IndexError::corrupt("node header tag or level", at));
        }
        let node = Node {
            off,
            level,
            bitmap: h as u16,
        };
        if at + node.byte_len() > nodes.len() {
            return Err(IndexError::corrupt("node body out of bounds", at));
        }
        Ok(node)
    }

    pub(crate) fn entry_count(&self) -> usize {
        self.bitmap.count_ones() as usize
    }

    pub(crate) fn byte_len(&self) -> usize {
        4 + self.entry_count() * if self.level == 1 { 8 } else { 4 }
    }

    #[inline]
    pub(crate) fn has(&self, d: usize) -> bool {
        self.bitmap & (1u16 << d) != 0
    }

    #[inline]
    fn slot(&self, d: usize) -> Option<usize> {
        if self.has(d) {
            Some((self.bitmap & ((1u16 << d) - 1)).count_ones() as usize)
        } else {
            None
        }
    }

    /// The child offset at digit `d` of an internal node.
    #[inline]
    pub(crate) fn child(&self, nodes: &[u8], d: usize) -> Result<Option<u32>, IndexError> {
        match self.slot(d) {
            Some(s) => read_u32(nodes, self.off as usize + 4 + 4 * s, "child offset").map(Some),
            None => Ok(None),
        }
    }

    /// The value at digit `d` of a leaf.
    #[inline]
    pub(crate) fn value(&self, nodes: &[u8], d: usize) -> Result<Option<u64>, IndexError> {
        match self.slot(d) {
            Some(s) => read_u64(nodes, self.off as usize + 4 + 8 * s, "leaf value").map(Some),
            None => Ok(None),
        }
    }
}

/// The value under `key` in the tree rooted at `root` of `height`.
pub(crate) fn lookup(
    nodes: &[u8],
    root: u32,
    height: u8,
    key: u32,
) -> Result<Option<u64>, IndexError> {
    if !fits(key, height) {
        return Ok(None);
    }
    let mut node = Node::read(nodes, root, height)?;
    loop {
        let d = digit(key, node.level);
        if node.level == 1 {
            return node.value(nodes, d);
        }
        match node.child(nodes, d)? {
            Some(c) => node = Node::read(nodes, c, node.level - 1)?,
            None => return Ok(None),
        }
    }
}

/// Calls `f(key, value)` for every key in `lo..hi` of the tree, in key order.
pub(crate) fn scan(
    nodes: &[u8],
    root: u32,
    height: u8,
    lo: u64,
    hi: u64,
    f: &mut dyn FnMut(u32, u64),
) -> Result<(), IndexError> {
    let node = Node::read(nodes, root, height)?;
    scan_node(nodes, node, 0, lo, hi, f)
}

fn scan_node(
    nodes: &[u8],
    node: Node,
    base: u64,
    lo: u64,
    hi: u64,
    f: &mut dyn FnMut(u32, u64),
) -> Result<(), IndexError> {
    let span = child_span(node.level);
    let mut slot = 0usize;
    for d in 0..FANOUT {
        if !node.has(d) {
            continue;
        }
        let start = base + d as u64 * span;
        let s = slot;
        slot += 1;
        if start + span <= lo || start >= hi {
            continue;
        }
        if node.level == 1 {
            let v = read_u64(nodes, node.off as usize + 4 + 8 * s, "leaf value")?;
            f(start as u32, v);
        } else {
            let c = read_u32(nodes, node.off as usize + 4 + 4 * s, "child offset")?;
            scan_node(
                nodes,
                Node::read(nodes, c, node.level - 1)?,
                start,
                lo,
                hi,
                f,
            )?;
        }
    }
    Ok(())
}

/// A subtree already in the arena. Its `level` may be below the level being built: a tree
/// that grows taller keeps its old root as the leftmost descendant of the new nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Subtree {
    pub off: u32,
    pub level: u8,
}

/// The append-only node area of one group.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    pub bytes: Vec<u8>,
}

impl Arena {
    pub(crate) fn new() -> Self {
        Arena {
            bytes: NODE_AREA_MAGIC.to_vec(),
        }
    }

    fn begin_node(&mut self, level: u8, bitmap: u16, body: usize) -> Result<u32, IndexError> {
        let off = self.bytes.len();
        let end = off as u64 + 4 + body as u64;
        if end > u64::from(u32::MAX) {
            return Err(IndexError::GroupTooLarge { bytes: end });
        }
        let header = u32::from(bitmap) | (u32::from(level) << 16) | (NODE_TAG << 24);
        self.bytes.extend_from_slice(&header.to_le_bytes());
        Ok(off as u32)
    }

    fn write_internal(
        &mut self,
        level: u8,
        children: &[Option<u32>; FANOUT],
    ) -> Result<u32, IndexError> {
        let bitmap = bitmap_of(children);
        let off = self.begin_node(level, bitmap, 4 * bitmap.count_ones() as usize)?;
        for c in children.iter().flatten() {
            self.bytes.extend_from_slice(&c.to_le_bytes());
        }
        Ok(off)
    }

    fn write_leaf(&mut self, values: &[Option<u64>; FANOUT]) -> Result<u32, IndexError> {
        let bitmap = bitmap_of(values);
        let off = self.begin_node(1, bitmap, 8 * bitmap.count_ones() as usize)?;
        for v in values.iter().flatten() {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        Ok(off)
    }
}

fn bitmap_of<T>(slots: &[Option<T>; FANOUT]) -> u16 {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_some())
        .fold(0u16, |b, (d, _)| b | (1 << d))
}

/// Writes the tree of `level` that is `old` overridden by `entries` (sorted by key, all below
/// 16^level) and returns its root. Every subtree of `old` that no entry touches is shared, not
/// copied: only the paths to changed keys are new (path copying).
pub(crate) fn merge(
    arena: &mut Arena,
    old: Option<Subtree>,
    level: u8,
    entries: &[(u32, u64)],
) -> Result<u32, IndexError> {
    let mut old_children: [Option<Subtree>; FANOUT] = [None; FANOUT];
    let mut values: [Option<u64>; FANOUT] = [None; FANOUT];
    match old {
        Some(o) if o.level == level => {
            let node = Node::read(&arena.bytes, o.off, level)?;
            for (d, child) in old_children.iter_mut().enumerate() {
                if level == 1 {
                    values[d] = node.value(&arena.bytes, d)?;
                } else if let Some(off) = node.child(&arena.bytes, d)? {
                    *child = Some(Subtree {
                        off,
                        level: level - 1,
                    });
                }
            }
        }
        Some(o) if o.level < level => old_children[0] = Some(o),
        Some(_) => {
            return Err(IndexError::InvalidArgument(
                "old subtree is taller than the new one",
            ))
        }
        None => {}
    }
    if level == 1 {
        for &(k, v) in entries {
            values[digit(k, 1)] = Some(v);
        }
        return arena.write_leaf(&values);
    }
    let mut children: [Option<u32>; FANOUT] = [None; FANOUT];
    let mut rest = entries;
    for d in 0..FANOUT {
        let n = rest
            .iter()
            .take_while(|(k, _)| digit(*k, level) == d)
            .count();
        let (group, tail) = rest.split_at(n);
        rest = tail;
        children[d] = match (old_children[d], group.is_empty()) {
            (Some(s), true) if s.level == level - 1 => Some(s.off),
            (None, true) => None,
            (old_child, _) => Some(merge(arena, old_child, level - 1, group)?),
        };
    }
    if !rest.is_empty() {
        return Err(IndexError::InvalidArgument(
            "entries are unsorted or exceed the tree height",
        ));
    }
    arena.write_internal(level, &children)
}

/// Packs a relation's block-tree root and height into a directory value.
pub(crate) fn pack_rel(root: u32, height: u8) -> u64 {
    u64::from(root) | (u64::from(height) << 32)
}

/// Unpacks a directory value, checking the height.
pub(crate) fn unpack_rel(v: u64) -> Result<(u32, u8), IndexError> {
    let height = (v >> 32) as u8;
    if height == 0 || height > MAX_HEIGHT || v >> 40 != 0 {
        return Err(IndexError::corrupt("relation directory entry", 0));
    }
    Ok((v as u32, height))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(entries: &[(u32, u64)]) -> (Arena, u32, u8) {
        let mut a = Arena::new();
        let h = height_for(entries.iter().map(|e| e.0).max().unwrap_or(0));
        let root = merge(&mut a, None, h, entries).unwrap();
        (a, root, h)
    }

    #[test]
    fn heights_cover_their_keys() {
        assert_eq!(height_for(0), 1);
        assert_eq!(height_for(3), 1);
        assert_eq!(height_for(4), 2);
        assert_eq!(height_for(63), 2);
        assert_eq!(height_for(64), 3);
        assert_eq!(height_for(u32::MAX), 9);
        assert!(fits(1023, 3) && !fits(1024, 3) && fits(u32::MAX, 9) && !fits(u32::MAX, 8));
        assert_eq!((digit(0b11_0110, 1), digit(0b11_0110, 2)), (0b10, 0b1101));
    }

    #[test]
    fn lookup_and_scan_see_every_entry() {
        let entries: Vec<(u32, u64)> = (0..300u32).map(|k| (k * 3, u64::from(k) + 1000)).collect();
        let (a, root, h) = build(&entries);
        for &(k, v) in &entries {
            assert_eq!(lookup(&a.bytes, root, h, k).unwrap(), Some(v));
            assert_eq!(lookup(&a.bytes, root, h, k + 1).unwrap(), None);
        }
        assert_eq!(lookup(&a.bytes, root, h, u32::MAX).unwrap(), None);
        let mut seen = Vec::new();
        scan(&a.bytes, root, h, 30, 61, &mut |k, v| seen.push((k, v))).unwrap();
        let want: Vec<_> = entries
            .iter()
            .copied()
            .filter(|e| (30..61).contains(&e.0))
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn path_copy_shares_untouched_subtrees_and_grows_height() {
        let entries: Vec<(u32, u64)> = (0..4096u32).map(|k| (k, 1)).collect();
        let (mut a, root, h) = build(&entries);
        assert_eq!(h, 4);
        let before = a.bytes.len();
        let root2 = merge(
            &mut a,
            Some(Subtree {
                off: root,
                level: h,
            }),
            h,
            &[(17, 2)],
        )
        .unwrap();
        // one leaf (4 + 4*8), two full internal nodes (4 + 16*4) and the root, which has
        // only 4 children (4096 = 4 x 16 x 16 x 4)
        assert_eq!(a.bytes.len() - before, 36 + 2 * 68 + 20);
        assert_eq!(lookup(&a.bytes, root2, h, 17).unwrap(), Some(2));
        assert_eq!(lookup(&a.bytes, root, h, 17).unwrap(), Some(1));
        // growing: key 1 << 20 needs height 6; the old root becomes the leftmost subtree
        let old = Some(Subtree {
            off: root2,
            level: 4,
        });
        let root3 = merge(&mut a, old, 6, &[(1 << 20, 9)]).unwrap();
        assert_eq!(lookup(&a.bytes, root3, 6, 1 << 20).unwrap(), Some(9));
        assert_eq!(lookup(&a.bytes, root3, 6, 17).unwrap(), Some(2));
        assert_eq!(lookup(&a.bytes, root3, 6, 4095).unwrap(), Some(1));
        assert_eq!(lookup(&a.bytes, root3, 6, 4096).unwrap(), None);
    }

    #[test]
    fn corrupt_nodes_are_errors() {
        let (mut a, root, h) = build(&[(1, 5), (200, 6)]);
        assert!(Node::read(&a.bytes, root, h + 1).is_err());
        assert!(Node::read(&a.bytes, 0, h).is_err());
        assert!(lookup(&a.bytes[..a.bytes.len() - 2], root, h, 200).is_err());
        // point the root's first child at the root itself: the level check stops the walk
        let at = root as usize + 4;
        a.bytes[at..at + 4].copy_from_slice(&root.to_le_bytes());
        assert!(lookup(&a.bytes, root, h, 1).is_err());
        assert!(unpack_rel(pack_rel(8, 0)).is_err());
        assert_eq!(unpack_rel(pack_rel(8, 3)), Ok((8, 3)));
    }
}
