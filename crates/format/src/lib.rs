//! gsnap's own byte formats for what a snapshot stores about a table: the *view* of a page
//! (the tuples one snapshot sees on it) and the *row type* of the table at that snapshot.
//!
//! Both are produced and consumed by the extension; the store keeps them as opaque bytes.
//! Every format starts with a version byte, and decoding checks every length, so a corrupt
//! or foreign buffer is an error, never a panic or an out-of-bounds read.
//!
//! Next to the formats live the decisions about them that need no PostgreSQL, so they are
//! tested here, against simple models, instead of only through a server:
//! - [`heap`]: PostgreSQL 15's heap tuple header and varlena headers, named once;
//! - [`columns`]: how each of today's columns gets its value from a tuple of an older row type;
//! - [`diff`]: which tuples of two views of a page differ, and which rows only moved;
//! - [`delta`]: those tuples for an image and the one its block held before, kept at capture;
//! - [`versions`]: which tuples of consecutive images of a block are the same row version;
//! - [`definition`]: what a snapshot records to recreate a table (columns' defaults,
//!   constraints, indexes, owner), and the SQL that recreates it after a DROP;
//! - [`visibility`]: which tuple versions of a copied page an MVCC snapshot sees.

#![forbid(unsafe_code)]

pub mod columns;
pub mod definition;
pub mod delta;
pub mod diff;
pub mod heap;
pub mod rowtype;
pub mod runs;
pub mod versions;
pub mod view;
pub mod visibility;

/// Why bytes could not be decoded, or a snapshot's rows cannot be read as today's row type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes are not in the format they should be in (truncated, another version, a
    /// length or header that does not add up): corrupt or foreign data.
    Corrupt(String),
    /// A column that still exists had, at the snapshot, a type that no longer exists, so its
    /// old values cannot be converted to the column's type today.
    TypeGone {
        /// The column's attribute number.
        attnum: i16,
        /// The column's name at the snapshot.
        column: String,
        /// The name of its type at the snapshot (as `format_type` printed it).
        type_name: String,
    },
}

impl FormatError {
    /// A [`FormatError::Corrupt`] with `message`.
    pub fn corrupt(message: impl Into<String>) -> FormatError {
        FormatError::Corrupt(message.into())
    }
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::Corrupt(message) => f.write_str(message),
            FormatError::TypeGone {
                column, type_name, ..
            } => write!(
                f,
                "column \"{column}\" had type {type_name}, which no longer exists"
            ),
        }
    }
}

impl std::error::Error for FormatError {}

/// A little-endian reader over a byte slice that never reads out of bounds.
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

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                FormatError::corrupt(format!("{} is truncated at byte {}", self.what, self.pos))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub(crate) fn i16(&mut self) -> Result<i16, FormatError> {
        Ok(i16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, FormatError> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn string(&mut self) -> Result<String, FormatError> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            FormatError::corrupt(format!("{} holds a string that is not UTF-8", self.what))
        })
    }

    /// A string with a `u32` length (expressions and definitions may pass 64 KiB).
    pub(crate) fn long_string(&mut self) -> Result<String, FormatError> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            FormatError::corrupt(format!("{} holds a string that is not UTF-8", self.what))
        })
    }

    /// The bytes not read yet (all of them are then read).
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.bytes[self.pos..];
        self.pos = self.bytes.len();
        s
    }

    pub(crate) fn end(&self) -> Result<(), FormatError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(FormatError::corrupt(format!(
                "{} has {} unexpected trailing bytes",
                self.what,
                self.bytes.len() - self.pos
            )))
        }
    }

    pub(crate) fn version(&mut self, expected: u8) -> Result<(), FormatError> {
        self.version_in(expected, expected).map(|_| ())
    }

    /// Reads a version byte that must be in `oldest..=newest`; returns it.
    pub(crate) fn version_in(&mut self, oldest: u8, newest: u8) -> Result<u8, FormatError> {
        let v = self.u8()?;
        if (oldest..=newest).contains(&v) {
            Ok(v)
        } else {
            Err(FormatError::corrupt(format!(
                "{} has format version {v}, this gsnap reads versions {oldest} to {newest}",
                self.what
            )))
        }
    }
}

/// Writes a string with a `u32` length (read back by `Reader::long_string`).
pub(crate) fn put_long_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&b[..n]);
}
