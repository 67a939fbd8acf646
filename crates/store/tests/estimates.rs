//! Estimates of what deleting a snapshot would free, kept in the store (`estimates.rs`): read
//! back after reopening while they hold, forgotten in the batch that changes a count they
//! read (a reclamation step, a commit sharing older content, a repair), never kept if such a
//! batch came after they were computed, and not read back for a snapshot whose neighbours
//! changed. The seeded model in `reclaim.rs` checks the same invariant (a kept estimate is
//! what `would_free` says now) over random workloads.

mod common;

use common::{check_kept_estimates, keep_estimates, page_key, setup};
use gsnap_store::keys::{self, Cf};
use gsnap_store::*;

fn options() -> StoreOptions {
    StoreOptions {
        max_batch_bytes: 1500,
        id_lease: 6,
        ..StoreOptions::new(0xE571)
    }
}

/// Commits a snapshot mapping each page to a new image of the given content.
fn commit<B: KvBackend>(
    store: &SnapshotStore<B>,
    decl: &SnapshotDecl,
    pages: &[(PageKey, &[u8])],
) -> SnapId {
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    for (page, content) in pages {
        let image = cap.put_image(content, &[]).unwrap();
        cap.add_mapping(*page, image).unwrap();
    }
    cap.commit().unwrap().id
}

#[test]
fn kept_estimates_are_read_back_after_reopening_until_a_count_they_read_changes() {
    let mem = MemBackend::new();
    let store = SnapshotStore::open(mem.clone(), options()).unwrap();
    let (rels, decl) = setup(&store, 1, 4);
    let (p0, p1) = (page_key(rels[0], 0), page_key(rels[0], 1));
    let s1 = commit(&store, &decl, &[(p0, b"a"), (p1, b"b")]);
    let s2 = commit(&store, &decl, &[(p0, b"c"), (p1, b"c2")]);
    let s3 = commit(&store, &decl, &[(p0, b"d"), (p1, b"d2")]);
    // The newest has no estimate, so none is kept for it.
    let found = keep_estimates(&store, &[s1, s2, s3]);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].1.images, 2, "deleting s1 frees a and b");

    let store = SnapshotStore::open(mem.clone(), options()).unwrap();
    assert_eq!(
        check_kept_estimates(&store, "read back"),
        found,
        "read back after reopening"
    );

    // A commit of new content only adds counts of its own images: they stand.
    let s4 = commit(&store, &decl, &[(p0, b"e")]);
    assert_eq!(check_kept_estimates(&store, "read back"), found);
    // Deleting changes no count (reclaiming does): they stand.
    store.delete_snapshots(&[s2], 1).unwrap();
    assert_eq!(check_kept_estimates(&store, "read back"), found);

    // A reclamation step changes counts: every kept estimate goes with it, even before the
    // job is complete.
    let mut job = store
        .reclaim_next(&|_| true)
        .unwrap()
        .expect("s2 is deleted");
    assert_eq!(job.snap, s2);
    keep_estimates(&store, &[s1, s3]);
    assert!(!check_kept_estimates(&store, "read back").is_empty());
    assert_eq!(job.total(), 2, "c and c2 die");
    assert!(!store.reclaim_step(&mut job, 1, &|_| false).unwrap());
    assert!(
        store.kept_estimates().unwrap().is_empty(),
        "forgotten by the step"
    );
    while !store.reclaim_step(&mut job, 1, &|_| false).unwrap() {}

    // An estimate computed before a batch that forgot them is not kept.
    let epoch = store.estimates_epoch();
    let stale = store
        .would_free(s1)
        .unwrap()
        .expect("s1 has a newer neighbour");
    keep_estimates(&store, &[s3]);
    let s5 = {
        // A page mapped to content stored before (a dedup hit on a): counts of older
        // content change.
        let mut cap = store.declare_and_begin(decl.clone()).unwrap();
        let a = cap.put_image(b"a", &[]).unwrap();
        cap.add_mapping(p1, a).unwrap();
        assert!(cap.shares_older_content());
        cap.commit().unwrap().id
    };
    assert!(
        store.kept_estimates().unwrap().is_empty(),
        "forgotten by the commit"
    );
    assert!(!store.keep_estimates(epoch, &[(s1, stale)]).unwrap());
    assert!(store.kept_estimates().unwrap().is_empty());

    // Kept again at the current epoch, they hold across reopening.
    let found = keep_estimates(&store, &[s1, s3, s4, s5]);
    assert_eq!(found.len(), 3);
    let store = SnapshotStore::open(mem, options()).unwrap();
    assert_eq!(check_kept_estimates(&store, "read back"), found);
}

#[test]
fn a_repair_forgets_the_kept_estimates_and_a_report_does_not() {
    let store = SnapshotStore::open(MemBackend::new(), options()).unwrap();
    let (rels, decl) = setup(&store, 1, 4);
    let p0 = page_key(rels[0], 0);
    let s1 = commit(&store, &decl, &[(p0, b"a")]);
    commit(&store, &decl, &[(p0, b"b")]);
    let a = store.page_table(s1).unwrap()[0].1;
    let found = keep_estimates(&store, &[s1]);
    // A wrong count (as a bug or damage would leave): the kept estimate was computed with it.
    let mut damage = WriteBatch::new();
    damage.put(Cf::Refs, &keys::image_refs_key(a), &3u64.to_be_bytes());
    store.backend().write(&damage, true).unwrap();
    assert!(store.verify(false, &|_| false).unwrap().wrong_counts > 0);
    assert_eq!(
        store.kept_estimates().unwrap(),
        found,
        "a report writes nothing"
    );
    assert!(store.verify(true, &|_| false).unwrap().repaired);
    assert!(store.kept_estimates().unwrap().is_empty());
    assert_eq!(
        keep_estimates(&store, &[s1]),
        found,
        "the repaired count is the one it had"
    );
}

/// A kept estimate records the neighbours it was computed against: one whose snapshot has
/// other neighbours now (here a record left by a writer that did not forget it, as a build
/// without kept estimates would) is not read back.
#[test]
fn an_estimate_whose_neighbours_changed_is_not_read_back() {
    let mem = MemBackend::new();
    let store = SnapshotStore::open(mem.clone(), options()).unwrap();
    let (rels, decl) = setup(&store, 1, 4);
    let (p0, p1) = (page_key(rels[0], 0), page_key(rels[0], 1));
    let s1 = commit(&store, &decl, &[(p0, b"a"), (p1, b"b")]);
    let s2 = commit(&store, &decl, &[(p0, b"c")]);
    commit(&store, &decl, &[(p1, b"d")]);
    keep_estimates(&store, &[s1, s2]);
    let left: Vec<(Vec<u8>, Vec<u8>)> = mem
        .entries(Cf::Catalog)
        .into_iter()
        .filter(|(k, _)| k[0] == keys::TAG_ESTIMATE)
        .collect();
    assert_eq!(left.len(), 2);
    store.delete_snapshots(&[s1], 1).unwrap();
    let mut job = store.reclaim_next(&|_| true).unwrap().unwrap();
    while !store.reclaim_step(&mut job, 10, &|_| false).unwrap() {}
    assert!(store.kept_estimates().unwrap().is_empty());
    let mut put_back = WriteBatch::new();
    for (k, v) in &left {
        put_back.put(Cf::Catalog, k, v);
    }
    store.backend().write(&put_back, true).unwrap();
    // s1 is reclaimed, and s2's lower neighbour was s1: neither is read back.
    let store = SnapshotStore::open(mem, options()).unwrap();
    assert!(store.kept_estimates().unwrap().is_empty());
    assert!(store.would_free(s2).unwrap().is_some());
}

/// A reclamation step that releases only content its job's dead mappings alone named changes
/// no other snapshot's estimate but those of the reclaimed snapshot's neighbours (their dead
/// mappings grow): the others stay kept. One that leaves content it decremented named
/// elsewhere (here an image two pages share) may change any estimate: all go.
#[test]
fn a_reclamation_forgets_its_neighbours_estimates_or_all_if_it_leaves_content_shared() {
    let store = SnapshotStore::open(MemBackend::new(), options()).unwrap();
    let (rels, decl) = setup(&store, 1, 4);
    let (p0, p1) = (page_key(rels[0], 0), page_key(rels[0], 1));
    let s1 = commit(&store, &decl, &[(p0, b"a"), (p1, b"b")]);
    let s2 = commit(&store, &decl, &[(p0, b"c"), (p1, b"x")]);
    // p0 takes the content p1 had at s2: one image named by two mappings.
    let s3 = commit(&store, &decl, &[(p0, b"x"), (p1, b"d")]);
    let s4 = commit(&store, &decl, &[(p0, b"e"), (p1, b"e2")]);
    let s5 = commit(&store, &decl, &[(p0, b"f"), (p1, b"f2")]);
    let s6 = commit(&store, &decl, &[(p0, b"g")]);
    let all = [s1, s2, s3, s4, s5, s6];
    keep_estimates(&store, &all);
    assert_eq!(check_kept_estimates(&store, "read back").len(), 5);

    // s4's dead mappings name e and e2 alone: s3 and s5 (its neighbours) and s4 go.
    store.delete_snapshots(&[s4], 1).unwrap();
    let mut job = store.reclaim_next(&|_| true).unwrap().unwrap();
    while !store.reclaim_step(&mut job, 1, &|_| false).unwrap() {}
    assert!(!job.changed_shared_content());
    let left: Vec<SnapId> = check_kept_estimates(&store, "read back")
        .iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(left, vec![s1, s2]);

    // s2's dead mappings name c and x; x stays named by s3's p0: every estimate goes.
    keep_estimates(&store, &all);
    store.delete_snapshots(&[s2], 2).unwrap();
    let mut job = store.reclaim_next(&|_| true).unwrap().unwrap();
    assert_eq!(job.snap, s2);
    while !store.reclaim_step(&mut job, 10, &|_| false).unwrap() {}
    assert!(job.changed_shared_content());
    assert!(store.kept_estimates().unwrap().is_empty());
    assert_eq!(
        keep_estimates(&store, &all).len(),
        3,
        "s1, s3 and s5 have a newer neighbour"
    );
}

/// The same for TOAST values: a step that frees an image naming a TOAST value another image
/// still names changes the estimate of any snapshot whose dying images name that value (here
/// s4, not a neighbour of the reclaimed s1: the value is freed with s4's image once it is the
/// last one naming it).
#[test]
fn a_reclamation_leaving_a_toast_value_named_elsewhere_forgets_every_estimate() {
    let store = SnapshotStore::open(MemBackend::new(), options()).unwrap();
    let (rels, decl) = setup(&store, 1, 4);
    let (p0, p1) = (page_key(rels[0], 0), page_key(rels[0], 1));
    let value = common::view(7, 9_000);
    let with_toast = |content: &[u8], page: PageKey| {
        let mut cap = store.declare_and_begin(decl.clone()).unwrap();
        let t = cap.put_toast(&value).unwrap();
        let image = cap.put_image(content, &[t]).unwrap();
        cap.add_mapping(page, image).unwrap();
        cap.commit().unwrap().id
    };
    let s1 = with_toast(b"a", p0);
    commit(&store, &decl, &[(p0, b"c")]);
    commit(&store, &decl, &[(p1, b"m")]);
    let s4 = with_toast(b"z", p1);
    commit(&store, &decl, &[(p1, b"y")]);
    commit(&store, &decl, &[(p0, b"g")]);
    let before = store.would_free(s4).unwrap().unwrap();
    assert_eq!(before.toast_values, 0, "a still names the value");
    let snaps: Vec<SnapId> = store.snapshots().unwrap().iter().map(|i| i.id).collect();
    keep_estimates(&store, &snaps);
    assert!(check_kept_estimates(&store, "read back")
        .iter()
        .any(|e| e.0 == s4));

    store.delete_snapshots(&[s1], 1).unwrap();
    let mut job = store.reclaim_next(&|_| true).unwrap().unwrap();
    while !store.reclaim_step(&mut job, 10, &|_| false).unwrap() {}
    assert!(job.changed_shared_content());
    assert_eq!(store.would_free(s4).unwrap().unwrap().toast_values, 1);
    assert!(store.kept_estimates().unwrap().is_empty());
}
