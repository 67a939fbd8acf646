//! Behaviour of the store API on the in-memory backend: round trips of every record, dedup,
//! capture rules, abort and deletion, corruption detection.

mod common;

use common::{check_invariants, decl_for, image_at, page_key, setup, view};
use gsnap_store::keys::{self, Cf};
use gsnap_store::*;

fn small_batches() -> StoreOptions {
    StoreOptions {
        max_batch_bytes: 2048,
        id_lease: 3,
        ..StoreOptions::new(42)
    }
}

#[test]
fn snapshot_record_round_trips_with_stats_and_relations() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, mut decl) = setup(&store, 2, 5);
    decl.declared_at_us = 1_700_000_000_000_000;
    decl.wal_lsn = 0x0123_4567_89ab;
    decl.rank = Rank(3);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let snap = cap.snapshot();
    assert_eq!(
        store.snapshot(snap).unwrap().state,
        SnapshotState::Capturing
    );
    let a = cap.put_image(&view(1, 8192), &[]).unwrap();
    let b = cap.put_image(&view(1, 8192), &[]).unwrap();
    assert_eq!(a, b);
    cap.add_mapping(page_key(rels[0], 0), a).unwrap();
    cap.add_mapping(page_key(rels[1], 4), b).unwrap();
    cap.carry(page_key(rels[1], 4)).unwrap();
    let committed = cap.commit().unwrap();
    let read = store.snapshot(snap).unwrap();
    assert_eq!(read, committed);
    assert_eq!(read.decl, decl);
    assert_eq!(read.state, SnapshotState::Committed);
    assert_eq!(read.stats.pages_captured, 2);
    assert_eq!(read.stats.new_images, 1);
    assert_eq!(read.stats.dedup_hits, 1);
    assert_eq!(read.stats.image_bytes_raw, 8192);
    assert!(
        read.stats.image_bytes_stored < 8192,
        "a compressible view must be stored compressed"
    );
    assert_eq!(read.stats.carried_pages, 1);
    assert_eq!(read.relation(16385).unwrap().rel, rels[1]);
    assert_eq!(
        store.carried_pages(snap).unwrap(),
        vec![page_key(rels[1], 4)]
    );
    assert_eq!(store.snapshots().unwrap(), vec![read]);
    check_invariants(&store);
}

#[test]
fn images_round_trip_single_and_batched() {
    let store = SnapshotStore::open_in_memory(42);
    let (_, decl) = setup(&store, 1, 1);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let views: Vec<Vec<u8>> = vec![vec![], vec![0; 8192], view(7, 100), view(8, 8192)];
    let ids: Vec<ImageId> = views
        .iter()
        .map(|v| cap.put_image(v, &[]).unwrap())
        .collect();
    cap.commit().unwrap();
    for (id, v) in ids.iter().zip(&views) {
        assert_eq!(&store.image(*id).unwrap(), v);
    }
    let mut shuffled = ids.clone();
    shuffled.reverse();
    let got = store.images(&shuffled).unwrap();
    assert_eq!(got, views.iter().rev().cloned().collect::<Vec<_>>());
    let missing = store.images(&[ids[0], ImageId(999)]).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    assert_eq!(
        store.image(ImageId(999)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn toast_values_round_trip_by_chunk() {
    let store = SnapshotStore::open_in_memory(42);
    let (_, decl) = setup(&store, 1, 1);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let sizes = [
        0usize,
        1,
        TOAST_CHUNK_BYTES,
        TOAST_CHUNK_BYTES + 1,
        5 * TOAST_CHUNK_BYTES - 3,
    ];
    let values: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| view(100 + i as u64, *n))
        .collect();
    let ids: Vec<ToastId> = values.iter().map(|v| cap.put_toast(v).unwrap()).collect();
    assert_eq!(
        cap.put_toast(&values[3]).unwrap(),
        ids[3],
        "same value twice is stored once"
    );
    cap.commit().unwrap();
    for ((id, v), n) in ids.iter().zip(&values).zip(sizes) {
        let info = store.toast_info(*id).unwrap();
        assert_eq!(info.len, n as u64);
        assert_eq!(info.chunks as usize, n.div_ceil(TOAST_CHUNK_BYTES));
        assert_eq!(info.fingerprint, Fingerprint::of(v));
        let mut joined = Vec::new();
        for c in 0..info.chunks {
            let chunk = store.toast_chunk(*id, c).unwrap();
            assert!(chunk.len() <= TOAST_CHUNK_BYTES);
            joined.extend(chunk);
        }
        assert_eq!(&joined, v);
        assert_eq!(&store.toast_value(*id).unwrap(), v);
        assert_eq!(
            store.toast_chunk(*id, info.chunks).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    assert_eq!(
        store.toast_info(ToastId(77)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn row_types_and_rel_incarnations_round_trip_and_dedup() {
    let store = SnapshotStore::open_in_memory(42);
    let a = store.put_row_type(b"type a").unwrap();
    let b = store.put_row_type(b"type b").unwrap();
    assert_ne!(a, b);
    assert_eq!(store.put_row_type(b"type a").unwrap(), a);
    assert_eq!(store.row_type(a).unwrap(), b"type a");
    assert_eq!(store.row_type(b).unwrap(), b"type b");
    assert_eq!(
        store.row_type(RowTypeId(99)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let inc = RelIncarnation {
        pg_relid: 5,
        relfilenode: 6,
        name: "s.t".into(),
    };
    let r1 = store.allocate_rel(&inc).unwrap();
    let r2 = store.allocate_rel(&inc).unwrap();
    assert_ne!(r1, r2, "every request allocates a new incarnation");
    assert_eq!(store.rel(r1).unwrap(), inc);
    assert_eq!(store.rels().unwrap().len(), 2);
    assert_eq!(
        store.rel(RelId(99)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn dedup_across_captures_and_distinct_views_get_distinct_ids() {
    let store = SnapshotStore::open(MemBackend::new(), small_batches()).unwrap();
    let (rels, decl) = setup(&store, 1, 10);
    let mut first = Vec::new();
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    for i in 0..10 {
        let id = cap.put_image(&view(i, 3000), &[]).unwrap();
        cap.add_mapping(page_key(rels[0], i as u32), id).unwrap();
        first.push(id);
    }
    cap.commit().unwrap();
    let distinct: std::collections::BTreeSet<_> = first.iter().collect();
    assert_eq!(distinct.len(), 10);
    let mut cap = store.declare_and_begin(decl).unwrap();
    for i in 0..10 {
        assert_eq!(
            cap.put_image(&view(i, 3000), &[]).unwrap(),
            first[i as usize]
        );
    }
    let stats = cap.stats();
    assert_eq!((stats.new_images, stats.dedup_hits), (0, 10));
    cap.commit().unwrap();
    assert_eq!(
        Scan::range(store.backend(), Cf::Images(Rank(0)), &[], None)
            .unwrap()
            .count(),
        10
    );
    check_invariants(&store);
}

#[test]
fn views_sealed_ahead_dedup_against_older_captures_and_store_only_what_is_put() {
    let store = SnapshotStore::open(MemBackend::new(), small_batches()).unwrap();
    let (rels, decl) = setup(&store, 1, 10);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let old = cap.put_image(&view(1, 3000), &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 0), old).unwrap();
    let stale = cap.seal_views(&[&view(2, 3000)]).unwrap().pop().unwrap();
    cap.commit().unwrap();

    let mut cap = store.declare_and_begin(decl).unwrap();
    let too_big = vec![0u8; MAX_VIEW_BYTES + 1];
    let (a, b, c) = (view(1, 3000), view(2, 3000), view(3, 3000));
    assert_eq!(
        cap.seal_views(&[&a, &too_big]).err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument)
    );
    let mut sealed = cap.seal_views(&[&a, &b, &c, &b]).unwrap().into_iter();
    // Only the capture that sealed a view stores it.
    assert_eq!(
        cap.put_sealed(stale, &[]).err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument)
    );
    // The older capture's image, found by the batched lookup, is kept for this capture.
    let found = cap.put_sealed(sealed.next().unwrap(), &[]).unwrap();
    assert_eq!(found, old);
    cap.add_mapping(page_key(rels[0], 1), found).unwrap();
    assert!(cap.older_images_mapped().contains(&old));
    assert!(cap.existing_images().contains(&old));
    // A new view, then the same content again (written in between: 3000-byte views fill
    // the 2048-byte batches), is one image.
    let new = cap.put_sealed(sealed.next().unwrap(), &[]).unwrap();
    let _not_stored = sealed.next().unwrap();
    assert_eq!(cap.put_sealed(sealed.next().unwrap(), &[]).unwrap(), new);
    cap.add_mapping(page_key(rels[0], 2), new).unwrap();
    let stats = cap.stats();
    assert_eq!((stats.new_images, stats.dedup_hits), (1, 2));
    cap.commit().unwrap();
    // The view sealed and never stored left nothing: two images in all.
    assert_eq!(
        Scan::range(store.backend(), Cf::Images(Rank(0)), &[], None)
            .unwrap()
            .count(),
        2
    );
    assert_eq!(store.image(new).unwrap(), b);
    check_invariants(&store);
}

#[test]
fn page_tables_see_latest_mapping_at_or_before_and_nothing_uncommitted() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, decl) = setup(&store, 1, 4);
    let p = |b| page_key(rels[0], b);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let i1 = cap.put_image(b"v1 of block 0", &[]).unwrap();
    cap.add_mapping(p(0), i1).unwrap();
    cap.add_mapping(p(2), i1).unwrap();
    let s1 = cap.commit().unwrap().id;
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let i2 = cap.put_image(b"v2 of block 0", &[]).unwrap();
    let i2b = cap.put_image(b"v2 of block 0, again", &[]).unwrap();
    // The same page twice is refused; the first mapping stays.
    cap.add_mapping(p(0), i2).unwrap();
    assert_eq!(
        cap.add_mapping(p(0), i2b).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let s2 = cap.commit().unwrap();
    assert_eq!(s2.stats.pages_captured, 1);
    let s2 = s2.id;
    let mut cap = store.declare_and_begin(decl).unwrap();
    let i3 = cap.put_image(b"v3 of block 0", &[]).unwrap();
    cap.add_mapping(p(1), i3).unwrap();
    cap.add_mapping(p(0), i3).unwrap();
    let s3 = cap.snapshot();
    // s3 is capturing: never readable, its mappings invisible to s2 and to the log.
    assert_eq!(
        store.page_table(s3).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(store.page_table(s1).unwrap(), vec![(p(0), i1), (p(2), i1)]);
    assert_eq!(store.page_table(s2).unwrap(), vec![(p(0), i2), (p(2), i1)]);
    let log = store.mapping_log(SnapId(1), SnapId(100)).unwrap();
    assert_eq!(
        log,
        vec![
            Mapping::new(p(0), s1, i1),
            Mapping::new(p(2), s1, i1),
            Mapping::new(p(0), s2, i2)
        ]
    );
    assert_eq!(store.mapping_log(s2, s1).unwrap(), vec![]);
    cap.abort("test").unwrap();
    assert_eq!(
        store.snapshot(s3).unwrap().failure_reason.as_deref(),
        Some("test")
    );
    assert_eq!(store.mapping_log(s3, s3).unwrap(), vec![]);
    assert_eq!(store.latest_committed(), Some(s2));
    check_invariants(&store);
}

#[test]
fn capture_rules_are_enforced() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, decl) = setup(&store, 1, 4);
    let cap = store.declare_and_begin(decl.clone()).unwrap();
    assert_eq!(
        store.declare_and_begin(decl.clone()).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        store.recover().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    drop(cap); // aborts
    store.recover().unwrap();
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let too_big = vec![0u8; MAX_VIEW_BYTES + 1];
    assert_eq!(
        cap.put_image(&too_big, &[]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let id = cap.put_image(b"x", &[]).unwrap();
    let stranger = page_key(RelId(rels[0].0 + 100), 0);
    assert_eq!(
        cap.add_mapping(stranger, id).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        cap.add_mapping(page_key(rels[0], 0), ImageId(1 << 40))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    cap.commit().unwrap();
    let mut bad = decl.clone();
    bad.relations[0].rel = RelId(500);
    assert_eq!(
        store.declare_and_begin(bad).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    let mut bad = decl.clone();
    bad.relations[0].row_type = RowTypeId(500);
    assert_eq!(
        store.declare_and_begin(bad).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    let mut bad = decl;
    bad.relations.push(bad.relations[0].clone());
    assert_eq!(
        store.declare_and_begin(bad).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn dropped_capture_is_failed_and_leaves_nothing_behind() {
    let store = SnapshotStore::open(MemBackend::new(), small_batches()).unwrap();
    let (rels, decl) = setup(&store, 1, 50);
    let snap;
    {
        let mut cap = store.declare_and_begin(decl.clone()).unwrap();
        snap = cap.snapshot();
        for b in 0..50 {
            let id = cap.put_image(&view(b, 1000), &[]).unwrap();
            cap.add_mapping(page_key(rels[0], b as u32), id).unwrap();
            cap.carry(page_key(rels[0], b as u32)).unwrap();
        }
        assert!(
            Scan::prefix(store.backend(), Cf::Catalog, &keys::carried_prefix(snap))
                .unwrap()
                .count()
                > 0,
            "batches were flushed"
        );
        assert_eq!(
            Scan::range(store.backend(), Cf::MapLog, &[], None)
                .unwrap()
                .count(),
            0,
            "only a commit writes the mapping log"
        );
    }
    let info = store.snapshot(snap).unwrap();
    assert_eq!(info.state, SnapshotState::Failed);
    assert!(info.failure_reason.unwrap().contains("abandoned"));
    assert_eq!(
        Scan::prefix(store.backend(), Cf::Catalog, &keys::carried_prefix(snap))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        Scan::range(store.backend(), Cf::MapLog, &[], None)
            .unwrap()
            .count(),
        0
    );
    // The images and dedup entries the failed capture flushed are removed with it.
    assert_eq!(
        Scan::range(store.backend(), Cf::Images(Rank(0)), &[], None)
            .unwrap()
            .count(),
        0
    );
    let image_entries = Scan::range(store.backend(), Cf::Dedup, &[], None)
        .unwrap()
        .filter(|e| {
            let (k, _) = e.as_ref().unwrap();
            keys::decode_dedup_key(k).unwrap().0 == keys::DedupKind::Image
        })
        .count();
    assert_eq!(image_entries, 0);
    check_invariants(&store);
    let mut cap = store.declare_and_begin(decl).unwrap();
    cap.put_image(&view(3, 1000), &[]).unwrap();
    assert_eq!(cap.stats().dedup_hits, 0);
    let next = cap.commit().unwrap().id;
    assert!(next > snap);
}

#[test]
fn only_a_failed_snapshot_takes_a_new_failure_reason() {
    let store = SnapshotStore::open(MemBackend::new(), small_batches()).unwrap();
    let (_, decl) = setup(&store, 1, 4);
    let committed = store
        .declare_and_begin(decl.clone())
        .unwrap()
        .commit()
        .unwrap()
        .id;
    let failed = store.declare_and_begin(decl).unwrap().snapshot();
    assert_eq!(store.snapshot(failed).unwrap().state, SnapshotState::Failed);
    store
        .set_failure_reason(failed, "No space left on device")
        .unwrap();
    let info = store.snapshot(failed).unwrap();
    assert_eq!(info.state, SnapshotState::Failed);
    assert_eq!(
        info.failure_reason.as_deref(),
        Some("No space left on device")
    );
    let e = store.set_failure_reason(committed, "nonsense").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(store.snapshot(committed).unwrap().failure_reason, None);
    let e = store
        .set_failure_reason(SnapId(999), "nonsense")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    check_invariants(&store);
}

#[test]
fn deleted_snapshots_are_listed_not_readable_and_keep_later_page_tables() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, decl) = setup(&store, 1, 2);
    let p = page_key(rels[0], 0);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let i = cap.put_image(b"a", &[]).unwrap();
    cap.add_mapping(p, i).unwrap();
    let s1 = cap.commit().unwrap().id;
    let s2 = store.declare_and_begin(decl).unwrap().commit().unwrap().id;
    store.delete_snapshot(s1).unwrap();
    store.delete_snapshot(s1).unwrap();
    assert_eq!(store.snapshot(s1).unwrap().state, SnapshotState::Deleted);
    assert_eq!(
        store.page_table(s1).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        store.page_table(s2).unwrap(),
        vec![(p, i)],
        "s2 still sees s1's mapping"
    );
    assert_eq!(store.mapping_log(s1, s2).unwrap().len(), 1);
    assert_eq!(
        store.delete_snapshot(SnapId(99)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    check_invariants(&store);
}

#[test]
fn time_resolution_picks_latest_committed_at_or_before() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, _) = setup(&store, 1, 1);
    let rt = store
        .put_row_type(b"row type: (id int, payload text)")
        .unwrap();
    let s10 = store
        .declare_and_begin(decl_for(&rels, 1, rt, 10))
        .unwrap()
        .commit()
        .unwrap()
        .id;
    let s20 = store
        .declare_and_begin(decl_for(&rels, 1, rt, 20))
        .unwrap()
        .commit()
        .unwrap()
        .id;
    store
        .declare_and_begin(decl_for(&rels, 1, rt, 30))
        .unwrap()
        .abort("storage gone")
        .unwrap();
    assert_eq!(store.committed_at_or_before(9), None);
    assert_eq!(store.committed_at_or_before(10), Some(s10));
    assert_eq!(store.committed_at_or_before(25), Some(s20));
    assert_eq!(store.committed_at_or_before(35), Some(s20));
}

#[test]
fn reopening_keeps_everything_and_ids_keep_growing() {
    let mem = MemBackend::new();
    let store = SnapshotStore::open(mem.clone(), small_batches()).unwrap();
    let (rels, decl) = setup(&store, 1, 3);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let i = cap.put_image(b"kept", &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 1), i).unwrap();
    let s = cap.commit().unwrap().id;
    let identity = store.identity();
    drop(store);
    let store = SnapshotStore::open(mem, small_batches()).unwrap();
    assert_eq!(store.identity(), identity);
    assert_eq!(
        store.page_table(s).unwrap(),
        vec![(page_key(rels[0], 1), i)]
    );
    let mut cap = store.declare_and_begin(decl).unwrap();
    assert!(cap.snapshot() > s);
    assert!(cap.put_image(b"new", &[]).unwrap() > i);
    cap.commit().unwrap();
    check_invariants(&store);
}

#[test]
fn identity_and_emptiness_checks_on_open() {
    let mem = MemBackend::new();
    SnapshotStore::open(mem.clone(), StoreOptions::new(1)).unwrap();
    let e = SnapshotStore::open(mem.clone(), StoreOptions::new(2))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(e.message().contains("another PostgreSQL cluster"), "{e}");
    let foreign = MemBackend::new();
    let mut b = WriteBatch::new();
    b.put(Cf::Catalog, b"something", b"else");
    foreign.write(&b, true).unwrap();
    let e = SnapshotStore::open(foreign, StoreOptions::new(1))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    let e = SnapshotStore::open(
        MemBackend::new(),
        StoreOptions {
            create: false,
            ..StoreOptions::new(1)
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let mut b = WriteBatch::new();
    let mut bad = mem.get(Cf::Meta, keys::FORMAT_KEY).unwrap().unwrap();
    bad[11] = 9; // format version 9
    b.put(Cf::Meta, keys::FORMAT_KEY, &bad);
    mem.write(&b, true).unwrap();
    let e = SnapshotStore::open(mem, StoreOptions::new(1))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(e.message().contains("format version 9"), "{e}");
}

#[test]
fn image_records_decode_into_a_callers_buffer_as_images_do() {
    let mem = MemBackend::new();
    let store = SnapshotStore::open(mem.clone(), StoreOptions::new(42)).unwrap();
    let (_, decl) = setup(&store, 1, 1);
    let mut cap = store.declare_and_begin(decl).unwrap();
    // compressible, incompressible (stored raw) and empty views
    let mut noise = vec![0u8; 3000];
    let mut x = 0x2545_f491_u32;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let views = [view(5, 4000), noise, Vec::new()];
    let ids: Vec<ImageId> = views
        .iter()
        .map(|v| cap.put_image(v, &[]).unwrap())
        .collect();
    cap.commit().unwrap();
    let mut buf = Vec::new();
    let records = store.image_records_in(&ids, &mut buf).unwrap();
    assert_eq!(store.images(&ids).unwrap(), views.to_vec());
    for verify in [true, false] {
        for (r, v) in records.iter().zip(&views) {
            assert_eq!(r.len(), v.len());
            let mut out = vec![0xAA; r.len()];
            r.decode_into(&mut out, verify).unwrap();
            assert_eq!(&out, v);
        }
    }
    // A buffer of another size is refused, never written past.
    let mut short = vec![0; views[0].len() - 1];
    assert_eq!(
        records[0].decode_into(&mut short, true).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // A damaged payload is corrupt; a missing image is not found.
    let key = keys::image_key(ids[0]);
    let mut v = mem.get(Cf::Images(Rank(0)), &key).unwrap().unwrap();
    let last = v.len() - 1;
    v[last] ^= 0x55;
    let mut b = WriteBatch::new();
    b.put(Cf::Images(Rank(0)), &key, &v);
    mem.write(&b, false).unwrap();
    // (the same buffer, reused: a later batch reads what is stored now)
    let damaged = store.image_records_in(&ids[..1], &mut buf).unwrap();
    let mut out = vec![0; damaged[0].len()];
    assert_eq!(
        damaged[0].decode_into(&mut out, true).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert_eq!(
        store
            .image_records_in(&[ImageId(ids[2].0 + 1000)], &mut buf)
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn damaged_values_are_reported_as_corrupt() {
    let mem = MemBackend::new();
    let store = SnapshotStore::open(mem.clone(), StoreOptions::new(42)).unwrap();
    let (_, decl) = setup(&store, 1, 1);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let img = cap.put_image(&view(5, 4000), &[]).unwrap();
    let toast = cap.put_toast(&view(6, 9000)).unwrap();
    cap.commit().unwrap();
    let flip = |cf: Cf, key: &[u8]| {
        let mut v = mem.get(cf, key).unwrap().unwrap();
        let last = v.len() - 1;
        v[last] ^= 0x55;
        let mut b = WriteBatch::new();
        b.put(cf, key, &v);
        mem.write(&b, false).unwrap();
    };
    flip(Cf::Images(Rank(0)), &keys::image_key(img));
    let err = store.image(img).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(
        err.message().contains(&img.to_string()),
        "{}",
        err.message()
    );
    // Without the fingerprint check the damage is caught only if it breaks the decoding;
    // either way the store never returns the damaged content as the original.
    store.set_verify_images(false);
    match store.image(img) {
        Ok(v) => assert_ne!(v, view(5, 4000)),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt),
    }
    // A record cut short is corrupt whether or not fingerprints are checked.
    let mut v = mem
        .get(Cf::Images(Rank(0)), &keys::image_key(img))
        .unwrap()
        .unwrap();
    v.truncate(v.len() / 2);
    let mut b = WriteBatch::new();
    b.put(Cf::Images(Rank(0)), &keys::image_key(img), &v);
    mem.write(&b, false).unwrap();
    assert_eq!(store.image(img).unwrap_err().kind(), ErrorKind::Corrupt);
    store.set_verify_images(true);
    flip(Cf::Toast, &keys::toast_chunk_key(toast, 1));
    assert_eq!(
        store.toast_chunk(toast, 1).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert_eq!(
        store.toast_value(toast).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert_eq!(
        store.toast_chunk(toast, 0).unwrap().len(),
        TOAST_CHUNK_BYTES
    );
    let mut b = WriteBatch::new();
    b.put(Cf::Catalog, &keys::snapshot_key(SnapId(1)), &[1, 2]);
    mem.write(&b, false).unwrap();
    assert_eq!(
        store.snapshot(SnapId(1)).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
}

#[test]
fn store_is_usable_from_helper_threads() {
    let store = std::sync::Arc::new(SnapshotStore::open_in_memory(42));
    let (rels, decl) = setup(&*store, 1, 1);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let id = cap.put_image(b"shared", &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 0), id).unwrap();
    let snap = cap.commit().unwrap().id;
    let page = page_key(rels[0], 0);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let table = store.page_table(snap).unwrap();
                store.image(image_at(&table, page).unwrap()).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), b"shared");
    }
}

#[test]
fn declared_snapshots_queue_and_are_captured_oldest_first() {
    let store = SnapshotStore::open_in_memory(42);
    let (rels, decl) = setup(&store, 1, 3);
    let v1 = store.declare(decl.clone()).unwrap();
    let v2 = store.declare(decl.clone()).unwrap();
    let v3 = store.declare(decl.clone()).unwrap();
    assert!(v1 < v2 && v2 < v3);
    // Out of order is refused, and so is a second open capture.
    assert_eq!(
        store.begin_capture(v2).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    let mut cap = store.begin_capture(v1).unwrap();
    assert_eq!(
        store.begin_capture(v2).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    let img = cap.put_image(&view(9, 100), &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 0), img).unwrap();
    cap.commit().unwrap();
    // A declared snapshot can be given up before its capture begins.
    store.abandon(v2, "the table was dropped").unwrap();
    assert_eq!(store.snapshot_state(v2), Some(SnapshotState::Failed));
    assert_eq!(
        store.snapshot(v2).unwrap().failure_reason.as_deref(),
        Some("the table was dropped")
    );
    let cap3 = store.begin_capture(v3).unwrap();
    cap3.commit().unwrap();
    assert_eq!(
        store.page_table(v3).unwrap(),
        vec![(page_key(rels[0], 0), img)]
    );
    assert_eq!(
        store.abandon(v3, "too late").err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    check_invariants(&store);
}

#[test]
fn declared_but_uncaptured_snapshots_fail_on_reopen() {
    let backend = MemBackend::new();
    let store = SnapshotStore::open(backend.clone(), StoreOptions::new(42)).unwrap();
    let (_, decl) = setup(&store, 1, 2);
    let v1 = store.declare(decl.clone()).unwrap();
    let v2 = store.declare(decl).unwrap();
    store.begin_capture(v1).unwrap().commit().unwrap();
    drop(store);
    let reopened = SnapshotStore::open(backend, StoreOptions::new(42)).unwrap();
    assert_eq!(reopened.snapshot_state(v1), Some(SnapshotState::Committed));
    assert_eq!(reopened.snapshot_state(v2), Some(SnapshotState::Failed));
    check_invariants(&reopened);
}

#[test]
fn a_store_of_another_content_version_is_refused() {
    let backend = MemBackend::new();
    let v1 = StoreOptions {
        content_version: 1,
        ..StoreOptions::new(42)
    };
    drop(SnapshotStore::open(backend.clone(), v1.clone()).unwrap());
    // the same version opens again
    drop(SnapshotStore::open(backend.clone(), v1).unwrap());
    let v2 = StoreOptions {
        content_version: 2,
        ..StoreOptions::new(42)
    };
    let err = SnapshotStore::open(backend, v2).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Incompatible);
    assert!(
        err.message().contains("content format 1"),
        "{}",
        err.message()
    );
}

#[test]
fn an_older_content_version_the_caller_reads_is_raised_to_its_own() {
    let backend = MemBackend::new();
    let old = StoreOptions {
        content_version: 2,
        ..StoreOptions::new(42)
    };
    drop(SnapshotStore::open(backend.clone(), old.clone()).unwrap());
    let new = StoreOptions {
        content_version: 3,
        oldest_content_version: 2,
        ..StoreOptions::new(42)
    };
    drop(SnapshotStore::open(backend.clone(), new.clone()).unwrap());
    // Raised: the build that wrote version 2 now refuses the store, the new one opens it.
    let err = SnapshotStore::open(backend.clone(), old).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Incompatible);
    assert!(
        err.message().contains("content format 3"),
        "{}",
        err.message()
    );
    drop(SnapshotStore::open(backend.clone(), new).unwrap());
    // A version older than the oldest read is still refused, naming the range.
    let newer = StoreOptions {
        content_version: 5,
        oldest_content_version: 4,
        ..StoreOptions::new(42)
    };
    let err = SnapshotStore::open(backend, newer).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Incompatible);
    assert!(
        err.message().contains("formats 4 to 5"),
        "{}",
        err.message()
    );
}

#[test]
fn a_format_1_store_is_refused_with_both_versions_named() {
    // A store of format version 1 (before the mapping log was kept once): its format record
    // has the version 1 and no mapping log shape.
    let backend = MemBackend::new();
    let mut record = b"GSNAPSTO".to_vec();
    record.extend(1u32.to_be_bytes());
    record.extend([7u8; 16]);
    record.extend(42u64.to_be_bytes());
    record.extend(1_700_000_000_000_000i64.to_be_bytes());
    let mut b = WriteBatch::new();
    b.put(Cf::Meta, keys::FORMAT_KEY, &record);
    backend.write(&b, true).unwrap();
    let e = SnapshotStore::open(backend, StoreOptions::new(42))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(
        e.message().contains("format version 1")
            && e.message()
                .contains(&format!("versions 3 to {FORMAT_VERSION}")),
        "{e}"
    );
}

#[test]
fn the_mapping_log_shape_is_checked_and_recorded_at_creation() {
    let bad = StoreOptions {
        mapping_log: SkippyConfig {
            node_size: 0,
            height: 2,
        },
        ..StoreOptions::new(42)
    };
    let e = SnapshotStore::open(MemBackend::new(), bad).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let backend = MemBackend::new();
    let shape = SkippyConfig {
        node_size: 5,
        height: 1,
    };
    let options = StoreOptions {
        mapping_log: shape,
        ..StoreOptions::new(42)
    };
    drop(SnapshotStore::open(backend.clone(), options).unwrap());
    let store = SnapshotStore::open(backend, StoreOptions::new(42)).unwrap();
    assert_eq!(store.identity().mapping_log, shape);
    assert_eq!(store.identity().format_version, FORMAT_VERSION);
}
