//! The row type of a table at one snapshot: what is needed to decode its tuples later, even
//! after the table's columns were added, dropped or changed.
//!
//! Layout (little-endian): version `u8` = 1, attribute count `u16`, then per attribute its
//! number `i16`, flags `u8` (dropped, by value, not null, has a missing value), length `i16`,
//! alignment `u8` (PostgreSQL's `c`/`s`/`i`/`d`), type OID `u32`, type modifier `i32`,
//! collation OID `u32`, name, type name (as `format_type` printed it), and, if flagged, the
//! missing value in text form (the value rows written before `ADD COLUMN ... DEFAULT` show).
//! Strings are a `u16` length and UTF-8 bytes. Version 2 appends the table's definition
//! ([`crate::definition`]); a row type without one is still written as version 1.

use crate::definition::TableDefinition;
use crate::{put_string, FormatError, Reader};

const VERSION: u8 = 1;
const VERSION_WITH_DEFINITION: u8 = 2;
const DROPPED: u8 = 1;
const BYVAL: u8 = 2;
const NOT_NULL: u8 = 4;
const HAS_MISSING: u8 = 8;

/// One attribute (column) of a row type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attribute {
    /// Attribute number (1-based; dropped columns keep theirs).
    pub attnum: i16,
    /// Column name (PostgreSQL's placeholder name for a dropped column).
    pub name: String,
    /// Dropped column: physically present in old tuples, never returned.
    pub dropped: bool,
    /// Type OID (0 for a dropped column).
    pub type_oid: u32,
    /// Type modifier.
    pub typmod: i32,
    /// Type name with modifier, for messages.
    pub type_name: String,
    /// Storage length (-1 varlena, -2 cstring).
    pub len: i16,
    /// Passed by value.
    pub byval: bool,
    /// Alignment code: `c`, `s`, `i` or `d`.
    pub align: u8,
    /// Collation OID.
    pub collation: u32,
    /// NOT NULL constraint.
    pub not_null: bool,
    /// Text form of the value that tuples too old to contain the column show.
    pub missing: Option<String>,
}

/// A row type: the attributes in attribute-number order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowType {
    /// Attributes, `attributes[i].attnum == i + 1`.
    pub attributes: Vec<Attribute>,
    /// What recreating the table needs beyond its columns (recorded since row type
    /// version 2).
    pub definition: Option<TableDefinition>,
}

impl RowType {
    /// Encodes the row type.
    pub fn encode(&self) -> Vec<u8> {
        let version = if self.definition.is_some() {
            VERSION_WITH_DEFINITION
        } else {
            VERSION
        };
        let mut out = vec![version];
        out.extend_from_slice(&(self.attributes.len() as u16).to_le_bytes());
        for a in &self.attributes {
            let flags = (if a.dropped { DROPPED } else { 0 })
                | (if a.byval { BYVAL } else { 0 })
                | (if a.not_null { NOT_NULL } else { 0 })
                | (if a.missing.is_some() { HAS_MISSING } else { 0 });
            out.extend_from_slice(&a.attnum.to_le_bytes());
            out.push(flags);
            out.extend_from_slice(&a.len.to_le_bytes());
            out.push(a.align);
            out.extend_from_slice(&a.type_oid.to_le_bytes());
            out.extend_from_slice(&a.typmod.to_le_bytes());
            out.extend_from_slice(&a.collation.to_le_bytes());
            put_string(&mut out, &a.name);
            put_string(&mut out, &a.type_name);
            if let Some(m) = &a.missing {
                let b = m.as_bytes();
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
        if let Some(d) = &self.definition {
            d.encode_into(&mut out);
        }
        out
    }

    /// Decodes and checks a row type.
    pub fn decode(bytes: &[u8]) -> Result<RowType, FormatError> {
        let mut r = Reader::new(bytes, "row type");
        let version = r.version_in(VERSION, VERSION_WITH_DEFINITION)?;
        let n = r.u16()?;
        let mut attributes = Vec::with_capacity(n as usize);
        for i in 0..n {
            let attnum = r.i16()?;
            if i32::from(attnum) != i32::from(i) + 1 {
                return Err(FormatError::corrupt(format!(
                    "row type lists attribute {attnum} in position {}",
                    i + 1
                )));
            }
            let flags = r.u8()?;
            let len = r.i16()?;
            let align = r.u8()?;
            if !matches!(align, b'c' | b's' | b'i' | b'd') {
                return Err(FormatError::corrupt(format!(
                    "row type has alignment code {align}"
                )));
            }
            let type_oid = r.u32()?;
            let typmod = r.i32()?;
            let collation = r.u32()?;
            let name = r.string()?;
            let type_name = r.string()?;
            let missing = if flags & HAS_MISSING != 0 {
                let n = r.u32()? as usize;
                Some(String::from_utf8(r.take(n)?.to_vec()).map_err(|_| {
                    FormatError::corrupt("row type holds a missing value that is not UTF-8")
                })?)
            } else {
                None
            };
            attributes.push(Attribute {
                attnum,
                name,
                dropped: flags & DROPPED != 0,
                type_oid,
                typmod,
                type_name,
                len,
                byval: flags & BYVAL != 0,
                align,
                collation,
                not_null: flags & NOT_NULL != 0,
                missing,
            });
        }
        let definition = if version == VERSION_WITH_DEFINITION {
            Some(TableDefinition::decode_from(&mut r, attributes.len())?)
        } else {
            None
        };
        r.end()?;
        Ok(RowType {
            attributes,
            definition,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RowType {
        RowType {
            definition: None,
            attributes: vec![
                Attribute {
                    attnum: 1,
                    name: "id".into(),
                    type_oid: 23,
                    typmod: -1,
                    type_name: "integer".into(),
                    len: 4,
                    byval: true,
                    align: b'i',
                    not_null: true,
                    ..Default::default()
                },
                Attribute {
                    attnum: 2,
                    name: "........pg.dropped.2........".into(),
                    dropped: true,
                    len: -1,
                    align: b'i',
                    ..Default::default()
                },
                Attribute {
                    attnum: 3,
                    name: "note".into(),
                    type_oid: 1043,
                    typmod: 24,
                    type_name: "character varying(20)".into(),
                    len: -1,
                    align: b'i',
                    collation: 100,
                    missing: Some("n/a ünïcode".into()),
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let rt = sample();
        assert_eq!(RowType::decode(&rt.encode()).unwrap(), rt);
        assert_eq!(
            RowType::decode(&RowType::default().encode()).unwrap(),
            RowType::default()
        );
    }

    #[test]
    fn corrupt_row_types_are_errors() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(
                RowType::decode(&bytes[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        let mut bad = bytes.clone();
        bad[3] = 9; // first attnum
        assert!(RowType::decode(&bad).is_err());
        let mut trailing = bytes;
        trailing.push(1);
        assert!(RowType::decode(&trailing).is_err());
    }
}
