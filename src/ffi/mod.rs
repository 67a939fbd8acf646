//! The narrow edge to PostgreSQL's C API: small safe or clearly-unsafe helpers for what the
//! rest of the extension would otherwise write by hand many times (List iteration, memory
//! context switches, relations held open, V1 function arguments and results, `regclass`
//! arguments, nodes built in Rust, tuple descriptors, tuples and slots, expressions evaluated
//! in the executor, catalog scans and type I/O functions).
//!
//! Rules kept here: an `unsafe fn` says in `# Safety` what its caller promises; a safe
//! function never dereferences a pointer it was given; every `unsafe` block is a few lines
//! with a `SAFETY:` comment saying why that call is sound.

pub mod catalog;
pub mod expr;
pub mod fcinfo;
pub mod latch;
pub mod list;
pub mod memcx;
pub mod node;
pub mod regclass;
pub mod relation;
pub mod settings;
pub mod tuple;

/// What `#[pg_guard]` on an `extern` block expands to call (it names `crate::ffi`, pgrx's own
/// module of that name): see `catalog::partitioning`.
#[doc(hidden)]
pub use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
