//! The baselines of the GSnap paper's evaluation, behind `SnapshotIndex`, built from the same
//! radix nodes as GSnap so that memory and lookup time compare like with like:
//! - `TIndex` (traditional RoW): each snapshot's tree holds only its own mappings and points
//!   to its predecessor; a lookup walks the chain back until a tree has the page;
//! - `OIndex` (optimized RoW, as in Amazon EBS): every snapshot has a complete tree, copied
//!   from its predecessor; no sharing, no chain.

mod oindex;
mod tindex;

pub use oindex::OIndex;
pub use tindex::TIndex;
