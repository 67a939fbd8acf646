//! Helpers shared by the integration tests: building declarations, and a consistency checker
//! that reads a store's raw column families and asserts every cross-record invariant of
//! `docs/format.md`.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use gsnap_store::keys::{self, Cf, Counter, DedupKind};
use gsnap_store::*;

/// Allocates `n` relation incarnations and one row type; returns a declaration covering them
/// (each relation `nblocks` long).
pub fn setup<B: KvBackend>(
    store: &SnapshotStore<B>,
    n: u32,
    nblocks: u32,
) -> (Vec<RelId>, SnapshotDecl) {
    let row_type = store
        .put_row_type(b"row type: (id int, payload text)")
        .unwrap();
    let rels: Vec<RelId> = (0..n)
        .map(|i| {
            store
                .allocate_rel(&RelIncarnation {
                    pg_relid: 16384 + i,
                    relfilenode: 20000 + i,
                    name: format!("public.t{i}"),
                })
                .unwrap()
        })
        .collect();
    (rels.clone(), decl_for(&rels, nblocks, row_type, 1))
}

/// A declaration of `rels` at time `t`.
pub fn decl_for(rels: &[RelId], nblocks: u32, row_type: RowTypeId, t: i64) -> SnapshotDecl {
    SnapshotDecl {
        declared_at_us: t,
        wal_lsn: 0x1000 * t as u64,
        timeline: 1,
        rank: Rank(0),
        label: None,
        relations: rels
            .iter()
            .enumerate()
            .map(|(i, rel)| RelationSnapshot {
                pg_relid: 16384 + i as u32,
                rel: *rel,
                relfilenode: 20000 + i as u32,
                nblocks,
                row_type,
                name: format!("public.t{i}"),
            })
            .collect(),
    }
}

/// Page `block` of relation incarnation `rel`.
pub fn page_key(rel: RelId, block: u32) -> PageKey {
    PageKey { rel, block }
}

/// The image `page` has in a page table (as [`SnapshotStore::page_table`] returns it).
pub fn image_at(table: &[(PageKey, ImageId)], page: PageKey) -> Option<ImageId> {
    table
        .binary_search_by_key(&page, |(p, _)| *p)
        .ok()
        .map(|i| table[i].1)
}

/// A deterministic page view for content number `n`, `len` bytes, compressible but distinct.
pub fn view(n: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Runs of 8 random bytes alternate with runs of 8 dots, so LZ4 has something to do.
        v.push(if (v.len() / 8) % 2 == 0 {
            (x & 0xff) as u8
        } else {
            b'.'
        });
    }
    v
}

fn all<B: KvBackend>(b: &B, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
    Scan::range(b, cf, &[], None)
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

/// Asserts every invariant a store must keep after `open` (and after any completed call):
/// no capture left half-done; the mapping log well formed (nodes decodable, mappings only of
/// committed or deleted snapshots, in snapshot order, sorted by page within one, naming stored
/// images) and its Skippy levels consistent with level 0 (every page table built with them
/// equals the one folded from the mappings); every dedup entry pointing at matching content;
/// every id below its counter; carried pages only of readable-once snapshots.
pub fn check_invariants<B: KvBackend>(store: &SnapshotStore<B>) {
    let b = store.backend();
    let snaps = store.snapshots().unwrap();
    let durable: BTreeSet<SnapId> = snaps
        .iter()
        .filter(|s| matches!(s.state, SnapshotState::Committed | SnapshotState::Deleted))
        .map(|s| s.id)
        .collect();
    assert!(
        snaps.iter().all(|s| s.state != SnapshotState::Capturing),
        "a snapshot is still capturing"
    );
    let markers = Scan::prefix(b, Cf::Catalog, &[keys::TAG_CAPTURING])
        .unwrap()
        .count();
    assert_eq!(markers, 0, "capturing markers left after open");
    for s in &snaps {
        assert_eq!(
            store.snapshot_state(s.id),
            Some(s.state),
            "in-memory state of {} differs",
            s.id
        );
        assert!(s.id.0 < store.next_id(Counter::Snap));
    }

    for (k, _) in all(b, Cf::MapLog) {
        keys::decode_log_node_key(&k).expect("a mapping log key");
    }
    let log = store.mapping_log(SnapId(0), SnapId(u64::MAX)).unwrap();
    for pair in log.windows(2) {
        assert!(
            (pair[0].snap, pair[0].page) < (pair[1].snap, pair[1].page),
            "mapping log out of order: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    for m in &log {
        assert!(
            durable.contains(&m.snap),
            "mapping of {} at {}, which is not committed",
            m.page,
            m.snap
        );
        store
            .image(m.image)
            .unwrap_or_else(|e| panic!("mapping of {} at {}: {e}", m.page, m.snap));
    }
    let mut folded: BTreeMap<PageKey, ImageId> = BTreeMap::new();
    let mut rest = log.as_slice();
    for s in snaps.iter().filter(|s| durable.contains(&s.id)) {
        let n = rest.partition_point(|m| m.snap <= s.id);
        folded.extend(rest[..n].iter().map(|m| (m.page, m.image)));
        rest = &rest[n..];
        assert_eq!(
            store.mapping_log(s.id, s.id).unwrap().len(),
            n,
            "mappings of {}",
            s.id
        );
        if s.state == SnapshotState::Committed {
            let want: Vec<(PageKey, ImageId)> = folded.iter().map(|(p, i)| (*p, *i)).collect();
            assert_eq!(
                store.page_table(s.id).unwrap(),
                want,
                "page table of {} built with the Skippy levels",
                s.id
            );
        }
    }
    for (k, _) in all(b, Cf::Catalog)
        .into_iter()
        .filter(|(k, _)| k[0] == keys::TAG_CARRIED)
    {
        let (s, _) = keys::decode_carried_key(&k).unwrap();
        assert!(durable.contains(&s), "carried page of uncommitted {s}");
    }

    for (k, v) in all(b, Cf::Dedup) {
        let (kind, fp) = keys::decode_dedup_key(&k).unwrap();
        let id = keys::decode_u64_value(&v, "dedup").unwrap();
        match kind {
            DedupKind::Image => {
                let content = store
                    .image(ImageId(id))
                    .expect("dedup entry names a missing image");
                assert_eq!(
                    Fingerprint::of_image(&content),
                    fp,
                    "dedup entry names an image of other content"
                );
                assert!(keys::image_seq(ImageId(id)) < store.next_id(Counter::Image));
            }
            DedupKind::Toast => {
                let value = store
                    .toast_value(ToastId(id))
                    .expect("dedup entry names a missing TOAST value");
                assert_eq!(Fingerprint::of(&value), fp);
                assert!(id < store.next_id(Counter::Toast));
            }
            DedupKind::RowType => {
                let bytes = store
                    .row_type(RowTypeId(id))
                    .expect("dedup entry names a missing row type");
                assert_eq!(Fingerprint::of(&bytes), fp);
                assert!(id < store.next_id(Counter::RowType));
            }
        }
    }
    for (k, _) in all(b, Cf::Deltas) {
        let id = keys::decode_image_key(&k).unwrap();
        store
            .image(id)
            .unwrap_or_else(|e| panic!("the delta of {id} outlived its image: {e}"));
    }
    for r in 0..keys::IMAGE_RANKS {
        for (k, _) in all(b, Cf::Images(Rank(r))) {
            let id = keys::decode_image_key(&k).unwrap();
            assert_eq!(
                keys::image_rank(id),
                Rank(r),
                "image {id} in the wrong rank"
            );
            assert!(keys::image_seq(id) < store.next_id(Counter::Image));
        }
    }
    for (rel, _) in store.rels().unwrap() {
        assert!(u64::from(rel.0) < store.next_id(Counter::Rel));
    }
}

/// Computes what deleting each of `snaps` would free and keeps the estimates in the store
/// (asserting it kept them); returns them (snapshots without an estimate left out).
pub fn keep_estimates<B: KvBackend>(
    store: &SnapshotStore<B>,
    snaps: &[SnapId],
) -> Vec<(SnapId, Freed)> {
    let epoch = store.estimates_epoch();
    let found: Vec<(SnapId, Freed)> = snaps
        .iter()
        .filter_map(|&s| Some((s, store.would_free(s).unwrap()?)))
        .collect();
    assert!(store.keep_estimates(epoch, &found).unwrap());
    found
}

/// Asserts that every estimate the store reads back is what deleting its snapshot would free
/// now (`what` names the moment in the messages); returns them.
pub fn check_kept_estimates<B: KvBackend>(
    store: &SnapshotStore<B>,
    what: &str,
) -> Vec<(SnapId, Freed)> {
    let kept = store.kept_estimates().unwrap();
    for &(snap, freed) in &kept {
        assert_eq!(
            store.would_free(snap).unwrap(),
            Some(freed),
            "{what}: kept estimate of {snap}"
        );
    }
    kept
}
