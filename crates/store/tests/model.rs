//! Property test: random capture workloads against a simple reference model (a map of maps).
//!
//! Each case runs a sequence of captures (random pages, random contents from a small pool so
//! dedup happens, some aborted, some dropped, some followed by a deletion) with a random
//! batch size and mapping log shape (tiny nodes, so that nodes fill and Skippy levels grow),
//! images stored one by one or sealed ahead in chunks, and after every step compares every
//! page table ("latest mapping at or before v"), the mapping log and dedup against the model.

mod common;

use std::collections::BTreeMap;

use common::{check_invariants, image_at, page_key, setup, view};
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
    /// None: each view stored with `put_image`; Some(k): sealed ahead k at a time
    /// (`seal_views`, then `put_sealed`), as phase two stores its chunks.
    seal_chunk: Option<usize>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec((0..RELS, 0..BLOCKS, 0u64..10), 0..30),
        prop_oneof![6 => Just(Outcome::Commit), 1 => Just(Outcome::Abort), 1 => Just(Outcome::Drop)],
        prop::option::weighted(0.2, 0usize..8),
        prop::option::of(1usize..8),
    )
        .prop_map(|(mappings, outcome, delete_earlier, seal_chunk)| Step {
            mappings,
            outcome,
            delete_earlier,
            seal_chunk,
        })
}

fn content(n: u64) -> Vec<u8> {
    view(n, 64 + (n as usize * 37) % 500)
}

#[derive(Default)]
struct Model {
    /// Snapshots whose mappings are in the log (committed or later deleted), with their
    /// mappings (page -> content number).
    logged: BTreeMap<SnapId, BTreeMap<PageKey, u64>>,
    deleted: Vec<SnapId>,
    image_of: BTreeMap<u64, ImageId>,
}

impl Model {
    fn at(&self, page: PageKey, snap: SnapId) -> Option<u64> {
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
        let table = store.page_table(*snap).unwrap();
        let mut want = Vec::new();
        for rel in rels {
            for block in 0..BLOCKS {
                let page = page_key(*rel, block);
                let exp = model.at(page, *snap).map(|c| model.image_of[&c]);
                assert_eq!(image_at(&table, page), exp, "{page} at {snap}");
                if let Some(id) = exp {
                    want.push((page, id));
                }
            }
        }
        assert_eq!(table, want, "page table of {snap}");
    }
    for snap in &model.deleted {
        assert_eq!(store.snapshot_state(*snap), Some(SnapshotState::Deleted));
        assert_eq!(
            store.page_table(*snap).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    let log_of = |(s, m): (&SnapId, &BTreeMap<PageKey, u64>)| -> Vec<Mapping> {
        m.iter()
            .map(|(p, c)| Mapping::new(*p, *s, model.image_of[c]))
            .collect()
    };
    let want_log: Vec<Mapping> = model.logged.iter().flat_map(log_of).collect();
    assert_eq!(
        store.mapping_log(SnapId(1), SnapId(u64::MAX)).unwrap(),
        want_log
    );
    // Any range of the log holds exactly the mappings of the snapshots in it.
    let ids: Vec<SnapId> = model.logged.keys().copied().collect();
    if ids.len() >= 3 {
        let (first, last) = (ids[1], ids[ids.len() - 2]);
        let want: Vec<Mapping> = model.logged.range(first..=last).flat_map(log_of).collect();
        assert_eq!(store.mapping_log(first, last).unwrap(), want);
    }
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
        shape in prop_oneof![Just((2usize, 1u8)), Just((3, 2)), Just((5, 3)), Just((2048, 2))],
        reopen_at in 0usize..10,
    ) {
        let mem = MemBackend::new();
        let opts = StoreOptions {
            max_batch_bytes: batch,
            id_lease: 5,
            mapping_log: SkippyConfig { node_size: shape.0, height: shape.1 },
            ..StoreOptions::new(9)
        };
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
            let mut todo = Vec::new();
            for (r, b, c) in &st.mappings {
                let page = page_key(rels[*r as usize], *b);
                // A page is mapped at most once per capture (a second mapping is refused).
                if let std::collections::btree_map::Entry::Vacant(e) = mine.entry(page) {
                    e.insert(*c);
                    todo.push((page, *c));
                }
            }
            for chunk in todo.chunks(st.seal_chunk.unwrap_or(1)) {
                let views: Vec<Vec<u8>> = chunk.iter().map(|(_, c)| content(*c)).collect();
                let ids: Vec<ImageId> = match st.seal_chunk {
                    None => views.iter().map(|v| cap.put_image(v, &[]).unwrap()).collect(),
                    Some(_) => {
                        let refs: Vec<&[u8]> = views.iter().map(Vec::as_slice).collect();
                        let sealed = cap.seal_views(&refs).unwrap();
                        sealed.into_iter().map(|s| cap.put_sealed(s, &[]).unwrap()).collect()
                    }
                };
                for (&(page, c), id) in chunk.iter().zip(ids) {
                    // Dedup: one content, one image id, across all captures (aborted ones
                    // too), also when a batch is written between a view's sealing and its
                    // storing.
                    prop_assert_eq!(*model.image_of.entry(c).or_insert(id), id);
                    cap.add_mapping(page, id).unwrap();
                }
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
