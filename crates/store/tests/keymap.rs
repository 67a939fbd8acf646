//! Key maps (`keymap.rs`): entries recorded with a capture are found by hash, the record
//! becomes visible only with the commit, the wildcard is a candidate for every key, and every
//! entry leaves the store with its image: when reclamation frees it, and when an aborted
//! capture's content is removed.

mod common;

use common::{decl_for, page_key, setup, view};
use gsnap_store::keys::Cf;
use gsnap_store::*;

fn entries<B: KvBackend>(store: &SnapshotStore<B>) -> usize {
    Scan::prefix(store.backend(), Cf::Keys, &[])
        .unwrap()
        .count()
}

fn reclaim_all<B: KvBackend>(store: &SnapshotStore<B>) {
    while let Some(mut job) = store.reclaim_next(&|_| true).unwrap() {
        while !store.reclaim_step(&mut job, 3, &|_| false).unwrap() {}
    }
}

#[test]
fn keys_are_found_by_hash_and_the_map_starts_with_its_commit() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 1, 3);
    let rel = rels[0];
    let mut c = store.declare_and_begin(decl.clone()).unwrap();
    let snap = c.snapshot();
    let a = c.put_image(&view(1, 300), &[]).unwrap();
    let b = c.put_image(&view(2, 300), &[]).unwrap();
    c.add_mapping(page_key(rel, 0), a).unwrap();
    c.add_mapping(page_key(rel, 1), b).unwrap();
    c.add_keys(page_key(rel, 0), a, snap, &[10, 11]).unwrap();
    c.add_keys(page_key(rel, 1), b, snap, &[11, WILDCARD_KEY])
        .unwrap();
    c.start_key_map(rel, b"id int4").unwrap();
    assert_eq!(
        store.key_map(rel).unwrap(),
        None,
        "visible before the commit"
    );
    assert!(c.start_key_map(RelId(999), b"x").is_err());
    c.commit().unwrap();
    let map = store.key_map(rel).unwrap().unwrap();
    assert_eq!(
        (map.start, map.definition.as_slice()),
        (snap, &b"id int4"[..])
    );
    // 10 is in block 0 only, but block 1 holds a row whose key could not be hashed.
    assert_eq!(
        store.key_candidates(rel, &[10]).unwrap(),
        vec![(0, a), (1, b)]
    );
    assert_eq!(
        store.key_candidates(rel, &[11]).unwrap(),
        vec![(0, a), (1, b)]
    );
    assert_eq!(store.key_candidates(rel, &[12]).unwrap(), vec![(1, b)]);
    // Another relation's entries are not candidates.
    assert_eq!(
        store.key_candidates(RelId(rel.0 + 1), &[10]).unwrap(),
        vec![]
    );

    // Ending the map removes the record at the next commit; the entries stay with their images.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 3, decl.relations[0].row_type, 2))
        .unwrap();
    c.end_key_map(rel).unwrap();
    c.commit().unwrap();
    assert_eq!(store.key_map(rel).unwrap(), None);
    assert_eq!(
        store.key_candidates(rel, &[10]).unwrap(),
        vec![(0, a), (1, b)]
    );
}

#[test]
fn entries_leave_with_their_images() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 2, 2);
    let (rel, other) = (rels[0], rels[1]);
    let row_type = decl.relations[0].row_type;
    let mut c = store.declare_and_begin(decl).unwrap();
    let s1 = c.snapshot();
    // The same image at the same block of two tables (a copy of a table).
    let a = c.put_image(&view(1, 300), &[]).unwrap();
    for r in [rel, other] {
        c.add_mapping(page_key(r, 0), a).unwrap();
        c.add_keys(page_key(r, 0), a, s1, &[1, 2, 3]).unwrap();
        c.start_key_map(r, b"k").unwrap();
    }
    c.commit().unwrap();
    // Snapshot 2 maps both blocks 0 to a new image: the old one dies when snapshot 1 is
    // reclaimed. The new image also at another block, recorded by another key map.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 2))
        .unwrap();
    let b = c.put_image(&view(2, 300), &[]).unwrap();
    for r in [rel, other] {
        c.add_mapping(page_key(r, 0), b).unwrap();
        c.add_keys(page_key(r, 0), b, s1, &[3, 4]).unwrap();
    }
    c.add_keys(page_key(rel, 1), b, SnapId(s1.0 + 1), &[5])
        .unwrap();
    c.commit().unwrap();
    assert_eq!(entries(&store), 2 * (3 + 1) + 2 * (2 + 1) + (1 + 1));
    assert_eq!(
        store.key_candidates(rel, &[3]).unwrap(),
        vec![(0, a), (0, b)]
    );
    // A third capture stores an image with keys and is aborted: its entries go with it.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 3))
        .unwrap();
    let x = c.put_image(&view(3, 300), &[]).unwrap();
    c.add_keys(page_key(rel, 1), x, s1, &[9]).unwrap();
    c.abort("test").unwrap();
    assert_eq!(store.key_candidates(rel, &[9]).unwrap(), vec![]);
    assert_eq!(entries(&store), 16);
    store.delete_snapshot(s1).unwrap();
    reclaim_all(&store);
    for r in [rel, other] {
        assert_eq!(store.key_candidates(r, &[1, 2, 3]).unwrap(), vec![(0, b)]);
    }
    assert_eq!(
        entries(&store),
        2 * (2 + 1) + (1 + 1),
        "the entries of image {a} are left"
    );
}
