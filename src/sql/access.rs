//! Who may read what: reading a table AS OF needs what reading it now needs.
//!
//! - SELECT on the whole table (as `SELECT *` would), through a table grant or column grants
//!   on every column;
//! - no row-level security applying to the caller: gsnap cannot evaluate today's policies
//!   against yesterday's rows faithfully, so it refuses rather than show rows a policy would
//!   hide (owners and BYPASSRLS roles, to whom policies do not apply, can read);
//! - the database must be the one gsnap serves (`gsnap.database`): table OIDs are per
//!   database.

use crate::error::error;
use crate::ffi::relation::relation_name;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// Raises an ERROR unless this session is connected to gsnap's database.
pub fn require_gsnap_database() {
    crate::require_preloaded();
    let wanted = crate::gucs::database();
    let name = std::ffi::CString::new(wanted.clone()).unwrap_or_default();
    // SAFETY: catalog lookup of a database by name; MyDatabaseId is set in a backend.
    let (oid, mine) = unsafe {
        (
            pg_sys::get_database_oid(name.as_ptr(), true),
            pg_sys::MyDatabaseId,
        )
    };
    if oid != mine {
        error(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("gsnap serves database \"{wanted}\" only"),
        )
        .hint("Connect to that database, or set gsnap.database (and restart the server).")
        .raise();
    }
}

/// Raises an ERROR unless the current user may read all of `relid` now.
pub fn require_read_access(relid: pg_sys::Oid) {
    use pg_sys::AclResult::ACLCHECK_OK;
    // SAFETY: the current user's id, set for every session.
    let user = unsafe { pg_sys::GetUserId() };
    // SAFETY: a privilege check by OIDs in the catalog.
    let table_ok =
        unsafe { pg_sys::pg_class_aclcheck(relid, user, pg_sys::ACL_SELECT) } == ACLCHECK_OK;
    let all_columns = pg_sys::AclMaskHow::ACLMASK_ALL;
    // SAFETY: a privilege check by OIDs in the catalog, for every column.
    let columns_ok = table_ok
        || unsafe {
            pg_sys::pg_attribute_aclcheck_all(relid, user, pg_sys::ACL_SELECT, all_columns)
        } == ACLCHECK_OK;
    if !columns_ok {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", relation_name(relid)),
        )
        .detail("Reading a table as of a snapshot needs SELECT on the whole table.")
        .raise();
    }
    // SAFETY: whether row-level security applies to the current user, by OID in the catalog.
    let rls = unsafe { pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, false) };
    if rls == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32 {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "table {} has row-level security, which gsnap cannot apply to snapshots",
                relation_name(relid)
            ),
        )
        .hint("The table owner, or a role with BYPASSRLS, can read its snapshots.")
        .raise();
    }
}
