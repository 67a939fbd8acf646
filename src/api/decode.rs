//! Turning a snapshot's page views back into rows of the table's *current* row type.
//!
//! Tuples are deformed with the row type recorded at the snapshot (so dropped and added
//! columns, and the values rows older than `ADD COLUMN ... DEFAULT` show, are right for that
//! time), then mapped onto today's columns by attribute number:
//! - a column added since the snapshot reads as NULL;
//! - a column dropped since the snapshot is skipped;
//! - a column whose type changed is converted through text (the old type's output, the new
//!   type's input with its modifier), as `CAST(old::text AS new_type)` would; a value the new
//!   type does not accept is that type's input ERROR.
//!
//! TOAST pointers in views name values in gsnap's store (see `worker/page.rs`); they are
//! fetched from there and never reach PostgreSQL as TOAST pointers.

use crate::error::error;
use crate::ipc::protocol::Kind;
use crate::ipc::{self, Pinned};
use gsnap_format::rowtype::RowType;
use gsnap_format::view;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::ffi::CString;

/// How an output column gets its value.
enum Plan {
    Null,
    Copy(usize),
    Convert {
        old: usize,
        out_fn: pg_sys::Oid,
        in_fn: pg_sys::Oid,
        ioparam: pg_sys::Oid,
        typmod: i32,
    },
}

/// Decodes the views of one table at one snapshot into rows of `out_desc`.
pub struct Decoder {
    snap: u64,
    relid: pg_sys::Oid,
    old_desc: pg_sys::TupleDesc,
    row_type: RowType,
    /// Per old attribute: the value tuples too short to hold it show.
    missing: Vec<Option<pg_sys::Datum>>,
    plans: Vec<Plan>,
    old_values: Vec<pg_sys::Datum>,
    old_nulls: Vec<bool>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    buf: Vec<u64>,
}

fn type_exists(oid: u32) -> bool {
    // SAFETY: catalog lookup; returns '\0' for an unknown type.
    unsafe { pg_sys::get_typtype(pg_sys::Oid::from(oid)) != 0 }
}

impl Decoder {
    /// Prepares decoding tuples of `row_type` (recorded at snapshot `snap`) into `out_desc`.
    ///
    /// # Safety
    /// `out_desc` must be the table's current row type descriptor; call in a transaction.
    pub unsafe fn new(
        snap: u64,
        relid: pg_sys::Oid,
        row_type: RowType,
        out_desc: pg_sys::TupleDesc,
    ) -> Decoder {
        // SAFETY: builds a private descriptor and reads the catalog.
        unsafe {
            let natts = row_type.attributes.len();
            let old_desc = pg_sys::CreateTemplateTupleDesc(natts as i32);
            let attrs = (*old_desc).attrs.as_mut_slice(natts);
            // CreateTemplateTupleDesc leaves the attributes uninitialized; every field we do
            // not set (atthasmissing among them) must read as zero.
            std::ptr::write_bytes(attrs.as_mut_ptr(), 0, natts);
            let mut missing = Vec::with_capacity(natts);
            for (a, rt) in attrs.iter_mut().zip(&row_type.attributes) {
                let name = CString::new(rt.name.as_str()).unwrap_or_default();
                pg_sys::namestrcpy(&mut a.attname, name.as_ptr());
                a.attrelid = relid;
                a.attnum = rt.attnum;
                a.atttypid = pg_sys::Oid::from(rt.type_oid);
                a.atttypmod = rt.typmod;
                a.attlen = rt.len;
                a.attbyval = rt.byval;
                a.attalign = rt.align as std::ffi::c_char;
                a.attisdropped = rt.dropped;
                a.attcollation = pg_sys::Oid::from(rt.collation);
                a.attcacheoff = -1;
                a.attndims = 0;
                a.attstorage = if rt.len == -1 { b'x' } else { b'p' } as std::ffi::c_char;
                missing.push(match &rt.missing {
                    Some(text) if type_exists(rt.type_oid) => {
                        let mut in_fn = pg_sys::InvalidOid;
                        let mut ioparam = pg_sys::InvalidOid;
                        pg_sys::getTypeInputInfo(a.atttypid, &mut in_fn, &mut ioparam);
                        let c = CString::new(text.as_str()).unwrap_or_default();
                        Some(pg_sys::OidInputFunctionCall(
                            in_fn,
                            c.as_ptr().cast_mut(),
                            ioparam,
                            rt.typmod,
                        ))
                    }
                    _ => None,
                });
            }
            let out_natts = (*out_desc).natts as usize;
            let out_attrs = (*out_desc).attrs.as_slice(out_natts);
            let mut plans = Vec::with_capacity(out_natts);
            for (j, out) in out_attrs.iter().enumerate() {
                let plan = match row_type.attributes.get(j) {
                    _ if out.attisdropped => Plan::Null,
                    Some(old) if !old.dropped => {
                        if old.type_oid == out.atttypid.to_u32() {
                            Plan::Copy(j)
                        } else {
                            if !type_exists(old.type_oid) {
                                error(
                                    PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                                    format!(
                                        "column \"{}\" had type {} at snapshot {snap}, which no longer exists",
                                        old.name, old.type_name
                                    ),
                                )
                                .raise();
                            }
                            let (mut out_fn, mut varlena) = (pg_sys::InvalidOid, false);
                            pg_sys::getTypeOutputInfo(
                                pg_sys::Oid::from(old.type_oid),
                                &mut out_fn,
                                &mut varlena,
                            );
                            let (mut in_fn, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
                            pg_sys::getTypeInputInfo(out.atttypid, &mut in_fn, &mut ioparam);
                            Plan::Convert {
                                old: j,
                                out_fn,
                                in_fn,
                                ioparam,
                                typmod: out.atttypmod,
                            }
                        }
                    }
                    _ => Plan::Null,
                };
                plans.push(plan);
            }
            Decoder {
                snap,
                relid,
                old_desc,
                missing,
                plans,
                old_values: vec![pg_sys::Datum::from(0usize); natts],
                old_nulls: vec![true; natts],
                values: vec![pg_sys::Datum::from(0usize); out_natts],
                nulls: vec![true; out_natts],
                buf: Vec::new(),
                row_type,
            }
        }
    }

    /// Decodes the view of `block` and hands every row to `emit`. Allocations go to the
    /// current memory context; the caller resets it between pages.
    pub fn decode_page(
        &mut self,
        block: u32,
        image: &[u8],
        emit: &mut dyn FnMut(&[pg_sys::Datum], &[bool]),
    ) {
        let tuples = view::decode(image).unwrap_or_else(|e| {
            error(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                format!(
                    "snapshot {} holds a corrupt page view for block {block}: {e}",
                    self.snap
                ),
            )
            .raise()
        });
        for t in tuples {
            let (values, nulls) = self.decode_tuple(block, t.lp, t.bytes);
            emit(values, nulls);
        }
    }

    /// Decodes one tuple of a view (at `block`, line pointer `lp`) into the output row type.
    pub fn decode_tuple(
        &mut self,
        block: u32,
        lp: u16,
        bytes: &[u8],
    ) -> (&[pg_sys::Datum], &[bool]) {
        if bytes.len() < 23 {
            error(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                "a page view holds a truncated tuple",
            )
            .raise();
        }
        self.buf.clear();
        self.buf.resize(bytes.len().div_ceil(8), 0);
        // SAFETY: `buf` has room for `bytes`; deforming an aligned copy with the descriptor
        // recorded for these tuples.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.buf.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            );
            let mut tuple = pg_sys::HeapTupleData {
                t_len: bytes.len() as u32,
                t_self: pg_sys::ItemPointerData::default(),
                t_tableOid: self.relid,
                t_data: self.buf.as_mut_ptr().cast(),
            };
            pgrx::itemptr::item_pointer_set_all(&mut tuple.t_self, block, lp);
            let natts_in_tuple = usize::from(
                u16::from_ne_bytes([bytes[18], bytes[19]]) & pg_sys::HEAP_NATTS_MASK as u16,
            );
            pg_sys::heap_deform_tuple(
                &mut tuple,
                self.old_desc,
                self.old_values.as_mut_ptr(),
                self.old_nulls.as_mut_ptr(),
            );
            for i in natts_in_tuple..self.old_values.len() {
                if let Some(d) = self.missing[i] {
                    self.old_values[i] = d;
                    self.old_nulls[i] = false;
                }
            }
            for (i, a) in self.row_type.attributes.iter().enumerate() {
                if !self.old_nulls[i] && a.len == -1 && !a.dropped {
                    if let Some(id) = stored_toast_id(self.old_values[i]) {
                        self.old_values[i] = fetch_toast(id);
                    }
                }
            }
            for (j, plan) in self.plans.iter().enumerate() {
                match *plan {
                    Plan::Null => self.nulls[j] = true,
                    Plan::Copy(i) => {
                        self.values[j] = self.old_values[i];
                        self.nulls[j] = self.old_nulls[i];
                    }
                    Plan::Convert {
                        old,
                        out_fn,
                        in_fn,
                        ioparam,
                        typmod,
                    } => {
                        self.nulls[j] = self.old_nulls[old];
                        if !self.nulls[j] {
                            let text = pg_sys::OidOutputFunctionCall(out_fn, self.old_values[old]);
                            self.values[j] =
                                pg_sys::OidInputFunctionCall(in_fn, text, ioparam, typmod);
                        }
                    }
                }
            }
        }
        (&self.values, &self.nulls)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: created by CreateTemplateTupleDesc in `new`.
        unsafe { pg_sys::FreeTupleDesc(self.old_desc) };
    }
}

/// If `d` is one of gsnap's TOAST pointers (VARATT_IS_EXTERNAL_ONDISK in a view), the id of
/// the value in the store.
///
/// # Safety
/// `d` must point to a varlena.
unsafe fn stored_toast_id(d: pg_sys::Datum) -> Option<u64> {
    // SAFETY: reading a varlena header and, for an external one, its 16-byte payload.
    unsafe {
        let p = d.cast_mut_ptr::<u8>();
        if *p != 0x01 || u32::from(*p.add(1)) != pg_sys::vartag_external::VARTAG_ONDISK {
            return None;
        }
        let mut id = [0u8; 8];
        std::ptr::copy_nonoverlapping(p.add(2 + 8), id.as_mut_ptr(), 8);
        Some(u64::from_le_bytes(id))
    }
}

/// Fetches a TOAST value from the store, chunk by chunk through the cache, into a palloc'd
/// varlena (possibly compressed, as PostgreSQL stored it).
fn fetch_toast(id: u64) -> pg_sys::Datum {
    let mut first = 0u32;
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut filled = 0usize;
    let mut total = 0usize;
    loop {
        let answer = ipc::call(Kind::ToastFetch, &[id as i64, i64::from(first), 64]);
        let chunks = answer.result as u32;
        if out.is_null() {
            total = answer.total as usize;
            // SAFETY: allocation in the current memory context.
            out = unsafe { pg_sys::palloc(total.max(1)) }.cast();
        }
        let pinned = Pinned::from_answer(&answer);
        if pinned.entries.is_empty() && first < chunks {
            drop(pinned);
            ipc::wait_latch(std::time::Duration::from_millis(5));
            continue;
        }
        for e in &pinned.entries {
            let bytes = pinned.bytes(e);
            if filled + bytes.len() > total {
                error(
                    PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!("stored TOAST value {id} is longer than recorded"),
                )
                .raise();
            }
            // SAFETY: `out` has `total` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.add(filled), bytes.len()) };
            filled += bytes.len();
            first = e.key + 1;
        }
        if first >= chunks {
            break;
        }
    }
    if filled != total {
        error(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("stored TOAST value {id} is incomplete"),
        )
        .raise();
    }
    pg_sys::Datum::from(out)
}
