//! The SQL functions of gsnap.

mod spans;
