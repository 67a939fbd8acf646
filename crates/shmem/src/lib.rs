//! gsnap's shared-memory data structures, built over plain atomics and bytes.
//!
//! Nothing here knows PostgreSQL: the extension places these structures in its shared-memory
//! segment and the unit tests place them in ordinary vectors (the neon-shmem approach). Each
//! structure documents which process may call which operation. [`carry`] is the worker's
//! private bookkeeping of what the dirty sets handed it, kept next to them.

pub mod blocks;
pub mod cache;
pub mod carry;
pub mod dirty;
pub mod requests;
