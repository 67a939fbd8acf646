//! Crash and error tests with the fault-injecting backend.
//!
//! A scenario (row type, relations, four captures of which one aborts, a deletion) is run
//! once to count its writes, then once per write with a simulated crash at that write. The
//! disk a crash leaves (synced prefix, plus 0, 1 or all unsynced batches) is reopened and
//! checked: every snapshot is complete or absent (failed; or gone, if its unsynced
//! declaration did not reach the disk), no mapping of an uncommitted
//! snapshot is in the mapping log, page tables equal the model, ids are never reused, the
//! dedup index is consistent. The mapping log has tiny nodes here, so commits fill nodes and
//! grow its Skippy levels. Recovery itself is crashed at each of its writes too. Finally, "no
//! space" errors are injected at every write.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{check_invariants, decl_for, image_at, page_key, view};
use gsnap_store::*;

#[derive(Default, Debug)]
struct Log {
    rels: Vec<RelId>,
    begun: Vec<SnapId>,
    committed: Vec<SnapId>,
    deleted: Vec<SnapId>,
    images: BTreeMap<ImageId, Vec<u8>>,
    toasts: BTreeMap<ToastId, Vec<u8>>,
    mappings: BTreeMap<SnapId, BTreeMap<PageKey, ImageId>>,
}

const NBLOCKS: u32 = 8;

fn options() -> StoreOptions {
    // Tiny batches and leases so that a capture takes many writes, including lease renewals.
    StoreOptions {
        max_batch_bytes: 200,
        id_lease: 4,
        mapping_log: SkippyConfig {
            node_size: 3,
            height: 2,
        },
        ..StoreOptions::new(77)
    }
}

fn pages_of_round(rels: &[RelId], round: u64) -> Vec<PageKey> {
    let range = |rel: RelId, blocks: std::ops::Range<u32>| blocks.map(move |b| page_key(rel, b));
    match round {
        0 => range(rels[0], 0..NBLOCKS)
            .chain(range(rels[1], 0..NBLOCKS))
            .collect(),
        1 => range(rels[0], 0..4).collect(),
        2 => range(rels[1], 2..8).collect(),
        _ => range(rels[0], 3..6).chain(range(rels[1], 3..6)).collect(),
    }
}

fn scenario<B: KvBackend>(store: &SnapshotStore<B>, log: &mut Log) -> Result<()> {
    let rt = store.put_row_type(b"row type (a int, b text)")?;
    for i in 0..2 {
        let inc = RelIncarnation {
            pg_relid: 16384 + i,
            relfilenode: 20000 + i,
            name: format!("public.t{i}"),
        };
        log.rels.push(store.allocate_rel(&inc)?);
    }
    for round in 0..4u64 {
        let decl = decl_for(&log.rels, NBLOCKS, rt, round as i64 + 1);
        let mut cap = store.declare_and_begin(decl)?;
        let snap = cap.snapshot();
        log.begun.push(snap);
        for (k, page) in pages_of_round(&log.rels, round).into_iter().enumerate() {
            let content = view((round * 3 + k as u64) % 10, 700);
            let id = cap.put_image(&content, &[])?;
            if cap.stored_image(id) {
                // (every crash point must leave no delta of an image that is gone)
                cap.put_delta(id, &view(900 + k as u64, 40))?;
            }
            log.images.insert(id, content);
            cap.add_mapping(page, id)?;
            log.mappings.entry(snap).or_default().insert(page, id);
        }
        if round == 1 {
            let value = view(500, 3 * TOAST_CHUNK_BYTES + 17);
            let id = cap.put_toast(&value)?;
            log.toasts.insert(id, value);
        }
        if round == 0 {
            cap.carry(page_key(log.rels[0], 1))?;
        }
        if round == 2 {
            cap.abort("storage vanished")?;
            continue;
        }
        cap.commit()?;
        log.committed.push(snap);
    }
    store.delete_snapshot(log.committed[1])?;
    log.deleted.push(log.committed[1]);
    Ok(())
}

/// The image `page` must have at readable snapshot `snap`, per the log.
fn expected(log: &Log, page: PageKey, snap: SnapId) -> Option<ImageId> {
    log.committed
        .iter()
        .filter(|s| **s <= snap)
        .rev()
        .find_map(|s| log.mappings.get(s).and_then(|m| m.get(&page)).copied())
}

/// Reopens a crashed disk and checks everything the crash must have preserved.
fn verify_after_crash(disk: MemBackend, log: &Log, what: &str) {
    let store = SnapshotStore::open(disk, options())
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    check_invariants(&store);
    let listed = store.snapshots().unwrap();
    for s in &listed {
        assert!(log.begun.contains(&s.id), "{what}: unknown {}", s.id);
        let want = if log.deleted.contains(&s.id) {
            SnapshotState::Deleted
        } else if log.committed.contains(&s.id) {
            SnapshotState::Committed
        } else {
            SnapshotState::Failed
        };
        assert_eq!(s.state, want, "{what}: state of {}", s.id);
    }
    // A declaration is written unsynced: it is on the disk a crash leaves if a synced write
    // followed it (its commit, the next id lease, a deletion) or the unsynced batches kept
    // reach it. So the snapshots that survive are the first ones declared, and every
    // committed one is among them.
    let survived = log
        .begun
        .iter()
        .take_while(|s| listed.iter().any(|l| l.id == **s))
        .count();
    for s in &log.begun[survived..] {
        assert!(
            !listed.iter().any(|l| l.id == *s),
            "{what}: {s} survived the crash, an earlier declaration did not"
        );
        assert!(!log.committed.contains(s), "{what}: committed {s} vanished");
    }
    for snap in log.committed.iter().filter(|s| !log.deleted.contains(s)) {
        let table = store.page_table(*snap).unwrap();
        let mut want = Vec::new();
        for rel in &log.rels {
            for block in 0..NBLOCKS {
                let page = page_key(*rel, block);
                let exp = expected(log, page, *snap);
                assert_eq!(image_at(&table, page), exp, "{what}: {page} at {snap}");
                if let Some(id) = exp {
                    want.push((page, id));
                }
            }
        }
        assert_eq!(table, want, "{what}: page table of {snap}");
        if log.committed.first() == Some(snap) {
            assert_eq!(
                store.carried_pages(*snap).unwrap(),
                vec![page_key(log.rels[0], 1)]
            );
        }
    }
    // Ids already used keep their content; new ids are above every id ever handed out.
    for (id, content) in &log.images {
        if let Ok(stored) = store.image(*id) {
            assert_eq!(&stored, content, "{what}: {id} changed content");
        }
    }
    for (id, value) in &log.toasts {
        if let Ok(stored) = store.toast_value(*id) {
            assert_eq!(&stored, value, "{what}: {id} changed content");
        }
    }
    if log.rels.len() == 2 {
        let rt = store.put_row_type(b"row type (a int, b text)").unwrap();
        let mut cap = store
            .declare_and_begin(decl_for(&log.rels, NBLOCKS, rt, 99))
            .unwrap();
        assert!(
            log.begun.iter().all(|s| *s < cap.snapshot()),
            "{what}: snapshot id reused"
        );
        for n in 0..6 {
            let id = cap.put_image(&view(1000 + n, 700), &[]).unwrap();
            assert!(
                log.images.keys().all(|old| *old < id),
                "{what}: image id {id} reused"
            );
        }
        let t = cap.put_toast(&view(2000, 100)).unwrap();
        assert!(
            log.toasts.keys().all(|old| *old < t),
            "{what}: TOAST id reused"
        );
        cap.commit().unwrap();
        check_invariants(&store);
    }
}

fn count_writes() -> u64 {
    let faulty = FaultyBackend::new(MemBackend::new()).unwrap();
    let store = SnapshotStore::open(faulty, options()).unwrap();
    let mut log = Log::default();
    scenario(&store, &mut log).unwrap();
    assert_eq!(log.committed.len(), 3);
    verify_after_crash(store.backend().disk_after_crash(0), &log, "clean run");
    store.backend().writes_attempted()
}

#[test]
fn crash_at_every_write_leaves_each_snapshot_complete_or_absent() {
    let total = count_writes();
    // About 30: declarations, id leases, flushed image and TOAST batches, commits, the abort
    // and the deletion (mappings are written only by the commits).
    assert!(
        total > 25,
        "the scenario should exercise many batches, got {total}"
    );
    eprintln!("crashing at each of {total} writes");
    for n in 0..total {
        let faulty = FaultyBackend::new(MemBackend::new()).unwrap();
        faulty.fail_write(n, Fault::Crash);
        let mut log = Log::default();
        let outcome = SnapshotStore::open(faulty, options()).map(|store| {
            let r = scenario(&store, &mut log);
            (r, store)
        });
        let faulty_store = match outcome {
            Ok((r, store)) => {
                assert!(r.is_err(), "crash at write {n} went unnoticed");
                store
            }
            Err(_) => continue, // crashed while creating the store: nothing to check
        };
        let backend = faulty_store.backend();
        assert!(backend.crashed());
        let unsynced = backend.unsynced_batches();
        for keep in [0, 1, unsynced] {
            verify_after_crash(
                backend.disk_after_crash(keep),
                &log,
                &format!("crash at write {n}, keep {keep}"),
            );
        }
    }
}

#[test]
fn crash_during_recovery_is_recovered_by_the_next_open() {
    let total = count_writes();
    let mut recoveries = 0;
    for n in (0..total).step_by(3) {
        let faulty = FaultyBackend::new(MemBackend::new()).unwrap();
        faulty.fail_write(n, Fault::Crash);
        let mut log = Log::default();
        let Ok(store) = SnapshotStore::open(faulty, options()) else {
            continue;
        };
        let _ = scenario(&store, &mut log);
        let disk = store.backend().disk_after_crash(usize::MAX);
        // How many writes does recovery make on this disk?
        let counter = Arc::new(FaultyBackend::new(disk.deep_copy()).unwrap());
        SnapshotStore::open(counter.clone(), options()).unwrap();
        for r in 0..counter.writes_attempted() {
            recoveries += 1;
            let again = Arc::new(FaultyBackend::new(disk.deep_copy()).unwrap());
            again.fail_write(r, Fault::Crash);
            assert!(
                SnapshotStore::open(again.clone(), options()).is_err(),
                "recovery write {r} crashed unnoticed"
            );
            for keep in [0, usize::MAX] {
                verify_after_crash(
                    again.disk_after_crash(keep),
                    &log,
                    &format!("crash {n}, recovery crash {r}"),
                );
            }
        }
    }
    assert!(
        recoveries > 0,
        "some crash points must leave a capture to recover"
    );
}

#[test]
fn no_space_at_any_write_is_reported_and_leaves_the_store_consistent() {
    let total = count_writes();
    for n in 1..total {
        let faulty = FaultyBackend::new(MemBackend::new()).unwrap();
        faulty.fail_write(n, Fault::NoSpace);
        let store = SnapshotStore::open(faulty, options()).unwrap();
        let mut log = Log::default();
        let err = scenario(&store, &mut log).expect_err("the injected error must surface");
        assert_eq!(err.kind(), ErrorKind::NoSpace, "write {n}: {err}");
        // Nothing uncommitted is visible, even if the failed write was part of an abort (whose
        // clean-up the next capture or open redoes) ...
        for m in store.mapping_log(SnapId(1), SnapId(u64::MAX)).unwrap() {
            assert!(
                log.committed.contains(&m.snap),
                "write {n}: mapping of uncommitted {}",
                m.snap
            );
        }
        // ... and once recovered (here explicitly) the live store is consistent and usable; so
        // is its disk after a restart.
        store.recover().unwrap();
        check_invariants(&store);
        for s in store.snapshots().unwrap() {
            let ok = log.committed.contains(&s.id);
            assert_eq!(
                s.state == SnapshotState::Committed || s.state == SnapshotState::Deleted,
                ok,
                "write {n}: {}",
                s.id
            );
        }
        if log.rels.len() == 2 {
            let rt = store.put_row_type(b"row type (a int, b text)").unwrap();
            let mut cap = store
                .declare_and_begin(decl_for(&log.rels, NBLOCKS, rt, 50))
                .unwrap();
            let id = cap.put_image(&view(3000, 700), &[]).unwrap();
            cap.add_mapping(page_key(log.rels[0], 0), id).unwrap();
            let snap = cap.commit().unwrap().id;
            let table = store.page_table(snap).unwrap();
            assert_eq!(image_at(&table, page_key(log.rels[0], 0)), Some(id));
        }
        let disk = store.backend().disk_after_crash(usize::MAX);
        check_invariants(&SnapshotStore::open(disk, options()).unwrap());
    }
}

#[test]
fn no_space_mid_capture_then_abort() {
    let faulty = FaultyBackend::new(MemBackend::new()).unwrap();
    let store = SnapshotStore::open(faulty, options()).unwrap();
    let (rels, decl) = common::setup(&store, 1, 100);
    let mut cap = store.declare_and_begin(decl.clone()).unwrap();
    let snap = cap.snapshot();
    store
        .backend()
        .fail_write(store.backend().writes_attempted() + 3, Fault::NoSpace);
    let mut err = None;
    for b in 0..100u32 {
        let r = cap
            .put_image(&view(b as u64, 2000), &[])
            .and_then(|id| cap.add_mapping(page_key(rels[0], b), id));
        if let Err(e) = r {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("no space must be reported");
    assert_eq!(err.kind(), ErrorKind::NoSpace);
    // The capture refuses to go on (its flushed state is incomplete) ...
    assert_eq!(
        cap.put_image(b"more", &[]).unwrap_err().kind(),
        ErrorKind::NoSpace
    );
    // ... and aborts cleanly.
    cap.abort("disk full").unwrap();
    assert_eq!(store.snapshot(snap).unwrap().state, SnapshotState::Failed);
    check_invariants(&store);
    let mut cap = store.declare_and_begin(decl).unwrap();
    let id = cap.put_image(b"after the disk was freed", &[]).unwrap();
    cap.add_mapping(page_key(rels[0], 0), id).unwrap();
    cap.commit().unwrap();
    check_invariants(&store);
}

#[test]
fn a_declaration_lost_in_a_crash_leaves_its_id_unused_and_a_clean_close_no_gap() {
    let store =
        SnapshotStore::open(FaultyBackend::new(MemBackend::new()).unwrap(), options()).unwrap();
    let rt = store.put_row_type(b"row type (a int)").unwrap();
    let rel = store
        .allocate_rel(&RelIncarnation {
            pg_relid: 16384,
            relfilenode: 20000,
            name: "public.t".into(),
        })
        .unwrap();
    let first = store.declare(decl_for(&[rel], 1, rt, 1)).unwrap();
    let lost = store.declare(decl_for(&[rel], 1, rt, 2)).unwrap();
    // The first declaration leased ids (synced); neither declaration's own write is synced:
    // a crash that keeps the first one's loses the second.
    assert_eq!(store.backend().unsynced_batches(), 2);
    let disk = store.backend().disk_after_crash(1);
    let store = SnapshotStore::open(disk, options()).unwrap();
    let ids: Vec<SnapId> = store.snapshots().unwrap().iter().map(|s| s.id).collect();
    assert_eq!(
        ids,
        vec![first],
        "the unsynced declaration is gone, the first one failed"
    );
    let next = store.declare(decl_for(&[rel], 1, rt, 3)).unwrap();
    assert!(next > lost, "{lost} handed out again");
    assert_eq!(
        next.0,
        first.0 + options().snap_id_lease,
        "the rest of the crashed lease is skipped"
    );
    // A clean close gives the rest of the lease back: ids go on without a gap.
    let before = store.declare(decl_for(&[rel], 1, rt, 4)).unwrap();
    let disk = FaultyBackend::new(store.into_backend()).unwrap();
    let store = SnapshotStore::open(disk, options()).unwrap();
    let after = store.declare(decl_for(&[rel], 1, rt, 5)).unwrap();
    assert_eq!(after.0, before.0 + 1);
    // and a later crash still never reuses one: the lease was taken again, synced
    let disk = store.backend().disk_after_crash(0);
    let store = SnapshotStore::open(disk, options()).unwrap();
    assert!(store.declare(decl_for(&[rel], 1, rt, 6)).unwrap().0 > after.0);
}
