//! The planner side of queries over snapshots.
//!
//! - `deps`: every query calling a reader depends on its table and locks it (issue 11);
//! - `paths`: `FROM gsnap_asof(NULL::t, ...)` and `FROM gsnap_range(...)` become custom scan
//!   paths instead of function scans;
//! - `nodes`: the custom scan plan nodes built from those paths, and what their private
//!   lists hold;
//! - `aggregates`: `GROUP BY snap_id` over a range computed from its versions;
//! - `as_of`: `SET gsnap.as_of`: every gsnap table the session reads, read at a snapshot.
//!
//! The executor side of the scans is `crate::exec`; what they read, `crate::read`.

mod aggregates;
pub mod as_of;
pub mod deps;
mod fields;
pub mod nodes;
mod paths;
pub(crate) mod security;

pub use aggregates::AggKind;

/// Installs the planner hooks; called from `_PG_init`.
pub fn init() {
    as_of::init();
    deps::init();
    nodes::register();
    paths::init();
    aggregates::init();
}
