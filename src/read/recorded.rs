//! A table as a snapshot recorded it, read without the live relation (a dropped table, or
//! one renamed or changed since): its rows in the row type recorded at the snapshot, live
//! attributes only, in attribute order. Behind `gsnap_asof_dropped` and `gsnap_undrop`.

use super::asof::{AsofRows, Row};
use super::decode::old_descriptor;
use super::table;
pub use super::table::TableAtSnapshot;
use pgrx::pg_sys;

/// What snapshot `snap` holds of the table that had OID `relid` then (it must hold it).
pub fn at(snap: u64, relid: u32) -> TableAtSnapshot {
    table::at(snap, pg_sys::Oid::from(relid))
}

/// The attribute numbers of the columns table `relid` had at snapshot `snap` (dropped ones
/// left out); None if the snapshot does not hold it.
pub fn columns_at(snap: u64, relid: u32) -> Option<Vec<i16>> {
    table::held_by(snap, pg_sys::Oid::from(relid)).map(|t| {
        t.row_type
            .attributes
            .iter()
            .filter(|a| !a.dropped)
            .map(|a| a.attnum)
            .collect()
    })
}

/// The rows of a recorded table.
pub struct RecordedRows {
    rows: AsofRows,
    /// Positions of the live attributes in the recorded row type.
    live: Vec<usize>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
}

impl RecordedRows {
    /// Opens the table that had OID `relid` at snapshot `snap`, as `table` describes it.
    ///
    /// # Safety
    /// Call in a transaction; every type of the recorded row type's live attributes exists.
    pub unsafe fn open(relid: u32, snap: u64, table: TableAtSnapshot) -> RecordedRows {
        let relid = pg_sys::Oid::from(relid);
        let live: Vec<usize> = table
            .row_type
            .attributes
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.dropped)
            .map(|(i, _)| i)
            .collect();
        // SAFETY: in a transaction (the caller's promise); the descriptor is only read while
        // the rows are opened, then freed.
        let rows = unsafe {
            let desc = old_descriptor(relid, &table.row_type);
            let rows = AsofRows::open_at(relid, desc, snap, table, false);
            pg_sys::FreeTupleDesc(desc);
            rows
        };
        RecordedRows {
            rows,
            values: Vec::with_capacity(live.len()),
            nulls: Vec::with_capacity(live.len()),
            live,
        }
    }

    /// The next row's values and nulls, one per live attribute; valid until the next call.
    pub fn next(&mut self) -> Option<(&[pg_sys::Datum], &[bool])> {
        let Row::Values { values, nulls, .. } = self.rows.next()? else {
            unreachable!("rows opened without stored tuples come as values")
        };
        self.values.clear();
        self.nulls.clear();
        for &i in &self.live {
            self.values.push(values[i]);
            self.nulls.push(nulls[i]);
        }
        Some((&self.values, &self.nulls))
    }
}
