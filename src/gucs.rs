//! Every gsnap setting, in one place. Each is a GUC named `gsnap.*`.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

/// Pages one span's dirty set can hold before a relation falls back to a full capture.
pub static MAX_DIRTY_PAGES: GucSetting<i32> = GucSetting::<i32>::new(1 << 20);

/// The database whose gsnap tables are snapshotted (the worker connects to it).
pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// Registers the settings; called from `_PG_init`.
pub fn init() {
    GucRegistry::define_string_guc(
        c"gsnap.database",
        c"The database in which gsnap tables can be created and snapshotted.",
        c"gsnap's background worker connects to this database. gsnap tables in any other \
          database are refused.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.max_dirty_pages",
        c"Pages a span's dirty set can record before falling back to full captures.",
        c"Each gsnap write records its page in the dirty set of the current span (8 bytes per \
          page, two sets). When a set is full, the relation of a page that does not fit is \
          captured completely at the next snapshot instead: correct, but slower. Raise it if \
          the log reports dirty-set overflows.",
        &MAX_DIRTY_PAGES,
        1024,
        1 << 28,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    // SAFETY: called from _PG_init on the main thread.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"gsnap".as_ptr()) };
}
