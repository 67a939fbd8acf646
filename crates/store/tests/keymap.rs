//! Key maps (`keymap.rs`): a capture's recorded key hashes become entries that begin where a
//! block gains a key and end where it loses it; lookups at a snapshot or over a range find
//! exactly the blocks whose entries cover them (and the wildcard's); the map record becomes
//! visible with its commit; a failed capture's recordings are compared with, not trusted for
//! its snapshot; the sweep deletes what no readable snapshot needs; ending or restarting a
//! map removes its entries.

mod common;

use common::{decl_for, page_key, setup};
use gsnap_store::keys::Cf;
use gsnap_store::*;

fn entries<B: KvBackend>(store: &SnapshotStore<B>) -> usize {
    Scan::prefix(store.backend(), Cf::Keys, b"E")
        .unwrap()
        .count()
}

fn sweep<B: KvBackend>(store: &SnapshotStore<B>, budget: usize) -> u64 {
    let (mut deleted, mut next) = store.sweep_keys(None, budget).unwrap();
    while let Some(after) = next {
        let (d, n) = store.sweep_keys(Some(&after), budget).unwrap();
        deleted += d;
        next = n;
    }
    deleted
}

#[test]
fn entries_follow_keys_into_and_out_of_blocks() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 1, 2);
    let rel = rels[0];
    let row_type = decl.relations[0].row_type;
    let capture = |t: i64, pages: &[(u32, &[u64])], start: bool, commit: bool| {
        let mut c = store
            .declare_and_begin(decl_for(&rels, 2, row_type, t))
            .unwrap();
        let snap = c.snapshot();
        let map = store.key_map(rel).unwrap().map_or(snap, |m| m.start);
        if start {
            c.start_key_map(rel, b"id int4").unwrap();
        }
        for (block, hashes) in pages {
            let map = if start { snap } else { map };
            c.record_keys(page_key(rel, *block), map, hashes).unwrap();
        }
        if commit {
            c.commit().unwrap();
        } else {
            c.abort("test").unwrap();
        }
        snap
    };
    let s1 = capture(1, &[(0, &[10, 11]), (1, &[11, WILDCARD_KEY])], true, true);
    let map = store.key_map(rel).unwrap().unwrap();
    assert_eq!(
        (map.start, map.definition.as_slice()),
        (s1, &b"id int4"[..])
    );
    let at = |h: u64, a: SnapId, b: SnapId| store.key_candidates(rel, s1, &[h], a, b).unwrap();
    // Block 1 holds a row whose key could not be hashed: a candidate for every key.
    assert_eq!(at(10, s1, s1), vec![0, 1]);
    assert_eq!(at(12, s1, s1), vec![1]);
    assert_eq!(
        store
            .key_candidates(RelId(rel.0 + 1), s1, &[10], s1, s1)
            .unwrap(),
        Vec::<u32>::new()
    );
    // Key 10 leaves block 0, 12 arrives; block 1 is emptied (its entries read ahead).
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 2))
        .unwrap();
    let s2 = c.snapshot();
    c.prefetch_block_keys(&[(page_key(rel, 1), s1), (page_key(rel, 0), s1)])
        .unwrap();
    c.record_keys(page_key(rel, 0), s1, &[12, 11]).unwrap();
    c.record_keys(page_key(rel, 1), s1, &[]).unwrap();
    c.commit().unwrap();
    assert_eq!(at(10, s2, s2), Vec::<u32>::new());
    assert_eq!(at(12, s2, s2), vec![0]);
    assert_eq!(at(12, s1, s1), vec![1]);
    assert_eq!(
        at(10, s1, s2),
        vec![0, 1],
        "over the range: wherever it was"
    );
    // A failed capture empties block 0; the next one finds key 11 there again.
    let s3 = capture(3, &[(0, &[])], false, false);
    let s4 = capture(4, &[(0, &[11])], false, true);
    assert!(s3 < s4);
    assert_eq!(at(11, s2, s2), vec![0]);
    assert_eq!(at(11, s4, s4), vec![0]);
    assert_eq!(at(12, s4, s4), Vec::<u32>::new());
    // An update that keeps its keys on the page writes no entry.
    let before = entries(&store);
    capture(5, &[(0, &[11])], false, true);
    assert_eq!(entries(&store), before);

    // The sweep: nothing while every snapshot is readable; once s1 is deleted, the entries
    // only s1 needed (10 in block 0, 11 and the wildcard in block 1) go.
    assert_eq!(sweep(&store, 2), 0);
    store.delete_snapshot(s1).unwrap();
    // A map this small is swept after any reclamation that killed a mapping.
    assert!(!store.key_sweep_due(0).unwrap());
    assert!(store.key_sweep_due(1).unwrap());
    assert_eq!(sweep(&store, 2), 3);
    assert_eq!(at(10, s1, s4), Vec::<u32>::new());
    assert_eq!(at(11, s2, s2), vec![0]);

    // Starting the map again (another key) removes the old map's entries with the commit.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 6))
        .unwrap();
    let s6 = c.snapshot();
    c.start_key_map(rel, b"other key").unwrap();
    c.record_keys(page_key(rel, 0), s6, &[99]).unwrap();
    assert!(c.start_key_map(RelId(999), b"x").is_err());
    c.commit().unwrap();
    assert_eq!(store.key_map(rel).unwrap().unwrap().start, s6);
    assert_eq!(entries(&store), 1);
    assert_eq!(
        store.key_candidates(rel, s6, &[99], s6, s6).unwrap(),
        vec![0]
    );
    // Ending it removes the record, the entries and the blocks' records.
    let mut c = store
        .declare_and_begin(decl_for(&rels, 2, row_type, 7))
        .unwrap();
    c.end_key_map(rel).unwrap();
    c.commit().unwrap();
    assert_eq!(store.key_map(rel).unwrap(), None);
    assert_eq!(
        Scan::prefix(store.backend(), Cf::Keys, &[])
            .unwrap()
            .count(),
        0
    );
}

/// The store's cache of blocks' open key entries (`openkeys.rs`) never changes what a capture
/// writes: three stores (a cache big enough for everything, one so small that it keeps
/// dropping blocks, none) go through the same captures, committed, aborted, and failed part
/// way with some of their batches written (an injected I/O error), with keys moving between
/// blocks, pages recorded with and without reading ahead, and the map started again; after
/// every capture their `keys` families are equal entry for entry, and the cached stores took
/// blocks from their caches.
#[test]
fn the_open_key_cache_changes_nothing_a_capture_writes() {
    let open = |cache: usize| {
        let options = StoreOptions {
            max_batch_bytes: 300,
            open_key_cache_bytes: cache,
            ..StoreOptions::new(7)
        };
        SnapshotStore::open(FaultyBackend::new(MemBackend::new()).unwrap(), options).unwrap()
    };
    let stores = [open(1 << 20), open(700), open(0)];
    let setups: Vec<_> = stores.iter().map(|s| setup(s, 2, 8)).collect();
    assert_eq!(
        setups[0].0, setups[2].0,
        "the same relation ids in every store"
    );
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    let mut random = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let keys_family = |s: &SnapshotStore<FaultyBackend>| -> Vec<(Vec<u8>, Vec<u8>)> {
        Scan::prefix(s.backend(), Cf::Keys, &[])
            .unwrap()
            .map(|e| e.unwrap())
            .collect()
    };
    let (mut committed, mut failed) = (0, 0);
    for round in 0..80 {
        let start = round == 0 || round % 23 == 11;
        // 0-6: commit; 7: abort; 8-9: an I/O error at one of the capture's batches.
        let outcome = if start { 0 } else { random(10) };
        let fail_at = random(6);
        let mut blocks: Vec<(u32, Vec<u64>)> = Vec::new();
        for b in 0..8 {
            if start || random(3) > 0 {
                // Keys 0..24 over 8 blocks: rows keep their block, move, leave and come back.
                let n = random(5);
                blocks.push((b, (0..n).map(|_| random(24)).collect()));
            }
        }
        let read_ahead = random(2) == 0;
        let mut results = Vec::new();
        for (store, (rels, decl)) in stores.iter().zip(&setups) {
            let row_type = decl.relations[0].row_type;
            if outcome >= 8 {
                let at = store.backend().writes_attempted() + 1 + fail_at;
                store.backend().fail_write(at, Fault::Io);
            }
            let mut c = store
                .declare_and_begin(decl_for(rels, 8, row_type, round + 1))
                .unwrap();
            let snap = c.snapshot();
            let mut ok = true;
            for &rel in rels {
                let map = if start {
                    c.start_key_map(rel, b"id int4").unwrap();
                    snap
                } else {
                    store.key_map(rel).unwrap().unwrap().start
                };
                if read_ahead {
                    let pages: Vec<_> = blocks
                        .iter()
                        .map(|(b, _)| (page_key(rel, *b), map))
                        .collect();
                    ok &= c.prefetch_block_keys(&pages).is_ok();
                }
                for (b, hashes) in &blocks {
                    ok = ok && c.record_keys(page_key(rel, *b), map, hashes).is_ok();
                }
            }
            let done = if outcome < 7 && ok {
                c.commit().is_ok()
            } else {
                c.abort("test").unwrap();
                false
            };
            store.backend().fail_write(u64::MAX, Fault::Io);
            results.push(done);
        }
        assert!(results.iter().all(|r| *r == results[0]), "round {round}");
        if results[0] {
            committed += 1;
        } else {
            failed += 1;
        }
        let want = keys_family(&stores[2]);
        assert_eq!(
            keys_family(&stores[0]),
            want,
            "round {round}: the big cache"
        );
        assert_eq!(
            keys_family(&stores[1]),
            want,
            "round {round}: the small cache"
        );
    }
    assert!(
        committed > 40 && failed > 10,
        "{committed} committed, {failed} failed"
    );
    let (blocks, bytes, taken) = stores[0].open_key_cache_stats();
    assert!(
        blocks > 0 && bytes > 0 && taken > 300,
        "{blocks} {bytes} {taken}"
    );
    let (_, small_bytes, small_taken) = stores[1].open_key_cache_stats();
    assert!(small_bytes <= 700 && small_taken > 0 && small_taken < taken);
    assert_eq!(stores[2].open_key_cache_stats(), (0, 0, 0));
}

#[test]
fn a_large_key_map_is_swept_once_an_eighth_of_the_log_died() {
    // Nothing killed: never.
    assert!(!key_sweep_due(0, 10, 100));
    assert!(!key_sweep_due(0, 10_000_000, 1));
    // Up to SMALL_KEY_MAP entries: after any reclamation that killed a mapping.
    assert!(key_sweep_due(1, SMALL_KEY_MAP, 1_000_000_000));
    // Above: once the mappings killed since the last sweep are an eighth of the log's.
    let (entries, log) = (SMALL_KEY_MAP + 1, 8_000_000);
    assert!(!key_sweep_due(999_999, entries, log));
    assert!(key_sweep_due(1_000_000, entries, log));
    assert!(key_sweep_due(u64::MAX, entries, log));
}

/// A lookup of many keys (one cursor moved from hash to hash) finds exactly the blocks that
/// held one of them, and no entry of a neighbouring relation's map: two relations' maps, 64
/// blocks holding random hashes (some shared, the smallest and nearly the largest), two
/// snapshots with keys moving between them, against a model of what each block held.
#[test]
fn a_lookup_of_many_keys_finds_every_block_that_held_one() {
    let store = SnapshotStore::open_in_memory(7);
    let (rels, decl) = setup(&store, 2, 64);
    let row_type = decl.relations[0].row_type;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pool: Vec<u64> = (0..40)
        .map(|i| match i {
            0 => 0,
            1 => u64::MAX - 1,
            _ => next() >> 1,
        })
        .collect();
    // held[snapshot][relation][block]: the hashes recorded.
    let mut held: Vec<Vec<Vec<Vec<u64>>>> = Vec::new();
    let mut snaps = Vec::new();
    for t in 1..=2 {
        let mut c = store
            .declare_and_begin(decl_for(&rels, 64, row_type, t))
            .unwrap();
        let snap = c.snapshot();
        let mut at_snap = Vec::new();
        for &rel in &rels {
            let map = store.key_map(rel).unwrap().map_or(snap, |m| m.start);
            if t == 1 {
                c.start_key_map(rel, b"id int4").unwrap();
            }
            let mut blocks = Vec::new();
            for block in 0..64 {
                let hashes: Vec<u64> = (0..3)
                    .map(|_| pool[(next() % pool.len() as u64) as usize])
                    .collect();
                c.record_keys(page_key(rel, block), map, &hashes).unwrap();
                blocks.push(hashes);
            }
            at_snap.push(blocks);
        }
        c.commit().unwrap();
        snaps.push(snap);
        held.push(at_snap);
    }
    let map = store.key_map(rels[0]).unwrap().unwrap().start;
    let all: Vec<u64> = pool.iter().copied().chain([7, u64::MAX - 1]).collect();
    for (r, &rel) in rels.iter().enumerate() {
        for (a, b) in [(0, 0), (1, 1), (0, 1)] {
            for wanted in [&all[..], &all[..5], &all[1..2], &all[38..]] {
                let model: Vec<u32> = (0..64u32)
                    .filter(|&block| {
                        (a..=b).any(|t| {
                            held[t][r][block as usize]
                                .iter()
                                .any(|h| wanted.contains(h))
                        })
                    })
                    .collect();
                let got = store
                    .key_candidates(rel, map, wanted, snaps[a], snaps[b])
                    .unwrap();
                assert_eq!(got, model, "relation {r}, snapshots {a}..={b}, {wanted:?}");
            }
        }
    }
}
