//! What the worker reads from PostgreSQL's catalog at declaration: which tables are gsnap
//! tables, and for each its storage identity, size, row type and definition
//! (`definition.rs`).

use crate::ffi::catalog::{for_each_row, name_of, output_function, string_from};
use crate::ffi::relation::{qualified_name, OpenRelation};
use crate::ffi::tuple;
use gsnap_format::rowtype::{Attribute, RowType};
use pgrx::{pg_guard, pg_sys};
use std::cell::RefCell;

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
/// Every declaration asks twice (before and after locking the tables), and reading the list
/// means a scan of all of `pg_class`, which grows with the database (the scan was a third of
/// an idle declaration's time with 400 relations). So the list is kept per process with the
/// access method it was read for, and read again after any change to `pg_class`: the
/// syscache callback below marks it stale on every invalidation of a `pg_class` row (each
/// insert, update or delete of one sends it, at commit to other processes and at the next
/// command to this one) and on a reset of the invalidation queue (which calls every
/// callback). The mark is cleared before the scan, so a change whose invalidation arrives
/// during the scan is read again next time.
///
/// # Safety
/// Must run inside a transaction.
pub unsafe fn gsnap_tables() -> Vec<u32> {
    // SAFETY: a catalog lookup by name.
    let am = unsafe { pg_sys::get_am_oid(c"gsnap".as_ptr(), true) };
    if am == pg_sys::InvalidOid {
        return Vec::new();
    }
    if !LISTED.with(|l| l.borrow().registered) {
        // SAFETY: registers a callback with a static lifetime, once per process.
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                pg_sys::SysCacheIdentifier::RELOID as i32,
                Some(pg_class_changed),
                pg_sys::Datum::from(0usize),
            )
        };
        LISTED.with(|l| l.borrow_mut().registered = true);
    }
    let cached = LISTED.with(|l| {
        let l = l.borrow();
        (!l.stale && l.am == am).then(|| l.tables.clone())
    });
    if let Some(tables) = cached {
        return tables;
    }
    LISTED.with(|l| l.borrow_mut().stale = false);
    // SAFETY: the caller's promise.
    let tables = unsafe { scan_gsnap_tables(am) };
    LISTED.with(|l| {
        let mut l = l.borrow_mut();
        l.am = am;
        l.tables = tables.clone();
    });
    tables
}

/// The gsnap tables as last listed, for access method `am`.
struct Listed {
    registered: bool,
    stale: bool,
    am: pg_sys::Oid,
    tables: Vec<u32>,
}

thread_local! {
    static LISTED: RefCell<Listed> = const {
        RefCell::new(Listed {
            registered: false,
            stale: true,
            am: pg_sys::InvalidOid,
            tables: Vec::new(),
        })
    };
}

/// PostgreSQL's syscache callback for `pg_class`: the list is read again at its next use.
#[pg_guard]
unsafe extern "C-unwind" fn pg_class_changed(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    LISTED.with(|l| l.borrow_mut().stale = true);
}

/// Scans `pg_class` for the snapshotted tables of access method `am`, sorted.
///
/// # Safety
/// Must run inside a transaction.
unsafe fn scan_gsnap_tables(am: pg_sys::Oid) -> Vec<u32> {
    let mut out = Vec::new();
    let snapshotted = |form: &pg_sys::FormData_pg_class| {
        let kind = form.relkind as u8;
        form.relam == am
            && (kind == pg_sys::RELKIND_RELATION || kind == pg_sys::RELKIND_MATVIEW)
            && form.relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP
    };
    // SAFETY: pg_class's rows are FormData_pg_class; in a transaction (the caller's promise).
    unsafe {
        for_each_row(
            pg_sys::RelationRelationId,
            |form: &pg_sys::FormData_pg_class| {
                if snapshotted(form) {
                    out.push(form.oid.to_u32());
                }
            },
        )
    };
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
    /// WAL-logged (permanent), so its pages carry LSNs.
    pub logged: bool,
}

/// Reads a locked table's identity, size and row type; None if it no longer exists.
///
/// # Safety
/// Must run inside a transaction, with the table locked by this process.
pub unsafe fn table_info(relid: u32) -> Option<TableInfo> {
    // The caller holds a lock on the table, so it cannot be dropped or rewritten while it is
    // open here.
    let rel = OpenRelation::open(pg_sys::Oid::from(relid), pg_sys::NoLock as i32)?;
    let class = rel.class();
    let name = qualified_name(rel.oid())?;
    let nblocks = rel.nblocks();
    // SAFETY: the open relation's file identity.
    let relfilenode = unsafe { (*rel.as_ptr()).rd_node.relNode.to_u32() };
    // SAFETY: the open relation's descriptor; in a transaction.
    let mut row_type = unsafe { row_type_of(rel.descriptor()) };
    // SAFETY: the open, locked relation; in a transaction.
    row_type.definition = Some(unsafe { super::definition::definition_of(&rel, &name) });
    Some(TableInfo {
        relid,
        relfilenode,
        nblocks,
        row_type,
        name,
        logged: class.relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT,
    })
}

/// The row type of a tuple descriptor, with the values that rows older than an
/// `ADD COLUMN ... DEFAULT` show for the new column.
///
/// # Safety
/// `desc` must be a valid relation descriptor; must run inside a transaction.
pub unsafe fn row_type_of(desc: pg_sys::TupleDesc) -> RowType {
    // SAFETY: the caller's promise.
    let (attrs, constr) = unsafe { (tuple::attributes(desc), (*desc).constr) };
    let missing = if constr.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: the descriptor's constraints, valid with it.
        unsafe { (*constr).missing.cast::<AttrMissing>() }
    };
    let attributes = attrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let has_missing = a.atthasmissing && !a.attisdropped && !missing.is_null();
            let value = has_missing.then(|| {
                // SAFETY: the descriptor has a missing-value entry per attribute.
                let m = unsafe { &*missing.add(i) };
                m.am_present.then_some(m.am_value)
            });
            attribute(i, a, value.flatten())
        })
        .collect();
    RowType {
        attributes,
        definition: None,
    }
}

/// Attribute `i` of a descriptor, `a`, with the value rows too short to hold it show.
fn attribute(
    i: usize,
    a: &pg_sys::FormData_pg_attribute,
    missing: Option<pg_sys::Datum>,
) -> Attribute {
    let dropped = a.attisdropped;
    let type_name = if dropped {
        String::new()
    } else {
        // SAFETY: the type's name with its modifier, a new string.
        unsafe { string_from(pg_sys::format_type_with_typemod(a.atttypid, a.atttypmod)) }
    };
    let missing = missing.map(|value| {
        // SAFETY: the attribute type's output function, given a value of that type; the text
        // is a new string.
        unsafe {
            let text = pg_sys::OidOutputFunctionCall(output_function(a.atttypid), value);
            string_from(text)
        }
    });
    Attribute {
        attnum: (i + 1) as i16,
        name: name_of(&a.attname).to_string_lossy().into_owned(),
        dropped,
        type_oid: a.atttypid.to_u32(),
        typmod: a.atttypmod,
        type_name,
        len: a.attlen,
        byval: a.attbyval,
        align: a.attalign as u8,
        collation: a.attcollation.to_u32(),
        not_null: a.attnotnull,
        missing,
    }
}
