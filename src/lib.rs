//! gsnap: a PostgreSQL extension that keeps many long-lived, transactionally consistent,
//! page-level snapshots of chosen tables and answers queries over them.
//!
//! This crate is the only code that talks to PostgreSQL (docs/design.md): `am` is the table
//! access method, `shmem` the shared memory, `worker` the background worker (declare, capture,
//! serve), `ipc` how backends talk to it, `plan` and `exec` the planner and executor sides of
//! the custom scans, `read` the readers over snapshots, `sql` the SQL functions, `ffi` the
//! narrow helpers over PostgreSQL's C API, `gucs` the settings. The algorithms and formats
//! live in the pure crates under `crates/`.

mod am;
mod error;
mod exec;
mod ffi;
mod gucs;
mod ipc;
mod keymap;
mod locks;
mod plan;
mod read;
mod shmem;
mod sql;
mod worker;

use pgrx::prelude::*;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::sync::atomic::{AtomicBool, Ordering};

::pgrx::pg_module_magic!(name, version);

/// Set when the library was loaded by `shared_preload_libraries` (inherited by every child
/// of the postmaster).
static PRELOADED: AtomicBool = AtomicBool::new(false);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: reading a PostgreSQL global from the main thread.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        // Loaded late (CREATE EXTENSION or LOAD without preloading): define nothing, so the
        // first use can raise the error that says how to fix it (require_preloaded).
        return;
    }
    error::keep_backtraces_out_of_errors();
    gucs::init();
    PRELOADED.store(true, Ordering::Release);
    shmem::init();
    worker::register();
    plan::init();
    exec::init();
}

/// Raises a clear ERROR unless gsnap was loaded through `shared_preload_libraries`.
pub(crate) fn require_preloaded() {
    if !PRELOADED.load(Ordering::Acquire) {
        error::error(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "gsnap must be loaded via shared_preload_libraries",
        )
        .detail("gsnap needs shared memory and a background worker, which only a library loaded at server start can have.")
        .hint("Add 'gsnap' to shared_preload_libraries in postgresql.conf and restart the server.")
        .raise();
    }
}

/// Fails CREATE EXTENSION early (with the fix in the hint) when gsnap is not preloaded.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_preload_check() -> bool {
    require_preloaded();
    sql::access::require_gsnap_database();
    true
}

extension_sql!(
    "SELECT gsnap_preload_check();\n",
    name = "gsnap_preload_check_call",
    requires = [gsnap_preload_check],
);
