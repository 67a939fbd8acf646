//! The view of a page: the tuples one snapshot sees on it, each with its line pointer number.
//!
//! Layout (little-endian): version `u8` = 1, tuple count `u16`, then per tuple its line
//! pointer number `u16`, its length `u16` and its bytes. The tuple bytes are PostgreSQL's
//! heap tuple with the header *normalized* by the extension (transaction ids, command id and
//! ctid zeroed, only the layout bits of the infomasks kept), so that the view depends only on
//! what the snapshot sees: hint bits, freezing and pruning never change it, and identical
//! views are stored once. Tuples are in line-pointer order.

use crate::{FormatError, Reader};

const VERSION: u8 = 1;

/// Builds a view tuple by tuple.
#[derive(Debug, Default, Clone)]
pub struct ViewBuilder {
    bytes: Vec<u8>,
    count: u16,
}

impl ViewBuilder {
    /// An empty view.
    pub fn new() -> Self {
        let mut bytes = Vec::with_capacity(8192);
        bytes.push(VERSION);
        bytes.extend_from_slice(&0u16.to_le_bytes());
        ViewBuilder { bytes, count: 0 }
    }

    /// Appends the tuple at line pointer `lp`. Line pointers must increase.
    ///
    /// # Panics
    /// If the tuple is longer than 65535 bytes (a heap tuple never is).
    pub fn push(&mut self, lp: u16, tuple: &[u8]) {
        let len = u16::try_from(tuple.len()).expect("a heap tuple fits in a page");
        self.bytes.extend_from_slice(&lp.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(tuple);
        self.count += 1;
    }

    /// Number of tuples so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// True if no tuple was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded view.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes[1..3].copy_from_slice(&self.count.to_le_bytes());
        self.bytes
    }
}

/// One tuple of a decoded view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewTuple<'a> {
    /// Line pointer number (the tuple's offset number in its block).
    pub lp: u16,
    /// The normalized heap tuple.
    pub bytes: &'a [u8],
}

/// Decodes a view into its tuples, checking the layout.
pub fn decode(view: &[u8]) -> Result<Vec<ViewTuple<'_>>, FormatError> {
    let mut r = Reader::new(view, "page view");
    r.version(VERSION)?;
    let n = r.u16()?;
    let mut tuples = Vec::with_capacity(n as usize);
    let mut last = 0u16;
    for _ in 0..n {
        let lp = r.u16()?;
        if lp <= last {
            return Err(FormatError(format!(
                "page view lists line pointer {lp} after {last}"
            )));
        }
        last = lp;
        let len = r.u16()? as usize;
        tuples.push(ViewTuple {
            lp,
            bytes: r.take(len)?,
        });
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
        assert!(decode(&wrong_version).unwrap_err().0.contains("version 9"));
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
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
