//! Heap's storage-replacing callbacks, wrapped so each marks its relation for a full capture.
//!
//! TRUNCATE, VACUUM FULL, CLUSTER, ALTER TABLE ... SET TABLESPACE and the first storage of a
//! new table give the relation new files; the page-by-page dirty set cannot describe that, so
//! the next snapshot captures the relation completely. (A rewriting ALTER TABLE copies rows
//! through `tuple_insert` into a transient table and swaps the files without calling any of
//! these on the original relation: the capture notices the changed relfilenode instead.)

use crate::shmem::mark_full_capture;
use pgrx::pg_guard;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::pg_sys::{self, MultiXactId, RelFileNode, Relation, TransactionId};

use super::heap_routine;

pub(super) fn install(r: &mut pg_sys::TableAmRoutine) {
    r.relation_set_new_filenode = Some(relation_set_new_filenode);
    r.relation_nontransactional_truncate = Some(relation_nontransactional_truncate);
    r.relation_copy_data = Some(relation_copy_data);
    r.relation_copy_for_cluster = Some(relation_copy_for_cluster);
}

#[pg_guard]
unsafe extern "C-unwind" fn relation_set_new_filenode(
    rel: Relation,
    newrnode: *const RelFileNode,
    persistence: std::ffi::c_char,
    freeze_xid: *mut TransactionId,
    minmulti: *mut MultiXactId,
) {
    crate::require_preloaded();
    if persistence as u8 != pg_sys::RELPERSISTENCE_TEMP {
        crate::sql::access::require_gsnap_database();
    }
    let heap = heap_routine()
        .relation_set_new_filenode
        .expect("heap has relation_set_new_filenode");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback.
    unsafe {
        pg_guard_ffi_boundary(|| heap(rel, newrnode, persistence, freeze_xid, minmulti));
    }
    // SAFETY: PostgreSQL's open relation.
    unsafe { mark_full_capture(rel) };
}

#[pg_guard]
unsafe extern "C-unwind" fn relation_nontransactional_truncate(rel: Relation) {
    let heap = heap_routine()
        .relation_nontransactional_truncate
        .expect("heap has relation_nontransactional_truncate");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback.
    unsafe { pg_guard_ffi_boundary(|| heap(rel)) };
    // SAFETY: PostgreSQL's open relation.
    unsafe { mark_full_capture(rel) };
}

#[pg_guard]
unsafe extern "C-unwind" fn relation_copy_data(rel: Relation, newrnode: *const RelFileNode) {
    let heap = heap_routine()
        .relation_copy_data
        .expect("heap has relation_copy_data");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback.
    unsafe { pg_guard_ffi_boundary(|| heap(rel, newrnode)) };
    // SAFETY: PostgreSQL's open relation.
    unsafe { mark_full_capture(rel) };
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn relation_copy_for_cluster(
    old_table: Relation,
    new_table: Relation,
    old_index: Relation,
    use_sort: bool,
    oldest_xmin: TransactionId,
    xid_cutoff: *mut TransactionId,
    multi_cutoff: *mut MultiXactId,
    num_tuples: *mut f64,
    tups_vacuumed: *mut f64,
    tups_recently_dead: *mut f64,
) {
    let heap = heap_routine()
        .relation_copy_for_cluster
        .expect("heap has relation_copy_for_cluster");
    // SAFETY: PostgreSQL's arguments forwarded to heap's callback.
    unsafe {
        pg_guard_ffi_boundary(|| {
            heap(
                old_table,
                new_table,
                old_index,
                use_sort,
                oldest_xmin,
                xid_cutoff,
                multi_cutoff,
                num_tuples,
                tups_vacuumed,
                tups_recently_dead,
            )
        });
    }
    // The files of `new_table` become `old_table`'s when the command finishes.
    // SAFETY: PostgreSQL's open relation.
    unsafe { mark_full_capture(old_table) };
}
