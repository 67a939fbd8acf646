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

/// The bases of a capture's deltas (`Capture::base_image`) come from the memory of the images
/// the last committed captures stored (`recent.rs`) when it holds them, and are the same bytes
/// either way: what a committed capture stored is taken from memory (once), what an aborted
/// one stored is never kept, an image the budget left out is read from the store, and an
/// image not taken stays for later captures.
#[test]
fn the_bases_of_deltas_come_from_the_last_committed_captures() {
    let open = |budget: usize| {
        let options = StoreOptions {
            recent_image_cache_bytes: budget,
            ..StoreOptions::new(7)
        };
        SnapshotStore::open(MemBackend::new(), options).unwrap()
    };
    // Room for two of the three images of the first capture (records of a few hundred
    // bytes), and none at all.
    let record = {
        let s = open(0);
        let (_, decl) = setup(&s, 1, 1);
        let mut c = s.declare_and_begin(decl).unwrap();
        c.put_image(&view(1, 600), &[]).unwrap();
        let bytes = c.stats().image_bytes_stored as usize;
        c.abort("sizing").unwrap();
        bytes
    };
    for budget in [2 * record + record / 2, 0] {
        let cached = usize::from(budget > 0);
        let store = open(budget);
        let (rels, decl) = setup(&store, 1, 3);
        let row_type = decl.relations[0].row_type;
        let mut c = store.declare_and_begin(decl).unwrap();
        let first: Vec<ImageId> = (0..3)
            .map(|b| {
                let id = c.put_image(&view(10 + b, 600), &[]).unwrap();
                c.add_mapping(page_key(rels[0], b as u32), id).unwrap();
                id
            })
            .collect();
        // Before the commit nothing is kept.
        assert_eq!(store.recent_image_cache_stats(), (0, 0, 0));
        c.commit().unwrap();
        assert_eq!(store.recent_image_cache_stats().0, 2 * cached);

        // An aborted capture leaves what the committed one stored, and adds nothing.
        let mut c = store
            .declare_and_begin(decl_for(&rels, 3, row_type, 2))
            .unwrap();
        let lost = c.put_image(&view(20, 600), &[]).unwrap();
        c.abort("test").unwrap();
        assert_eq!(store.recent_image_cache_stats().0, 2 * cached);

        // Blocks 0 and 2 change: their bases are taken (block 2's was left out by the budget).
        let mut c = store
            .declare_and_begin(decl_for(&rels, 3, row_type, 3))
            .unwrap();
        for b in [0, 2] {
            let want = view(10 + b as u64, 600);
            assert_eq!(c.base_image(first[b]).unwrap(), want, "image of block {b}");
            // Taken once: a second page with the same base reads it from the store.
            assert_eq!(c.base_image(first[b]).unwrap(), want);
        }
        assert_eq!(store.recent_image_cache_stats().2, cached as u64);
        assert!(
            c.base_image(lost).is_err(),
            "the aborted capture's image is gone"
        );
        let second = c.put_image(&view(30, 600), &[]).unwrap();
        c.add_mapping(page_key(rels[0], 0), second).unwrap();
        c.commit().unwrap();
        // Block 1's image (not taken) and the new one are held.
        assert_eq!(store.recent_image_cache_stats().0, 2 * cached);
        let mut c = store
            .declare_and_begin(decl_for(&rels, 3, row_type, 4))
            .unwrap();
        assert_eq!(c.base_image(second).unwrap(), view(30, 600));
        assert_eq!(c.base_image(first[1]).unwrap(), view(11, 600));
        assert_eq!(c.base_image(first[2]).unwrap(), view(12, 600));
        assert_eq!(store.recent_image_cache_stats(), (0, 0, 3 * cached as u64));
        c.commit().unwrap();
        check_invariants(&store);
    }
}

/// With `keep_recent_images(false)` (the worker's `gsnap.page_deltas = off`) what was held is
/// forgotten and a capture keeps nothing; on again, the next commit keeps its images.
#[test]
fn recent_images_are_kept_only_while_asked() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 1, 2);
    let row_type = decl.relations[0].row_type;
    let mut c = store.declare_and_begin(decl).unwrap();
    let a = c.put_image(&view(1, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 0), a).unwrap();
    c.commit().unwrap();
    assert_eq!(store.recent_image_cache_stats().0, 1);
    store.keep_recent_images(false);
    assert_eq!(store.recent_image_cache_stats().0, 0);
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 2))
        .unwrap();
    let b = c.put_image(&view(2, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 1), b).unwrap();
    assert_eq!(
        c.base_image(a).unwrap(),
        view(1, 600),
        "read from the store"
    );
    c.commit().unwrap();
    assert_eq!(store.recent_image_cache_stats(), (0, 0, 0));
    store.keep_recent_images(true);
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 3))
        .unwrap();
    let x = c.put_image(&view(3, 600), &[]).unwrap();
    c.add_mapping(page_key(rels[0], 1), x).unwrap();
    c.commit().unwrap();
    assert_eq!(store.recent_image_cache_stats().0, 1);
    check_invariants(&store);
}
