//! Relations by OID: their names for messages, and relations held open by a scan.

use pgrx::pg_sys;
use std::ffi::CStr;

/// The name of a relation for messages ("relation with OID n" if there is none).
pub fn relation_name(relid: pg_sys::Oid) -> String {
    // SAFETY: a catalog lookup; the name is copied before anything else can free it.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            format!("relation with OID {}", relid.to_u32())
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// The kind of relation `relid` (`pg_class.relkind`), or None if there is no such relation.
pub fn relation_kind(relid: pg_sys::Oid) -> Option<u8> {
    // SAFETY: a catalog lookup by OID; '\0' when there is no such relation.
    let kind = unsafe { pg_sys::get_rel_relkind(relid) } as u8;
    (kind != 0).then_some(kind)
}

/// A relation open (and locked) for a scan: closed on drop, its lock kept until the
/// transaction ends, as PostgreSQL's own scans do. When an ERROR aborts the transaction,
/// the relation reference is released by the transaction's resource owner instead, so an
/// `OpenRelation` must not be dropped after that: [`OpenRelation::forget`].
pub struct OpenRelation(pg_sys::Relation);

impl OpenRelation {
    /// Opens `relid` with `lock` (held until the transaction ends); None if it no longer
    /// exists.
    pub fn open(relid: pg_sys::Oid, lock: pg_sys::LOCKMODE) -> Option<OpenRelation> {
        // SAFETY: try_relation_open returns NULL (and takes no lock) for a missing relation.
        let rel = unsafe { pg_sys::try_relation_open(relid, lock) };
        (!rel.is_null()).then_some(OpenRelation(rel))
    }

    /// The relation's OID.
    pub fn oid(&self) -> pg_sys::Oid {
        // SAFETY: the relation is open.
        unsafe { (*self.0).rd_id }
    }

    /// The relation's current tuple descriptor (valid while the relation is open).
    pub fn descriptor(&self) -> pg_sys::TupleDesc {
        // SAFETY: the relation is open.
        unsafe { (*self.0).rd_att }
    }

    /// The relation's `pg_class` row (valid while the relation is open).
    pub fn class(&self) -> &pg_sys::FormData_pg_class {
        // SAFETY: an open relation's rd_rel is valid until it is closed.
        unsafe { &*(*self.0).rd_rel }
    }

    /// Leaves the relation to the transaction's resource owner (after an ERROR).
    pub fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for OpenRelation {
    fn drop(&mut self) {
        // SAFETY: opened by `open`; NoLock keeps the lock until the transaction ends.
        unsafe { pg_sys::relation_close(self.0, pg_sys::NoLock as pg_sys::LOCKMODE) };
    }
}
