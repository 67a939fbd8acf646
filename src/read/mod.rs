//! Reading snapshots, below SQL and the executor: what a snapshot holds of a table
//! (`table`), the pins on index groups and page images (`pins`), one snapshot's pages in
//! block order (`pages`, shared out between a parallel scan's participants), tuples back
//! into rows of today's row type (`decode`, `toast`), and the readers: one snapshot row by
//! row (`asof`), a range of snapshots row version by row version (`range`), a table as a
//! snapshot recorded it, without the live relation (`recorded`: dropped tables), every
//! distinct version of a range once with its run of snapshots (`versions`, over `range`),
//! and the difference between two snapshots (`diff`).
//!
//! The decisions these make that need no PostgreSQL (the column plan, the heap tuple layout,
//! the diff's merge and moved-row cancellation, row version matching) are pure code in
//! `gsnap_format`; the walks over page tables are `gsnap_core`.

pub mod asof;
pub mod by_key;
mod decode;
pub use decode::current_columns;
pub mod diff;
mod pages;
pub mod partitioned;
mod pins;
pub mod range;
pub mod recorded;
mod table;
mod toast;
pub mod versions;

pub use pages::SharedBlocks;
pub use range::SharedRange;
