//! Every gsnap setting, in one place. Each is a GUC named `gsnap.*`; those that size shared
//! memory or pick the database need a restart, the others a reload (they are read by the
//! worker). None can be changed by an ordinary user in a session (`gsnap.as_of`, the one a
//! session sets, is defined with the planner hook that reads it, `plan::as_of`).

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

/// The database whose gsnap tables are snapshotted (the worker connects to it).
pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// Directory of the snapshot store; empty means `$PGDATA/gsnap`.
pub static STORE_DIRECTORY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Seconds between periodic snapshots (0: only on request).
pub static SNAPSHOT_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Pages one span's dirty set can hold before a relation falls back to a full capture.
pub static MAX_DIRTY_PAGES: GucSetting<i32> = GucSetting::<i32>::new(1 << 20);

/// Shared image cache size, in kB.
pub static IMAGE_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// Shared group cache size, in kB.
pub static INDEX_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// The store's block cache (RocksDB), in kB.
pub static STORE_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

/// The worker's cache of the key maps' open entries of recently captured blocks, in kB.
pub static KEY_MAP_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// The worker's memory for the images the last captures stored (the next ones' delta bases), kB.
pub static DELTA_BASE_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// L_1*: the first index group's length budget (snapshots per group until queries tell).
pub static GROUP_LENGTH: GucSetting<i32> = GucSetting::<i32>::new(20);

/// p: GSnap's punish factor for a group that did not use its page budget.
pub static GROUP_PUNISH_FACTOR: GucSetting<f64> = GucSetting::<f64>::new(0.75);

/// Pages the worker captures between two looks at its requests.
pub static CAPTURE_BATCH_PAGES: GucSetting<i32> = GucSetting::<i32>::new(256);

/// Memory for a capture's copies of the pages it read (kB): phase one copies what fits, then
/// releases the snapshot; pages beyond are stored as they are read, under the snapshot.
pub static CAPTURE_MEMORY_KB: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

/// `gsnap.capture_memory` in bytes.
pub fn capture_memory_bytes() -> usize {
    CAPTURE_MEMORY_KB.get().max(0) as usize * 1024
}

/// Phase one copies changed pages whole and decides what the snapshot sees on them after
/// releasing it (`page.rs`).
pub static CAPTURE_PAGE_COPIES: GucSetting<bool> = GucSetting::<bool>::new(true);

/// How long before a periodic snapshot the worker copies the pages written so far (ms; 0:
/// never), so that the capture only checks them (`worker/ahead.rs`).
pub static CAPTURE_COPY_AHEAD_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// The part of `gsnap.snapshot_interval` over which phase two of a capture is spread.
pub static CAPTURE_PACE: GucSetting<f64> = GucSetting::<f64>::new(0.8);

/// Check every image read from the store against its BLAKE3 fingerprint.
pub static VERIFY_IMAGES: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Keep a key map of each captured table with a primary key or unique index (`keymap.rs`).
pub static KEY_MAPS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Store the delta of each changed page's new image (`gsnap_format::delta`) for diffs.
pub static PAGE_DELTAS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Declared snapshots that may wait for their capture.
pub static MAX_QUEUED_SNAPSHOTS: GucSetting<i32> = GucSetting::<i32>::new(16);

/// The retention policy, in restic/borg words (`gsnap_lifetimes::Policy`); empty: keep every
/// snapshot.
pub static RETENTION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The newest snapshots the policy never deletes.
pub static MIN_SNAPSHOTS: GucSetting<i32> = GucSetting::<i32>::new(1);

/// Cap on the store's size on disk, in MB (0: none): the policy then also thins the lowest
/// ranks, oldest first.
pub static MAX_STORE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Seconds between a snapshot's deletion and the reclamation of its space.
pub static RECLAIM_DELAY: GucSetting<i32> = GucSetting::<i32>::new(10);

/// Dead mappings reclaimed per step (one store batch between two looks at requests).
pub static RECLAIM_BATCH: GucSetting<i32> = GucSetting::<i32>::new(512);

/// Test hook: milliseconds the worker pauses between taking a declaration's MVCC snapshot
/// and switching dirty sets (widens the window the first capture ordering is about).
pub static DEBUG_DECLARE_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Test hook: milliseconds between two capture batches (keeps a capture in flight).
pub static DEBUG_CAPTURE_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Test hook: milliseconds between a capture's last page read and its commit.
pub static DEBUG_COMMIT_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Test hook: milliseconds between two reclamation steps (keeps a reclamation in flight).
pub static DEBUG_RECLAIM_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Registers the settings; called from `_PG_init` during preload.
pub fn init() {
    GucRegistry::define_string_guc(
        c"gsnap.database",
        c"The database in which gsnap tables can be created and snapshotted.",
        c"gsnap's background worker connects to this database. gsnap tables in any other \
          database are refused.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"gsnap.store_directory",
        c"Directory of gsnap's snapshot store (default: gsnap under the data directory).",
        c"One RocksDB database per cluster, opened only by the gsnap worker. The directory \
          is created with mode 0700; a relative path is relative to the data directory.",
        &STORE_DIRECTORY,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"gsnap.snapshot_interval",
        c"Seconds between snapshots the worker declares by itself (0 = only on request).",
        c"With an interval, every gsnap table gets a snapshot periodically, with no change \
          to the clients (pgbench runs with periodic snapshots).",
        &SNAPSHOT_INTERVAL,
        0,
        7 * 24 * 3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"gsnap.max_dirty_pages",
        c"Pages a span's dirty set can record before falling back to full captures.",
        c"Each gsnap write records its page in the dirty set of the current span (8 bytes per \
          page, three sets: the current span's, the first part of a span split for copies \
          made ahead, and the one drained last). When a set is full, the table of a page that \
          does not fit is captured completely at the next snapshot instead: correct, but \
          slower. Raise it if the log reports dirty-set overflows.",
        &MAX_DIRTY_PAGES,
        1024,
        1 << 28,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.image_cache_size",
        c"Shared memory for recently read snapshot pages and TOAST chunks.",
        c"Queries over snapshots read pages through this cache, so repeated reads of the \
          same snapshots need no trip to the store.",
        &IMAGE_CACHE_SIZE,
        2 * 1024,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.index_cache_size",
        c"Shared memory for the snapshot index groups queries read.",
        c"Holds the active group and recently used sealed groups of the GSnap index, \
          evicted whole, least recently used first. A group never exceeds a quarter of it.",
        &INDEX_CACHE_SIZE,
        1024,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.store_cache_size",
        c"Memory of the gsnap worker for the snapshot store's recently read blocks (RocksDB's \
          block cache).",
        c"A capture reads, for every page it stores, the newest image of the page (for its \
          delta) and the key map's entries of its block: when those no longer fit, every read \
          goes to the files and captures fall behind a busy database. Size it to the \
          compressed size of the captured tables plus about 40 bytes per row with a key.",
        &STORE_CACHE_SIZE,
        8 * 1024,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.key_map_cache_size",
        c"Memory of the gsnap worker for the key map entries of the blocks recently captured.",
        c"A capture compares the keys of every page it stores with those its block held at \
          its last capture. With this cache it finds them in memory instead of reading them \
          from the store: about 16 bytes per row with a key, plus 64 per block, of the pages \
          changed between two snapshots. 0 turns it off.",
        &KEY_MAP_CACHE_SIZE,
        0,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.delta_base_cache_size",
        c"Memory of the gsnap worker for the images the last captures stored.",
        c"With gsnap.page_deltas, a capture gives each page it stores again a delta from the \
          image the page had, usually one an earlier capture stored. With this cache it \
          finds that image in memory instead of reading it from the store: about 700-900 \
          bytes per page (compressed); past it, the oldest are forgotten. Nothing is kept \
          while gsnap.page_deltas is off. 0 turns it off.",
        &DELTA_BASE_CACHE_SIZE,
        0,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.group_length",
        c"Snapshots in the first index group (GSnap's initial length budget L1*).",
        c"Later groups adapt their length to the update ratio and to the length of the \
          snapshot ranges queries actually read (GSnap Algorithm 1).",
        &GROUP_LENGTH,
        1,
        4096,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"gsnap.group_punish_factor",
        c"GSnap's punish factor p: how much a group that did not use its page budget shrinks.",
        c"The next group's length budget is max(p x length, C), where C is the average \
          length of recent snapshot-range queries.",
        &GROUP_PUNISH_FACTOR,
        0.05,
        1.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.capture_batch_pages",
        c"Pages the worker captures before it looks at waiting requests again.",
        c"Smaller keeps queries over snapshots responsive during big captures; larger \
          captures slightly faster.",
        &CAPTURE_BATCH_PAGES,
        1,
        1 << 20,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.capture_memory",
        c"Memory for the pages a capture has read and not stored yet.",
        c"A capture first copies the views of the pages it must read into this much memory and \
          releases its MVCC snapshot once every page is read (VACUUM may go on); it \
          fingerprints, compresses and stores them afterwards. Pages beyond it are stored as \
          they are read, while the snapshot is held. 0: store every page as it is read.",
        &CAPTURE_MEMORY_KB,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_bool_guc(
        c"gsnap.capture_page_copies",
        c"Capture copies changed pages whole and decides visibility after releasing the snapshot.",
        c"On: while a capture holds its MVCC snapshot (and VACUUM's horizon) it only copies each \
          changed page, and decides which tuples the snapshot sees on the copies after \
          releasing it, from the snapshot's list of running transactions and the commit log. \
          Pages with out-of-line (TOAST) values, and every page when the snapshot's \
          subtransactions overflowed, are decided as they are read. Off: every page is decided \
          while the snapshot is held.",
        &CAPTURE_PAGE_COPIES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.capture_copy_ahead",
        c"How long before a periodic snapshot the worker copies the pages written so far.",
        c"With gsnap.snapshot_interval set and gsnap.capture_page_copies on, the worker copies \
          the pages written in the span this long before the next periodic snapshot (at most a \
          quarter of the interval), without holding any snapshot; the capture then takes the \
          copy of a page nobody wrote since without looking at it, and of a page written since \
          when its LSN is unchanged, which shortens the time it holds VACUUM back. Tables \
          that are not WAL-logged are read at the snapshot as before. The copies count \
          against gsnap.capture_memory. 0: off.",
        &CAPTURE_COPY_AHEAD_MS,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"gsnap.capture_pace",
        c"Part of gsnap.snapshot_interval over which a capture stores the pages it has read.",
        c"Phase two of a capture (fingerprints, compression, store writes) runs on a thread of \
          the worker, spread over this part of the interval after the declaration instead of \
          taking a core at once; the decisions on the page copies before it are spread over \
          its first quarter, at most 5 seconds. It hurries when a session waits for the \
          snapshot or the next one is declared. 0: store at full speed.",
        &CAPTURE_PACE,
        0.0,
        1.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.max_queued_snapshots",
        c"Snapshots that may be declared while earlier ones are still being captured.",
        c"Each holds back vacuum until its capture has read its last page. When the queue is full, a \
          new declaration waits for the oldest capture.",
        &MAX_QUEUED_SNAPSHOTS,
        1,
        1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"gsnap.retention",
        c"Which snapshots to keep, e.g. 'within=2h hourly=48 daily=30 weekly=8 monthly=12 yearly=unlimited'.",
        c"Empty keeps every snapshot. within keeps every snapshot younger than that (counted \
          from the newest snapshot); minutely, hourly, daily, weekly, monthly and yearly keep \
          the first snapshot of that many of the most recent periods (UTC) that have one. \
          Pinned snapshots and the newest gsnap.min_snapshots are always kept. \
          gsnap_retention_preview() shows what a policy keeps and why.",
        &RETENTION,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.min_snapshots",
        c"The newest snapshots retention never deletes.",
        c"At least 1, so the newest snapshot always stays.",
        &MIN_SNAPSHOTS,
        1,
        1 << 20,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.max_store_size",
        c"Largest size of the snapshot store on disk (0: no limit).",
        c"Above it, retention also deletes snapshots of the lowest ranks, oldest first, never \
          pinned ones nor the newest gsnap.min_snapshots, and warns when that is not enough.",
        &MAX_STORE_SIZE,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"gsnap.reclaim_delay",
        c"Seconds between a snapshot's deletion and the reclamation of its space.",
        c"Queries that started before the deletion keep reading it; reclamation also waits \
          while a query pins the index group holding it.",
        &RECLAIM_DELAY,
        0,
        24 * 3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"gsnap.reclaim_batch",
        c"Dead mappings reclaimed in one step of the worker.",
        c"Each step is one store batch between two looks at waiting requests and captures; \
          smaller keeps them more responsive, larger reclaims faster.",
        &RECLAIM_BATCH,
        1,
        1 << 20,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"gsnap.key_maps",
        c"Keep a key map of each table with a primary key (or unique index), so that lookups \
          by key AS OF a snapshot read only the pages that can hold the key.",
        c"The capture hashes the key of every row of the pages it reads. Turned on for a table \
          (or its key changes), the next capture reads every page of the table once; lookups \
          by key use the map for the snapshots taken from then on.",
        &KEY_MAPS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"gsnap.page_deltas",
        c"Keep, with each changed page's new image, the tuples that changed since the page's \
          previous image, so that gsnap_diff reads those instead of both images.",
        c"The capture then reads the page's previous image to compare; a delta larger than \
          half the page is not kept. Diffs of snapshots taken without deltas read both images.",
        &PAGE_DELTAS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"gsnap.verify_images",
        c"Check every page image read from the store against its BLAKE3 fingerprint.",
        c"RocksDB checks the CRC32c checksum of every block it reads either way; this adds an \
          end-to-end check of each image, at the cost of hashing it (the worker spends about \
          a third more CPU serving AS OF reads). TOAST values are always checked.",
        &VERIFY_IMAGES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gsnap.debug_declare_pause_ms",
        c"Test hook: pause between a declaration's MVCC snapshot and its dirty-set switch.",
        c"For tests of the capture orderings only; keep 0 in production.",
        &DEBUG_DECLARE_PAUSE_MS,
        0,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_int_guc(
        c"gsnap.debug_capture_pause_ms",
        c"Test hook: pause between two capture batches.",
        c"For tests that need a capture in flight; keep 0 in production.",
        &DEBUG_CAPTURE_PAUSE_MS,
        0,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_int_guc(
        c"gsnap.debug_commit_pause_ms",
        c"Test hook: pause between a capture's last page read and its commit.",
        c"For tests that need a capture whose pages are all read but not yet durable; keep 0 \
          in production.",
        &DEBUG_COMMIT_PAUSE_MS,
        0,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_int_guc(
        c"gsnap.debug_reclaim_pause_ms",
        c"Test hook: pause between two reclamation steps.",
        c"For tests that need a reclamation in flight; keep 0 in production.",
        &DEBUG_RECLAIM_PAUSE_MS,
        0,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS | GucFlags::NO_SHOW_ALL,
    );
    // SAFETY: called from _PG_init on the main thread.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"gsnap".as_ptr()) };
}

/// The configured retention policy's text ('' when unset).
pub fn retention() -> String {
    RETENTION
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `gsnap.max_store_size` in bytes (0: no cap).
pub fn max_store_size_bytes() -> u64 {
    u64::try_from(MAX_STORE_SIZE.get()).unwrap_or(0) * 1024 * 1024
}

/// The configured database name.
pub fn database() -> String {
    DATABASE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "postgres".into())
}
