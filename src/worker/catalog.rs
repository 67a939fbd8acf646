//! What the worker reads from PostgreSQL's catalog at declaration: which tables are gsnap
//! tables, and for each its storage identity, size and row type.

use gsnap_format::rowtype::{Attribute, RowType};
use pgrx::pg_sys;
use std::ffi::CStr;

/// PostgreSQL timestamps count microseconds from 2000-01-01; ours from 1970-01-01.
pub const UNIX_TO_PG_EPOCH_US: i64 = 946_684_800_000_000;

/// The current time in microseconds since the Unix epoch.
pub fn now_unix_us() -> i64 {
    // SAFETY: reads the clock.
    unsafe { pg_sys::GetCurrentTimestamp() + UNIX_TO_PG_EPOCH_US }
}

/// OIDs of the snapshotted gsnap tables of the connected database: tables and materialized
/// views using the gsnap access method, except temporary ones.
///
/// # Safety
/// Must run inside a transaction.
pub unsafe fn gsnap_tables() -> Vec<u32> {
    let mut out = Vec::new();
    // SAFETY: a catalog scan of pg_class under an ACCESS SHARE lock released at close.
    unsafe {
        let am = pg_sys::get_am_oid(c"gsnap".as_ptr(), true);
        if am == pg_sys::InvalidOid {
            return out;
        }
        let lock = pg_sys::AccessShareLock as i32;
        let class = pg_sys::table_open(pg_sys::RelationRelationId, lock);
        let scan = pg_sys::systable_beginscan(
            class,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let form = pg_sys::GETSTRUCT(tuple).cast::<pg_sys::FormData_pg_class>();
            let kind = (*form).relkind as u8;
            if (*form).relam == am
                && (kind == pg_sys::RELKIND_RELATION || kind == pg_sys::RELKIND_MATVIEW)
                && (*form).relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP
            {
                out.push((*form).oid.to_u32());
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(class, lock);
    }
    out.sort_unstable();
    out
}

/// PostgreSQL's `AttrMissing` (opaque in the bindings: it is in `tupdesc_details.h`).
#[repr(C)]
struct AttrMissing {
    am_present: bool,
    am_value: pg_sys::Datum,
}

/// A gsnap table as declared in a snapshot.
pub struct TableInfo {
    pub relid: u32,
    pub relfilenode: u32,
    pub nblocks: u32,
    pub row_type: RowType,
    pub name: String,
}

/// Reads a locked table's identity, size and row type; None if it no longer exists.
///
/// # Safety
/// Must run inside a transaction, with the table locked by this process.
pub unsafe fn table_info(relid: u32) -> Option<TableInfo> {
    // SAFETY: the caller holds a lock on the table, so it cannot be dropped or rewritten
    // while it is open here.
    unsafe {
        let rel = pg_sys::try_relation_open(pg_sys::Oid::from(relid), pg_sys::NoLock as i32);
        if rel.is_null() {
            return None;
        }
        let form = (*rel).rd_rel;
        let name = {
            let nsp = pg_sys::get_namespace_name((*form).relnamespace);
            let q = pg_sys::quote_qualified_identifier(nsp, (*form).relname.data.as_ptr());
            CStr::from_ptr(q).to_string_lossy().into_owned()
        };
        let info = TableInfo {
            relid,
            relfilenode: (*rel).rd_node.relNode.to_u32(),
            nblocks: pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM),
            row_type: row_type_of((*rel).rd_att),
            name,
        };
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        Some(info)
    }
}

/// The row type of a tuple descriptor, with the values that rows older than an
/// `ADD COLUMN ... DEFAULT` show for the new column.
///
/// # Safety
/// `desc` must be a valid relation descriptor; must run inside a transaction.
pub unsafe fn row_type_of(desc: pg_sys::TupleDesc) -> RowType {
    // SAFETY: reading a valid descriptor and calling type output functions.
    unsafe {
        let natts = (*desc).natts as usize;
        let attrs = (*desc).attrs.as_slice(natts);
        let missing = if (*desc).constr.is_null() {
            std::ptr::null_mut()
        } else {
            (*(*desc).constr).missing.cast::<AttrMissing>()
        };
        let mut attributes = Vec::with_capacity(natts);
        for (i, a) in attrs.iter().enumerate() {
            let dropped = a.attisdropped;
            let type_name = if dropped {
                String::new()
            } else {
                CStr::from_ptr(pg_sys::format_type_with_typemod(a.atttypid, a.atttypmod))
                    .to_string_lossy()
                    .into_owned()
            };
            let missing_value = if a.atthasmissing && !dropped && !missing.is_null() {
                let m = &*missing.add(i);
                if m.am_present {
                    let mut out_fn = pg_sys::InvalidOid;
                    let mut varlena = false;
                    pg_sys::getTypeOutputInfo(a.atttypid, &mut out_fn, &mut varlena);
                    let text = pg_sys::OidOutputFunctionCall(out_fn, m.am_value);
                    Some(CStr::from_ptr(text).to_string_lossy().into_owned())
                } else {
                    None
                }
            } else {
                None
            };
            attributes.push(Attribute {
                attnum: (i + 1) as i16,
                name: CStr::from_ptr(a.attname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                dropped,
                type_oid: a.atttypid.to_u32(),
                typmod: a.atttypmod,
                type_name,
                len: a.attlen,
                byval: a.attbyval,
                align: a.attalign as u8,
                collation: a.attcollation.to_u32(),
                not_null: a.attnotnull,
                missing: missing_value,
            });
        }
        RowType { attributes }
    }
}
