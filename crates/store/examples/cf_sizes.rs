//! What each column family of a gsnap store holds on disk, for finding where the space goes:
//! `cf_sizes STORE_DIR` (read-only; the server may be running or stopped; how to build it:
//! `common/mod.rs`). Per column family: the table files' size, RocksDB's estimate of
//! its live data, its keys, and its files per level. With a column family's name after the
//! directory, its table files too: level, size, entries, deletions and key range (to see
//! which files a compaction must rewrite together).

use rocksdb::{Options, DB};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: cf_sizes STORE_DIR");
        std::process::exit(2);
    };
    let names = DB::list_cf(&Options::default(), &path).expect("a RocksDB database");
    let db = DB::open_cf_for_read_only(&Options::default(), &path, &names, false)
        .expect("opened read-only");
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>6}  levels (files, MiB)",
        "cf", "sst MiB", "live MiB", "keys", "amp"
    );
    for name in &names {
        let cf = db.cf_handle(name).expect("listed");
        let int = |p: &str| db.property_int_value_cf(&cf, p).ok().flatten().unwrap_or(0);
        let sst = int("rocksdb.total-sst-files-size") as f64 / 1048576.0;
        let live = int("rocksdb.estimate-live-data-size") as f64 / 1048576.0;
        let keys = int("rocksdb.estimate-num-keys");
        let mut levels = Vec::new();
        for level in 0..7 {
            let files = int(&format!("rocksdb.num-files-at-level{level}"));
            if files > 0 {
                levels.push(format!("L{level}:{files}"));
            }
        }
        let amp = if live > 0.0 { sst / live } else { 0.0 };
        println!(
            "{name:<12} {sst:>10.1} {live:>10.1} {keys:>10} {amp:>6.2}  {}",
            levels.join(" ")
        );
    }
    let Some(family) = std::env::args().nth(2) else {
        return;
    };
    let hex = |k: &Option<Vec<u8>>| {
        k.as_deref()
            .unwrap_or_default()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let mut files: Vec<_> = db
        .live_files()
        .expect("the table files")
        .into_iter()
        .filter(|f| f.column_family_name == family)
        .collect();
    files.sort_by(|a, b| (a.level, &a.start_key).cmp(&(b.level, &b.start_key)));
    for f in files {
        println!(
            "L{} {} {:>8.1} MiB {:>9} entries {:>7} deletions  {} .. {}",
            f.level,
            f.name,
            f.size as f64 / 1048576.0,
            f.num_entries,
            f.num_deletions,
            hex(&f.start_key),
            hex(&f.end_key)
        );
    }
}
