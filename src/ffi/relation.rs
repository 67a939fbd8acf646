//! Relations by OID: their names for messages, and relations held open by a scan.

use super::catalog::string_from;
use pgrx::pg_sys;

/// The name of a relation for messages ("relation with OID n" if there is none).
pub fn relation_name(relid: pg_sys::Oid) -> String {
    // SAFETY: a catalog lookup by OID: a palloc'd copy of the name, or NULL.
    let name = unsafe { pg_sys::get_rel_name(relid) };
    if name.is_null() {
        return format!("relation with OID {}", relid.to_u32());
    }
    // SAFETY: a C string just returned, not freed before it is copied.
    unsafe { string_from(name) }
}

/// The schema-qualified name of relation `relid`, each part quoted as SQL needs it (as
/// `quote_qualified_identifier` prints it); None if there is no such relation.
pub fn qualified_name(relid: pg_sys::Oid) -> Option<String> {
    // SAFETY: catalog lookups by OID (NULL for a relation that does not exist); the result is
    // copied before anything can free it.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            return None;
        }
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        Some(string_from(pg_sys::quote_qualified_identifier(
            schema, name,
        )))
    }
}

/// The name of column `attnum` of `relid` (its number if there is no such column).
pub fn column_name(relid: pg_sys::Oid, attnum: i16) -> String {
    // SAFETY: a catalog lookup by OID and number: a palloc'd copy of the name, or NULL.
    let name = unsafe { pg_sys::get_attname(relid, attnum, true) };
    if name.is_null() {
        return format!("number {attnum}");
    }
    // SAFETY: a C string just returned, not freed before it is copied.
    unsafe { string_from(name) }
}

/// The kind of relation `relid` (`pg_class.relkind`), or None if there is no such relation.
pub fn relation_kind(relid: pg_sys::Oid) -> Option<u8> {
    // SAFETY: a catalog lookup by OID; '\0' when there is no such relation.
    let kind = unsafe { pg_sys::get_rel_relkind(relid) } as u8;
    (kind != 0).then_some(kind)
}

/// The relation whose row type is `type_oid`, if it is one.
pub fn relation_of_type(type_oid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup by OID (InvalidOid for a type that is no relation's).
    let relid = unsafe { pg_sys::get_typ_typrelid(type_oid) };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

/// The row type of relation `relid` (InvalidOid if there is no such relation).
pub fn relation_row_type(relid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a catalog lookup by OID.
    unsafe { pg_sys::get_rel_type_id(relid) }
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
        // (Not `then_some(OpenRelation(rel))`: its argument is made, and dropped, even for
        // NULL, and dropping one closes the relation: relation_close(NULL) was a segfault
        // whenever a table was dropped while a query over it waited for its lock.)
        if rel.is_null() {
            None
        } else {
            Some(OpenRelation(rel))
        }
    }

    /// The relation, for PostgreSQL's functions (valid while it is open).
    pub fn as_ptr(&self) -> pg_sys::Relation {
        self.0
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

    /// The relation's size now, in blocks of its main fork.
    pub fn nblocks(&self) -> u32 {
        // SAFETY: the open relation's storage, whose size this reads.
        unsafe { pg_sys::RelationGetNumberOfBlocksInFork(self.0, pg_sys::ForkNumber::MAIN_FORKNUM) }
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
