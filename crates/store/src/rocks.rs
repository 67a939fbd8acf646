//! The real [`KvBackend`]: one RocksDB database in one directory, one column family per
//! [`Cf`].
//!
//! Invariants:
//! - the directory is private to the server's OS user: created with mode 0700, and an
//!   existing store whose directory is open to others is refused;
//! - a non-empty directory is opened only if it is a RocksDB database that has gsnap's `meta`
//!   column family; anything else is refused without being modified (the format record
//!   itself is checked by `SnapshotStore::open`);
//! - the WAL is on and recovered in point-in-time mode, so a crash keeps a prefix of the
//!   written batches, as the [`KvBackend`] contract requires;
//! - RocksDB compresses nothing (it is built without compression libraries): the store
//!   compresses values itself.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, CompactOptions,
    DBCompactionStyle, DBCompressionType, DBRawIterator, DBRecoveryMode, Options,
    UniversalCompactOptions, WriteOptions, DB,
};

use crate::backend::{CfEstimate, KvBackend, KvCursor, WriteBatch};
use crate::error::{ErrorKind, Result, StoreError};
use crate::keys::Cf;

/// Memory and file settings of the RocksDB backend. The defaults are modest (about 64 MiB of
/// block cache, at most 64 MiB of memtables and 32 MiB of write-ahead log): the worker shares
/// the machine with PostgreSQL, and the store's size on disk counts the log.
#[derive(Debug, Clone)]
pub struct RocksConfig {
    /// Shared LRU block cache for all column families, in bytes.
    pub block_cache_bytes: usize,
    /// Upper bound on all memtables together, in bytes.
    pub total_write_buffer_bytes: usize,
    /// Memtable size of the large column families (images, TOAST values, the mapping log).
    pub large_write_buffer_bytes: usize,
    /// Memtable size of the small column families.
    pub small_write_buffer_bytes: usize,
    /// Upper bound on the write-ahead log: past it, the column families holding its oldest
    /// file are flushed and the file is removed.
    pub max_wal_bytes: u64,
    /// Maximum number of open SST files (-1: unlimited).
    pub max_open_files: i32,
    /// Background flush and compaction threads.
    pub background_jobs: i32,
}

impl Default for RocksConfig {
    fn default() -> Self {
        RocksConfig {
            block_cache_bytes: 64 << 20,
            total_write_buffer_bytes: 64 << 20,
            large_write_buffer_bytes: 16 << 20,
            small_write_buffer_bytes: 4 << 20,
            max_wal_bytes: 32 << 20,
            max_open_files: 512,
            background_jobs: 2,
        }
    }
}

/// A RocksDB database holding a gsnap store.
pub struct RocksBackend {
    db: DB,
    path: PathBuf,
    names: HashMap<Cf, String>,
}

/// Reads the format record of the store in `path` (column families `existing`) without
/// writing anything; an error if it names another format. A store without one (an
/// interrupted creation) passes.
fn check_format_read_only(path: &Path, existing: &[String]) -> Result<()> {
    let db = DB::open_cf_for_read_only(&Options::default(), path, existing, false)
        .map_err(|e| rocks_error(path, "opening (read-only)", &e))?;
    let meta = db.cf_handle("meta").ok_or_else(|| {
        StoreError::corrupt(format!(
            "gsnap store at \"{}\" has no meta column family",
            path.display()
        ))
    })?;
    let record = db
        .get_cf(&meta, crate::keys::FORMAT_KEY)
        .map_err(|e| rocks_error(path, "reading", &e))?;
    if let Some(v) = record {
        let where_ = format!("gsnap store at \"{}\"", path.display());
        crate::records::decode_format(&v, &where_)?;
    }
    Ok(())
}

impl RocksBackend {
    /// Marks the store's creation complete (the format record is durable): from now on the
    /// directory is a store, never cleared as an interrupted creation.
    pub fn finish_creation(&self) -> Result<()> {
        let marker = self.path.join(CREATING_MARKER);
        match fs::remove_file(&marker) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            r => r.map_err(|e| {
                StoreError::from_io(
                    &e,
                    format!("finishing the store in \"{}\"", self.path.display()),
                )
            })?,
        }
        fs::File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|e| {
                StoreError::from_io(
                    &e,
                    format!("finishing the store in \"{}\"", self.path.display()),
                )
            })
    }

    /// Turns off RocksDB's per-operation performance counters on the calling thread (they
    /// are thread-local, counted on every read and write unless disabled, and read by no one
    /// here).
    pub fn quiet_counters() {
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
    }

    /// Lowers the CPU priority of RocksDB's compaction threads in this process to nice 19
    /// (RocksDB's `LowerThreadPoolCPUPriority`): compaction rewrites files nobody waits for,
    /// and on a busy machine it should take the CPU the database's backends leave rather
    /// than theirs. Flushes keep theirs (writers stall when memtables cannot be flushed).
    /// The threads lower themselves when they next start a job; once lowered, a process
    /// without `CAP_SYS_NICE` cannot raise them again, so only the worker calls this.
    pub fn lower_compaction_priority() {
        rocksdb::Env::new()
            .expect("the default environment always exists")
            .lower_thread_pool_cpu_priority();
    }

    /// Opens the store in `path` with default settings; with `create`, a missing or empty
    /// directory becomes a new, empty database.
    pub fn open(path: &Path, create: bool) -> Result<Self> {
        Self::open_with(path, create, &RocksConfig::default())
    }

    /// Opens the store in `path` with `config`.
    pub fn open_with(path: &Path, create: bool, config: &RocksConfig) -> Result<Self> {
        let fresh = prepare_directory(path, create)?;
        let known: Vec<Cf> = Cf::all();
        let names: HashMap<Cf, String> =
            known.iter().map(|c| (*c, c.name().into_owned())).collect();

        let mut extra = Vec::new();
        if !fresh {
            let existing = DB::list_cf(&Options::default(), path).map_err(|e| {
                // A CURRENT file says a RocksDB database lives here: one that cannot be
                // listed is damaged (a file lost or cut short), not someone else's.
                if path.join("CURRENT").is_file() {
                    return StoreError::new(
                        ErrorKind::Corrupt,
                        format!(
                            "gsnap store at \"{}\" cannot be read ({e}); the store is damaged: \
                             put back a copy made by gsnap_copy_store(), or move it aside to \
                             start an empty store (its snapshots are then lost)",
                            path.display()
                        ),
                    );
                }
                StoreError::incompatible(format!(
                    "directory \"{}\" is not a gsnap store: it is not a readable RocksDB \
                     database ({e}); point gsnap at an empty or missing directory, or at an \
                     existing gsnap store",
                    path.display()
                ))
            })?;
            if !existing.iter().any(|n| n == "meta") {
                return Err(StoreError::incompatible(format!(
                    "directory \"{}\" holds a RocksDB database that is not a gsnap store \
                     (no \"meta\" column family); it was left untouched: point gsnap at an \
                     empty or missing directory",
                    path.display()
                )));
            }
            // A store of another format lacks some of this format's column families: its
            // format record is read first (read-only), so that it is refused untouched
            // instead of being given new column families.
            if names.values().any(|n| !existing.contains(n)) {
                check_format_read_only(path, &existing)?;
            }
            // Column families of a newer format are opened too, so that the format record can
            // be read and the version mismatch reported clearly.
            extra = existing
                .into_iter()
                .filter(|n| n != "default" && !names.values().any(|k| k == n))
                .collect();
        }

        let cache = Cache::new_lru_cache(config.block_cache_bytes);
        let mut db_opts = Options::default();
        db_opts.create_if_missing(create);
        db_opts.create_missing_column_families(true);
        db_opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
        db_opts.set_paranoid_checks(true);
        db_opts.set_compression_type(DBCompressionType::None);
        db_opts.set_db_write_buffer_size(config.total_write_buffer_bytes);
        // The log is kept small: a column family written rarely is flushed instead of holding
        // old log files (the store's size on disk counts the log).
        db_opts.set_max_total_wal_size(config.max_wal_bytes);
        db_opts.set_max_background_jobs(config.background_jobs);
        db_opts.set_max_open_files(config.max_open_files);
        // RocksDB's own info log: at most about 3 MiB (it counts in the size on disk too).
        db_opts.set_keep_log_file_num(2);
        db_opts.set_max_log_file_size(1 << 20);
        db_opts.set_bytes_per_sync(1 << 20);
        // The log is synced in the background every 512 KiB, so that a synced write (a
        // declaration, a deletion) flushes at most that much of the unsynced batches written
        // before it (a capture's, reclamation's) instead of all of them.
        db_opts.set_wal_bytes_per_sync(512 << 10);

        let mut descriptors: Vec<ColumnFamilyDescriptor> = known
            .iter()
            .map(|cf| {
                ColumnFamilyDescriptor::new(names[cf].clone(), cf_options(*cf, config, &cache))
            })
            .collect();
        for name in extra {
            descriptors.push(ColumnFamilyDescriptor::new(name, Options::default()));
        }
        let db = DB::open_cf_descriptors(&db_opts, path, descriptors)
            .map_err(|e| rocks_error(path, "opening", &e))?;
        Ok(RocksBackend {
            db,
            path: path.to_path_buf(),
            names,
        })
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn handle(&self, cf: Cf) -> Result<&ColumnFamily> {
        self.names
            .get(&cf)
            .and_then(|n| self.db.cf_handle(n))
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "gsnap store at \"{}\": column family {} is missing",
                    self.path.display(),
                    cf.name()
                ))
            })
    }

    fn err(&self, what: &str, e: &rocksdb::Error) -> StoreError {
        rocks_error(&self.path, what, e)
    }

    /// One batched read of `keys` in `cf`, keeping `keep` of each value RocksDB pins (a
    /// copy, or only its size).
    fn batched_read<T>(
        &self,
        cf: Cf,
        keys: &[&[u8]],
        keep: impl Fn(&[u8]) -> T,
    ) -> Result<Vec<Option<T>>> {
        let handle = self.handle(cf)?;
        self.db
            .batched_multi_get_cf(handle, keys.iter().copied(), false)
            .into_iter()
            .map(|r| match r {
                Ok(v) => Ok(v.map(|s| keep(&s))),
                Err(e) => Err(self.err("reading", &e)),
            })
            .collect()
    }
}

/// Options of one column family: no compression, the shared block cache, a Bloom filter where
/// point lookups are frequent and usually miss (the dedup index). Where reclamation deletes,
/// a table file in which deletions pile up is marked for compaction, so that the deletions
/// meet the values they delete and both leave the disk (without it, deleted images stay in
/// the lower levels until new data happens to push compactions there).
fn cf_options(cf: Cf, config: &RocksConfig, cache: &Cache) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    let mut opts = Options::default();
    opts.set_compression_type(DBCompressionType::None);
    match cf {
        // Values of kilobytes (images, chunks) to tens of kilobytes (log nodes), read whole.
        // Table files of 16 MiB, compacted at most 128 MiB at a time: a compaction writes its
        // output before it deletes its input, so its size is how far the disk use swings.
        Cf::Images(_) | Cf::Toast | Cf::MapLog => {
            table.set_block_size(16 << 10);
            opts.set_write_buffer_size(config.large_write_buffer_bytes);
            opts.set_target_file_size_base(16 << 20);
            opts.set_max_compaction_bytes(128 << 20);
        }
        // Point lookups that often miss: dedup entries, reference counts of new images, and
        // deltas (a diff asks for the delta of each changed page; not every image has one).
        // Dedup entries are keyed by fingerprints, spread over the whole key space like the
        // key maps' entries below, and compacted the same way. So are counts and deltas:
        // their keys are image ids, which grow within a rank, but snapshots of different
        // ranks take turns (every sixth one minutely, say), and a capture's counts span the
        // 'I' and 'L' prefixes: every flushed file overlapped the whole bottom level, and
        // leveled compaction rewrote all of it every four flushes (under pgbench with a
        // snapshot every 10 s, 0.4-0.6 s of compaction CPU per capture, as much as storing
        // the pages).
        Cf::Dedup | Cf::Refs | Cf::Deltas => {
            table.set_bloom_filter(10.0, false);
            opts.set_write_buffer_size(config.small_write_buffer_bytes);
            merge_runs_by_size(&mut opts);
        }
        Cf::Meta | Cf::Catalog | Cf::Groups => {
            opts.set_write_buffer_size(config.small_write_buffer_bytes)
        }
        // Small entries, many at once when a map starts (one per row of the table): the large
        // write buffer keeps the number of files to compact down. Each page a capture stores
        // reads its block's record (a point lookup, hence the Bloom filter); a key lookup
        // scans one short prefix per key hash.
        // Their keys are key hashes, spread over the whole key space: every new file overlaps
        // every older one, and leveled compaction would rewrite the whole family for each;
        // universal compaction merges files of similar sizes instead. (Not compacted early
        // for its deletions either: a row that moves deletes an open entry, and those would
        // keep the family compacting.)
        Cf::Keys => {
            table.set_bloom_filter(10.0, false);
            opts.set_write_buffer_size(config.large_write_buffer_bytes);
            merge_runs_by_size(&mut opts);
        }
    }
    if matches!(cf, Cf::Dedup | Cf::Refs | Cf::Deltas | Cf::Keys) {
        // The same for the write buffer: every page a capture stores looks its fingerprint
        // up in the dedup index, whose write buffer then holds the capture's own new entries;
        // without a filter each miss walked the buffer's skip list (a fifth of phase two's
        // CPU in a profile under pgbench).
        opts.set_memtable_prefix_bloom_ratio(0.02);
        opts.set_memtable_whole_key_filtering(true);
    }
    if matches!(
        cf,
        Cf::Images(_) | Cf::Toast | Cf::MapLog | Cf::Dedup | Cf::Refs | Cf::Deltas
    ) {
        // Half of any 256 consecutive entries, or half of the file, being deletions.
        opts.add_compact_on_deletion_collector_factory(256, 128, 0.5);
    }
    opts.set_block_based_table_factory(&table);
    opts
}

/// Universal compaction for a family whose keys are hashes: every new file overlaps every
/// older one, so leveled compaction would rewrite the whole family for each. Every capture
/// flushes a small run into such a family (the log's size limit flushes every family with
/// data in the oldest log file); with RocksDB's defaults (a compaction at 4 sorted runs,
/// runs merged by size only within 1% of one another) and a few large runs, each small run
/// was merged into the newest large one: ~65 MB of key map entries rewritten per capture,
/// 4 s of compaction per minute of pgbench. With 8 runs allowed and runs within 10% of one
/// another merged, the small runs merge among themselves.
fn merge_runs_by_size(opts: &mut Options) {
    opts.set_compaction_style(DBCompactionStyle::Universal);
    let mut universal = UniversalCompactOptions::default();
    universal.set_size_ratio(10);
    opts.set_universal_compaction_options(&universal);
    opts.set_level_zero_file_num_compaction_trigger(8);
}

/// Checks (and if asked, creates) the store directory. Returns true if it is new or empty.
/// A file that exists in a store directory only while the store is being created: a creation
/// interrupted by a crash (a RocksDB database without gsnap's column families or format
/// record) is recognized by it and started over, instead of being refused forever.
const CREATING_MARKER: &str = "GSNAP-CREATING";

/// Writes the creation marker into the (empty) directory `path`, durably.
fn mark_creating(path: &Path) -> Result<()> {
    let shown = path.display();
    let io =
        |e: std::io::Error| StoreError::from_io(&e, format!("creating a store in \"{shown}\""));
    fs::File::create(path.join(CREATING_MARKER))
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    fs::File::open(path).and_then(|d| d.sync_all()).map_err(io)
}

/// Empties a directory whose store creation was interrupted (it holds the creation marker).
fn clear_interrupted_creation(path: &Path) -> Result<()> {
    let shown = path.display();
    let io = |e: std::io::Error| {
        StoreError::from_io(
            &e,
            format!("clearing the interrupted store creation in \"{shown}\""),
        )
    };
    for entry in fs::read_dir(path).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_dir() {
            fs::remove_dir_all(entry.path()).map_err(io)?;
        } else {
            fs::remove_file(entry.path()).map_err(io)?;
        }
    }
    Ok(())
}

fn prepare_directory(path: &Path, create: bool) -> Result<bool> {
    let fresh = claim_directory(path, create)?;
    if fresh {
        mark_creating(path)?;
    }
    Ok(fresh)
}

/// Checks `path` and says whether a new store is to be created there (it was missing, empty,
/// or held an interrupted creation, now cleared).
fn claim_directory(path: &Path, create: bool) -> Result<bool> {
    let shown = path.display();
    match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Err(StoreError::not_found(format!(
                    "no gsnap store at \"{shown}\": the directory does not exist"
                )));
            }
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    StoreError::from_io(&e, format!("creating store directory \"{shown}\""))
                })?;
            Ok(true)
        }
        Err(e) => Err(StoreError::from_io(
            &e,
            format!("examining store directory \"{shown}\""),
        )),
        Ok(meta) if !meta.is_dir() => Err(StoreError::incompatible(format!(
            "\"{shown}\" is not a directory, so it cannot hold a gsnap store"
        ))),
        Ok(meta) => {
            let empty = fs::read_dir(path)
                .map_err(|e| {
                    StoreError::from_io(&e, format!("listing store directory \"{shown}\""))
                })?
                .next()
                .is_none();
            let mode = meta.permissions().mode() & 0o777;
            if empty {
                if !create {
                    return Err(StoreError::not_found(format!(
                        "no gsnap store at \"{shown}\": the directory is empty"
                    )));
                }
                fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|e| {
                    StoreError::from_io(&e, format!("making store directory \"{shown}\" private"))
                })?;
                return Ok(true);
            }
            if mode & 0o027 != 0 {
                return Err(StoreError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "gsnap store directory \"{shown}\" has permissions {mode:04o}; it must be \
                         private to the server's OS user: run chmod 0700 \"{shown}\""
                    ),
                ));
            }
            if path.join(CREATING_MARKER).exists() {
                if !create {
                    return Err(StoreError::not_found(format!(
                        "no gsnap store at \"{shown}\": its creation was interrupted"
                    )));
                }
                clear_interrupted_creation(path)?;
                return Ok(true);
            }
            if !path.join("CURRENT").exists() {
                return Err(StoreError::incompatible(format!(
                    "directory \"{shown}\" is not empty and is not a gsnap store (it has no \
                     RocksDB CURRENT file); point gsnap at an empty or missing directory, or at \
                     an existing gsnap store"
                )));
            }
            Ok(false)
        }
    }
}

/// Converts a RocksDB error into a [`StoreError`] with the directory and advice.
fn rocks_error(path: &Path, what: &str, e: &rocksdb::Error) -> StoreError {
    let text: &str = e.as_ref();
    let kind = StoreError::classify_message(text);
    let shown = path.display();
    let advice = match kind {
        ErrorKind::NoSpace => format!(
            "free disk space on the file system that holds \"{shown}\"; snapshots being \
             captured when it filled up are marked failed"
        ),
        ErrorKind::PermissionDenied => format!(
            "make \"{shown}\" and every file in it owned by and accessible to the PostgreSQL \
             server's OS user"
        ),
        ErrorKind::Corrupt => format!(
            "the store is damaged; restore \"{shown}\" from a backup, or move it aside to start \
             an empty store (its snapshots are then lost)"
        ),
        _ if text.contains("lock") => format!(
            "another process has the store open; only one gsnap worker per store may run, stop \
             the other one (or the tool that opened \"{shown}\")"
        ),
        _ => "check the server log and the file system".to_string(),
    };
    StoreError::new(
        kind,
        format!("gsnap store at \"{shown}\": {what} failed: {text}; {advice}"),
    )
}

impl KvBackend for RocksBackend {
    fn describe(&self) -> String {
        format!("gsnap store at \"{}\"", self.path.display())
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get_cf(self.handle(cf)?, key)
            .map_err(|e| self.err("reading", &e))
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.batched_read(cf, keys, <[u8]>::to_vec)
    }

    fn value_sizes(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<usize>>> {
        self.batched_read(cf, keys, <[u8]>::len)
    }

    fn cursor(&self, cf: Cf) -> Result<Box<dyn KvCursor + '_>> {
        let it = self.db.raw_iterator_cf(self.handle(cf)?);
        Ok(Box::new(RocksCursor { it, backend: self }))
    }

    fn last_in_range(
        &self,
        cf: Cf,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if start >= end {
            return Ok(None);
        }
        let mut it = self.db.raw_iterator_cf(self.handle(cf)?);
        it.seek_for_prev(end);
        if it.valid() && it.key() == Some(end) {
            it.prev();
        }
        it.status().map_err(|e| self.err("reading", &e))?;
        Ok(it
            .item()
            .filter(|(k, _)| *k >= start)
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn write(&self, batch: &WriteBatch, sync: bool) -> Result<()> {
        // Room for the whole batch at once (its size counts 16 bytes of overhead per
        // operation, more than RocksDB's record headers), so it is not regrown as it fills.
        let mut rb = rocksdb::WriteBatch::with_capacity_bytes(batch.size_bytes() + 64);
        for op in batch.ops() {
            match op {
                crate::backend::BatchOp::Put { cf, key, value } => {
                    rb.put_cf(self.handle(cf)?, key, value)
                }
                crate::backend::BatchOp::Delete { cf, key } => rb.delete_cf(self.handle(cf)?, key),
                crate::backend::BatchOp::DeleteRange { cf, start, end } => {
                    rb.delete_range_cf(self.handle(cf)?, start, end)
                }
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        self.db
            .write_opt(rb, &opts)
            .map_err(|e| self.err("writing", &e))
    }

    fn compact_range(&self, cf: Cf, start: &[u8], end: &[u8]) -> Result<()> {
        // Not exclusive: RocksDB's own compactions go on meanwhile, so writers never stall
        // behind this one (it runs on a thread of its own: `src/worker/lifetimes.rs`).
        let mut opts = CompactOptions::default();
        opts.set_exclusive_manual_compaction(false);
        self.db
            .compact_range_cf_opt(self.handle(cf)?, Some(start), Some(end), &opts);
        Ok(())
    }

    fn copy_to(&self, dir: &Path) -> Result<()> {
        // A RocksDB checkpoint: the memtables flushed, then a new manifest naming the live
        // files, hard-linked into the copy (copied across file systems); writers go on
        // meanwhile, and the copy holds what was written up to one moment.
        if dir.exists() {
            return Err(StoreError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the gsnap store cannot be copied to \"{}\": it already exists",
                    dir.display()
                ),
            ));
        }
        let failed = |e: rocksdb::Error| {
            let text: &str = e.as_ref();
            StoreError::new(
                StoreError::classify_message(text),
                format!(
                    "copying the gsnap store at \"{}\" to \"{}\" failed: {text}",
                    self.path.display(),
                    dir.display()
                ),
            )
        };
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(failed)?;
        // Private, as the store is (the server's umask already makes it so).
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| {
            StoreError::new(
                ErrorKind::Io,
                format!("making the copy \"{}\" private: {e}", dir.display()),
            )
        })
    }

    fn disk_bytes(&self) -> Result<u64> {
        // The whole directory: table files, the write-ahead log, the manifest and the logs.
        let mut total = 0;
        let entries = std::fs::read_dir(&self.path).map_err(|e| {
            StoreError::new(
                ErrorKind::Io,
                format!("listing the store directory {}: {e}", self.path.display()),
            )
        })?;
        for entry in entries {
            // A file removed between the listing and its metadata (compaction) counts 0.
            if let Ok(meta) = entry.and_then(|e| e.metadata()) {
                if meta.is_file() {
                    total += meta.len();
                }
            }
        }
        Ok(total)
    }

    fn estimate(&self, cf: Cf) -> Result<CfEstimate> {
        let handle = self.handle(cf)?;
        let property = |name: &str| -> Result<u64> {
            Ok(self
                .db
                .property_int_value_cf(handle, name)
                .map_err(|e| self.err("reading a property", &e))?
                .unwrap_or(0))
        };
        Ok(CfEstimate {
            entries: property("rocksdb.estimate-num-keys")?,
            bytes: property("rocksdb.estimate-live-data-size")?
                + property("rocksdb.cur-size-all-mem-tables")?,
        })
    }
}

struct RocksCursor<'a> {
    it: DBRawIterator<'a>,
    backend: &'a RocksBackend,
}

impl RocksCursor<'_> {
    fn check(&self) -> Result<()> {
        if self.it.valid() {
            return Ok(());
        }
        self.it
            .status()
            .map_err(|e| self.backend.err("reading", &e))
    }
}

impl KvCursor for RocksCursor<'_> {
    fn seek(&mut self, key: &[u8]) -> Result<()> {
        self.it.seek(key);
        self.check()
    }

    fn next(&mut self) -> Result<()> {
        if self.it.valid() {
            self.it.next();
        }
        self.check()
    }

    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.it.item()
    }
}
