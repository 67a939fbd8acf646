//! Bounds-checked little-endian reads and writes over byte slices, and the checksum used by
//! sealed groups.
//!
//! Every read of index bytes goes through `read_u32`/`read_u64`, which return
//! `IndexError::Corrupt` instead of panicking when the offset is out of bounds, so a corrupt
//! buffer can never cause an out-of-bounds access.

use crate::error::IndexError;

#[inline]
pub(crate) fn read_u32(buf: &[u8], at: usize, what: &'static str) -> Result<u32, IndexError> {
    match buf.get(at..at.wrapping_add(4)) {
        Some(b) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(IndexError::corrupt(what, at)),
    }
}

#[inline]
pub(crate) fn read_u64(buf: &[u8], at: usize, what: &'static str) -> Result<u64, IndexError> {
    match buf.get(at..at.wrapping_add(8)) {
        Some(b) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a))
        }
        None => Err(IndexError::corrupt(what, at)),
    }
}

/// Writes `v` at `at`; the caller guarantees the range exists (buffers it sized itself).
#[inline]
pub(crate) fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` at `at`; the caller guarantees the range exists (buffers it sized itself).
#[inline]
pub(crate) fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A 64-bit checksum for detecting accidental corruption (not an adversary): words are mixed
/// with a multiply-rotate step, the tail byte by byte, then finalized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checksum(u64);

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

impl Checksum {
    pub(crate) fn new() -> Self {
        Checksum(0x6A09_E667_F3BC_C908)
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            self.mix(u64::from_le_bytes(a));
        }
        for &b in chunks.remainder() {
            self.mix(u64::from(b) | 0x100);
        }
    }

    #[inline]
    fn mix(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(MUL).rotate_left(29);
    }

    pub(crate) fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 33;
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_out_of_bounds_are_errors() {
        let buf = [1u8, 0, 0, 0, 2, 0, 0, 0];
        assert_eq!(read_u32(&buf, 4, "x"), Ok(2));
        assert_eq!(read_u64(&buf, 0, "x"), Ok(0x0000_0002_0000_0001));
        assert!(read_u32(&buf, 5, "x").is_err());
        assert!(read_u64(&buf, 1, "x").is_err());
        assert!(read_u32(&buf, usize::MAX, "x").is_err());
        assert!(read_u64(&buf, usize::MAX - 3, "x").is_err());
    }

    #[test]
    fn checksum_sees_a_single_flipped_bit() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut a = Checksum::new();
        a.update(&data);
        let mut flipped = data.clone();
        flipped[517] ^= 0x10;
        let mut b = Checksum::new();
        b.update(&flipped);
        assert_ne!(a.finish(), b.finish());
    }
}
