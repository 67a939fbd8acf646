//! What the store's examples share: their command lines.
//!
//! Build them with the workspace, `cargo build --release --workspace --examples`, and run
//! them from the target directory (`/var/cache/gsnap/target/release/examples/`, set in
//! `.cargo/config.toml`). `cargo run -p gsnap-store` resolves RocksDB's features for that one
//! package and rebuilds RocksDB from source (15-20 minutes here).

/// Argument `n`, a number, or `default` if it is absent.
pub fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

/// The first argument (a directory), or the usage on stderr and exit status 2.
pub fn first_or_usage(usage: &str) -> std::path::PathBuf {
    match std::env::args().nth(1) {
        Some(dir) => dir.into(),
        None => {
            eprintln!("usage: {usage}");
            std::process::exit(2);
        }
    }
}

/// Allocates one relation incarnation named `name` (PostgreSQL oid and relfilenode 1) and
/// returns a declaration of it, `nblocks` long, and its incarnation.
pub fn one_table<B: gsnap_store::KvBackend>(
    store: &gsnap_store::SnapshotStore<B>,
    name: &str,
    nblocks: u32,
) -> (gsnap_store::SnapshotDecl, gsnap_store::RelId) {
    let rel = store
        .allocate_rel(&gsnap_store::RelIncarnation {
            pg_relid: 1,
            relfilenode: 1,
            name: name.into(),
        })
        .unwrap();
    let decl = gsnap_store::SnapshotDecl {
        relations: vec![gsnap_store::RelationSnapshot {
            pg_relid: 1,
            rel,
            relfilenode: 1,
            nblocks,
            row_type: store.put_row_type(b"row type").unwrap(),
            name: name.into(),
        }],
        ..gsnap_store::SnapshotDecl::default()
    };
    (decl, rel)
}
