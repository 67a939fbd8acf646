//! gsnap's shared-memory data structures, built over plain atomics and bytes.
//!
//! Nothing here knows PostgreSQL: the extension places these structures in its shared-memory
//! segment and the unit tests place them in ordinary vectors (the neon-shmem approach). Each
//! structure documents which process may call which operation.

pub mod cache;
pub mod dirty;
pub mod requests;
