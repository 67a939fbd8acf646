//! Who may read what: reading a table AS OF needs what reading it now needs.
//!
//! - SELECT on what the query reads, as for the live table: the table, or each column the
//!   query reads (the custom scans know which: an AS OF scan's columns, the fields of `rec`
//!   a range, versions or diff query selects, `plan::fields`; the function scans return
//!   whole rows, so they need every column);
//! - row-level security: the custom scans apply the policies that apply to the caller now
//!   (PostgreSQL's own `get_row_security_policies`, as for a query of the live table) to the
//!   old rows, before the query's own conditions (`plan::security`), in the AS OF, range,
//!   versions and diff scans; where there is no place to apply them (the function scans: a
//!   reader outside FROM, WITH ORDINALITY or in a LATERAL call) or a policy
//!   has a sub-query, it refuses rather than show rows a policy would hide (owners and
//!   BYPASSRLS roles, to whom policies do not apply, can read);
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
    require_column_access(relid, None, pg_sys::InvalidOid, pg_sys::InvalidOid);
}

/// Raises an ERROR unless the current user may read the columns `columns` of `relid` now
/// (None: all of them; no column, as for `count(*)`: any one of them), as PostgreSQL checks a
/// query of the live table: SELECT on the table, or on each of those columns. Row-level
/// security that applies to the user is refused unless `rls_user` is the user: the scan
/// applies that user's policies (`plan::nodes`).
///
/// `check_as` is the role to check instead of the current user (the owner of the view a scan
/// comes from, as PostgreSQL checks the tables a view reads as its owner); InvalidOid: the
/// current user.
pub fn require_column_access(
    relid: pg_sys::Oid,
    columns: Option<&[i16]>,
    rls_user: pg_sys::Oid,
    check_as: pg_sys::Oid,
) {
    use pg_sys::AclResult::ACLCHECK_OK;
    let user = effective_user(check_as);
    // SAFETY: a privilege check by OIDs in the catalog.
    let table_ok =
        unsafe { pg_sys::pg_class_aclcheck(relid, user, pg_sys::ACL_SELECT) } == ACLCHECK_OK;
    let refused: Option<String> = match columns {
        _ if table_ok => None,
        None | Some([]) => {
            // Whole rows: every column; no column (as for `count(*)`): any one of them.
            let (how, detail) = match columns {
                None => (
                    pg_sys::AclMaskHow::ACLMASK_ALL,
                    "Reading whole rows of a table as of a snapshot needs SELECT on every column.",
                ),
                _ => (
                    pg_sys::AclMaskHow::ACLMASK_ANY,
                    "The query needs SELECT on at least one column of the table.",
                ),
            };
            // SAFETY: a privilege check by OIDs in the catalog, over the table's columns.
            let result =
                unsafe { pg_sys::pg_attribute_aclcheck_all(relid, user, pg_sys::ACL_SELECT, how) };
            (result != ACLCHECK_OK).then(|| detail.to_string())
        }
        Some(columns) => columns
            .iter()
            .find(|&&a| {
                // SAFETY: a privilege check by OIDs and attribute number in the catalog.
                let result =
                    unsafe { pg_sys::pg_attribute_aclcheck(relid, a, user, pg_sys::ACL_SELECT) };
                result != ACLCHECK_OK
            })
            .map(|&a| {
                format!(
                    "The query reads column {} of the table, which this role may not read.",
                    crate::ffi::relation::column_name(relid, a)
                )
            }),
    };
    if let Some(detail) = refused {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", relation_name(relid)),
        )
        .detail(detail)
        .raise();
    }
    // SAFETY: whether row-level security applies to the current user, by OID in the catalog.
    let rls = unsafe { pg_sys::check_enable_rls(relid, check_as, false) };
    if rls == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32 && rls_user != user {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "table {} has row-level security, which gsnap applies to snapshots only in \
                 scans of gsnap_asof, gsnap_range, gsnap_versions and gsnap_diff in FROM",
                relation_name(relid)
            ),
        )
        .detail(
            "This query reads the table through a function scan (a reader WITH ORDINALITY, in a \
             LATERAL call or outside FROM), which has no place to apply the policies.",
        )
        .hint(
            "Read gsnap_asof(...), gsnap_range(...) or gsnap_diff(...) in FROM; the table owner, or a role \
             with BYPASSRLS, can read all of its snapshots.",
        )
        .raise();
    }
}

/// The role whose privileges are checked: `check_as` (a range-table entry's `checkAsUser`)
/// if set, else the current user, as PostgreSQL's executor chooses.
pub fn effective_user(check_as: pg_sys::Oid) -> pg_sys::Oid {
    if check_as == pg_sys::InvalidOid {
        // SAFETY: the current user's id, set for every session.
        unsafe { pg_sys::GetUserId() }
    } else {
        check_as
    }
}
