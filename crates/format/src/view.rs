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

/// The bytes a tuple of `len` bytes takes in a view (rounded up to 8): what
/// [`ViewBuilder::with_capacity`] counts per tuple.
pub fn tuple_room(len: usize) -> usize {
    pad8(len)
}

/// Builds a view tuple by tuple, in the buffer it returns: the tuples are written after room
/// for the directory of as many tuples as the builder was made for, so a page's tuples are
/// copied once (and, if fewer are pushed, moved down once).
#[derive(Debug, Clone)]
pub struct ViewBuilder {
    dir: Vec<(u16, u16)>,
    /// Header and directory room (`tuples_at` bytes), then the tuples pushed.
    out: Vec<u8>,
    tuples_at: usize,
}

impl Default for ViewBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ViewBuilder {
    /// An empty view.
    pub fn new() -> Self {
        Self::with_capacity(0, 8192)
    }

    /// An empty view with room for `count` tuples of `tuple_bytes` bytes in all (each rounded
    /// up to 8): pushing that many makes no other allocation.
    pub fn with_capacity(count: usize, tuple_bytes: usize) -> Self {
        let tuples_at = pad8(HEADER + 4 * count);
        let mut out = Vec::with_capacity(tuples_at + tuple_bytes);
        out.resize(tuples_at, 0);
        ViewBuilder {
            dir: Vec::with_capacity(count),
            out,
            tuples_at,
        }
    }

    /// Appends the tuple at line pointer `lp`. Line pointers must increase.
    ///
    /// # Panics
    /// If the tuple is longer than 65535 bytes (a heap tuple never is).
    pub fn push(&mut self, lp: u16, tuple: &[u8]) {
        let len = u16::try_from(tuple.len()).expect("a heap tuple fits in a page");
        self.dir.push((lp, len));
        self.out.extend_from_slice(tuple);
        self.out.resize(pad8(self.out.len()), 0);
    }

    /// Number of tuples so far.
    pub fn len(&self) -> usize {
        self.dir.len()
    }

    /// True if no tuple was added.
    pub fn is_empty(&self) -> bool {
        self.dir.is_empty()
    }

    /// Calls `f` with the bytes of each tuple pushed, in order, which it may change in place
    /// (not their length). Each starts 8-byte aligned in the builder's buffer.
    pub fn tuples_mut<E>(
        &mut self,
        mut f: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut at = self.tuples_at;
        for &(_, len) in &self.dir {
            let len = len as usize;
            f(&mut self.out[at..at + len])?;
            at += pad8(len);
        }
        Ok(())
    }

    /// The encoded view.
    pub fn finish(self) -> Vec<u8> {
        let ViewBuilder {
            dir,
            mut out,
            tuples_at,
        } = self;
        let dir_end = pad8(HEADER + 4 * dir.len());
        if dir_end < tuples_at {
            // Room was left for more tuples than were pushed.
            out.copy_within(tuples_at.., dir_end);
            out.truncate(out.len() - (tuples_at - dir_end));
        } else if dir_end > tuples_at {
            let mut grown = Vec::with_capacity(out.len() + dir_end - tuples_at);
            grown.resize(dir_end, 0);
            grown.extend_from_slice(&out[tuples_at..]);
            out = grown;
        }
        out[0] = VERSION;
        out[1] = 0;
        out[2..4].copy_from_slice(&(dir.len() as u16).to_le_bytes());
        out[4..HEADER].fill(0);
        for (i, (lp, len)) in dir.iter().enumerate() {
            let at = HEADER + 4 * i;
            out[at..at + 2].copy_from_slice(&lp.to_le_bytes());
            out[at + 2..at + 4].copy_from_slice(&len.to_le_bytes());
        }
        out[HEADER + 4 * dir.len()..dir_end].fill(0);
        // (shrinking gives the room not used back in place)
        out.shrink_to_fit();
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
    let n = view
        .get(2..4)
        .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
    let mut tuples = Vec::with_capacity(n as usize);
    each_tuple(view, |t| tuples.push(t))?;
    Ok(tuples)
}

/// Calls `f` with each tuple of a view in order, checking the layout as it goes (without
/// allocating): an error may come after some tuples were given.
pub fn each_tuple<'a>(view: &'a [u8], mut f: impl FnMut(ViewTuple<'a>)) -> Result<(), FormatError> {
    let mut r = Reader::new(view, "page view");
    r.version(VERSION)?;
    r.take(1)?;
    let n = r.u16()? as usize;
    r.take(4)?;
    let dir = r.take(4 * n)?;
    r.take(pad8(HEADER + 4 * n) - (HEADER + 4 * n))?;
    let mut last = 0u16;
    for e in dir.chunks_exact(4) {
        let lp = u16::from_le_bytes([e[0], e[1]]);
        if lp <= last {
            return Err(FormatError::corrupt(format!(
                "page view lists line pointer {lp} after {last}"
            )));
        }
        last = lp;
        let len = usize::from(u16::from_le_bytes([e[2], e[3]]));
        let bytes = r.take(len)?;
        r.take(pad8(len) - len)?;
        f(ViewTuple { lp, bytes });
    }
    r.end()
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
        fn the_room_reserved_never_changes_the_view(tuples in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..200), 0..40), room in 0usize..60) {
            let mut plain = ViewBuilder::new();
            let mut reserved = ViewBuilder::with_capacity(room, 64);
            for (i, t) in tuples.iter().enumerate() {
                plain.push(i as u16 + 1, t);
                reserved.push(i as u16 + 1, t);
            }
            let mut seen = Vec::new();
            reserved.tuples_mut(|bytes| {
                seen.push((bytes.to_vec(), bytes.as_ptr() as usize % 8));
                bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                Ok::<(), ()>(())
            }).unwrap();
            let want: Vec<_> = tuples.iter().cloned().map(|t| (t, 0)).collect();
            prop_assert_eq!(seen, want);
            let mut bumped = ViewBuilder::new();
            for (i, t) in tuples.iter().enumerate() {
                let t: Vec<u8> = t.iter().map(|b| b.wrapping_add(1)).collect();
                bumped.push(i as u16 + 1, &t);
            }
            prop_assert_eq!(reserved.finish(), bumped.finish());
            let plain = plain.finish();
            let decoded = decode(&plain).unwrap();
            prop_assert_eq!(decoded.len(), tuples.len());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
