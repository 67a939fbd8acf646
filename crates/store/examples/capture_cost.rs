//! The store's share of a capture's CPU per page, on RocksDB, without PostgreSQL: what phase
//! two of a capture does with each changed page of a pgbench-like table (its image sealed
//! and looked up among the stored ones a chunk at a time, its mapping, the delta from its previous image, its
//! rows' keys), timed over whole captures. For A/B measures of the capture path: the
//! figures of one build are only comparable with another build's from the same machine and
//! the same hour.
//!
//! `capture_cost OUT_DIR [TABLE_PAGES] [CHANGED_PER_SNAPSHOT] [SNAPSHOTS]` (defaults 40000,
//! 10000, 12; how to build it: `common/mod.rs`). The first snapshot stores
//! every page (not timed); each later one changes one row of CHANGED_PER_SNAPSHOT random
//! pages and stores them. Prints, per snapshot, the CPU of every thread of the process
//! (RocksDB's own included) per page, and the median; then the time of the estimate the
//! worker makes after each commit while someone reads `gsnap_snapshots()` (what deleting the
//! snapshot before would free), per page of that snapshot. Writes
//! `OUT_DIR/capture_cost.json`.
//! The store is built in `OUT_DIR/capture_cost_store` and removed at the end.

mod common;

use common::{arg, first_or_usage, one_table};
use std::time::Instant;

use gsnap_store::{PageKey, SnapId, SnapshotStore, StoreOptions};

/// Rows per page and bytes per row of pgbench_accounts (int, int, int, char(84)).
const ROWS: usize = 61;
const ROW_BYTES: usize = 121;
/// The worker's defaults (`gsnap.store_cache_size`, `gsnap.key_map_cache_size`,
/// `gsnap.delta_base_cache_size`).
const BLOCK_CACHE: usize = 512 << 20;
const KEY_CACHE: usize = 64 << 20;
const BASE_CACHE: usize = 64 << 20;
/// Pages phase two handles between two looks at its pace (`src/worker/storing.rs`).
const CHUNK: usize = 64;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A page's view: a header, then rows of a tuple header (with an xmin), three ints and a
/// blank-padded filler, as pgbench_accounts' pages hold them.
fn page(block: u32, xmin: &[u32; ROWS], balance: &[i32; ROWS]) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + ROWS * ROW_BYTES);
    v.extend_from_slice(&[0u8; 20]);
    v.extend_from_slice(&block.to_le_bytes());
    for r in 0..ROWS {
        let mut row = [b' '; ROW_BYTES];
        row[..4].copy_from_slice(&xmin[r].to_le_bytes());
        row[4..23].fill(0);
        let aid = block * ROWS as u32 + r as u32 + 1;
        row[23..27].copy_from_slice(&aid.to_le_bytes());
        row[27..31].copy_from_slice(&(aid / 100_000 + 1).to_le_bytes());
        row[31..35].copy_from_slice(&balance[r].to_le_bytes());
        v.extend_from_slice(&row);
    }
    v
}

/// CPU time of every thread of this process so far, in ns (`/proc/self/task/*/schedstat`).
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| {
                    s.split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let out =
        first_or_usage("capture_cost OUT_DIR [TABLE_PAGES] [CHANGED_PER_SNAPSHOT] [SNAPSHOTS]");
    let (table_pages, changed, snapshots) = (arg(2, 40_000), arg(3, 10_000), arg(4, 12));
    assert!(
        changed <= table_pages,
        "more changed pages than the table has"
    );
    std::fs::create_dir_all(&out).expect("the output directory");
    let path = out.join("capture_cost_store");
    let _ = std::fs::remove_dir_all(&path);
    let options = StoreOptions {
        block_cache_bytes: Some(BLOCK_CACHE),
        open_key_cache_bytes: KEY_CACHE,
        recent_image_cache_bytes: BASE_CACHE,
        ..StoreOptions::new(1)
    };
    let store = SnapshotStore::open_dir(&path, options).expect("a new store");
    let (decl, rel) = one_table(&store, "public.accounts", table_pages as u32);

    let n = table_pages as usize;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut xmin = vec![[1u32; ROWS]; n];
    let mut balance = vec![[0i32; ROWS]; n];
    let mut images = vec![None; n];
    let mut map: Option<SnapId> = None;
    let mut per_page_us = Vec::new();
    let mut estimate_us = Vec::new();
    let mut last: Option<(SnapId, usize)> = None;
    let mut next_xid = 2u32;
    for s in 0..=snapshots {
        let blocks: Vec<usize> = if s == 0 {
            (0..n).collect()
        } else {
            let mut b: Vec<usize> = (0..changed)
                .map(|_| (rng.next() % table_pages) as usize)
                .collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        for &b in blocks.iter().filter(|_| s > 0) {
            let r = (rng.next() % ROWS as u64) as usize;
            xmin[b][r] = next_xid;
            balance[b][r] += (rng.next() % 10_000) as i32 - 5_000;
            next_xid += 1;
        }
        let views: Vec<Vec<u8>> = blocks
            .iter()
            .map(|&b| page(b as u32, &xmin[b], &balance[b]))
            .collect();
        let (cpu0, wall0) = (cpu_ns(), Instant::now());
        let mut cap = store.declare_and_begin(decl.clone()).unwrap();
        let keys_map = match map {
            Some(m) => m,
            None => {
                cap.start_key_map(rel, b"aid").unwrap();
                cap.snapshot()
            }
        };
        for (chunk_blocks, chunk_views) in blocks.chunks(CHUNK).zip(views.chunks(CHUNK)) {
            if map.is_some() {
                let pages: Vec<(PageKey, SnapId)> = chunk_blocks
                    .iter()
                    .map(|&b| {
                        (
                            PageKey {
                                rel,
                                block: b as u32,
                            },
                            keys_map,
                        )
                    })
                    .collect();
                cap.prefetch_block_keys(&pages).unwrap();
            }
            let refs: Vec<&[u8]> = chunk_views.iter().map(Vec::as_slice).collect();
            let sealed = cap.seal_views(&refs).unwrap();
            for (&b, view) in chunk_blocks.iter().zip(sealed) {
                let page = PageKey {
                    rel,
                    block: b as u32,
                };
                let image = cap.put_sealed(view, &[]).unwrap();
                let previous = images[b].replace(image);
                if previous != Some(image) {
                    cap.add_mapping(page, image).unwrap();
                }
                if let Some(base) = previous.filter(|&p| p != image) {
                    // The delta's size as a one-row change gives it; its bytes do not matter.
                    let before = cap.base_image(base).unwrap();
                    let delta = &before[..ROW_BYTES.min(before.len())];
                    cap.put_delta(image, delta).unwrap();
                }
                let hashes: Vec<u64> = (0..ROWS as u64)
                    .map(|r| {
                        gsnap_store::settle_key_hash((b as u64 * ROWS as u64 + r) * 0x9e37_79b9)
                    })
                    .collect();
                cap.record_keys(page, keys_map, &hashes).unwrap();
            }
        }
        let snap = cap.commit().unwrap().id;
        map = Some(keys_map);
        let (cpu, wall) = (cpu_ns() - cpu0, wall0.elapsed());
        let us = cpu as f64 / 1e3 / blocks.len() as f64;
        eprintln!(
            "snapshot {s}: {} pages, {:.2} s CPU, {:.2} s wall, {us:.1} us CPU per page{}",
            blocks.len(),
            cpu as f64 / 1e9,
            wall.as_secs_f64(),
            if s == 0 {
                " (the full capture, not counted)"
            } else {
                ""
            }
        );
        if s > 0 {
            per_page_us.push(us);
        }
        // What the worker's estimates thread does after each commit while someone reads
        // gsnap_snapshots(): what deleting the snapshot before this one would free.
        if let Some((prev, pages)) = last.replace((snap, blocks.len())).filter(|_| s > 1) {
            let t = Instant::now();
            let freed = store.would_free(prev).unwrap().expect("an estimate");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            eprintln!(
                "  estimate of snapshot {}: {ms:.1} ms ({:.2} us per page; {} images, {} bytes)",
                prev.0,
                ms * 1e3 / pages as f64,
                freed.images,
                freed.bytes
            );
            estimate_us.push(ms * 1e3 / pages as f64);
        }
    }
    let mut sorted = per_page_us.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!("median {median:.1} us of CPU per changed page over {snapshots} captures");
    estimate_us.sort_by(f64::total_cmp);
    let estimate = estimate_us
        .get(estimate_us.len() / 2)
        .copied()
        .unwrap_or(0.0);
    println!("median {estimate:.2} us per page of the snapshot estimated (wall time)");
    let json = format!(
        "{{\"table_pages\": {table_pages}, \"changed_per_snapshot\": {changed}, \
         \"us_per_page\": {per_page_us:?}, \"median_us_per_page\": {median:.2}, \
         \"median_estimate_us_per_page\": {estimate:.2}}}\n"
    );
    std::fs::write(out.join("capture_cost.json"), json).expect("writing the figures");
    drop(store);
    let _ = std::fs::remove_dir_all(&path);
}
