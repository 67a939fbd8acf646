//! The `gsnap` table access method: PostgreSQL's heap with its write callbacks wrapped.
//!
//! Reads are heap's, untouched. Every callback that changes a page records the page in the
//! current span's dirty set *after* heap has changed it, inside the writing transaction
//! (see `writes.rs`); callbacks that replace a relation's storage mark it for a full capture
//! (see `rewrites.rs`). Two heap paths check that the relation's routine is heap's own and
//! are run with heap's routine swapped in (see `heap_scans.rs`).
//!
//! The routine is a copy of heap's, made once per process and kept in a static: relcache
//! entries point at it for the life of the process, so it must never be palloc'd.

mod heap_scans;
pub mod load;
mod rewrites;
mod writes;

pub(crate) use writes::tid_block;

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::sync::OnceLock;

/// A `TableAmRoutine` we can keep in a static: it only holds function pointers and a tag.
struct Routine(pg_sys::TableAmRoutine);

// SAFETY: the routine is immutable after construction and contains only `extern fn` pointers
// and an integer tag; PostgreSQL reads it from one thread per process.
unsafe impl Sync for Routine {}
// SAFETY: as above, nothing in it is tied to a thread.
unsafe impl Send for Routine {}

static ROUTINE: OnceLock<Routine> = OnceLock::new();

/// Heap's own routine (a static inside PostgreSQL).
pub(crate) fn heap_routine() -> &'static pg_sys::TableAmRoutine {
    // SAFETY: GetHeapamTableAmRoutine returns a pointer to heap's static routine, valid for
    // the life of the process.
    unsafe { &*pg_sys::GetHeapamTableAmRoutine() }
}

/// True if `rel` (an open relation) is a gsnap table: its pages are heap's, its writes are
/// recorded.
///
/// # Safety
/// `rel` is an open relation.
pub(crate) unsafe fn is_gsnap(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's promise.
    std::ptr::eq(unsafe { (*rel).rd_tableam }, gsnap_routine())
}

fn gsnap_routine() -> &'static pg_sys::TableAmRoutine {
    &ROUTINE
        .get_or_init(|| {
            let mut r = *heap_routine();
            writes::install(&mut r);
            rewrites::install(&mut r);
            heap_scans::install(&mut r);
            r.relation_toast_am = Some(relation_toast_am);
            Routine(r)
        })
        .0
}

/// TOAST tables of gsnap tables are plain heap tables: a snapshot copies out-of-line values
/// into its own store at capture time, so it never depends on TOAST chunks (docs/design.md, image).
#[pg_guard]
unsafe extern "C-unwind" fn relation_toast_am(_rel: pg_sys::Relation) -> pg_sys::Oid {
    pg_sys::HEAP_TABLE_AM_OID
}

crate::v1_function_info!(pg_finfo_gsnap_tableam_handler);

/// The handler behind `CREATE ACCESS METHOD gsnap TYPE TABLE HANDLER gsnap_tableam_handler`.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gsnap_tableam_handler(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    crate::require_preloaded();
    pg_sys::Datum::from(gsnap_routine() as *const pg_sys::TableAmRoutine)
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_tableam_handler(internal) RETURNS table_am_handler
    AS 'MODULE_PATHNAME', 'gsnap_tableam_handler' LANGUAGE C STRICT;
COMMENT ON FUNCTION gsnap_tableam_handler(internal) IS 'table access method handler of gsnap';
CREATE ACCESS METHOD gsnap TYPE TABLE HANDLER gsnap_tableam_handler;
COMMENT ON ACCESS METHOD gsnap IS 'heap storage whose pages gsnap snapshots';
"#,
    name = "gsnap_access_method",
    requires = ["gsnap_preload_check_call"],
);
