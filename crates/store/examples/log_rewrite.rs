//! The mapping log rewrite at scale, on RocksDB: builds a store whose log holds millions of
//! mappings, deletes most snapshots and reclaims them, then rewrites the log without its dead
//! mappings and reports the time and the process's memory while it runs.
//!
//! `log_rewrite OUT_DIR [SNAPSHOTS] [PAGES_PER_SNAPSHOT] [TABLE_PAGES] [KEEP_EVERY]` (defaults
//! 1000, 10000, 200000, 4; how to build it: `common/mod.rs`).
//! Each snapshot maps half its pages to a hot set (the same pages every time: pgbench's
//! branches and tellers) and half to pages spread over the table; every KEEP_EVERY-th
//! snapshot and the newest are kept. Writes `OUT_DIR/log_rewrite.json` (the figures) and
//! `OUT_DIR/log_rewrite_rss.csv` (the resident memory every 20 ms during the rewrite); the
//! store is built in `OUT_DIR/log_rewrite_store` and removed at the end.

mod common;

use common::{arg, first_or_usage, one_table};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gsnap_store::{PageKey, SnapId, SnapshotStore, StoreOptions};

/// A field of /proc/self/status, in kB.
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let out = first_or_usage(
        "log_rewrite OUT_DIR [SNAPSHOTS] [PAGES_PER_SNAPSHOT] [TABLE_PAGES] [KEEP_EVERY]",
    );
    let (snapshots, per_snapshot, table_pages, keep_every) = (
        arg(2, 1000),
        arg(3, 10_000),
        arg(4, 200_000),
        arg(5, 4).max(1),
    );
    let hot = per_snapshot / 2;
    assert!(hot + per_snapshot <= table_pages, "the table is too small");
    std::fs::create_dir_all(&out).expect("the output directory");
    let path = out.join("log_rewrite_store");
    let _ = std::fs::remove_dir_all(&path);
    let store = SnapshotStore::open_dir(&path, StoreOptions::new(1)).expect("a new store");

    let t = Instant::now();
    let (decl, rel) = one_table(&store, "public.t", table_pages as u32);
    let mut ids = Vec::new();
    let spread = table_pages - hot;
    for s in 0..snapshots {
        let mut cap = store.declare_and_begin(decl.clone()).unwrap();
        let image = cap
            .put_image(format!("snapshot {s}").as_bytes(), &[])
            .unwrap();
        // The hot set, then distinct pages of the rest (a stride prime to its size).
        let start = s.wrapping_mul(2_654_435_761) % spread;
        let spread_out = (0..per_snapshot - hot).map(|i| hot + (start + i * 7919) % spread);
        for block in (0..hot).chain(spread_out) {
            let page = PageKey {
                rel,
                block: block as u32,
            };
            cap.add_mapping(page, image).unwrap();
        }
        ids.push(cap.commit().unwrap().id);
    }
    let build_s = t.elapsed().as_secs_f64();
    let newest = *ids.last().unwrap();
    let doomed: Vec<SnapId> = ids
        .iter()
        .enumerate()
        .filter(|(i, s)| !(*i as u64).is_multiple_of(keep_every) && **s != newest)
        .map(|(_, s)| *s)
        .collect();
    store.delete_snapshots(&doomed, 1).unwrap();
    let t = Instant::now();
    while let Some(mut job) = store.reclaim_next(&|_| true).unwrap() {
        while !store.reclaim_step(&mut job, 100_000, &|_| false).unwrap() {}
    }
    let reclaim_s = t.elapsed().as_secs_f64();
    let before = store.log_mappings().unwrap();
    let disk_before = dir_bytes(&path);
    eprintln!(
        "built {snapshots} snapshots ({before} mappings) in {build_s:.1} s, reclaimed {} in \
         {reclaim_s:.1} s",
        doomed.len()
    );

    // The rewrite, with the resident memory sampled meanwhile.
    let rss_start = status_kb("VmRSS:");
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let t = Instant::now();
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.push((t.elapsed().as_secs_f64(), status_kb("VmRSS:")));
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        })
    };
    let t = Instant::now();
    let rewrite = store
        .rewrite_log(4 << 20)
        .unwrap()
        .expect("no reclamation in flight");
    let rewrite_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let after = store
        .apply_log_rewrite(&rewrite)
        .unwrap()
        .expect("switched");
    let switch_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    store
        .compact_retired_log(rewrite.retired_generation())
        .unwrap();
    let compact_s = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(rss_start);
    let disk_after = dir_bytes(&path);

    let mut csv = String::from("t,rss_kb\n");
    for (t, kb) in &samples {
        let _ = writeln!(csv, "{t:.3},{kb}");
    }
    std::fs::write(out.join("log_rewrite_rss.csv"), csv).unwrap();
    // What the rewrite before streaming needed: the whole new log in memory, ~50 bytes a
    // mapping (and it gave up past 4 million).
    let in_memory_estimate_mb = after as f64 * 50.0 / 1e6;
    let json = format!(
        "{{\"snapshots\": {snapshots}, \"pages_per_snapshot\": {per_snapshot}, \
         \"table_pages\": {table_pages}, \"kept_every\": {keep_every}, \"deleted\": {}, \
         \"mappings_before\": {before}, \"mappings_after\": {after}, \
         \"build_s\": {build_s:.2}, \"reclaim_s\": {reclaim_s:.2}, \"rewrite_s\": {rewrite_s:.2}, \
         \"switch_ms\": {switch_ms:.1}, \"compact_s\": {compact_s:.2}, \
         \"rss_start_mb\": {:.1}, \"rss_peak_mb\": {:.1}, \"rss_growth_mb\": {:.1}, \
         \"in_memory_rewrite_estimate_mb\": {in_memory_estimate_mb:.1}, \
         \"store_mb_before\": {:.1}, \"store_mb_after\": {:.1}}}",
        doomed.len(),
        rss_start as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(rss_start) as f64 / 1024.0,
        disk_before as f64 / 1e6,
        disk_after as f64 / 1e6,
    );
    std::fs::write(out.join("log_rewrite.json"), &json).unwrap();
    println!("{json}");
    drop(store);
    let _ = std::fs::remove_dir_all(&path);
}
