//! The Skippy mapping log: the durable truth from which any page table can be rebuilt
//! (Skippy, Shaull, Shrira and Xu).
//!
//! Level 0 is the mapping log in snapshot order (its invariant, I_mapLog: every mapping of v
//! is written before any mapping of v+1), cut into nodes of `node_size` mappings. Level l+1 is
//! the concatenation, over the sealed nodes of level l in order, of each node's
//! first-encountered mappings (FEMs): the mappings a scan meets first, one per page. Every
//! level is cut into nodes of `node_size` the same way; level `height` is the top.
//!
//! Orientation. gsnap's page table is SPT(v) = the *latest* mapping at or before v of each
//! page, so a scan for SPT(v) runs *backwards* from the last mapping of v, and a node's FEM of
//! a page is its newest mapping in the node. The links follow: a node of level l < height
//! carries an *uplink*, the position in level l+1 where its own FEM segment begins, which is
//! exactly where the FEMs of all older nodes end; the top level's nodes carry an *in-link* to
//! the next older node of the same level.
//!
//! Building SPT(v): scan level 0 backwards from the end of v's mappings to the start of that
//! node, follow its uplink and scan level 1 backwards from there to the start of that node,
//! and so on up to the top level, where the in-links lead back to the log's start (or until
//! the caller's expected page count is found). Each page's first encounter is its newest
//! mapping at or before v: at level l+1, positions before the uplink summarize exactly the
//! level-l nodes older than the one just scanned, and within one page the order of positions
//! follows the order of the mappings at every level. Hot pages, repeated many times in level
//! 0, appear once per node above, which is what the scan skips.

mod log;
mod node;
mod store;

pub use log::{BuildStats, SkippyConfig, SkippyLog, StopWhen};
pub use node::LogNode;
pub use store::{LogStore, MemoryLogStore};
