//! Introspection of the current span: which pages gsnap will capture at the next snapshot.

use crate::shmem::dirty_sets;
use pgrx::prelude::*;
use pgrx::PgRelation;

/// The distinct blocks of `rel` written since the current span began (the pages the next
/// snapshot will capture), in block order.
#[pg_extern(volatile, parallel_safe)]
fn gsnap_written_blocks(rel: PgRelation) -> SetOfIterator<'static, i64> {
    let (blocks, _) = dirty_sets().current_for(rel.oid().to_u32());
    SetOfIterator::new(blocks.into_iter().map(i64::from))
}

/// True if the next snapshot must capture `rel` completely (its storage was replaced, or the
/// dirty set overflowed).
#[pg_extern(volatile, parallel_safe)]
fn gsnap_full_capture_pending(rel: PgRelation) -> bool {
    dirty_sets().current_for(rel.oid().to_u32()).1
}
