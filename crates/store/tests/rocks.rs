//! The same basic scenarios on real RocksDB in a temporary directory: capture and reopen,
//! recovery of an interrupted capture, format version and cluster mismatches, directories
//! that are not stores, permissions, a second opener.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{check_invariants, image_at, page_key, setup, view};
use gsnap_store::keys::{self, Cf};
use gsnap_store::*;

const SYSID: u64 = 7_301_234_567_890_123_456;

fn open(path: &Path) -> Result<SnapshotStore<RocksBackend>> {
    SnapshotStore::open_dir(
        path,
        StoreOptions {
            max_batch_bytes: 64 << 10,
            ..StoreOptions::new(SYSID)
        },
    )
}

/// Commits a snapshot of `decl` whose block 0 of `rel` holds `content`.
fn commit_one(
    store: &SnapshotStore<RocksBackend>,
    decl: SnapshotDecl,
    rel: RelId,
    content: &[u8],
) -> SnapId {
    let mut cap = store.declare_and_begin(decl).unwrap();
    let id = cap.put_image(content, &[]).unwrap();
    cap.add_mapping(page_key(rel, 0), id).unwrap();
    cap.commit().unwrap().id
}

/// Stores a distinct 4000-byte view for each of `blocks` of `rel` and maps it.
fn put_blocks(cap: &mut Capture<RocksBackend>, rel: RelId, blocks: std::ops::Range<u32>) {
    for b in blocks {
        let id = cap.put_image(&view(u64::from(b), 4000), &[]).unwrap();
        cap.add_mapping(page_key(rel, b), id).unwrap();
    }
}

#[test]
fn capture_reopen_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gsnap");
    let store = open(&path).unwrap();
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "store directory must be private");
    let (rels, decl) = setup(&store, 2, 300);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let mut images = Vec::new();
    for b in 0..300u32 {
        // Every third block repeats content: dedup on a real store.
        let id = cap.put_image(&view(u64::from(b % 100), 8192), &[]).unwrap();
        cap.add_mapping(page_key(rels[0], b), id).unwrap();
        images.push(id);
    }
    let toast_value = view(9999, 3 * TOAST_CHUNK_BYTES + 5);
    let toast = cap.put_toast(&toast_value).unwrap();
    cap.carry(page_key(rels[0], 7)).unwrap();
    let s1 = cap.commit().unwrap();
    assert_eq!(s1.stats.new_images, 100);
    assert_eq!(s1.stats.dedup_hits, 200);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let changed = cap.put_image(b"block 5, changed", &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 5), changed).unwrap();
    let s2 = cap.commit().unwrap().id;
    let identity = store.identity();
    drop(store);

    let store = open(&path).unwrap();
    assert_eq!(store.identity(), identity);
    assert_eq!(store.identity().system_identifier, SYSID);
    check_invariants(&store);
    assert_eq!(store.snapshot(s1.id).unwrap(), s1);
    let t1 = store.page_table(s1.id).unwrap();
    let t2 = store.page_table(s2).unwrap();
    assert_eq!(image_at(&t1, page_key(rels[0], 5)), Some(images[5]));
    assert_eq!(image_at(&t2, page_key(rels[0], 5)), Some(changed));
    assert_eq!(image_at(&t2, page_key(rels[1], 5)), None);
    assert_eq!(t2.len(), 300);
    assert_eq!(t2[5], (page_key(rels[0], 5), changed));
    assert_eq!(t2[299], (page_key(rels[0], 299), images[299]));
    let batch = store.images(&images[..10]).unwrap();
    for (b, got) in batch.iter().enumerate() {
        assert_eq!(got, &view(b as u64, 8192));
    }
    assert_eq!(store.image(changed).unwrap(), b"block 5, changed");
    assert_eq!(store.toast_value(toast).unwrap(), toast_value);
    assert_eq!(store.toast_info(toast).unwrap().chunks, 4);
    assert_eq!(
        store.carried_pages(s1.id).unwrap(),
        vec![page_key(rels[0], 7)]
    );
    assert_eq!(store.mapping_log(s1.id, s2).unwrap().len(), 301);
    let stored_images = Scan::range(store.backend(), Cf::Images(Rank(0)), &[], None)
        .unwrap()
        .count();
    assert_eq!(stored_images, 101);
}

/// Copies directory `from` (files only, as a store has) to `to`.
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    fs::set_permissions(to, fs::Permissions::from_mode(0o700)).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn interrupted_capture_is_recovered_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = open(&path).unwrap();
    let (rels, decl) = setup(&store, 1, 2000);
    let committed = commit_one(&store, decl.clone(), rels[0], b"committed");
    let mut cap = store.declare_and_begin(decl).unwrap();
    let lost = cap.snapshot();
    put_blocks(&mut cap, rels[0], 0..2000);
    // The worker dies without committing or aborting: no clean-up runs. The disk it leaves
    // is the store's files as they are now (written, not necessarily synced).
    let crashed = dir.path().join("crashed");
    copy_dir(&path, &crashed);
    drop(cap);
    drop(store);

    let store = open(&crashed).unwrap();
    check_invariants(&store);
    let info = store.snapshot(lost).unwrap();
    assert_eq!(info.state, SnapshotState::Failed);
    assert!(info.failure_reason.unwrap().contains("interrupted"));
    let table = store.page_table(committed).unwrap();
    assert_eq!(
        image_at(&table, page_key(rels[0], 0)).map(|i| store.image(i).unwrap()),
        Some(b"committed".to_vec())
    );
    assert_eq!(
        store.page_table(lost).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(store.mapping_log(SnapId(1), SnapId(100)).unwrap().len(), 1);
}

#[test]
fn wrong_cluster_and_wrong_format_version_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    drop(open(&path).unwrap());
    let e = SnapshotStore::open_dir(&path, StoreOptions::new(SYSID + 1))
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(e.message().contains("another PostgreSQL cluster"), "{e}");

    let backend = RocksBackend::open(&path, false).unwrap();
    let mut record = backend.get(Cf::Meta, keys::FORMAT_KEY).unwrap().unwrap();
    record[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_be_bytes());
    let mut b = WriteBatch::new();
    b.put(Cf::Meta, keys::FORMAT_KEY, &record);
    backend.write(&b, true).unwrap();
    drop(backend);
    let e = open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(
        e.message()
            .contains(&format!("format version {}", FORMAT_VERSION + 1)),
        "{e}"
    );
    assert!(
        e.message().contains(&path.display().to_string()),
        "the message names the directory: {e}"
    );
}

#[test]
fn directories_that_are_not_stores_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    // A directory with unrelated files.
    let junk = dir.path().join("junk");
    fs::create_dir(&junk).unwrap();
    fs::set_permissions(&junk, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(junk.join("notes.txt"), b"hello").unwrap();
    let e = open(&junk).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(e.message().contains("not a gsnap store"), "{e}");
    assert_eq!(
        fs::read_dir(&junk).unwrap().count(),
        1,
        "nothing was written"
    );

    // A RocksDB database of someone else.
    let other = dir.path().join("other-rocksdb");
    drop(rocksdb::DB::open_default(&other).unwrap());
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).unwrap();
    let e = open(&other).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(e.message().contains("not a gsnap store"), "{e}");
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), &other).unwrap();
    assert_eq!(
        cfs,
        vec!["default".to_string()],
        "no column family was added"
    );

    // A plain file.
    let file = dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    assert_eq!(open(&file).err().unwrap().kind(), ErrorKind::Incompatible);

    // Missing, without create.
    let missing = dir.path().join("missing");
    let e = SnapshotStore::open_dir(
        &missing,
        StoreOptions {
            create: false,
            ..StoreOptions::new(SYSID)
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(!missing.exists());
}

#[test]
fn an_empty_existing_directory_becomes_a_private_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty");
    fs::create_dir(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    drop(open(&path).unwrap());
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o700
    );
    // Loosened permissions on an existing store are refused.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
    let e = open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    assert!(e.message().contains("chmod 0700"), "{e}");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    drop(open(&path).unwrap());
}

#[test]
fn a_second_opener_is_refused_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let _first = open(&path).unwrap();
    let e = open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains("another process"), "{e}");
}

#[test]
fn index_data_and_deletion_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = open(&path).unwrap();
    let (_, decl) = setup(&store, 1, 1);
    let s = store.declare_and_begin(decl).unwrap().commit().unwrap().id;
    store.delete_snapshot(s).unwrap();
    let meta = GroupMeta {
        id: GroupId(1),
        snaps: vec![s],
        pages: 0,
        bytes: 4,
        next_length_budget: 8,
        next_page_budget: 100,
    };
    store.put_group(&meta, b"body").unwrap();
    drop(store);
    let store = open(&path).unwrap();
    assert_eq!(store.snapshot(s).unwrap().state, SnapshotState::Deleted);
    assert_eq!(
        store.group_body(GroupId(1)).unwrap().as_deref(),
        Some(&b"body"[..])
    );
    assert_eq!(store.group_metas().unwrap(), vec![meta]);
}

#[test]
fn an_interrupted_creation_is_started_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    // A creation that crashed after RocksDB made its files, before gsnap's column families
    // and format record: the directory holds the creation marker.
    fs::create_dir(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(path.join("GSNAP-CREATING"), b"").unwrap();
    drop(rocksdb::DB::open_default(&path).unwrap());
    let store = open(&path).unwrap();
    assert_eq!(store.snapshots().unwrap().len(), 0);
    drop(store);
    assert!(
        !path.join("GSNAP-CREATING").exists(),
        "a finished store has no marker"
    );
    // The finished store is a store: reopened, not cleared.
    let id = open(&path).unwrap().identity().store_id;
    assert_eq!(open(&path).unwrap().identity().store_id, id);
    // Without the marker, a foreign RocksDB database is still refused untouched.
    let other = dir.path().join("other");
    drop(rocksdb::DB::open_default(&other).unwrap());
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(open(&other).err().unwrap().kind(), ErrorKind::Incompatible);
}

#[test]
fn a_format_1_store_is_refused_untouched() {
    // What gsnap of format version 1 left: its column families (among them `page_versions`
    // and `skippy`, gone in version 2) and a format record of version 1.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old");
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let families = [
        "meta",
        "catalog",
        "dedup",
        "images_r0",
        "toast",
        "maplog",
        "page_versions",
        "skippy",
        "groups",
    ];
    {
        let db = rocksdb::DB::open_cf(&opts, &path, families).unwrap();
        let mut record = b"GSNAPSTO".to_vec();
        record.extend(1u32.to_be_bytes());
        record.extend([7u8; 16]);
        record.extend(SYSID.to_be_bytes());
        record.extend(1_700_000_000_000_000i64.to_be_bytes());
        db.put_cf(db.cf_handle("meta").unwrap(), b"F", &record)
            .unwrap();
        db.put_cf(
            db.cf_handle("page_versions").unwrap(),
            [0u8; 16],
            1u64.to_be_bytes(),
        )
        .unwrap();
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
    let e = open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Incompatible);
    assert!(
        e.message().contains("format version 1")
            && e.message()
                .contains(&format!("only versions 3 to {FORMAT_VERSION}"))
            && e.message().contains(&path.display().to_string()),
        "{e}"
    );
    // Nothing was removed: the old gsnap can still open it.
    let mut kept = rocksdb::DB::list_cf(&rocksdb::Options::default(), &path).unwrap();
    kept.sort();
    assert!(kept.contains(&"page_versions".to_string()) && kept.contains(&"skippy".to_string()));
    let db = rocksdb::DB::open_cf(&opts, &path, families).unwrap();
    assert!(db
        .get_cf(db.cf_handle("page_versions").unwrap(), [0u8; 16])
        .unwrap()
        .is_some());
}

#[test]
fn space_is_estimated_without_reading_and_counts_the_whole_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gsnap");
    let store = open(&path).unwrap();
    let (rels, decl) = setup(&store, 1, 400);
    let mut cap = store.declare_and_begin(decl).unwrap();
    for b in 0..400u32 {
        let id = cap.put_image(&view(u64::from(b), 8192), &[]).unwrap();
        cap.add_mapping(page_key(rels[0], b), id).unwrap();
    }
    cap.commit().unwrap();
    let stored: u64 = Scan::range(store.backend(), Cf::Images(Rank(0)), &[], None)
        .unwrap()
        .map(|e| e.unwrap().1.len() as u64)
        .sum();
    let space = store.space().unwrap();
    // RocksDB's estimates (memtables and table properties), not a count: near the truth.
    assert!(
        (360..=440).contains(&space.images),
        "images estimated at {}, 400 stored",
        space.images
    );
    assert!(
        space.content_bytes >= stored / 2 && space.content_bytes <= stored * 3,
        "content estimated at {} bytes, {stored} stored",
        space.content_bytes
    );
    // The size on disk is the whole directory: the write-ahead log holds these images until
    // a flush, and it is counted.
    let files: u64 = fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    let wal: u64 = fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(wal >= stored, "the images are in the log: {wal} < {stored}");
    assert!(space.disk_bytes >= wal, "{} < {wal}", space.disk_bytes);
    assert!(
        space.disk_bytes <= files + (1 << 20),
        "{} > {files}",
        space.disk_bytes
    );
}

#[test]
fn a_copy_is_the_store_at_one_moment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = open(&path).unwrap();
    let (rels, decl) = setup(&store, 1, 500);
    let before = commit_one(&store, decl.clone(), rels[0], b"committed before the copy");
    let mut cap = store.declare_and_begin(decl).unwrap();
    let in_flight = cap.snapshot();
    put_blocks(&mut cap, rels[0], 0..250);
    let copy = dir.path().join("copy");
    assert_eq!(store.copy_to(&copy).unwrap(), Some(before));
    assert_eq!(
        store.copy_to(&copy).unwrap_err().kind(),
        ErrorKind::InvalidArgument,
        "a copy never goes into an existing directory"
    );
    // The capture goes on and commits in the store, after the copy.
    put_blocks(&mut cap, rels[0], 250..500);
    assert_eq!(cap.commit().unwrap().id, in_flight);
    drop(store);

    let copied = open(&copy).unwrap();
    check_invariants(&copied);
    assert_eq!(copied.latest_committed(), Some(before));
    let info = copied.snapshot(in_flight).unwrap();
    assert_eq!(
        info.state,
        SnapshotState::Failed,
        "in flight at the copy: failed there"
    );
    let table = copied.page_table(before).unwrap();
    assert_eq!(
        image_at(&table, page_key(rels[0], 0)).map(|i| copied.image(i).unwrap()),
        Some(b"committed before the copy".to_vec())
    );
    assert_eq!(copied.identity().system_identifier, SYSID);
    drop(copied);
    // The store itself is unchanged by the copy.
    let store = open(&path).unwrap();
    assert_eq!(store.latest_committed(), Some(in_flight));
    assert_eq!(store.page_table(in_flight).unwrap().len(), 500);
}

#[test]
fn a_store_that_lost_its_manifest_is_reported_damaged_not_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = open(&path).unwrap();
    let (rels, decl) = setup(&store, 1, 10);
    commit_one(&store, decl, rels[0], b"content");
    drop(store);
    for entry in fs::read_dir(&path).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with("MANIFEST-") {
            fs::remove_file(entry.path()).unwrap();
        }
    }
    let e = open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.message().contains("the store is damaged"), "{e}");
    assert!(e.message().contains("gsnap_copy_store"), "{e}");
}
