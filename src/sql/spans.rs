//! Introspection of the current span: which pages gsnap will capture at the next snapshot.

use crate::error::error;
use crate::ffi::regclass::RegClass;
use crate::ffi::relation::relation_kind;
use crate::shmem::dirty_sets;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The OID of the relation `rel` names, which must exist (a table of another access method
/// records nothing: its answer is empty).
fn existing_relation(rel: RegClass) -> u32 {
    crate::require_preloaded();
    if relation_kind(rel.0).is_none() {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} does not exist", rel.0.to_u32()),
        )
        .raise();
    }
    rel.0.to_u32()
}

/// The distinct blocks of `rel` written since the current span began (the pages the next
/// snapshot will capture), in block order.
#[pg_extern(volatile, parallel_safe)]
fn gsnap_written_blocks(rel: RegClass) -> SetOfIterator<'static, i64> {
    let (blocks, _) = dirty_sets().current_for(existing_relation(rel));
    SetOfIterator::new(blocks.into_iter().map(i64::from))
}

/// True if the next snapshot must capture `rel` completely (its storage was replaced, or the
/// dirty set overflowed).
#[pg_extern(volatile, parallel_safe)]
fn gsnap_full_capture_pending(rel: RegClass) -> bool {
    dirty_sets().current_for(existing_relation(rel)).1
}
