//! Talking to the gsnap worker: a backend sends one typed [`Request`] through its own request
//! slot and gets one typed [`Reply`] or the worker's [`WorkerError`] back (DESIGN.md,
//! "Talking to the worker"). The bytes in between are `gsnap_protocol`'s, encoded and decoded
//! only there; the slot exchange is [`transport`]'s. The wait is interruptible: a cancelled
//! query gives the request up, and the worker cleans up after it.
//!
//! Bulk answers (page images, TOAST chunks, index groups) come through the shared caches:
//! the worker loads what was asked into cache slots *pinned* for the backend and answers with
//! the list of slots; the backend reads them in place and unpins them ([`Pinned`],
//! [`PinnedGroups`]). So every read also warms the cache for the next query, and no second
//! copy through a queue is needed.
//!
//! A worker's error becomes a PostgreSQL ERROR in one place, [`raise`]: its code's SQLSTATE,
//! its message, DETAIL and HINT.

mod pinned;
mod transport;

pub use pinned::{release, release_answer, unpin_groups, unpin_images, Pinned, PinnedGroups};
pub use transport::{prefetch, set_latch_of, wait_latch};

use crate::error::error;
use gsnap_protocol::listing::{
    self, DecisionRow, GroupRow, ReportRow, ScanHeader, SnapshotRow, TableRow,
};
use gsnap_protocol::{
    DecodeError, ErrorCode, ImageId, Kind, Pages, Reply, Request, SnapId, WorkerError,
};
use pgrx::PgSqlErrorCode;

/// Whether the server is in recovery (a standby, or still replaying WAL): the worker starts
/// only when recovery ends, so no request can be answered meanwhile.
pub fn in_recovery() -> bool {
    // SAFETY: reads the shared recovery state; callable in any backend.
    unsafe { pgrx::pg_sys::RecoveryInProgress() }
}

/// Sends `request` and waits for the worker's reply; the worker's error is raised as an
/// ERROR.
pub fn request(request: Request) -> Reply {
    request_checked(request).unwrap_or_else(|e| raise(e))
}

/// Sends `request` and waits for the worker's reply or error.
pub fn request_checked(request: Request) -> Result<Reply, WorkerError> {
    transport::exchange(&request, None)
}

/// Sends `request` and waits for the worker's reply, calling `watch` every few milliseconds
/// while it waits: `watch` may raise an ERROR (the request is then given up), for example
/// when the wait can never end. The worker's error is raised as an ERROR.
pub fn call_watching(request: Request, watch: &mut dyn FnMut()) -> Reply {
    transport::exchange(&request, Some(watch)).unwrap_or_else(|e| raise(e))
}

/// Raises a worker's error as a PostgreSQL ERROR: its code's SQLSTATE, its message, and its
/// DETAIL and HINT if it has them.
pub fn raise(e: WorkerError) -> ! {
    let mut r = error(sql_error_code(e.code.sqlstate()), e.message);
    if let Some(detail) = e.detail {
        r = r.detail(detail);
    }
    if let Some(hint) = e.hint {
        r = r.hint(hint);
    }
    r.raise()
}

/// pgrx's error code for a five-character SQLSTATE (PostgreSQL's `MAKE_SQLSTATE`: six bits
/// per character); one pgrx does not know is `internal_error`.
fn sql_error_code(sqlstate: &str) -> PgSqlErrorCode {
    let chars = sqlstate.as_bytes();
    if chars.len() != 5 {
        return PgSqlErrorCode::ERRCODE_INTERNAL_ERROR;
    }
    let code = chars.iter().enumerate().fold(0i32, |code, (i, &c)| {
        code + (((i32::from(c) - i32::from(b'0')) & 0x3F) << (6 * i))
    });
    PgSqlErrorCode::from(code)
}

/// A reply the request's kind never gets (`gsnap_protocol::decode_answer` refuses those, so
/// this is a bug): its pins are released and it is an ERROR.
pub fn unexpected(kind: Kind, reply: Reply) -> ! {
    release(&reply);
    error(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("gsnap: a {} reply to a {kind:?} request", reply.name()),
    )
    .raise()
}

/// How many times a paged listing is read again from its start because it changed while it
/// was read, before giving up.
const MAX_LISTING_RESTARTS: u32 = 100;

/// What a paged request gets: the whole listing, or the one reply that stands instead of it
/// (a ScanBegin's [`Reply::TableAbsent`]).
enum Paged {
    Listing(Vec<u8>),
    Instead(Reply),
}

/// Sends a paged `request` (see [`Kind::is_paged`]) page by page and joins the pages. A
/// listing that changes between two pages (its total differs, or it shrank below the offset
/// asked for, which the worker answers as an invalid argument) is read again from offset 0.
fn paged(mut request: Request) -> Result<Paged, WorkerError> {
    let kind = request.kind();
    let mut restarts = 0;
    let mut pages = Pages::new();
    loop {
        let offset = pages.next_offset();
        *request.offset_mut().expect("a paged request has an offset") = offset;
        let changed = match request_checked(request.clone()) {
            Ok(Reply::Page(page)) => match pages.add(page) {
                Ok(()) if pages.is_complete() => {
                    let bytes = pages.into_bytes().expect("a complete listing");
                    return Ok(Paged::Listing(bytes));
                }
                Ok(()) => false,
                Err(DecodeError::PageTotalChanged { .. }) => true,
                Err(e) => transport::bad_answer(kind, e),
            },
            Ok(reply) => return Ok(Paged::Instead(reply)),
            Err(e) if e.code == ErrorCode::InvalidArgument && offset > 0 => true,
            Err(e) => return Err(e),
        };
        if changed {
            if restarts == MAX_LISTING_RESTARTS {
                error(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("the gsnap worker's {kind:?} listing kept changing while it was read"),
                )
                .hint("Try again when fewer snapshots are being taken.")
                .raise();
            }
            restarts += 1;
            pages = Pages::new();
        }
    }
}

/// The listing a paged `request` answers, decoded with `decode`; the worker's error is
/// raised.
fn listing<T>(request: Request, decode: fn(&[u8]) -> Result<T, DecodeError>) -> T {
    let kind = request.kind();
    match paged(request).unwrap_or_else(|e| raise(e)) {
        Paged::Listing(bytes) => decode(&bytes).unwrap_or_else(|e| transport::bad_answer(kind, e)),
        Paged::Instead(reply) => unexpected(kind, reply),
    }
}

/// Every snapshot the store knows, oldest first.
pub fn snapshots() -> Vec<SnapshotRow> {
    listing(Request::Snapshots { offset: 0 }, listing::decode_snapshots)
}

/// The tables of snapshot `snap`.
pub fn snapshot_tables(snap: SnapId) -> Vec<TableRow> {
    listing(
        Request::SnapshotTables { snap, offset: 0 },
        listing::decode_tables,
    )
}

/// The index groups.
pub fn groups() -> Vec<GroupRow> {
    listing(Request::Groups { offset: 0 }, listing::decode_groups)
}

/// Sends a request whose answer is [`Reply::Done`] (deletion, pins, ranks).
pub fn done(request: Request) {
    let kind = request.kind();
    match self::request(request) {
        Reply::Done => {}
        reply => unexpected(kind, reply),
    }
}

/// What retention policy `policy` (the configured one if None) keeps and deletes.
pub fn retention_preview(policy: Option<String>) -> Vec<DecisionRow> {
    listing(
        Request::RetentionPreview { policy, offset: 0 },
        listing::decode_decisions,
    )
}

/// The reference verification's report (with `repair`, after repairing).
/// Waits (cancellably, with a NOTICE) while a capture is in progress: a capture's content is
/// counted when it commits, so the store is verified between captures.
pub fn verify(repair: bool) -> Vec<ReportRow> {
    let kind = Kind::Verify;
    let mut told = false;
    loop {
        match paged(Request::Verify { repair, offset: 0 }) {
            Ok(Paged::Listing(bytes)) => {
                return listing::decode_report(&bytes)
                    .unwrap_or_else(|e| transport::bad_answer(kind, e))
            }
            Ok(Paged::Instead(reply)) => unexpected(kind, reply),
            Err(e) if e.code == ErrorCode::Capturing => {
                if !told {
                    pgrx::notice!("gsnap_verify waits for the capture in progress to end");
                    told = true;
                }
                wait_latch(std::time::Duration::from_millis(20));
            }
            Err(e) => raise(e),
        }
    }
}

/// The store's space report.
pub fn store_stats() -> Vec<ReportRow> {
    listing(Request::StoreStats { offset: 0 }, listing::decode_report)
}

/// The start of reading table `relid` at `snap`: where its pages are and its row type bytes;
/// None if the snapshot does not hold the table.
pub fn scan_begin(snap: SnapId, relid: u32) -> Result<Option<(ScanHeader, Vec<u8>)>, WorkerError> {
    let kind = Kind::ScanBegin;
    match paged(Request::ScanBegin {
        snap,
        relid,
        offset: 0,
    })? {
        Paged::Listing(bytes) => Ok(Some(
            listing::decode_scan(&bytes).unwrap_or_else(|e| transport::bad_answer(kind, e)),
        )),
        Paged::Instead(Reply::TableAbsent) => Ok(None),
        Paged::Instead(reply) => unexpected(kind, reply),
    }
}

/// What the key map of relation incarnation `rel` says of the keys hashed to `hashes` at
/// the snapshots `from..=to` (`keymap.rs`): the snapshot it is complete from (None: no map
/// with `definition`), and the blocks that may hold the keys (None: too many to list).
pub fn key_candidates(
    rel: u32,
    definition: &[u8],
    hashes: &[u64],
    (from, to): (u64, u64),
) -> Option<(SnapId, Option<Vec<u32>>)> {
    let mut all: Vec<u32> = Vec::new();
    let mut found = None;
    // A request carries at most MAX_KEY_HASHES hashes: more are asked in several, and the
    // blocks are the union of their answers. No hash (a NULL key) is still one request: its
    // answer says whether the map covers the snapshots (no block, or every page read).
    let chunks = hashes.chunks(gsnap_protocol::MAX_KEY_HASHES);
    for chunk in chunks.chain(hashes.is_empty().then_some(&[][..])) {
        let reply = request(Request::KeyCandidates {
            rel,
            definition: definition.to_vec(),
            hashes: chunk.to_vec(),
            from: SnapId(from),
            to: SnapId(to),
        });
        let Reply::KeyCandidates {
            start,
            complete,
            blocks,
        } = reply
        else {
            unexpected(Kind::KeyCandidates, reply)
        };
        let start = start?;
        found = Some(start);
        if !complete {
            return Some((start, None));
        }
        all.extend(blocks);
    }
    all.sort_unstable();
    all.dedup();
    found.map(|start| (start, Some(all)))
}

/// What the readable snapshots of `from..=to` hold of the table with OID `relid`.
pub fn scan_range(relid: u32, from: SnapId, to: SnapId) -> listing::ScanRange {
    listing(
        Request::ScanRange {
            relid,
            from,
            to,
            offset: 0,
        },
        listing::decode_scan_range,
    )
}

/// The latest readable snapshot taken at or before `unix_us` (µs since the Unix epoch).
pub fn resolve_time(unix_us: i64) -> SnapId {
    match request_checked(Request::ResolveTime { unix_us }) {
        Ok(Reply::Resolved { snap }) => snap,
        Ok(reply) => unexpected(Kind::ResolveTime, reply),
        Err(mut e) => {
            // The hint names the first snapshot and its time, printed here in the session's
            // time zone.
            if e.code == ErrorCode::NoSnapshotAtTime {
                e.hint = Some(
                    match snapshots().into_iter().find(|s| s.state.is_readable()) {
                        Some(first) => format!(
                            "The first readable snapshot, {}, was taken at {}.",
                            first.id.0,
                            crate::ffi::settings::timestamptz_text(first.taken_at_us)
                        ),
                        None => "no readable snapshot exists yet; take one with gsnap_snapshot()"
                            .to_string(),
                    },
                );
            }
            raise(e)
        }
    }
}

/// Pins the index groups holding snapshots `first..=last` in the group cache. `record_access`
/// tells the dividing policy about the access.
pub fn index_pin(first: SnapId, last: SnapId, record_access: bool) -> PinnedGroups {
    match request(Request::IndexPin {
        first,
        last,
        record_access,
    }) {
        Reply::GroupsPinned { groups } => PinnedGroups::adopt(groups),
        reply => unexpected(Kind::IndexPin, reply),
    }
}

/// Pins the images `ids` (at most [`gsnap_protocol::MAX_IDS_PER_REQUEST`]) in the image
/// cache: entry `i` holds `ids[i]`. The worker pins a prefix of them, empty when the cache
/// has no room.
pub fn load_images(ids: Vec<ImageId>) -> Pinned {
    match request(Request::LoadImages { ids }) {
        Reply::ImagesPinned { entries } => Pinned::adopt(entries),
        reply => unexpected(Kind::LoadImages, reply),
    }
}

/// Chunks of a stored TOAST value, pinned in the image cache.
pub struct ToastChunks {
    /// The value's number of chunks.
    pub chunks: u32,
    /// The value's length in bytes.
    pub len: u64,
    /// The chunks pinned, from the one asked for, keyed by chunk number (none when the cache
    /// has no room).
    pub pinned: Pinned,
}

/// Pins chunks `first_chunk..` (at most `max_chunks`) of stored TOAST value `value`.
pub fn toast_fetch(value: u64, first_chunk: u32, max_chunks: u32) -> ToastChunks {
    match request(Request::ToastFetch {
        value,
        first_chunk,
        max_chunks,
    }) {
        Reply::ToastPinned {
            chunks,
            len,
            entries,
        } => ToastChunks {
            chunks,
            len,
            pinned: Pinned::adopt(entries),
        },
        reply => unexpected(Kind::ToastFetch, reply),
    }
}
