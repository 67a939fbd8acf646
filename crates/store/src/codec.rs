//! The tiny binary encoding used by every structured value, and value compression.
//!
//! Encoding: fixed-width integers are big-endian; a byte string or text is a u32 length
//! followed by the bytes (text is UTF-8). Every structured record starts with a one-byte
//! record version so its layout can evolve; a decoder refuses versions it does not know, and
//! refuses trailing bytes, so a misread is reported as [`crate::ErrorKind::Corrupt`] instead
//! of producing wrong values.
//!
//! Compression: a compressed payload is tagged with a one-byte codec ([`CODEC_RAW`] or
//! [`CODEC_LZ4`]) and the uncompressed length; LZ4 is used only when it makes the value
//! smaller.

use crate::error::{Result, StoreError};
use std::cell::RefCell;

/// Payload stored as is.
pub const CODEC_RAW: u8 = 0;
/// Payload is an LZ4 block (lz4_flex block format, no frame, no size prefix).
pub const CODEC_LZ4: u8 = 1;

/// Builds an encoded value.
#[derive(Debug, Default)]
pub struct Enc(Vec<u8>);

impl Enc {
    /// An encoder whose first byte is `version`.
    pub fn with_version(version: u8) -> Self {
        Enc(vec![version])
    }

    /// An encoder whose first byte is `version`, with room for `len` more bytes (a record
    /// built in one allocation).
    pub fn with_version_and_room(version: u8, len: usize) -> Self {
        let mut v = Vec::with_capacity(1 + len);
        v.push(version);
        Enc(v)
    }

    /// An encoder with no version byte (for fixed layouts such as the format record).
    pub fn raw() -> Self {
        Enc(Vec::new())
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    /// Appends a u32, big-endian.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends a u64, big-endian.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends an i64, big-endian two's complement.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends bytes with no length (fixed-size fields such as fingerprints, or a trailing
    /// payload).
    pub fn fixed(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }

    /// Appends a u32 length and the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).expect("encoded byte strings are smaller than 4 GiB");
        self.u32(len).fixed(v)
    }

    /// Appends a u32 length and the UTF-8 bytes of `v`.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    /// The encoded bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads an encoded value; every error names the record being decoded.
#[derive(Debug)]
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Dec<'a> {
    /// A decoder over `buf`, a value of kind `what` (used in error messages).
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Dec { buf, pos: 0, what }
    }

    /// Reads the record version byte and checks that it is `expected`.
    pub fn version(&mut self, expected: u8) -> Result<()> {
        let v = self.u8()?;
        if v != expected {
            return Err(StoreError::corrupt(format!(
                "{} record has version {v}, this gsnap build reads version {expected}",
                self.what
            )));
        }
        Ok(())
    }

    /// Reads the version byte, one of `accepted`, and returns it.
    pub fn version_in(&mut self, accepted: std::ops::RangeInclusive<u8>) -> Result<u8> {
        let v = self.u8()?;
        if !accepted.contains(&v) {
            return Err(StoreError::corrupt(format!(
                "{} record has version {v}, this gsnap build reads versions {} to {}",
                self.what,
                accepted.start(),
                accepted.end()
            )));
        }
        Ok(v)
    }

    /// Reads `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "{} record is truncated ({} bytes, needed {} more at offset {})",
                    self.what,
                    self.buf.len(),
                    n,
                    self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// Reads a big-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian i64.
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// Reads a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// Reads a u32 length and that many bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Reads a u32 length and that many bytes of UTF-8.
    pub fn str(&mut self) -> Result<String> {
        let what = self.what;
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| StoreError::corrupt(format!("{what} record holds invalid UTF-8 text")))
    }

    /// The rest of the value.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// Checks that the whole value was read.
    pub fn end(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(StoreError::corrupt(format!(
                "{} record has {} unexpected trailing bytes",
                self.what,
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// Compresses `raw` with LZ4 if that makes it smaller and hands `f` the codec and the
/// payload, which is `raw` itself or lies in a buffer of the calling thread. That buffer and
/// LZ4's hash table are reused from one call to the next: a capture compresses every page it
/// stores, and allocating and zeroing both for each page (~17 KB) showed in its profile.
/// `f` must not compress (the buffer is borrowed while it runs).
///
/// The output is LZ4's for a fresh table either way: an image's dedup key is the fingerprint
/// of its compressed form, so the same view must compress to the same bytes whatever was
/// compressed before it (a table is only reused below 64 KiB, where LZ4 always takes the
/// same kind of table; see the test `compression_output_is_pinned`).
pub fn with_compressed<R>(raw: &[u8], f: impl FnOnce(u8, &[u8]) -> R) -> R {
    use lz4_flex::block::{compress_into, compress_into_with_table, get_maximum_output_size};
    thread_local! {
        static SCRATCH: RefCell<(lz4_flex::block::CompressTable, Vec<u8>)> =
            RefCell::new((lz4_flex::block::CompressTable::small(), Vec::new()));
    }
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let (table, out) = &mut *scratch;
        let max = get_maximum_output_size(raw.len());
        if out.len() < max {
            out.resize(max, 0);
        }
        let written = if raw.len() < usize::from(u16::MAX) {
            compress_into_with_table(raw, &mut out[..max], table)
        } else {
            compress_into(raw, &mut out[..max])
        }
        .expect("the output buffer has LZ4's maximum size");
        if written < raw.len() {
            f(CODEC_LZ4, &out[..written])
        } else {
            f(CODEC_RAW, raw)
        }
    })
}

/// Reverses [`with_compressed`] into `out`, whose length is the recorded uncompressed length.
pub fn decompress_into(codec: u8, payload: &[u8], out: &mut [u8], what: &str) -> Result<()> {
    let written = match codec {
        CODEC_RAW if payload.len() == out.len() => {
            out.copy_from_slice(payload);
            out.len()
        }
        CODEC_RAW => payload.len(),
        CODEC_LZ4 => lz4_decode(payload, out)
            .ok_or_else(|| StoreError::corrupt(format!("{what}: LZ4 payload does not decode")))?,
        other => {
            return Err(StoreError::corrupt(format!(
                "{what}: unknown codec {other}"
            )))
        }
    };
    if written != out.len() {
        return Err(StoreError::corrupt(format!(
            "{what}: decoded to {written} bytes, the record says {}",
            out.len()
        )));
    }
    Ok(())
}

/// Decodes the LZ4 block `payload` into `out` with liblz4's `LZ4_decompress_safe`, the decoder
/// PostgreSQL itself runs on the lz4-compressed TOAST values and WAL it reads from disk: for
/// any bytes, damaged or crafted, it reads nothing outside `payload` and writes nothing outside
/// `out`, and it reports a payload that does not decode into `out`. It takes about a third less
/// time per page than lz4_flex's safe decoder (a worker decodes every image an AS OF scan
/// reads; bench/snapshots/README.md). Returns the bytes written, None if the payload does not
/// decode.
fn lz4_decode(payload: &[u8], out: &mut [u8]) -> Option<usize> {
    // (The `lz4` crate passes the lengths to C as `i32`.)
    i32::try_from(payload.len()).ok()?;
    let out_len = i32::try_from(out.len()).ok()?;
    lz4::block::decompress_to_buffer(payload, Some(out_len), out).ok()
}

/// A zeroed buffer of `raw_len` bytes to decompress `payload` into, if `payload` can hold
/// that much (LZ4 expands a byte to at most 255: a damaged length must not allocate
/// gigabytes).
pub fn output_for(payload: &[u8], raw_len: usize, what: &str) -> Result<Vec<u8>> {
    if raw_len > payload.len().saturating_mul(255).saturating_add(16) {
        return Err(StoreError::corrupt(format!(
            "{what}: the record says {raw_len} bytes, more than its {} stored bytes can hold",
            payload.len()
        )));
    }
    Ok(vec![0; raw_len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compress(raw: &[u8]) -> (u8, Vec<u8>) {
        with_compressed(raw, |codec, payload| (codec, payload.to_vec()))
    }

    /// Reverses [`compress`]; `raw_len` is the recorded uncompressed length.
    fn decompress(codec: u8, payload: &[u8], raw_len: usize, what: &str) -> Result<Vec<u8>> {
        let mut raw = output_for(payload, raw_len, what)?;
        decompress_into(codec, payload, &mut raw, what)?;
        Ok(raw)
    }
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    #[test]
    fn fields_round_trip() {
        let v = Enc::with_version(3)
            .u8(7)
            .u32(9)
            .u64(u64::MAX)
            .i64(-5)
            .str("héllo")
            .bytes(b"")
            .finish();
        let mut d = Dec::new(&v, "test");
        d.version(3).unwrap();
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u32().unwrap(), 9);
        assert_eq!(d.u64().unwrap(), u64::MAX);
        assert_eq!(d.i64().unwrap(), -5);
        assert_eq!(d.str().unwrap(), "héllo");
        assert_eq!(d.bytes().unwrap(), b"");
        d.end().unwrap();
    }

    #[test]
    fn truncation_version_and_trailing_bytes_are_corrupt() {
        let v = Enc::with_version(1).u64(1).finish();
        assert_eq!(
            Dec::new(&v[..5], "t").u64().unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        assert_eq!(
            Dec::new(&v, "t").version(2).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        let mut d = Dec::new(&v, "t");
        d.version(1).unwrap();
        assert!(d.end().is_err());
        let huge = Enc::raw().u32(u32::MAX).finish();
        assert!(Dec::new(&huge, "t").bytes().is_err());
    }

    #[test]
    fn compression_round_trips_and_never_grows() {
        let zeros = vec![0u8; 8192];
        let (c, p) = compress(&zeros);
        assert_eq!(c, CODEC_LZ4);
        assert!(p.len() < 200);
        assert_eq!(decompress(c, &p, 8192, "t").unwrap(), zeros);
        let noise: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let (c, p) = compress(&noise);
        assert!(p.len() <= noise.len());
        assert_eq!(decompress(c, &p, noise.len(), "t").unwrap(), noise);
        assert!(
            decompress(CODEC_LZ4, &p[..p.len() / 2], noise.len(), "t").is_err() || c == CODEC_RAW
        );
        assert!(decompress(9, &p, noise.len(), "t").is_err());
        assert!(decompress(CODEC_RAW, b"abc", 4, "t").is_err());
    }

    /// Rows of text, like a heap page's: compressible, with matches near and far.
    fn rows(n: usize, seed: u32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let k = (i as u32).wrapping_mul(2_654_435_761) ^ seed;
                format!("{i:06}|{k:010}|{}|", " ".repeat(k as usize % 90)).into_bytes()
            })
            .collect()
    }

    /// Bytes like a page's: runs of blanks, repeated and random fragments.
    fn compressible() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                (1usize..300).prop_map(|n| vec![b' '; n]),
                prop::collection::vec(any::<u8>(), 1..40),
                (0u32..50).prop_map(|i| format!("{i:06}|row|").into_bytes()),
            ],
            1..120,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn lz4_payloads_decode_to_what_was_compressed(raw in compressible()) {
            let (c, p) = compress(&raw);
            prop_assert_eq!(decompress(c, &p, raw.len(), "t").unwrap(), raw.clone());
            if c == CODEC_LZ4 {
                // The decoder of the same crate that compressed agrees.
                prop_assert_eq!(lz4_flex::block::decompress(&p, raw.len()).unwrap(), raw);
            }
        }

        /// A damaged payload, or a wrong recorded length, is an error or decodes to what
        /// lz4_flex's safe decoder makes of it: never a crash, never other bytes.
        #[test]
        fn damaged_lz4_payloads_decode_as_the_reference_does_or_fail(
            raw in compressible(),
            cut in any::<prop::sample::Index>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..), 0..4),
            len_change in -3i64..4,
        ) {
            // (With a run of blanks, LZ4 always makes it smaller.)
            let raw = [raw, vec![b' '; 512]].concat();
            let (c, mut p) = compress(&raw);
            prop_assert_eq!(c, CODEC_LZ4);
            p.truncate(cut.index(p.len()) + 1);
            for (at, x) in &flips {
                let i = at.index(p.len());
                p[i] ^= x;
            }
            let len = (raw.len() as i64 + len_change).max(0) as usize;
            let mut out = vec![0u8; len];
            let reference = lz4_flex::block::decompress(&p, len).ok().filter(|r| r.len() == len);
            // (Not "the same payloads decode": lz4_flex decodes some rare damaged payloads
            // that liblz4 refuses, such as the one kept in proptest-regressions/codec.txt.)
            match decompress_into(CODEC_LZ4, &p, &mut out, "t") {
                Ok(()) => {
                    if let Some(r) = reference {
                        prop_assert_eq!(out, r);
                    }
                }
                Err(e) => prop_assert_eq!(e.kind(), ErrorKind::Corrupt),
            }
        }
    }

    #[test]
    fn a_cut_payload_or_a_wrong_length_does_not_decode() {
        let page = rows(80, 7);
        let (c, p) = compress(&page);
        assert_eq!(c, CODEC_LZ4);
        assert_eq!(decompress(c, &p, page.len(), "t").unwrap(), page);
        for cut in 0..p.len() {
            let err = decompress(c, &p[..cut], page.len(), "t").unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corrupt, "cut at {cut}");
        }
        for len in [0, 1, page.len() - 1, page.len() + 1, page.len() * 2] {
            assert!(decompress(c, &p, len, "t").is_err(), "length {len}");
        }
    }

    #[test]
    fn compression_output_is_pinned() {
        // Images are deduplicated by the fingerprint of their compressed form, across captures
        // and across gsnap versions: the same view must compress to the same bytes whatever was
        // compressed before it in the thread, and an LZ4 upgrade that changes its output would
        // store every unchanged page that a capture reads again as a new image.
        let page = rows(80, 7);
        let expected = "2ae39383";
        let digest = |raw: &[u8]| {
            let (c, p) = compress(raw);
            assert_eq!(c, CODEC_LZ4);
            assert_eq!(
                p,
                lz4_flex::block::compress(raw),
                "LZ4's output for a fresh table"
            );
            blake3::hash(&p).to_hex()[..8].to_string()
        };
        assert_eq!(digest(&page), expected);
        // After inputs of other sizes, on both sides of 64 KiB, the same output.
        for n in [3, 900, 1300, 5000] {
            digest(&rows(n, n as u32));
        }
        assert_eq!(digest(&page), expected);
    }
}
