//! The byte primitives every message is built from, and the crate's two error types.
//!
//! [`Writer`] appends little-endian fixed-width integers, `str` (u32 byte length, then UTF-8),
//! `opt<T>` (a byte 0 or 1, then T) and `vec<T>` (u32 count, then the items). [`Reader`] reads
//! them back and never reads past its slice, never panics and never allocates more than its
//! slice can hold: a count is checked against the bytes left before anything is reserved.

use std::fmt;

/// Why bytes could not be decoded. `what` names the message or field being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes end inside a field that starts at byte `at`.
    Truncated { what: &'static str, at: usize },
    /// The message ended `count` bytes before the bytes did.
    TrailingBytes { what: &'static str, count: usize },
    /// A message of another protocol version.
    UnsupportedVersion { found: u8 },
    /// A tag (request kind, reply shape, error code, state, listing) this version never
    /// writes.
    UnknownTag { what: &'static str, tag: u32 },
    /// A length or count that needs more bytes than are left.
    LengthBeyondEnd {
        what: &'static str,
        len: u64,
        left: usize,
    },
    /// A string that is not UTF-8.
    InvalidUtf8 { what: &'static str },
    /// A bool or option byte other than 0 or 1.
    InvalidValue { what: &'static str, value: u64 },
    /// The kind the transport carries differs from the kind inside the request bytes.
    KindMismatch { transport: u32, encoded: u8 },
    /// A reply shape the request kind never gets (a worker bug, or a stale buffer).
    UnexpectedReply {
        kind: crate::Kind,
        reply: &'static str,
    },
    /// The listing changed between two of its pages (its total differs): fetch it again
    /// from offset 0.
    PageTotalChanged { before: u64, now: u64 },
    /// A page reaches past the listing's total.
    PageBeyondTotal { end: u64, total: u64 },
    /// An empty page before the listing is complete.
    EmptyPage { offset: u64, total: u64 },
    /// The listing was taken before all of its pages arrived.
    Incomplete { have: u64, total: Option<u64> },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { what, at } => write!(f, "{what} is truncated at byte {at}"),
            DecodeError::TrailingBytes { what, count } => {
                write!(f, "{what} is followed by {count} unexpected bytes")
            }
            DecodeError::UnsupportedVersion { found } => write!(
                f,
                "message of protocol version {found}, this is version {}",
                crate::VERSION
            ),
            DecodeError::UnknownTag { what, tag } => write!(f, "unknown {what} {tag}"),
            DecodeError::LengthBeyondEnd { what, len, left } => {
                write!(f, "{what}: length {len} but only {left} bytes left")
            }
            DecodeError::InvalidUtf8 { what } => write!(f, "{what} is not valid UTF-8"),
            DecodeError::InvalidValue { what, value } => write!(f, "{what}: invalid value {value}"),
            DecodeError::KindMismatch { transport, encoded } => write!(
                f,
                "request sent as kind {transport} but encoded as kind {encoded}"
            ),
            DecodeError::UnexpectedReply { kind, reply } => {
                write!(f, "a {reply} reply does not answer a {kind:?} request")
            }
            DecodeError::PageTotalChanged { before, now } => write!(
                f,
                "the listing changed while it was read ({before} bytes, then {now})"
            ),
            DecodeError::PageBeyondTotal { end, total } => {
                write!(f, "a page ends at byte {end} of a {total}-byte listing")
            }
            DecodeError::EmptyPage { offset, total } => {
                write!(f, "empty page at byte {offset} of a {total}-byte listing")
            }
            DecodeError::Incomplete { have, total } => match total {
                Some(t) => write!(f, "listing incomplete: {have} of {t} bytes"),
                None => write!(f, "listing incomplete: no page arrived"),
            },
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a value could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The encoding needs `len` bytes; at most `limit` fit.
    TooLarge {
        what: &'static str,
        len: usize,
        limit: usize,
    },
    /// The worker tried to answer a request with a reply shape that kind never gets.
    WrongReply {
        kind: crate::Kind,
        reply: &'static str,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { what, len, limit } => {
                write!(f, "{what} needs {len} bytes, at most {limit} fit")
            }
            EncodeError::WrongReply { kind, reply } => {
                write!(f, "a {reply} reply does not answer a {kind:?} request")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// Appends fields to a message.
pub(crate) struct Writer {
    buf: Vec<u8>,
    what: &'static str,
}

impl Writer {
    pub(crate) fn new(what: &'static str) -> Self {
        Writer {
            buf: Vec::new(),
            what,
        }
    }

    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    pub(crate) fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }

    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A u32 length or count. Anything beyond u32 cannot fit a message or be a sane listing.
    pub(crate) fn count(&mut self, n: usize) -> Result<&mut Self, EncodeError> {
        let n = u32::try_from(n).map_err(|_| EncodeError::TooLarge {
            what: self.what,
            len: n,
            limit: u32::MAX as usize,
        })?;
        Ok(self.u32(n))
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> Result<&mut Self, EncodeError> {
        self.count(b.len())?;
        self.buf.extend_from_slice(b);
        Ok(self)
    }

    pub(crate) fn str(&mut self, s: &str) -> Result<&mut Self, EncodeError> {
        self.bytes(s.as_bytes())
    }

    pub(crate) fn opt_str(&mut self, s: Option<&str>) -> Result<&mut Self, EncodeError> {
        match s {
            None => Ok(self.u8(0)),
            Some(s) => self.u8(1).str(s),
        }
    }

    pub(crate) fn opt_u8(&mut self, v: Option<u8>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).u8(v),
        }
    }

    pub(crate) fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).u64(v),
        }
    }

    /// The bytes, whatever their length (listings, which travel in pages).
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// The bytes, if they fit one message.
    pub(crate) fn into_message(self) -> Result<Vec<u8>, EncodeError> {
        if self.buf.len() > crate::MAX_MESSAGE_BYTES {
            return Err(EncodeError::TooLarge {
                what: self.what,
                len: self.buf.len(),
                limit: crate::MAX_MESSAGE_BYTES,
            });
        }
        Ok(self.buf)
    }
}

/// Reads fields from a message; see the module comment.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader {
            bytes,
            pos: 0,
            what,
        }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.left() {
            return Err(DecodeError::Truncated {
                what: self.what,
                at: self.pos,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A byte that must be 0 or 1.
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::InvalidValue {
                what,
                value: u64::from(v),
            }),
        }
    }

    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        self.flag(what)
    }

    /// A u32 count of items of at least `min_item_bytes` each, checked against the bytes left.
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        min_item_bytes: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u32()?;
        let need = u64::from(n) * min_item_bytes.max(1) as u64;
        if need > self.left() as u64 {
            return Err(DecodeError::LengthBeyondEnd {
                what,
                len: u64::from(n),
                left: self.left(),
            });
        }
        Ok(n as usize)
    }

    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.count(what, 1)?;
        self.take(n)
    }

    pub(crate) fn str(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(what)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { what })
    }

    pub(crate) fn opt_str(&mut self, what: &'static str) -> Result<Option<String>, DecodeError> {
        Ok(if self.flag(what)? {
            Some(self.str(what)?)
        } else {
            None
        })
    }

    pub(crate) fn opt_u8(&mut self, what: &'static str) -> Result<Option<u8>, DecodeError> {
        Ok(if self.flag(what)? {
            Some(self.u8()?)
        } else {
            None
        })
    }

    pub(crate) fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        Ok(if self.flag(what)? {
            Some(self.u64()?)
        } else {
            None
        })
    }

    /// Checks the version byte every message starts with.
    pub(crate) fn version(&mut self) -> Result<(), DecodeError> {
        match self.u8()? {
            crate::VERSION => Ok(()),
            found => Err(DecodeError::UnsupportedVersion { found }),
        }
    }

    /// Ends the message: every byte must have been read.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.left() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                what: self.what,
                count,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reports_each_kind_of_bad_field() {
        assert_eq!(
            Reader::new(&[1, 2, 3], "x").u32(),
            Err(DecodeError::Truncated { what: "x", at: 0 })
        );
        assert_eq!(
            Reader::new(&[2], "x").bool("flag"),
            Err(DecodeError::InvalidValue {
                what: "flag",
                value: 2
            })
        );
        assert_eq!(
            Reader::new(&[5, 0, 0, 0, b'a'], "x").str("s"),
            Err(DecodeError::LengthBeyondEnd {
                what: "s",
                len: 5,
                left: 1
            })
        );
        assert_eq!(
            Reader::new(&[1, 0, 0, 0, 0xff], "x").str("s"),
            Err(DecodeError::InvalidUtf8 { what: "s" })
        );
        // A huge count is refused before anything is allocated.
        assert!(matches!(
            Reader::new(&[0xff, 0xff, 0xff, 0xff], "x").count("ids", 8),
            Err(DecodeError::LengthBeyondEnd { .. })
        ));
        let mut r = Reader::new(&[0, 9], "x");
        r.u8().unwrap();
        assert_eq!(
            r.finish(),
            Err(DecodeError::TrailingBytes {
                what: "x",
                count: 1
            })
        );
    }

    #[test]
    fn writer_refuses_a_message_beyond_the_limit() {
        let mut w = Writer::new("big");
        w.bytes(&vec![0; crate::MAX_MESSAGE_BYTES]).unwrap();
        assert!(matches!(
            w.into_message(),
            Err(EncodeError::TooLarge { what: "big", .. })
        ));
    }
}
