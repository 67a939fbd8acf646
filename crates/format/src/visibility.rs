//! Which tuple versions an MVCC snapshot sees, decided on a copy of their page.
//!
//! A capture copies each changed page whole while it holds the snapshot's horizon and decides
//! visibility after it has let the horizon go (docs/design.md, capture), so VACUUM waits only
//! for the copies. The decision then cannot be PostgreSQL's `HeapTupleSatisfiesMVCC`: that
//! function sets hint bits on the shared buffer it is given, and the buffer is gone. This
//! module is the same decision over a tuple's bytes: the rules of `HeapTupleSatisfiesMVCC` and
//! `XidInMVCCSnapshot` (PostgreSQL 15, `heapam_visibility.c` and `snapmgr.c`) for what a
//! capture copies, with the status of finished transactions asked of the caller (the commit
//! log, [`XactStatus`]).
//!
//! What the rules here leave out, the caller keeps away: a snapshot taken during recovery or
//! whose subtransaction array overflowed (its running transactions are not all listed: the
//! commit log cannot be asked after the horizon moves, [`SnapshotXids::from_parts`] refuses
//! it), tuples moved by a pre-9.0 VACUUM FULL ([`copyable`] is false), and tuples written by the
//! deciding transaction itself (the capture never writes a table it captures).
//!
//! Why the answers stay right after the release: a transaction the snapshot lists as running
//! is decided by the list alone; any other transaction below the snapshot's `xmax` had ended
//! before the snapshot, so its status in the commit log is final, and the commit log keeps it
//! until every table is frozen past it (a failed lookup is an ERROR: the capture fails, it
//! never stores a wrong view).

use crate::heap;
use crate::FormatError;

/// `t_infomask`: a transaction locked the tuple with a key-share lock.
const HEAP_XMAX_KEYSHR_LOCK: u16 = 0x0010;
/// `t_infomask`: an exclusive lock.
const HEAP_XMAX_EXCL_LOCK: u16 = 0x0040;
/// `t_infomask`: xmax, if valid, only locked the tuple.
const HEAP_XMAX_LOCK_ONLY: u16 = 0x0080;
/// `t_infomask`: every lock mode bit.
const HEAP_LOCK_MASK: u16 = HEAP_XMAX_EXCL_LOCK | HEAP_XMAX_KEYSHR_LOCK;
/// `t_infomask`: hint, xmin committed.
const HEAP_XMIN_COMMITTED: u16 = 0x0100;
/// `t_infomask`: hint, xmin aborted.
const HEAP_XMIN_INVALID: u16 = 0x0200;
/// `t_infomask`: both xmin hints: the tuple is frozen.
const HEAP_XMIN_FROZEN: u16 = HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID;
/// `t_infomask`: hint, xmax committed.
const HEAP_XMAX_COMMITTED: u16 = 0x0400;
/// `t_infomask`: xmax is a MultiXact id.
const HEAP_XMAX_IS_MULTI: u16 = 0x1000;
/// `t_infomask`: moved off or into the page by a pre-9.0 VACUUM FULL.
const HEAP_MOVED: u16 = 0x4000 | 0x8000;

/// The first normal transaction id: below it are the invalid, bootstrap and frozen ids.
pub const FIRST_NORMAL_XID: u32 = 3;

/// `TransactionIdPrecedes`: `a` is older than `b`, in the circular order of normal ids (the
/// special ids below [`FIRST_NORMAL_XID`] precede every normal one).
pub fn precedes(a: u32, b: u32) -> bool {
    if a < FIRST_NORMAL_XID || b < FIRST_NORMAL_XID {
        return a < b;
    }
    (a.wrapping_sub(b) as i32) < 0
}

/// The transactions an MVCC snapshot did not see as finished: those from `xmax` on, and those
/// it listed as running (top-level and subtransaction ids alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotXids {
    xmin: u32,
    xmax: u32,
    /// The listed ids, sorted.
    running: Vec<u32>,
}

impl SnapshotXids {
    /// The snapshot's bounds and listed ids (`xip` and `subxip`), or None for a snapshot this
    /// module cannot decide for: taken during recovery, or with an overflowed subtransaction
    /// array (some running subtransactions are not listed).
    pub fn from_parts(
        xmin: u32,
        xmax: u32,
        xip: &[u32],
        subxip: &[u32],
        suboverflowed: bool,
        during_recovery: bool,
    ) -> Option<SnapshotXids> {
        if suboverflowed || during_recovery {
            return None;
        }
        let mut running: Vec<u32> = xip.iter().chain(subxip).copied().collect();
        running.sort_unstable();
        Some(SnapshotXids {
            xmin,
            xmax,
            running,
        })
    }

    /// `XidInMVCCSnapshot`: true if the snapshot does not see `xid` as finished (running when
    /// it was taken, or started after).
    pub fn in_progress(&self, xid: u32) -> bool {
        if precedes(xid, self.xmin) {
            return false;
        }
        if !precedes(xid, self.xmax) {
            return true;
        }
        self.running.binary_search(&xid).is_ok()
    }
}

/// Which transactions a snapshot did not see as finished (`XidInMVCCSnapshot`): a
/// [`SnapshotXids`] after the release, or PostgreSQL's own test while the snapshot is held.
pub trait InProgress {
    /// True if the snapshot does not see `xid` as finished.
    fn in_progress(&self, xid: u32) -> bool;
}

impl InProgress for SnapshotXids {
    fn in_progress(&self, xid: u32) -> bool {
        SnapshotXids::in_progress(self, xid)
    }
}

/// What the rules ask about transactions the snapshot sees as finished (PostgreSQL's commit
/// log and MultiXact members, in the capture).
pub trait XactStatus {
    /// `TransactionIdDidCommit`.
    fn did_commit(&mut self, xid: u32) -> bool;
    /// `TransactionIdDidAbort`.
    fn did_abort(&mut self, xid: u32) -> bool;
    /// `HeapTupleGetUpdateXid`: the updating member of the MultiXact in the xmax of `tuple`
    /// (whose xmax is a MultiXact that did more than lock).
    fn update_xid(&mut self, tuple: &[u8]) -> u32;
}

/// The fields of a tuple header the rules read.
struct Header {
    xmin: u32,
    xmax: u32,
    infomask: u16,
}

fn header(tuple: &[u8]) -> Result<Header, FormatError> {
    let infomask = heap::infomask(tuple)?;
    let u32_at = |at: usize| u32::from_le_bytes(tuple[at..at + 4].try_into().expect("4 bytes"));
    Ok(Header {
        xmin: u32_at(0),
        xmax: u32_at(4),
        infomask,
    })
}

/// `HEAP_XMAX_IS_LOCKED_ONLY`: the xmax only locked the tuple (it did not delete or update it).
fn locked_only(infomask: u16) -> bool {
    infomask & HEAP_XMAX_LOCK_ONLY != 0
        || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK
}

/// True if the rules here can decide for the tuple after its page was copied: false for one
/// with out-of-line values (its TOAST chunks must be copied while the horizon is held) or one
/// moved by a pre-9.0 VACUUM FULL (decided by its `t_xvac`, which this module does not read).
pub fn copyable(tuple: &[u8]) -> bool {
    heap::infomask(tuple).is_ok_and(|m| m & (heap::HEAP_HASEXTERNAL | HEAP_MOVED) == 0)
}

/// `HeapTupleSatisfiesMVCC` without hint bits: true if the snapshot `xids` sees `tuple`.
pub fn visible(
    tuple: &[u8],
    xids: &SnapshotXids,
    status: &mut dyn XactStatus,
) -> Result<bool, FormatError> {
    let Header {
        xmin,
        xmax,
        infomask,
    } = header(tuple)?;
    if infomask & HEAP_XMIN_COMMITTED == 0 {
        if infomask & HEAP_XMIN_INVALID != 0 {
            return Ok(false); // its inserter aborted
        }
        if xids.in_progress(xmin) || !status.did_commit(xmin) {
            return Ok(false);
        }
    } else if infomask & HEAP_XMIN_FROZEN != HEAP_XMIN_FROZEN && xids.in_progress(xmin) {
        return Ok(false); // committed, but after the snapshot
    }
    // Inserted before the snapshot: visible unless a deleter the snapshot sees committed.
    if infomask & heap::HEAP_XMAX_INVALID != 0 || locked_only(infomask) {
        return Ok(true);
    }
    if infomask & HEAP_XMAX_IS_MULTI != 0 {
        let updater = status.update_xid(tuple);
        return Ok(xids.in_progress(updater) || !status.did_commit(updater));
    }
    if infomask & HEAP_XMAX_COMMITTED == 0 {
        return Ok(xids.in_progress(xmax) || !status.did_commit(xmax));
    }
    Ok(xids.in_progress(xmax))
}

/// True if the tuple version may still change which snapshots see it: its inserter, or its
/// deleter, is one the snapshot does not see as finished and has not aborted (docs/design.md,
/// capture step 3: its page is *unsettled*). Asked on copies after the release and on locked
/// buffers alike (`xids` is then PostgreSQL's test against the held snapshot).
pub fn unsettled(
    tuple: &[u8],
    xids: &dyn InProgress,
    status: &mut dyn XactStatus,
) -> Result<bool, FormatError> {
    let Header {
        xmin,
        xmax,
        infomask,
    } = header(tuple)?;
    let open = |xid: u32, status: &mut dyn XactStatus| {
        xid >= FIRST_NORMAL_XID && xids.in_progress(xid) && !status.did_abort(xid)
    };
    let xmin_frozen = infomask & HEAP_XMIN_FROZEN == HEAP_XMIN_FROZEN;
    if !xmin_frozen && infomask & HEAP_XMIN_INVALID != 0 {
        return Ok(false); // never visible to anyone
    }
    if !xmin_frozen && open(xmin, status) {
        return Ok(true);
    }
    if infomask & heap::HEAP_XMAX_INVALID != 0 || locked_only(infomask) {
        return Ok(false);
    }
    let deleter = if infomask & HEAP_XMAX_IS_MULTI != 0 {
        status.update_xid(tuple)
    } else {
        xmax
    };
    Ok(open(deleter, status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A commit log: committed and aborted ids (any other id crashed or runs: neither), and
    /// the updater of each MultiXact.
    #[derive(Default)]
    struct Log {
        committed: Vec<u32>,
        aborted: Vec<u32>,
        multis: HashMap<u32, u32>,
        asked: Vec<u32>,
    }

    impl XactStatus for Log {
        fn did_commit(&mut self, xid: u32) -> bool {
            self.asked.push(xid);
            xid == 1 || xid == 2 || self.committed.contains(&xid)
        }
        fn did_abort(&mut self, xid: u32) -> bool {
            self.asked.push(xid);
            self.aborted.contains(&xid)
        }
        fn update_xid(&mut self, tuple: &[u8]) -> u32 {
            let multi = u32::from_le_bytes(tuple[4..8].try_into().unwrap());
            self.multis[&multi]
        }
    }

    fn tuple(xmin: u32, xmax: u32, infomask: u16) -> Vec<u8> {
        let mut t = vec![0u8; 24];
        t[0..4].copy_from_slice(&xmin.to_le_bytes());
        t[4..8].copy_from_slice(&xmax.to_le_bytes());
        t[heap::INFOMASK_AT..heap::INFOMASK_AT + 2].copy_from_slice(&infomask.to_le_bytes());
        t[heap::HOFF_AT] = 24;
        t
    }

    /// A snapshot taken while 105 and 107 (and subtransaction 108) ran, with 110 the next id.
    fn snap() -> SnapshotXids {
        SnapshotXids::from_parts(100, 110, &[107, 105], &[108], false, false).unwrap()
    }

    fn log() -> Log {
        Log {
            committed: vec![50, 101, 102, 105, 112],
            aborted: vec![103, 107, 113],
            ..Log::default()
        }
    }

    const XMAX_INVALID: u16 = heap::HEAP_XMAX_INVALID;

    #[test]
    fn in_progress_is_xid_in_mvcc_snapshot() {
        let s = snap();
        for (xid, running) in [
            (50, false),
            (99, false),
            (100, false),
            (101, false),
            (105, true),
            (107, true),
            (108, true),
            (109, false),
            (110, true),
            (4_000_000_000, false), // more than 2^31 ahead of 100: in the past, circularly
            (2_000_000_000, true),
            (2, false), // frozen
            (0, false),
        ] {
            assert_eq!(s.in_progress(xid), running, "xid {xid}");
        }
        assert!(SnapshotXids::from_parts(1, 2, &[], &[], true, false).is_none());
        assert!(SnapshotXids::from_parts(1, 2, &[], &[], false, true).is_none());
    }

    #[test]
    fn precedes_is_circular_for_normal_ids_only() {
        assert!(precedes(3, 4));
        assert!(!precedes(4, 4));
        assert!(precedes(u32::MAX, 3 + 5)); // the ids wrapped around
        assert!(!precedes(5, u32::MAX));
        assert!(precedes(2, 3) && precedes(0, 2) && !precedes(3, 2));
    }

    /// Checks `visible` on tuples (xmin, xmax, infomask) against the snapshot and log above.
    fn assert_visible(cases: &[(u32, u32, u16, bool)]) {
        let (s, mut l) = (snap(), log());
        for &(xmin, xmax, mask, seen) in cases {
            let t = tuple(xmin, xmax, mask);
            let got = visible(&t, &s, &mut l);
            assert_eq!(got, Ok(seen), "xmin {xmin} xmax {xmax} mask {mask:#x}");
        }
    }

    #[test]
    fn inserters_decide_as_heap_tuple_satisfies_mvcc() {
        let m = XMAX_INVALID;
        assert_visible(&[
            (101, 0, m, true),                        // committed before the snapshot
            (103, 0, m, false),                       // aborted
            (104, 0, m, false),                       // crashed (neither)
            (105, 0, m, false),                       // running at the snapshot, committed since
            (105, 0, m | HEAP_XMIN_COMMITTED, false), // the hint does not make it visible
            (112, 0, m, false),                       // began after
            (50, 0, m | HEAP_XMIN_COMMITTED, true),
            (101, 0, m | HEAP_XMIN_INVALID, false), // the hint says aborted: trusted
            (105, 0, m | HEAP_XMIN_FROZEN, true),   // frozen: visible whatever the id
            (2, 0, m, true),                        // FrozenTransactionId
        ]);
    }

    #[test]
    fn deleters_decide_as_heap_tuple_satisfies_mvcc() {
        let c = HEAP_XMIN_COMMITTED;
        assert_visible(&[
            (50, 102, c, false),                       // deleted before the snapshot
            (50, 102, c | HEAP_XMAX_COMMITTED, false), // the same, hinted
            (50, 103, c, true),                        // the deleter aborted
            (50, 104, c, true),                        // crashed
            (50, 105, c, true),                        // running at the snapshot
            (50, 105, c | HEAP_XMAX_COMMITTED, true),  // committed since: still seen
            (50, 112, c | HEAP_XMAX_COMMITTED, true),  // began after
            (50, 102, c | XMAX_INVALID, true),         // the hint says no deleter
            (50, 102, c | HEAP_XMAX_LOCK_ONLY, true),  // only locked
            (50, 102, c | HEAP_XMAX_EXCL_LOCK, true),  // a lock, the old way
        ]);
    }

    #[test]
    fn multixact_deleters_are_their_updating_member() {
        let s = snap();
        let mut l = log();
        l.multis = HashMap::from([(7, 102), (8, 105), (9, 103)]);
        for (multi, seen) in [(7, false), (8, true), (9, true)] {
            let t = tuple(50, multi, HEAP_XMAX_IS_MULTI | HEAP_XMIN_COMMITTED);
            assert_eq!(visible(&t, &s, &mut l), Ok(seen), "multi {multi}");
        }
        // A multi that only locked: no member asked (the log would panic on multi 6).
        let t = tuple(
            50,
            6,
            HEAP_XMAX_IS_MULTI | HEAP_XMAX_LOCK_ONLY | HEAP_XMIN_COMMITTED,
        );
        assert_eq!(visible(&t, &s, &mut l), Ok(true));
        assert_eq!(unsettled(&t, &s, &mut l), Ok(false));
    }

    #[test]
    fn unsettled_tuples_wait_for_a_transaction_the_snapshot_did_not_see_end() {
        let s = snap();
        let mut l = log();
        l.multis = HashMap::from([(8, 105)]);
        for (xmin, xmax, mask, open) in [
            (101, 0, XMAX_INVALID, false),
            (105, 0, XMAX_INVALID, true), // inserted by a transaction running at the snapshot
            (107, 0, XMAX_INVALID, false), // ... which aborted since
            (112, 0, XMAX_INVALID, true), // began after, committed
            (113, 0, XMAX_INVALID, false), // began after, aborted
            (104, 0, XMAX_INVALID, false), // crashed before: settled
            (105, 0, HEAP_XMIN_FROZEN | XMAX_INVALID, false),
            (105, 0, HEAP_XMIN_INVALID | XMAX_INVALID, false),
            (101, 105, 0, true),  // deleted by one running at the snapshot
            (101, 107, 0, false), // ... that aborted
            (101, 105, HEAP_XMAX_LOCK_ONLY, false),
            (101, 8, HEAP_XMAX_IS_MULTI, true), // the multi's updater 105 runs
            (101, 1, 0, false),                 // a special id is never open
        ] {
            let t = tuple(xmin, xmax, mask);
            assert_eq!(
                unsettled(&t, &s, &mut l),
                Ok(open),
                "{xmin} {xmax} {mask:#x}"
            );
        }
    }

    #[test]
    fn short_tuples_are_errors_and_copyable_reads_the_layout_bits() {
        let s = snap();
        assert!(visible(&[0; 10], &s, &mut log()).is_err());
        assert!(unsettled(&[0; 22], &s, &mut log()).is_err());
        assert!(copyable(&tuple(1, 0, XMAX_INVALID)));
        assert!(!copyable(&tuple(1, 0, heap::HEAP_HASEXTERNAL)));
        assert!(!copyable(&tuple(1, 0, 0x8000)));
        assert!(!copyable(&tuple(1, 0, 0x4000)));
        assert!(!copyable(&[0; 5]));
    }

    #[test]
    fn transactions_the_snapshot_lists_are_never_looked_up() {
        // After the release, only transactions that had ended before the snapshot may be
        // asked about for visibility (their status is final).
        let s = snap();
        let mut l = log();
        for (xmin, xmax, mask) in [(105, 0, XMAX_INVALID), (101, 107, 0), (112, 0, 0)] {
            let _ = visible(&tuple(xmin, xmax, mask), &s, &mut l);
        }
        assert_eq!(l.asked, vec![101]);
    }
}
