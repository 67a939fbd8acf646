//! Index benchmarks: GSnap vs T-index vs O-index (memory and lookup time, the shapes of the
//! GSnap paper's Figures 10, 12 and 14) and Skippy page-table construction vs height (the
//! shape of Skippy's Table I).
//!
//! Run: `cargo run --release -p gsnap-core --example index_bench -- [--quick] [--out DIR]
//! [--only memory,lookup,grouplen,skippy]`. Writes CSV files and `summary.json` into DIR
//! (default `bench/index/results`) and prints every figure. Workloads are generated from a
//! fixed seed, so runs are repeatable.

use gsnap_core::baselines::{OIndex, TIndex};
use gsnap_core::skippy::{MemoryLogStore, SkippyConfig, SkippyLog, StopWhen};
use gsnap_core::{GsnapIndex, ImageId, Mapping, PageKey, RelId, SnapId, SnapshotIndex};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;

/// SplitMix64: a small, fast, seedable generator (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a span's writes pick pages.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Skew {
    /// `hot_share` of the writes go to `hot_pages` of the pages (50/50 is uniform).
    HotCold {
        name: &'static str,
        hot_share: f64,
        hot_pages: f64,
    },
    /// Writes touch whole aligned runs of 16 blocks (one radix leaf), uniformly.
    Runs,
}

impl Skew {
    fn name(&self) -> &'static str {
        match self {
            Skew::HotCold { name, .. } => name,
            Skew::Runs => "runs16",
        }
    }
    fn pick(&self, rng: &mut Rng, pages: u64) -> u64 {
        match *self {
            Skew::HotCold {
                hot_share,
                hot_pages,
                ..
            } => {
                let hot = ((pages as f64 * hot_pages) as u64).max(1);
                if rng.unit() < hot_share {
                    rng.below(hot)
                } else {
                    hot + rng.below(pages - hot)
                }
            }
            Skew::Runs => rng.below(pages),
        }
    }
}

const UNIFORM: Skew = Skew::HotCold {
    name: "uniform",
    hot_share: 0.5,
    hot_pages: 0.5,
};
const S80_20: Skew = Skew::HotCold {
    name: "80-20",
    hot_share: 0.8,
    hot_pages: 0.2,
};
const S99_1: Skew = Skew::HotCold {
    name: "99-1",
    hot_share: 0.99,
    hot_pages: 0.01,
};

/// One snapshot's mappings: `writes` page writes drawn by `skew` (the dirty set is their
/// distinct pages). The first snapshot captures every page.
fn span(rng: &mut Rng, snap: u64, pages: u64, writes: u64, skew: Skew) -> Vec<Mapping> {
    let mut dirty = BTreeSet::new();
    if snap == 1 {
        dirty.extend(0..pages);
    } else if skew == Skew::Runs {
        for _ in 0..writes.div_ceil(16) {
            let run = rng.below(pages / 16) * 16;
            dirty.extend(run..run + 16);
        }
    } else {
        for _ in 0..writes {
            dirty.insert(skew.pick(rng, pages));
        }
    }
    dirty
        .into_iter()
        .map(|b| Mapping::new(PageKey::new(1, b as u32), SnapId(snap), ImageId(rng.next())))
        .collect()
}

struct Config {
    quick: bool,
    out: String,
    only: Vec<String>,
}

fn main() {
    let mut cfg = Config {
        quick: false,
        out: "bench/index/results".into(),
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => cfg.quick = true,
            "--out" => cfg.out = args.next().expect("--out DIR"),
            "--only" => {
                cfg.only = args
                    .next()
                    .expect("--only LIST")
                    .split(',')
                    .map(String::from)
                    .collect()
            }
            other => panic!("unknown argument {other}"),
        }
    }
    std::fs::create_dir_all(&cfg.out).expect("create the output directory");
    let wants = |name: &str| cfg.only.is_empty() || cfg.only.iter().any(|o| o == name);
    let started = Instant::now();
    let mut summary = String::from("{\n");
    let _ = writeln!(summary, "  \"quick\": {},", cfg.quick);
    if wants("memory") || wants("lookup") {
        memory_and_lookup(&cfg, &mut summary);
    }
    if wants("grouplen") {
        group_length(&cfg, &mut summary);
    }
    if wants("skippy") {
        skippy(&cfg, &mut summary);
    }
    let _ = writeln!(
        summary,
        "  \"seconds\": {:.1}\n}}",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(format!("{}/summary.json", cfg.out), &summary).expect("write summary");
    println!(
        "\nwrote {}/ (total {:.1} s)",
        cfg.out,
        started.elapsed().as_secs_f64()
    );
}

/// Average ns per lookup of `n` random (snapshot, page) pairs among `snaps`: the best of three
/// rounds (the machine is shared; the best round is the least disturbed one).
fn time_lookups(
    index: &dyn SnapshotIndex,
    snaps: &[SnapId],
    pages: u64,
    n: usize,
    seed: u64,
) -> f64 {
    let mut rng = Rng(seed);
    let probes: Vec<(SnapId, PageKey)> = (0..n)
        .map(|_| {
            (
                snaps[rng.below(snaps.len() as u64) as usize],
                PageKey::new(1, rng.below(pages) as u32),
            )
        })
        .collect();
    for &(s, p) in probes.iter().take(n / 10) {
        black_box(index.lookup(s, p).ok());
    }
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for &(s, p) in &probes {
            black_box(index.lookup(s, p).ok());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

/// Average ns per lookup through a resolved relation tree (the snapshot and relation found once,
/// as an AS OF query does): the cost of the block-tree walk alone.
fn time_tree_lookups(g: &GsnapIndex, snaps: &[SnapId], pages: u64, n: usize) -> f64 {
    let mut rng = Rng(11);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let s = snaps[rng.below(snaps.len() as u64) as usize];
        let tree = g.tree(s).unwrap().relation(RelId(1)).unwrap().unwrap();
        let blocks: Vec<u32> = (0..n).map(|_| rng.below(pages) as u32).collect();
        let t = Instant::now();
        for &b in &blocks {
            black_box(tree.lookup(b).ok());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

/// Average number of trees a T-index lookup visits.
fn tindex_hops(t: &TIndex, snaps: &[SnapId], pages: u64, n: usize) -> f64 {
    let mut rng = Rng(13);
    let total: usize = (0..n)
        .map(|_| {
            t.hops(
                snaps[rng.below(snaps.len() as u64) as usize],
                PageKey::new(1, rng.below(pages) as u32),
            )
            .unwrap()
        })
        .sum();
    total as f64 / n as f64
}

/// Average ns per page of full-relation scans of random snapshots.
fn time_scans(index: &dyn SnapshotIndex, snaps: &[SnapId], pages: u64, n: usize) -> f64 {
    let mut rng = Rng(7);
    let t = Instant::now();
    let mut seen = 0u64;
    for _ in 0..n {
        let s = snaps[rng.below(snaps.len() as u64) as usize];
        index
            .scan(s, RelId(1), 0..u32::MAX, &mut |b, i| {
                seen += u64::from(b) ^ i.0
            })
            .ok();
    }
    black_box(seen);
    t.elapsed().as_nanos() as f64 / (n as f64 * pages as f64)
}

fn memory_and_lookup(cfg: &Config, summary: &mut String) {
    let (pages, max_snaps, group): (u64, usize, u32) = if cfg.quick {
        (2048, 100, 20)
    } else {
        (8192, 1000, 20)
    };
    let checkpoints: Vec<usize> = if cfg.quick {
        vec![20, 50, 100]
    } else {
        vec![100, 250, 500, 1000]
    };
    let ratios: Vec<f64> = if cfg.quick {
        vec![0.05, 0.25]
    } else {
        vec![0.01, 0.05, 0.10, 0.25, 0.50]
    };
    let skews: Vec<Skew> = if cfg.quick {
        vec![UNIFORM, S80_20]
    } else {
        vec![UNIFORM, S80_20, S99_1, Skew::Runs]
    };
    let lookups = if cfg.quick { 20_000 } else { 200_000 };
    let mut mem_csv = String::from("skew,p_write,snapshots,group_len,gsnap_bytes,tindex_bytes,oindex_bytes,ratio_o_over_g,p_page,p_node,model_p_node,model_p_page,model_err_p_node\n");
    let mut lk_csv = String::from(
        "skew,p_write,snapshots,gsnap_ns,tindex_ns,oindex_ns,gsnap_local_ns,tindex_local_ns,oindex_local_ns,gsnap_tree_ns,tindex_hops,gsnap_scan_ns_per_page,tindex_scan_ns_per_page,oindex_scan_ns_per_page\n",
    );
    let mut worst_model_err: f64 = 0.0;
    let mut worst_gsnap_ns: f64 = 0.0;
    let mut worst_gsnap_local_ns: f64 = 0.0;
    println!(
        "== memory and lookup: {pages} pages, group length {group}, up to {max_snaps} snapshots =="
    );
    println!(
        "{:<8} {:>5} {:>5} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6}",
        "skew", "P", "snaps", "gsnap", "t-index", "o-index", "O/G", "P_page", "P_node", "model",
        "g ns", "t ns", "o ns", "g loc", "t loc", "o loc", "hops", "g tree"
    );
    for &skew in &skews {
        for &p in &ratios {
            let mut rng = Rng(0x5EED ^ (p * 1000.0) as u64);
            let mut g = GsnapIndex::fixed_length(group);
            let mut t = TIndex::new();
            let mut o = OIndex::new();
            let writes = ((pages as f64) * p).round().max(1.0) as u64;
            let mut snaps = Vec::new();
            let mut dirty_pages = 0u64;
            for s in 1..=max_snaps as u64 {
                let maps = span(&mut rng, s, pages, writes, skew);
                if s > 1 {
                    dirty_pages += maps.len() as u64;
                }
                g.add_snapshot(SnapId(s), &maps).unwrap();
                t.add_snapshot(SnapId(s), &maps).unwrap();
                o.add_snapshot(SnapId(s), &maps).unwrap();
                snaps.push(SnapId(s));
                if !checkpoints.contains(&(s as usize)) {
                    continue;
                }
                let (gb, tb, ob) = (g.memory_bytes(), t.memory_bytes(), o.memory_bytes());
                // The model's P = M_p / M_c: mean partial tree bytes over mean complete tree bytes.
                let (mut full, mut nfull, mut part, mut npart) = (0usize, 0usize, 0usize, 0usize);
                for v in g.views() {
                    for (i, b) in v.snapshot_bytes().unwrap().into_iter().enumerate() {
                        if i == 0 {
                            full += b;
                            nfull += 1;
                        } else {
                            part += b;
                            npart += 1;
                        }
                    }
                }
                let p_node =
                    (part as f64 / npart.max(1) as f64) / (full as f64 / nfull.max(1) as f64);
                let p_page = dirty_pages as f64 / ((s - 1).max(1) as f64 * pages as f64);
                let sl = f64::from(group);
                let model = |pp: f64| sl / (1.0 + (sl - 1.0) * pp);
                let ratio = ob as f64 / gb as f64;
                let err = (ratio - model(p_node)).abs() / model(p_node);
                if (s as usize).is_multiple_of(group as usize) {
                    worst_model_err = worst_model_err.max(err);
                }
                let n_t = (lookups / 10).max(2000);
                let (gns, tns, ons) = (
                    time_lookups(&g, &snaps, pages, lookups, s),
                    time_lookups(&t, &snaps, pages, n_t, s),
                    time_lookups(&o, &snaps, pages, lookups, s),
                );
                worst_gsnap_ns = worst_gsnap_ns.max(gns);
                // The snapshots one query touches: the newest group-length window.
                let window = &snaps[snaps.len().saturating_sub(group as usize)..];
                let (gl, tl, ol) = (
                    time_lookups(&g, window, pages, lookups, s + 1),
                    time_lookups(&t, window, pages, n_t, s + 1),
                    time_lookups(&o, window, pages, lookups, s + 1),
                );
                worst_gsnap_local_ns = worst_gsnap_local_ns.max(gl);
                let tree_ns = time_tree_lookups(&g, &snaps, pages, lookups);
                let hops = tindex_hops(&t, &snaps, pages, 2000);
                let (gs, ts, os) = (
                    time_scans(&g, &snaps, pages, 20),
                    time_scans(&t, &snaps, pages, 3),
                    time_scans(&o, &snaps, pages, 20),
                );
                println!(
                    "{:<8} {:>5.2} {:>5} {:>9} {:>9} {:>9} {:>6.2} {:>6.3} {:>6.3} {:>6.2} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>5.1} {:>6.0}",
                    skew.name(), p, s, gb, tb, ob, ratio, p_page, p_node, model(p_node), gns, tns, ons, gl, tl, ol, hops, tree_ns
                );
                let _ = writeln!(
                    mem_csv,
                    "{},{p},{s},{group},{gb},{tb},{ob},{ratio:.4},{p_page:.5},{p_node:.5},{:.4},{:.4},{err:.5}",
                    skew.name(),
                    model(p_node),
                    model(p_page)
                );
                let _ = writeln!(
                    lk_csv,
                    "{},{p},{s},{gns:.1},{tns:.1},{ons:.1},{gl:.1},{tl:.1},{ol:.1},{tree_ns:.1},{hops:.1},{gs:.2},{ts:.2},{os:.2}",
                    skew.name()
                );
            }
        }
    }
    std::fs::write(format!("{}/memory.csv", cfg.out), mem_csv).unwrap();
    std::fs::write(format!("{}/lookup.csv", cfg.out), lk_csv).unwrap();
    println!(
        "worst |O/G - S/(1+(S-1)P_node)| / model = {:.2}% ; worst GSnap lookup {worst_gsnap_ns:.0} ns (random over all snapshots), {worst_gsnap_local_ns:.0} ns (one query's window)",
        worst_model_err * 100.0
    );
    let _ = writeln!(
        summary,
        "  \"memory_model_worst_error\": {worst_model_err:.5},"
    );
    let _ = writeln!(
        summary,
        "  \"memory_model_within_10pct\": {},",
        worst_model_err <= 0.10
    );
    let _ = writeln!(summary, "  \"gsnap_worst_lookup_ns\": {worst_gsnap_ns:.1},");
    let _ = writeln!(
        summary,
        "  \"gsnap_worst_local_lookup_ns\": {worst_gsnap_local_ns:.1},"
    );
    let under = worst_gsnap_ns.max(worst_gsnap_local_ns) < 1000.0;
    let _ = writeln!(summary, "  \"gsnap_lookup_under_1us\": {under},");
}

/// Figure 10's shape: the benefit of restoring one snapshot (its group) vs group length.
/// memory saving = 1 - (GSnap bytes / O-index bytes); load saving = 1 - (bytes GSnap loads to
/// restore a random snapshot, i.e. its group / bytes T-index loads, i.e. its whole chain);
/// benefit = 0.5 x memory saving + 0.5 x load saving (the paper's alpha = beta = 0.5).
fn group_length(cfg: &Config, summary: &mut String) {
    let (pages, snaps, p) = if cfg.quick {
        (2048u64, 100u64, 0.05)
    } else {
        (8192, 100, 0.05)
    };
    let lengths = [1u32, 2, 4, 6, 8, 10, 12, 16, 20, 25, 33, 50, 100];
    let mut csv = String::from(
        "group_len,gsnap_bytes,oindex_bytes,tindex_bytes,memory_saving,load_saving,benefit\n",
    );
    println!("\n== group length (Figure 10 shape): {pages} pages, {snaps} snapshots, P = {p} ==");
    println!(
        "{:>5} {:>10} {:>8} {:>8} {:>8}",
        "L", "gsnap", "mem sav", "load sav", "benefit"
    );
    let build = |idx: &mut dyn SnapshotIndex| {
        let mut rng = Rng(99);
        for s in 1..=snaps {
            idx.add_snapshot(
                SnapId(s),
                &span(&mut rng, s, pages, (pages as f64 * p) as u64, UNIFORM),
            )
            .unwrap();
        }
    };
    let mut o = OIndex::new();
    build(&mut o);
    let mut t = TIndex::new();
    build(&mut t);
    let (ob, tb) = (o.memory_bytes() as f64, t.memory_bytes() as f64);
    // T-index restoring snapshot v loads the trees of 1..=v: on average half the index.
    let t_load = tb * (snaps as f64 + 1.0) / (2.0 * snaps as f64);
    let mut best = (0u32, f64::MIN);
    for &l in &lengths {
        let mut g = GsnapIndex::fixed_length(l);
        build(&mut g);
        let gb = g.memory_bytes() as f64;
        let groups = g.groups();
        let g_load = groups
            .iter()
            .map(|x| x.bytes as f64 * x.snapshots as f64)
            .sum::<f64>()
            / snaps as f64;
        let mem = 1.0 - gb / ob;
        let load = 1.0 - g_load / t_load;
        let benefit = 0.5 * mem + 0.5 * load;
        if benefit > best.1 {
            best = (l, benefit);
        }
        println!("{l:>5} {gb:>10.0} {mem:>8.3} {load:>8.3} {benefit:>8.3}");
        let _ = writeln!(csv, "{l},{gb},{ob},{tb},{mem:.4},{load:.4},{benefit:.4}");
    }
    println!("best group length {} (benefit {:.3})", best.0, best.1);
    std::fs::write(format!("{}/group_length.csv", cfg.out), csv).unwrap();
    let _ = writeln!(summary, "  \"best_group_length\": {},", best.0);
}

/// Skippy's Table I shape: time to build one SPT over one overwrite cycle, per skew and height.
fn skippy(cfg: &Config, summary: &mut String) {
    let pages: u64 = if cfg.quick { 500 } else { 2000 };
    let node_size = (pages / 10) as usize;
    let workloads = [(UNIFORM, "50/50"), (S80_20, "80/20"), (S99_1, "99/1")];
    let mut csv =
        String::from("skew,height,ms,entries_scanned,nodes_read,log_mappings,stored_entries\n");
    println!("\n== Skippy SPT construction (Table I shape): {pages} pages, node of {node_size} mappings ==");
    println!(
        "{:<6} {:>6} {:>9} {:>12} {:>8} {:>9}",
        "skew", "height", "ms", "scanned", "nodes", "speedup"
    );
    let mut lines = Vec::new();
    for (skew, name) in workloads {
        // Enough single-mapping snapshots (continuous data protection) to hold one overwrite
        // cycle back from the newest snapshot: about cold pages x ln(cold pages) / cold share.
        let (cold_share, cold_pages) = match skew {
            Skew::HotCold {
                hot_share,
                hot_pages,
                ..
            } if hot_share > 0.5 => (1.0 - hot_share, pages as f64 * (1.0 - hot_pages)),
            _ => (1.0, pages as f64),
        };
        let cycle = cold_pages * cold_pages.ln() / cold_share;
        let mappings = (cycle * 1.5) as u64;
        let mut base_ms = None;
        for height in 0..=3u8 {
            let mut log =
                SkippyLog::open(MemoryLogStore::new(), SkippyConfig { node_size, height }).unwrap();
            let mut rng = Rng(4242);
            let first: Vec<Mapping> = (0..pages)
                .map(|b| Mapping::new(PageKey::new(1, b as u32), SnapId(1), ImageId(b)))
                .collect();
            log.append_snapshot(SnapId(1), &first).unwrap();
            let batch: Vec<(SnapId, Vec<Mapping>)> = (2..mappings + 2)
                .map(|s| {
                    (
                        SnapId(s),
                        vec![Mapping::new(
                            PageKey::new(1, skew.pick(&mut rng, pages) as u32),
                            SnapId(s),
                            ImageId(rng.next()),
                        )],
                    )
                })
                .collect();
            for chunk in batch.chunks(65_536) {
                let refs: Vec<(SnapId, &[Mapping])> =
                    chunk.iter().map(|(s, m)| (*s, &m[..])).collect();
                log.append_snapshots(&refs).unwrap();
            }
            let last = SnapId(mappings + 1);
            let runs = if cfg.quick { 3 } else { 5 };
            let mut times = Vec::new();
            let mut stats = None;
            for _ in 0..runs {
                let t = Instant::now();
                let (table, st) = log.build_page_table(last, StopWhen::Pages(pages)).unwrap();
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                assert_eq!(table.len() as u64, pages);
                stats = Some(st);
            }
            times.sort_by(f64::total_cmp);
            let ms = times[times.len() / 2];
            let st = stats.unwrap();
            let base = *base_ms.get_or_insert(ms);
            println!(
                "{name:<6} {height:>6} {ms:>9.3} {:>12} {:>8} {:>8.2}x",
                st.entries_scanned,
                st.nodes_read,
                base / ms
            );
            let _ = writeln!(
                csv,
                "{name},{height},{ms:.4},{},{},{},{}",
                st.entries_scanned,
                st.nodes_read,
                mappings + pages,
                log.store().entries()
            );
            lines.push(format!("{{\"skew\": \"{name}\", \"height\": {height}, \"ms\": {ms:.3}, \"entries_scanned\": {}}}", st.entries_scanned));
        }
    }
    std::fs::write(format!("{}/skippy.csv", cfg.out), csv).unwrap();
    let _ = writeln!(summary, "  \"skippy\": [{}],", lines.join(", "));
}
