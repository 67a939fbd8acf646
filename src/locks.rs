//! Relation locks by OID, as the worker takes them (session locks at declaration) and as a
//! backend checks them (does this transaction hold what the worker waits for?).

use pgrx::pg_sys;

/// The lock tag of relation `relid` of the connected database (`SET_LOCKTAG_RELATION`).
pub fn relation_locktag(relid: u32) -> pg_sys::LOCKTAG {
    // SAFETY: reading MyDatabaseId of a connected process.
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    pg_sys::LOCKTAG {
        locktag_field1: db,
        locktag_field2: relid,
        locktag_field3: 0,
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    }
}

/// True if this transaction holds a lock on relation `relid` that conflicts with ACCESS
/// SHARE (the lock a declaration needs): ACCESS EXCLUSIVE, taken by TRUNCATE, DROP, most
/// ALTER TABLE forms, LOCK TABLE.
pub fn holds_access_exclusive(relid: u32) -> bool {
    let tag = relation_locktag(relid);
    // SAFETY: a lookup in this backend's local lock table.
    unsafe { pg_sys::LockHeldByMe(&tag, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE) }
}

/// True if this transaction holds any lock on relation `relid`. When the worker cannot take
/// ACCESS SHARE on a table this transaction has locked, another session's ACCESS EXCLUSIVE
/// request is queued behind that lock (a conditional request waits for no one queued ahead
/// of it): a declaration would wait for that session, which waits for this transaction.
pub fn holds_any(relid: u32) -> bool {
    let tag = relation_locktag(relid);
    (pg_sys::AccessShareLock..=pg_sys::AccessExclusiveLock).any(|mode| {
        // SAFETY: a lookup in this backend's local lock table.
        unsafe { pg_sys::LockHeldByMe(&tag, mode as pg_sys::LOCKMODE) }
    })
}
