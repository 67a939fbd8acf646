//! The SQL functions of gsnap.

mod access;
mod asof;
mod custom_scan;
mod decode;
mod index;
mod scan;
mod sets;
mod snapshots;
mod spans;

pub use access::require_gsnap_database;
pub use custom_scan::init as init_custom_scan;
