//! The view of a page: the tuples one snapshot sees on it, each with its line pointer number.
//!
//! Layout (little-endian), version 2: an 8-byte header (version `u8` = 2, a zero byte, the
//! tuple count `u16`, four zero bytes), then a directory of `count` entries (line pointer
//! number `u16`, tuple length `u16`), zero padding to a multiple of 8, then the tuples in
//! directory order, each padded with zeros to a multiple of 8. So in a view stored at an
//! 8-byte aligned address every tuple is 8-byte aligned, as on a heap page, and can be used
//! in place; and a view is never larger than the page it describes (per tuple, 4 directory
//! bytes and the tuple rounded up to 8, as a page spends a line pointer and the tuple rounded
//! up to MAXALIGN).
//!
//! The tuple bytes are PostgreSQL's heap tuple with the header *normalized* by the extension
//! (transaction ids, command id and ctid zeroed, only the layout bits of the infomasks kept),
//! so that the view depends only on what the snapshot sees: hint bits, freezing and pruning
//! never change it, and identical views are stored once. Tuples are in line-pointer order.

use crate::{FormatError, Reader};

const VERSION: u8 = 2;
const HEADER: usize = 8;

fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// Builds a view tuple by tuple.
#[derive(Debug, Default, Clone)]
pub struct ViewBuilder {
    dir: Vec<(u16, u16)>,
    tuples: Vec<u8>,
}

impl ViewBuilder {
    /// An empty view.
    pub fn new() -> Self {
        ViewBuilder {
            dir: Vec::new(),
            tuples: Vec::with_capacity(8192),
        }
    }

    /// Appends the tuple at line pointer `lp`. Line pointers must increase.
    ///
    /// # Panics
    /// If the tuple is longer than 65535 bytes (a heap tuple never is).
    pub fn push(&mut self, lp: u16, tuple: &[u8]) {
        let len = u16::try_from(tuple.len()).expect("a heap tuple fits in a page");
        self.dir.push((lp, len));
        self.tuples.extend_from_slice(tuple);
        self.tuples.resize(pad8(self.tuples.len()), 0);
    }

    /// Number of tuples so far.
    pub fn len(&self) -> usize {
        self.dir.len()
    }

    /// True if no tuple was added.
    pub fn is_empty(&self) -> bool {
        self.dir.is_empty()
    }

    /// The encoded view.
    pub fn finish(self) -> Vec<u8> {
        let dir_end = pad8(HEADER + 4 * self.dir.len());
        let mut out = Vec::with_capacity(dir_end + self.tuples.len());
        out.push(VERSION);
        out.push(0);
        out.extend_from_slice(&(self.dir.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for (lp, len) in &self.dir {
            out.extend_from_slice(&lp.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.resize(dir_end, 0);
        out.extend_from_slice(&self.tuples);
        out
    }
}

/// One tuple of a decoded view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewTuple<'a> {
    /// Line pointer number (the tuple's offset number in its block).
    pub lp: u16,
    /// The normalized heap tuple (8-byte aligned if the view is).
    pub bytes: &'a [u8],
}

/// Decodes a view into its tuples, checking the layout.
pub fn decode(view: &[u8]) -> Result<Vec<ViewTuple<'_>>, FormatError> {
    let mut r = Reader::new(view, "page view");
    r.version(VERSION)?;
    r.take(1)?;
    let n = r.u16()? as usize;
    r.take(4)?;
    let mut dir = Vec::with_capacity(n);
    let mut last = 0u16;
    for _ in 0..n {
        let lp = r.u16()?;
        if lp <= last {
            return Err(FormatError::corrupt(format!(
                "page view lists line pointer {lp} after {last}"
            )));
        }
        last = lp;
        dir.push((lp, r.u16()? as usize));
    }
    r.take(pad8(HEADER + 4 * n) - (HEADER + 4 * n))?;
    let mut tuples = Vec::with_capacity(n);
    for (lp, len) in dir {
        let bytes = r.take(len)?;
        r.take(pad8(len) - len)?;
        tuples.push(ViewTuple { lp, bytes });
    }
    r.end()?;
    Ok(tuples)
}

/// The encoding of a page whose view is empty.
pub fn empty() -> Vec<u8> {
    ViewBuilder::new().finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let mut b = ViewBuilder::new();
        b.push(1, b"first");
        b.push(7, &[0u8; 300]);
        assert_eq!(b.len(), 2);
        let bytes = b.finish();
        let t = decode(&bytes).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].lp, t[0].bytes), (1, &b"first"[..]));
        assert_eq!((t[1].lp, t[1].bytes.len()), (7, 300));
        assert_eq!(decode(&empty()).unwrap(), vec![]);
    }

    #[test]
    fn corrupt_views_are_errors() {
        let mut b = ViewBuilder::new();
        b.push(3, b"abc");
        let good = b.finish();
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "truncated at {cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
        let mut wrong_version = good.clone();
        wrong_version[0] = 9;
        assert!(decode(&wrong_version)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let mut short_tuple = good.clone();
        short_tuple[10] = 200; // the first tuple's length
        assert!(decode(&short_tuple).is_err());
        assert!(decode(&wrong_version)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let mut b = ViewBuilder::new();
        b.push(3, b"a");
        b.push(3, b"b");
        assert!(decode(&b.finish()).is_err(), "line pointers must increase");
    }

    proptest! {
        #[test]
        fn any_tuples_round_trip(tuples in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..200), 0..40)) {
            let mut b = ViewBuilder::new();
            for (i, t) in tuples.iter().enumerate() {
                b.push(i as u16 + 1, t);
            }
            let bytes = b.finish();
            let decoded = decode(&bytes).unwrap();
            prop_assert_eq!(decoded.len(), tuples.len());
            for (d, t) in decoded.iter().zip(&tuples) {
                prop_assert_eq!(d.bytes, &t[..]);
                // every tuple starts 8-byte aligned relative to the view
                let offset = d.bytes.as_ptr() as usize - bytes.as_ptr() as usize;
                prop_assert_eq!(offset % 8, 0);
            }
            // never larger than a heap page holding the same tuples
            let page: usize = 24 + tuples.iter().map(|t| 4 + t.len().next_multiple_of(8)).sum::<usize>();
            prop_assert!(bytes.len() <= page);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
