//! The SQL functions of gsnap.

mod access;
mod asof;
mod custom_scan;
mod decode;
mod deps;
mod index;
mod regclass;
mod scan;
mod sets;
mod snapshots;
mod spans;

pub use access::require_gsnap_database;

/// Installs the planner hooks (the AS OF and range custom scans, and the dependencies of
/// queries over snapshots on their tables); called from `_PG_init`.
pub fn init_planner_hooks() {
    deps::init();
    custom_scan::init();
}
