//! Property test: random capture workloads against a simple reference model (a map of maps).
//!
//! Each case runs a sequence of captures (random pages, random contents from a small pool so
//! dedup happens, some aborted, some dropped, some followed by a deletion) with a random
//! batch size, and after every step compares "latest mapping at or before v", the
//! per-relation scan, the mapping log and dedup against the model.

mod common;

use std::collections::BTreeMap;

use common::{check_invariants, setup, view};
use gsnap_store::*;
use proptest::prelude::*;

const RELS: u32 = 3;
const BLOCKS: u32 = 12;

#[derive(Debug, Clone)]
enum Outcome {
    Commit,
    Abort,
    Drop,
}

#[derive(Debug, Clone)]
struct Step {
    mappings: Vec<(u32, u32, u64)>,
    outcome: Outcome,
    delete_earlier: Option<usize>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec((0..RELS, 0..BLOCKS, 0u64..10), 0..30),
        prop_oneof![6 => Just(Outcome::Commit), 1 => Just(Outcome::Abort), 1 => Just(Outcome::Drop)],
        prop::option::weighted(0.2, 0usize..8),
    )
        .prop_map(|(mappings, outcome, delete_earlier)| Step { mappings, outcome, delete_earlier })
}

fn content(n: u64) -> Vec<u8> {
    view(n, 64 + (n as usize * 37) % 500)
}

#[derive(Default)]
struct Model {
    /// Snapshots whose mappings are in the log (committed or later deleted), with their
    /// mappings (page -> content number).
    logged: BTreeMap<SnapId, BTreeMap<PageId, u64>>,
    deleted: Vec<SnapId>,
    image_of: BTreeMap<u64, ImageId>,
}

impl Model {
    fn at(&self, page: PageId, snap: SnapId) -> Option<u64> {
        self.logged
            .range(..=snap)
            .rev()
            .find_map(|(_, m)| m.get(&page).copied())
    }
}

fn check<B: KvBackend>(store: &SnapshotStore<B>, model: &Model, rels: &[RelId]) {
    check_invariants(store);
    for snap in model.logged.keys().filter(|s| !model.deleted.contains(s)) {
        assert_eq!(store.snapshot_state(*snap), Some(SnapshotState::Committed));
        for rel in rels {
            let mut want = Vec::new();
            for block in 0..BLOCKS {
                let page = PageId::new(*rel, block);
                let exp = model.at(page, *snap).map(|c| model.image_of[&c]);
                assert_eq!(store.lookup(page, *snap).unwrap(), exp, "{page} at {snap}");
                if let Some(id) = exp {
                    want.push((block, id));
                }
            }
            let got: Vec<_> = store
                .scan_relation(*rel, *snap)
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(got, want, "scan of {rel} at {snap}");
            let from = BLOCKS / 3;
            let got_from: Vec<_> = store
                .scan_relation_from(*rel, *snap, from)
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            let want_from: Vec<_> = want.iter().copied().filter(|(b, _)| *b >= from).collect();
            assert_eq!(
                got_from, want_from,
                "scan of {rel} at {snap} from block {from}"
            );
        }
    }
    for snap in &model.deleted {
        assert_eq!(store.snapshot_state(*snap), Some(SnapshotState::Deleted));
    }
    let want_log: Vec<Mapping> = model
        .logged
        .iter()
        .flat_map(|(s, m)| {
            m.iter().map(|(p, c)| Mapping {
                snap: *s,
                page: *p,
                image: model.image_of[c],
            })
        })
        .collect();
    let got_log: Vec<Mapping> = store
        .mapping_log(SnapId(1), SnapId(u64::MAX))
        .unwrap()
        .map(|m| m.unwrap())
        .collect();
    assert_eq!(got_log, want_log);
    for (c, id) in &model.image_of {
        assert_eq!(store.image(*id).unwrap(), content(*c));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn store_matches_reference_model(
        steps in prop::collection::vec(step(), 1..10),
        batch in prop_oneof![Just(300usize), Just(2000), Just(1 << 20)],
        reopen_at in 0usize..10,
    ) {
        let mem = MemBackend::new();
        let opts = StoreOptions { max_batch_bytes: batch, id_lease: 5, ..StoreOptions::new(9) };
        let mut store = SnapshotStore::open(mem.clone(), opts.clone()).unwrap();
        let (rels, decl) = setup(&store, RELS, BLOCKS);
        let mut model = Model::default();
        let mut committed: Vec<SnapId> = Vec::new();
        for (i, st) in steps.iter().enumerate() {
            if i == reopen_at {
                drop(store);
                store = SnapshotStore::open(mem.clone(), opts.clone()).unwrap();
            }
            let mut cap = store.declare_and_begin(decl.clone()).unwrap();
            let snap = cap.snapshot();
            let mut mine = BTreeMap::new();
            for (r, b, c) in &st.mappings {
                let id = cap.put_image(&content(*c)).unwrap();
                // Dedup: one content, one image id, across all captures (aborted ones too).
                prop_assert_eq!(*model.image_of.entry(*c).or_insert(id), id);
                let page = PageId::new(rels[*r as usize], *b);
                cap.add_mapping(page, id).unwrap();
                mine.insert(page, *c);
            }
            match st.outcome {
                Outcome::Commit => {
                    cap.commit().unwrap();
                    model.logged.insert(snap, mine);
                    committed.push(snap);
                }
                Outcome::Abort => cap.abort("model abort").unwrap(),
                Outcome::Drop => drop(cap),
            }
            if !matches!(st.outcome, Outcome::Commit) {
                prop_assert_eq!(store.snapshot_state(snap), Some(SnapshotState::Failed));
                // Images still in the aborted capture's unwritten batch are gone; flushed ones
                // stay and keep deduplicating.
                model.image_of.retain(|_, id| store.image(*id).is_ok());
            }
            if let Some(k) = st.delete_earlier {
                if let Some(victim) = committed.get(k).copied() {
                    store.delete_snapshot(victim).unwrap();
                    if !model.deleted.contains(&victim) {
                        model.deleted.push(victim);
                    }
                }
            }
            check(&store, &model, &rels);
        }
    }
}
