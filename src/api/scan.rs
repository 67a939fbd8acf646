//! Reading one table at one snapshot, page by page, through the worker and the shared image
//! cache. Used by `gsnap_asof` (and by the snapshot-set functions).

use super::access::relation_name;
use super::decode::Decoder;
use crate::error::error;
use crate::ipc::protocol::{ErrorCode, Kind, ScanHeader};
use crate::ipc::{self, Pinned};
use gsnap_format::rowtype::RowType;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::time::Duration;

/// Images asked for per round trip.
const PAGES_PER_REQUEST: i64 = 256;

/// Begins reading `relid` at `snap`; a snapshot whose capture is still running is waited
/// for (the wait can be cancelled).
fn scan_begin(snap: u64, relid: pg_sys::Oid) -> ipc::Answer {
    loop {
        let args = [snap as i64, i64::from(relid.to_u32()), 0];
        match ipc::call_paged_checked(Kind::ScanBegin, &args, 2) {
            Ok(a) => return a,
            Err((code, _)) if code == ErrorCode::Capturing as u32 => {
                ipc::wait_latch(Duration::from_millis(20))
            }
            Err((code, reply)) => ipc::raise_worker_error(code, &reply),
        }
    }
}

/// Hands every row of table `relid` at snapshot `snap`, in `out_desc`'s row type, to `emit`.
///
/// # Safety
/// `out_desc` must be the table's current row type; call in a transaction.
pub unsafe fn read_table(
    snap: u64,
    relid: pg_sys::Oid,
    out_desc: pg_sys::TupleDesc,
    emit: &mut dyn FnMut(&[pg_sys::Datum], &[bool]),
) {
    let begin = scan_begin(snap, relid);
    if begin.result == 1 {
        error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("table {} is not in snapshot {snap}", relation_name(relid)),
        )
        .hint("A snapshot holds the tables that used the gsnap access method when it was taken; see gsnap_snapshot_tables().")
        .raise();
    }
    let Some((header, row_type)) = ScanHeader::decode(&begin.reply) else {
        error(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "short answer from the gsnap worker").raise()
    };
    let row_type = RowType::decode(row_type).unwrap_or_else(|e| {
        error(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, format!("snapshot {snap}: {e}")).raise()
    });
    // SAFETY: per this function's contract.
    let mut decoder = unsafe { Decoder::new(snap, relid, row_type, out_desc) };
    let scratch = pgrx::PgMemoryContexts::new("gsnap scan");
    let mut start = 0u32;
    while start < header.nblocks {
        let answer = ipc::call(
            Kind::ScanPages,
            &[
                snap as i64,
                i64::from(header.rel),
                i64::from(start),
                i64::from(header.nblocks),
                PAGES_PER_REQUEST,
            ],
        );
        let pinned = Pinned::from_answer(&answer);
        let next = answer.result as u32;
        if pinned.entries.is_empty() && next == start {
            // The cache is full of other scans' pinned pages: let them drain.
            drop(pinned);
            ipc::wait_latch(Duration::from_millis(5));
            continue;
        }
        // SAFETY: switching to our scratch context for the rows' temporary allocations.
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(scratch.value());
            for e in &pinned.entries {
                decoder.decode_page(e.key, pinned.bytes(e), emit);
            }
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::MemoryContextReset(scratch.value());
        }
        drop(pinned);
        start = next;
    }
}
