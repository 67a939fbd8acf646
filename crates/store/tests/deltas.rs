//! Deltas of images (`Capture::put_delta`, `SnapshotStore::deltas`): stored only for an image
//! the capture stored, at most one per image, read back byte for byte, and gone with the image
//! (a capture that aborts, a reclamation that frees the image; a crash at every write:
//! `crash.rs`, whose captures store deltas).

mod common;

use common::{check_invariants, decl_for, page_key, setup, view};
use gsnap_store::*;

fn delta_of<B: KvBackend>(store: &SnapshotStore<B>, id: ImageId) -> Option<Vec<u8>> {
    store.deltas(&[id]).unwrap().pop().unwrap().map(|r| {
        let mut out = vec![0; r.len()];
        r.decode_into(&mut out, true).unwrap();
        out
    })
}

#[test]
fn deltas_are_kept_with_their_image_and_go_with_it() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 1, 2);
    let row_type = decl.relations[0].row_type;
    let mut c = store.declare_and_begin(decl).unwrap();
    let s1 = c.snapshot();
    let a = c.put_image(&view(1, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 0), a).unwrap();
    c.put_delta(a, b"first").unwrap();
    c.commit().unwrap();
    assert_eq!(delta_of(&store, a).as_deref(), Some(&b"first"[..]));

    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 2))
        .unwrap();
    let s2 = c.snapshot();
    // An older image gets no delta: it may be another page's content, with another base.
    assert!(c.put_delta(a, b"x").is_err());
    let b = c.put_image(&view(2, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 0), b).unwrap();
    c.put_delta(b, b"from a").unwrap();
    // A second page reaching the same content from another base keeps the first delta.
    c.add_mapping(page_key(rels[0], 1), b).unwrap();
    c.put_delta(b, b"from elsewhere").unwrap();
    assert_eq!(c.deltas(), 1);
    c.commit().unwrap();
    assert_eq!(delta_of(&store, b).as_deref(), Some(&b"from a"[..]));
    check_invariants(&store);

    // An aborted capture's deltas go with its images.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 3))
        .unwrap();
    let x = c.put_image(&view(3, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 0), x).unwrap();
    c.put_delta(x, b"aborted").unwrap();
    c.abort("test").unwrap();
    assert_eq!(delta_of(&store, x), None);
    check_invariants(&store);

    // Deleting s1 and reclaiming it frees image a (only s1 maps it): its delta goes too;
    // b's stays.
    store.delete_snapshot(s1).unwrap();
    while let Some(mut job) = store.reclaim_next(&|_| true).unwrap() {
        while !store.reclaim_step(&mut job, 100, &|_| false).unwrap() {}
    }
    assert!(store.image(a).is_err());
    assert_eq!(delta_of(&store, a), None);
    assert_eq!(delta_of(&store, b).as_deref(), Some(&b"from a"[..]));
    let _ = s2;

    // A delta whose image is not stored (a build before deltas freed the image) is a leak
    // that verification reports and repair deletes.
    let mut batch = WriteBatch::new();
    batch.put(keys::Cf::Deltas, &keys::delta_key(a), b"orphan");
    store.backend().write(&batch, true).unwrap();
    let r = store.verify(false, &|_| false).unwrap();
    assert_eq!((r.leaked_deltas, r.leaked_bytes), (1, 6));
    assert_eq!(store.verify(true, &|_| false).unwrap().leaked_deltas, 1);
    assert_eq!(store.verify(false, &|_| false).unwrap().leaked_deltas, 0);
    assert_eq!(delta_of(&store, b).as_deref(), Some(&b"from a"[..]));
}
