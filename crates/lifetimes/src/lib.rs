//! gsnap's snapshot lifetimes, in pure Rust: retention policies, ranks, keep/delete
//! decisions and the size cap. No PostgreSQL, no I/O, no clock: the caller passes the
//! snapshots and gets decisions back, so `gsnap_retention_preview` and the worker call the
//! same function on the same input and cannot disagree.
//!
//! - `calendar`: UTC calendar arithmetic and each level's buckets (minute, hour, day, ISO
//!   week, month, year);
//! - `level`: levels, ranks, eager ranks at declaration, lazy raises (Thresher's rank-tree);
//! - `duration`, `policy`, `error`: the policy language
//!   (`within=2h hourly=48 daily=30 ...`), its canonical form and its one error type;
//! - `decide`: keep or delete, and the rule that decided;
//! - `cap`: thinning under a size cap, lowest ranks first;
//! - `deletion`: what an explicit deletion would touch (newest, every snapshot, pins).
//!
//! The model in one paragraph: a bucket (one day, one month...) is represented by its
//! *members*, the snapshots whose rank includes its level. A snapshot's eager rank is the
//! highest level whose boundary it is the first to cross, computed once when it is declared
//! and stored; a user may raise it. A policy keeps the members of the `N` most recent
//! buckets of each level that hold one, everything within a window of the newest snapshot,
//! the pinned ones and the newest `min_snapshots`. See `README.md` for a worked example.

#![forbid(unsafe_code)]

mod calendar;
mod cap;
mod decide;
mod deletion;
mod duration;
mod error;
mod level;
mod policy;

pub use calendar::{
    utc_timestamp_us, Bucket, US_PER_DAY, US_PER_HOUR, US_PER_MINUTE, US_PER_SECOND,
};
pub use cap::{thin_to_cap, Thinning};
pub use decide::{decide, Decision, Rule, SnapshotInfo};
pub use deletion::{check_deletion, newest_snapshot, DeletionCheck};
pub use duration::{format_seconds, MAX_SECONDS};
pub use error::{DurationProblem, PolicyError, PolicyProblem};
pub use level::{eager_ranks, levels_at_declaration, rank_at_declaration, Level, LevelSet, Rank};
pub use policy::{Keep, Policy};
