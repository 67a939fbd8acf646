//! The SQL functions of gsnap.

mod access;
mod asof;
mod decode;
mod index;
mod scan;
mod sets;
mod snapshots;
mod spans;

pub use access::require_gsnap_database;
