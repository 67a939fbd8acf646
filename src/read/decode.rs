//! Turning the tuples of a snapshot's page views back into rows of the table's *current*
//! row type. Tuples are deformed with the row type recorded at the snapshot (so dropped and
//! added columns, and the values rows older than `ADD COLUMN ... DEFAULT` show, are right for
//! that time); then each current column gets its value as the column plan says
//! (`gsnap_format::columns`: NULL, the old value, or the old value converted through text).
//! Out-of-line values are fetched from the store (`toast.rs`).

use crate::error::{corrupt, error};
use crate::ffi::catalog::{input_function, output_function};
use crate::ffi::tuple::{self, item_pointer};
use gsnap_format::columns::{self, Column, ColumnPlan};
use gsnap_format::rowtype::{Attribute, RowType};
use gsnap_format::{heap, FormatError};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::ffi::{c_char, CString};

/// How a column whose type changed is converted: the old type's output function, the new
/// type's input function, its I/O parameter and modifier.
#[derive(Clone, Copy)]
struct Conversion {
    out_fn: pg_sys::Oid,
    in_fn: pg_sys::Oid,
    ioparam: pg_sys::Oid,
    typmod: i32,
}

/// The current columns of a table, for the column plan.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
pub unsafe fn current_columns(desc: pg_sys::TupleDesc) -> Vec<Column> {
    // SAFETY: the caller's promise.
    unsafe { tuple::attributes(desc) }
        .iter()
        .map(|a| Column {
            dropped: a.attisdropped,
            type_oid: a.atttypid.to_u32(),
            typmod: a.atttypmod,
            collation: a.attcollation.to_u32(),
        })
        .collect()
}

fn type_exists(oid: u32) -> bool {
    // SAFETY: catalog lookup; returns '\0' for an unknown type.
    unsafe { pg_sys::get_typtype(pg_sys::Oid::from(oid)) != 0 }
}

/// Decodes the tuples of one table's views at one snapshot into rows of the current type.
pub struct Decoder {
    snap: u64,
    relid: pg_sys::Oid,
    old_desc: pg_sys::TupleDesc,
    row_type: RowType,
    /// Per old attribute: the value tuples too short to hold it show.
    missing: Vec<Option<pg_sys::Datum>>,
    plans: Vec<ColumnPlan>,
    conversions: Vec<Option<Conversion>>,
    old_values: Vec<pg_sys::Datum>,
    old_nulls: Vec<bool>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    /// An 8-byte aligned copy of the tuple being deformed.
    buf: Vec<u64>,
}

impl Decoder {
    /// Prepares decoding tuples of `row_type` (recorded at snapshot `snap`) into `out_desc`.
    ///
    /// # Safety
    /// `out_desc` is the table's current row type descriptor; call in a transaction.
    pub unsafe fn new(
        snap: u64,
        relid: pg_sys::Oid,
        row_type: RowType,
        out_desc: pg_sys::TupleDesc,
    ) -> Decoder {
        // SAFETY: the caller's promise.
        let current = unsafe { current_columns(out_desc) };
        // SAFETY: the caller's promise.
        unsafe { Decoder::with_columns(snap, relid, row_type, current) }
    }

    /// [`Decoder::new`] into the columns `current` (a partition's columns laid out as its
    /// partitioned table's are now, `super::partitioned`).
    ///
    /// # Safety
    /// Call in a transaction.
    pub unsafe fn with_columns(
        snap: u64,
        relid: pg_sys::Oid,
        row_type: RowType,
        current: Vec<Column>,
    ) -> Decoder {
        let plans =
            columns::plan_columns(&row_type, &current, type_exists).unwrap_or_else(|e| match e {
                FormatError::TypeGone {
                    column, type_name, ..
                } => error(
                    PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                    format!(
                        "column \"{column}\" had type {type_name} at snapshot {snap}, which no \
                         longer exists"
                    ),
                )
                .raise(),
                e => corrupt(format_args!("snapshot {snap}: {e}")),
            });
        let conversions = plans
            .iter()
            .zip(&current)
            .map(|(plan, now)| match *plan {
                ColumnPlan::Convert { old } => Some(conversion(&row_type, old, now)),
                _ => None,
            })
            .collect();
        // SAFETY: in a transaction (the caller's promise); the descriptor is freed on drop.
        let old_desc = unsafe { old_descriptor(relid, &row_type) };
        let missing = row_type.attributes.iter().map(missing_value).collect();
        let natts = row_type.attributes.len();
        Decoder {
            snap,
            relid,
            old_desc,
            missing,
            plans,
            conversions,
            old_values: vec![pg_sys::Datum::from(0usize); natts],
            old_nulls: vec![true; natts],
            values: vec![pg_sys::Datum::from(0usize); current.len()],
            nulls: vec![true; current.len()],
            buf: Vec::new(),
            row_type,
        }
    }

    /// Decodes one tuple of a view (at `block`, line pointer `lp`) into the current row type;
    /// allocations go to the current memory context.
    pub fn decode_tuple(
        &mut self,
        block: u32,
        lp: u16,
        bytes: &[u8],
    ) -> (&[pg_sys::Datum], &[bool]) {
        let natts_in_tuple = heap::natts(bytes).unwrap_or_else(|e| {
            corrupt(format_args!(
                "snapshot {} holds a corrupt tuple at block {block}, item {lp}: {e}",
                self.snap
            ))
        });
        self.buf.clear();
        self.buf.resize(bytes.len().div_ceil(8), 0);
        // SAFETY: `buf` has room for `bytes`.
        unsafe {
            let to = self.buf.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len());
        }
        let mut tuple = pg_sys::HeapTupleData {
            t_len: bytes.len() as u32,
            t_self: item_pointer(block, lp),
            t_tableOid: self.relid,
            t_data: self.buf.as_mut_ptr().cast(),
        };
        // SAFETY: an 8-byte aligned copy of a tuple of the row type recorded with the view,
        // whose descriptor this is.
        unsafe {
            tuple::deform(
                &mut tuple,
                self.old_desc,
                &mut self.old_values,
                &mut self.old_nulls,
            )
        };
        for i in usize::from(natts_in_tuple)..self.old_values.len() {
            if let Some(d) = self.missing[i] {
                self.old_values[i] = d;
                self.old_nulls[i] = false;
            }
        }
        for (i, a) in self.row_type.attributes.iter().enumerate() {
            if !self.old_nulls[i] && a.len == -1 && !a.dropped {
                if let Some(id) = stored_toast_id(self.old_values[i]) {
                    self.old_values[i] = super::toast::fetch(id);
                }
            }
        }
        for (j, plan) in self.plans.iter().enumerate() {
            match *plan {
                ColumnPlan::Null => self.nulls[j] = true,
                ColumnPlan::Copy { old } => {
                    self.values[j] = self.old_values[old];
                    self.nulls[j] = self.old_nulls[old];
                }
                ColumnPlan::Convert { old } => {
                    self.nulls[j] = self.old_nulls[old];
                    if !self.nulls[j] {
                        let c = self.conversions[j].expect("planned with the column");
                        // SAFETY: the old value has the old type, whose output function this
                        // is; the text goes to the new type's input function.
                        self.values[j] = unsafe {
                            let text =
                                pg_sys::OidOutputFunctionCall(c.out_fn, self.old_values[old]);
                            pg_sys::OidInputFunctionCall(c.in_fn, text, c.ioparam, c.typmod)
                        };
                    }
                }
            }
        }
        (&self.values, &self.nulls)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: made by CreateTemplateTupleDesc in `old_descriptor`.
        unsafe { pg_sys::FreeTupleDesc(self.old_desc) };
    }
}

/// The output and input functions converting old attribute `old` into column `now`.
fn conversion(row_type: &RowType, old: usize, now: &Column) -> Conversion {
    let (in_fn, ioparam) = input_function(pg_sys::Oid::from(now.type_oid));
    Conversion {
        out_fn: output_function(pg_sys::Oid::from(row_type.attributes[old].type_oid)),
        in_fn,
        ioparam,
        typmod: now.typmod,
    }
}

/// A tuple descriptor of the row type recorded at a snapshot.
///
/// # Safety
/// Call in a transaction; the caller frees the descriptor.
pub(super) unsafe fn old_descriptor(relid: pg_sys::Oid, row_type: &RowType) -> pg_sys::TupleDesc {
    let natts = row_type.attributes.len();
    // SAFETY: a new descriptor of `natts` attributes, which it leaves uninitialized.
    let desc = unsafe { pg_sys::CreateTemplateTupleDesc(natts as i32) };
    // SAFETY: the new descriptor's attribute array, of `natts` entries.
    let attrs = unsafe { (*desc).attrs.as_mut_ptr() };
    for (i, rt) in row_type.attributes.iter().enumerate() {
        // SAFETY: entry `i` of that array, written whole.
        unsafe { attrs.add(i).write(old_attribute(relid, rt)) };
    }
    desc
}

/// Attribute `rt` of table `relid` as a descriptor holds it; every field not set here
/// (atthasmissing among them) reads as zero.
fn old_attribute(relid: pg_sys::Oid, rt: &Attribute) -> pg_sys::FormData_pg_attribute {
    let mut a = pg_sys::FormData_pg_attribute {
        attrelid: relid,
        attnum: rt.attnum,
        atttypid: pg_sys::Oid::from(rt.type_oid),
        atttypmod: rt.typmod,
        attlen: rt.len,
        attbyval: rt.byval,
        attalign: rt.align as c_char,
        attisdropped: rt.dropped,
        attcollation: pg_sys::Oid::from(rt.collation),
        attcacheoff: -1,
        attstorage: if rt.len == -1 { b'x' } else { b'p' } as c_char,
        ..Default::default()
    };
    let name = CString::new(rt.name.as_str()).unwrap_or_default();
    // SAFETY: copies a C string into the attribute's name (truncated to NAMEDATALEN).
    unsafe { pg_sys::namestrcpy(&mut a.attname, name.as_ptr()) };
    a
}

/// The value that tuples too short to hold attribute `rt` show for it (`ADD COLUMN ...
/// DEFAULT` before the snapshot), if any.
fn missing_value(rt: &Attribute) -> Option<pg_sys::Datum> {
    let text = rt.missing.as_ref().filter(|_| type_exists(rt.type_oid))?;
    let (in_fn, ioparam) = input_function(pg_sys::Oid::from(rt.type_oid));
    let text = CString::new(text.as_str()).unwrap_or_default();
    // SAFETY: the type's input function, given a C string it only reads.
    Some(unsafe {
        pg_sys::OidInputFunctionCall(in_fn, text.as_ptr().cast_mut(), ioparam, rt.typmod)
    })
}

/// If `d` is one of gsnap's TOAST pointers, the id of the value in the store.
fn stored_toast_id(d: pg_sys::Datum) -> Option<u64> {
    let p = d.cast_mut_ptr::<u8>().cast_const();
    // SAFETY: `d` is a non-null varlena datum of a deformed tuple: its first byte is readable,
    // an external one (first byte 0x01) has its tag after it, and an on-disk one its whole
    // pointer.
    let bytes = unsafe {
        if heap::varlena_header_len(*p) != heap::VARHDRSZ_EXTERNAL
            || *p.add(1) != heap::VARTAG_ONDISK
        {
            return None;
        }
        std::slice::from_raw_parts(p, heap::TOAST_POINTER_LEN)
    };
    heap::toast_id(bytes).ok().flatten()
}
