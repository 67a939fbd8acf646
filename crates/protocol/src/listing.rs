//! The listings the worker answers page by page, and the start of a scan: each is encoded
//! into one blob that [`crate::Page::slice`] cuts and [`crate::Pages`] joins again, then is
//! decoded here as a whole.
//!
//! A blob starts with its own tag byte, so decoding it as another listing is an error, and
//! ends exactly after its last row.

use crate::wire::{DecodeError, EncodeError, Reader, Writer};
use gsnap_core::{RelId, SnapId};

const SNAPSHOTS: u8 = 1;
const TABLES: u8 = 2;
const GROUPS: u8 = 3;
const SCAN: u8 = 4;
const DECISIONS: u8 = 5;
const REPORT: u8 = 6;
const SCAN_RANGE: u8 = 7;

/// Where a snapshot is in its life (the states of the store's snapshot records, with the
/// same tags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotState {
    /// Declared; its capture is not durable yet.
    Capturing = 1,
    /// Complete and readable.
    Committed = 2,
    /// The capture was aborted or interrupted; never readable.
    Failed = 3,
    /// Deleted by the user or by retention; not readable; its space is being reclaimed.
    Deleted = 4,
    /// Deleted, and the space only it used reclaimed; not readable.
    Reclaimed = 5,
}

impl SnapshotState {
    /// Every state, in tag order.
    pub const ALL: [SnapshotState; 5] = [
        SnapshotState::Capturing,
        SnapshotState::Committed,
        SnapshotState::Failed,
        SnapshotState::Deleted,
        SnapshotState::Reclaimed,
    ];

    /// The lower-case name shown by listings.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Capturing => "capturing",
            SnapshotState::Committed => "committed",
            SnapshotState::Failed => "failed",
            SnapshotState::Deleted => "deleted",
            SnapshotState::Reclaimed => "reclaimed",
        }
    }

    /// Whether a snapshot in this state can be read.
    pub fn is_readable(self) -> bool {
        self == SnapshotState::Committed
    }

    fn from_tag(tag: u8) -> Result<Self, DecodeError> {
        SnapshotState::ALL
            .into_iter()
            .find(|s| *s as u8 == tag)
            .ok_or(DecodeError::UnknownTag {
                what: "snapshot state",
                tag: u32::from(tag),
            })
    }
}

/// A snapshot as listed by `gsnap_snapshots()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: SnapId,
    pub state: SnapshotState,
    /// When it was declared, µs since the Unix epoch.
    pub taken_at_us: i64,
    pub lsn: u64,
    /// The rank known at declaration.
    pub rank: u8,
    /// A rank given later (0: none); the snapshot's rank is the higher of the two.
    pub explicit_rank: u8,
    pub label: Option<String>,
    /// Pins: (tag, until, µs since the Unix epoch; `i64::MAX`: for ever).
    pub pins: Vec<(String, i64)>,
    /// When it was deleted, µs since the Unix epoch.
    pub deleted_at_us: Option<i64>,
    pub tables: u32,
    pub pages_captured: u64,
    pub new_images: u64,
    pub bytes_stored: u64,
    pub carried_pages: u64,
    /// What deleting it (alone) would free in the store, in bytes; None when not known (the
    /// newest snapshot, snapshots that are not in the mapping log, or not computed yet).
    pub frees_bytes: Option<u64>,
    /// Why the capture failed (failed snapshots).
    pub failure: Option<String>,
}

/// A table of a snapshot as listed by `gsnap_snapshot_tables()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRow {
    /// The table's OID.
    pub relid: u32,
    /// The relation incarnation holding its pages.
    pub rel: RelId,
    pub relfilenode: u32,
    pub nblocks: u32,
    pub name: String,
    /// The partitioned tables the table was a partition of at the snapshot, its parent
    /// first (empty: not a partition).
    pub ancestors: Vec<u32>,
}

/// Whether an index group still grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    Sealed = 1,
    Active = 2,
}

impl GroupState {
    /// The lower-case name shown by `gsnap_groups()`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Sealed => "sealed",
            GroupState::Active => "active",
        }
    }
}

/// A row of `gsnap_groups()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    pub id: u64,
    pub state: GroupState,
    pub first: SnapId,
    pub last: SnapId,
    pub snapshots: u64,
    pub pages: u64,
    pub bytes: u64,
    /// Whether it is in the group cache.
    pub loaded: bool,
    pub length_budget: u64,
    /// None: no page budget (the first group).
    pub page_budget: Option<u64>,
}

/// The start of reading a table at a snapshot; its row type bytes follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanHeader {
    /// The relation incarnation holding the table's pages at the snapshot.
    pub rel: RelId,
    /// The table's size in blocks at the snapshot.
    pub nblocks: u32,
}

/// A row of `gsnap_retention_preview()`: what a policy decides for one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRow {
    pub snap: SnapId,
    /// When it was taken, µs since the Unix epoch.
    pub taken_at_us: i64,
    /// Its rank (the higher of the one known at declaration and an explicit one).
    pub rank: u8,
    pub label: Option<String>,
    /// A pin holds it.
    pub pinned: bool,
    pub keep: bool,
    /// The rule that decided ("daily #3 (2026-11-20)", "within", "not selected", ...).
    pub rule: String,
}

/// One line of a report (reference verification, store space): a name and a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRow {
    pub name: String,
    pub value: i64,
}

/// Encodes a retention preview.
pub fn encode_decisions(list: &[DecisionRow]) -> Result<Vec<u8>, EncodeError> {
    rows(DECISIONS, "retention preview", list, |w, d| {
        w.u64(d.snap.0).i64(d.taken_at_us).u8(d.rank);
        w.opt_str(d.label.as_deref())?
            .bool(d.pinned)
            .bool(d.keep)
            .str(&d.rule)?;
        Ok(())
    })
}

/// Decodes a retention preview.
pub fn decode_decisions(bytes: &[u8]) -> Result<Vec<DecisionRow>, DecodeError> {
    decode_rows(DECISIONS, "retention preview", bytes, 24, |r| {
        Ok(DecisionRow {
            snap: SnapId(r.u64()?),
            taken_at_us: r.i64()?,
            rank: r.u8()?,
            label: r.opt_str("label")?,
            pinned: r.bool("pinned")?,
            keep: r.bool("keep")?,
            rule: r.str("rule")?,
        })
    })
}

/// Encodes a report.
pub fn encode_report(list: &[ReportRow]) -> Result<Vec<u8>, EncodeError> {
    rows(REPORT, "report", list, |w, l| {
        w.str(&l.name)?.i64(l.value);
        Ok(())
    })
}

/// Decodes a report.
pub fn decode_report(bytes: &[u8]) -> Result<Vec<ReportRow>, DecodeError> {
    decode_rows(REPORT, "report", bytes, 12, |r| {
        Ok(ReportRow {
            name: r.str("report line")?,
            value: r.i64()?,
        })
    })
}

fn rows<T>(
    tag: u8,
    what: &'static str,
    rows: &[T],
    mut row: impl FnMut(&mut Writer, &T) -> Result<(), EncodeError>,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::new(what);
    w.u8(tag).count(rows.len())?;
    for r in rows {
        row(&mut w, r)?;
    }
    Ok(w.into_bytes())
}

fn decode_rows<T>(
    tag: u8,
    what: &'static str,
    bytes: &[u8],
    min_row_bytes: usize,
    mut row: impl FnMut(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let mut r = Reader::new(bytes, what);
    listing_tag(&mut r, tag)?;
    let n = r.count(what, min_row_bytes)?;
    let rows = (0..n).map(|_| row(&mut r)).collect::<Result<Vec<T>, _>>()?;
    r.finish()?;
    Ok(rows)
}

fn listing_tag(r: &mut Reader<'_>, want: u8) -> Result<(), DecodeError> {
    match r.u8()? {
        t if t == want => Ok(()),
        t => Err(DecodeError::UnknownTag {
            what: "listing",
            tag: u32::from(t),
        }),
    }
}

/// Encodes the catalog listing (Snapshots).
pub fn encode_snapshots(list: &[SnapshotRow]) -> Result<Vec<u8>, EncodeError> {
    rows(SNAPSHOTS, "snapshot listing", list, |w, s| {
        w.u64(s.id.0)
            .u8(s.state as u8)
            .i64(s.taken_at_us)
            .u64(s.lsn)
            .u8(s.rank)
            .u8(s.explicit_rank)
            .opt_str(s.label.as_deref())?
            .count(s.pins.len())?;
        for (tag, until) in &s.pins {
            w.str(tag)?.i64(*until);
        }
        w.opt_u64(s.deleted_at_us.map(|t| t as u64))
            .u32(s.tables)
            .u64(s.pages_captured)
            .u64(s.new_images)
            .u64(s.bytes_stored)
            .u64(s.carried_pages)
            .opt_u64(s.frees_bytes)
            .opt_str(s.failure.as_deref())?;
        Ok(())
    })
}

/// Decodes the catalog listing.
pub fn decode_snapshots(bytes: &[u8]) -> Result<Vec<SnapshotRow>, DecodeError> {
    decode_rows(SNAPSHOTS, "snapshot listing", bytes, 71, |r| {
        Ok(SnapshotRow {
            id: SnapId(r.u64()?),
            state: SnapshotState::from_tag(r.u8()?)?,
            taken_at_us: r.i64()?,
            lsn: r.u64()?,
            rank: r.u8()?,
            explicit_rank: r.u8()?,
            label: r.opt_str("label")?,
            pins: {
                let n = r.count("pins", 9)?;
                let mut pins = Vec::with_capacity(n);
                for _ in 0..n {
                    pins.push((r.str("pin tag")?, r.i64()?));
                }
                pins
            },
            deleted_at_us: r.opt_u64("deletion time")?.map(|t| t as i64),
            tables: r.u32()?,
            pages_captured: r.u64()?,
            new_images: r.u64()?,
            bytes_stored: r.u64()?,
            carried_pages: r.u64()?,
            frees_bytes: r.opt_u64("bytes a deletion frees")?,
            failure: r.opt_str("failure")?,
        })
    })
}

/// Encodes a snapshot's tables (SnapshotTables).
pub fn encode_tables(list: &[TableRow]) -> Result<Vec<u8>, EncodeError> {
    rows(TABLES, "table listing", list, |w, t| {
        w.u32(t.relid)
            .u32(t.rel.0)
            .u32(t.relfilenode)
            .u32(t.nblocks)
            .str(&t.name)?;
        w.u32(t.ancestors.len() as u32);
        for a in &t.ancestors {
            w.u32(*a);
        }
        Ok(())
    })
}

/// Decodes a snapshot's tables.
pub fn decode_tables(bytes: &[u8]) -> Result<Vec<TableRow>, DecodeError> {
    decode_rows(TABLES, "table listing", bytes, 24, |r| {
        let (relid, rel, relfilenode, nblocks) = (r.u32()?, RelId(r.u32()?), r.u32()?, r.u32()?);
        let name = r.str("table name")?;
        let n = r.u32()?;
        let ancestors = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(TableRow {
            relid,
            rel,
            relfilenode,
            nblocks,
            name,
            ancestors,
        })
    })
}

/// Encodes the group listing (Groups).
pub fn encode_groups(list: &[GroupRow]) -> Result<Vec<u8>, EncodeError> {
    rows(GROUPS, "group listing", list, |w, g| {
        w.u64(g.id)
            .u8(g.state as u8)
            .u64(g.first.0)
            .u64(g.last.0)
            .u64(g.snapshots)
            .u64(g.pages)
            .u64(g.bytes)
            .bool(g.loaded)
            .u64(g.length_budget)
            .opt_u64(g.page_budget);
        Ok(())
    })
}

/// Decodes the group listing.
pub fn decode_groups(bytes: &[u8]) -> Result<Vec<GroupRow>, DecodeError> {
    decode_rows(GROUPS, "group listing", bytes, 59, |r| {
        Ok(GroupRow {
            id: r.u64()?,
            state: match r.u8()? {
                1 => GroupState::Sealed,
                2 => GroupState::Active,
                tag => {
                    return Err(DecodeError::UnknownTag {
                        what: "group state",
                        tag: u32::from(tag),
                    })
                }
            },
            first: SnapId(r.u64()?),
            last: SnapId(r.u64()?),
            snapshots: r.u64()?,
            pages: r.u64()?,
            bytes: r.u64()?,
            loaded: r.bool("loaded")?,
            length_budget: r.u64()?,
            page_budget: r.opt_u64("page budget")?,
        })
    })
}

/// Encodes the start of a scan (ScanBegin): the header, then the row type bytes.
pub fn encode_scan(header: &ScanHeader, row_type: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::new("scan start");
    w.u8(SCAN)
        .u32(header.rel.0)
        .u32(header.nblocks)
        .bytes(row_type)?;
    Ok(w.into_bytes())
}

/// Decodes the start of a scan into the header and the row type bytes.
pub fn decode_scan(bytes: &[u8]) -> Result<(ScanHeader, Vec<u8>), DecodeError> {
    let mut r = Reader::new(bytes, "scan start");
    listing_tag(&mut r, SCAN)?;
    let header = ScanHeader {
        rel: RelId(r.u32()?),
        nblocks: r.u32()?,
    };
    let row_type = r.bytes("row type")?.to_vec();
    r.finish()?;
    Ok((header, row_type))
}

/// The start of a scan over a range of snapshots: how many readable snapshots the range has,
/// and for each of them that holds the table, its id, header and row type (an index into
/// `row_types`, each distinct row type listed once).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanRange {
    pub readable: u32,
    pub snapshots: Vec<(SnapId, ScanHeader, u32)>,
    pub row_types: Vec<Vec<u8>>,
}

/// Encodes the start of a scan over a range of snapshots.
pub fn encode_scan_range(range: &ScanRange) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::new("scan of a range");
    w.u8(SCAN_RANGE)
        .u32(range.readable)
        .count(range.snapshots.len())?;
    for (snap, header, row_type) in &range.snapshots {
        w.u64(snap.0)
            .u32(header.rel.0)
            .u32(header.nblocks)
            .u32(*row_type);
    }
    w.count(range.row_types.len())?;
    for t in &range.row_types {
        w.bytes(t)?;
    }
    Ok(w.into_bytes())
}

/// Decodes the start of a scan over a range of snapshots.
pub fn decode_scan_range(bytes: &[u8]) -> Result<ScanRange, DecodeError> {
    let mut r = Reader::new(bytes, "scan of a range");
    listing_tag(&mut r, SCAN_RANGE)?;
    let readable = r.u32()?;
    let n = r.count("snapshots", 20)?;
    let snapshots = (0..n)
        .map(|_| {
            Ok((
                SnapId(r.u64()?),
                ScanHeader {
                    rel: RelId(r.u32()?),
                    nblocks: r.u32()?,
                },
                r.u32()?,
            ))
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let m = r.count("row types", 4)?;
    let row_types = (0..m)
        .map(|_| Ok(r.bytes("row type")?.to_vec()))
        .collect::<Result<Vec<_>, DecodeError>>()?;
    if let Some((_, _, t)) = snapshots
        .iter()
        .find(|(_, _, t)| *t as usize >= row_types.len())
    {
        return Err(DecodeError::InvalidValue {
            what: "row type of a snapshot of a range",
            value: u64::from(*t),
        });
    }
    r.finish()?;
    Ok(ScanRange {
        readable,
        snapshots,
        row_types,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_range_round_trips_and_names_only_listed_row_types() {
        let range = ScanRange {
            readable: 3,
            snapshots: vec![
                (
                    SnapId(4),
                    ScanHeader {
                        rel: RelId(1),
                        nblocks: 9,
                    },
                    0,
                ),
                (
                    SnapId(6),
                    ScanHeader {
                        rel: RelId(2),
                        nblocks: 3,
                    },
                    1,
                ),
            ],
            row_types: vec![b"a".to_vec(), b"bc".to_vec()],
        };
        let bytes = encode_scan_range(&range).unwrap();
        assert_eq!(decode_scan_range(&bytes).unwrap(), range);
        let mut bad = range.clone();
        bad.snapshots[1].2 = 2;
        assert!(decode_scan_range(&encode_scan_range(&bad).unwrap()).is_err());
    }

    #[test]
    fn state_names_are_the_stores() {
        let names: Vec<&str> = SnapshotState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            ["capturing", "committed", "failed", "deleted", "reclaimed"]
        );
        assert!(SnapshotState::Committed.is_readable());
        assert!(!SnapshotState::Capturing.is_readable());
        assert!(SnapshotState::from_tag(6).is_err());
    }

    #[test]
    fn a_listing_decoded_as_another_is_an_error() {
        let tables = encode_tables(&[TableRow {
            relid: 1,
            rel: RelId(2),
            relfilenode: 3,
            nblocks: 4,
            name: "t".into(),
            ancestors: vec![7, 8],
        }])
        .unwrap();
        assert_eq!(decode_tables(&tables).unwrap()[0].ancestors, vec![7, 8]);
        assert!(matches!(
            decode_snapshots(&tables),
            Err(DecodeError::UnknownTag {
                what: "listing",
                tag: 2
            })
        ));
        assert_eq!(decode_tables(&tables).unwrap()[0].name, "t");
    }

    #[test]
    fn minimum_row_sizes_are_the_encoded_sizes() {
        let snap = SnapshotRow {
            id: SnapId(1),
            state: SnapshotState::Failed,
            taken_at_us: -1,
            lsn: 2,
            rank: 3,
            explicit_rank: 0,
            label: None,
            pins: Vec::new(),
            deleted_at_us: None,
            tables: 4,
            pages_captured: 5,
            new_images: 6,
            bytes_stored: 7,
            carried_pages: 8,
            frees_bytes: None,
            failure: None,
        };
        assert_eq!(encode_snapshots(&[snap]).unwrap().len(), 1 + 4 + 71);
        let group = GroupRow {
            id: 1,
            state: GroupState::Active,
            first: SnapId(1),
            last: SnapId(2),
            snapshots: 2,
            pages: 3,
            bytes: 4,
            loaded: true,
            length_budget: 5,
            page_budget: None,
        };
        assert_eq!(encode_groups(&[group]).unwrap().len(), 1 + 4 + 59);
        let table = TableRow {
            relid: 1,
            rel: RelId(1),
            relfilenode: 1,
            nblocks: 1,
            name: String::new(),
            ancestors: Vec::new(),
        };
        assert_eq!(encode_tables(&[table]).unwrap().len(), 1 + 4 + 24);
    }
}
