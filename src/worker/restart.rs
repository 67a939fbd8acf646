//! The first capture after the worker starts (issue 8, "restarts without a full recapture").
//!
//! While it runs, the worker knows which pages each span wrote; a new worker does not. It
//! used to capture every table as a new incarnation. Now a table whose storage is the one the
//! newest durable snapshot S recorded keeps its incarnation and is captured in `Rescan` mode
//! (every block's view compared with S's page table: only changed pages get mappings), and,
//! when the page LSN can vouch for it, a block is not even examined: a block below S's size,
//! not carried by S (unsettled at S), whose page LSN is at or before S's declaration LSN (and
//! not 0: a page no record set, new or initialized without WAL, may have been truncated away
//! and added again since) has not changed since S read it. That holds because every change to a logged heap page is
//! WAL-logged and sets the page LSN to the end of its record, and a change whose record ends
//! at or before S's LSN was made before S's declaration, so S's capture, which read the page
//! after it, saw it (DESIGN.md, capture orderings); visibility changes without a page change
//! are those of transactions in progress at S, whose pages S carried.
//!
//! The LSN is trusted only for the same history: the server on the timeline S was declared
//! on, with its WAL at or past S's LSN (a restored backup or a point-in-time recovery starts
//! a new timeline or an earlier WAL position, and then every block's view is compared).
//! Unlogged tables (no page LSNs) and stores written before the timeline was recorded are
//! compared block by block too.

use super::Store;
use gsnap_store::{RelId, SnapshotState, StoreError};
use std::collections::{HashMap, HashSet};

/// What the first capture after a start compares against: snapshot S's tables.
pub(crate) struct RestartBase {
    /// S's declaration LSN when page LSNs can be trusted against it (see the module comment).
    pub lsn_floor: Option<u64>,
    /// S's tables by OID: incarnation, storage, size.
    tables: HashMap<u32, (RelId, u32, u32)>,
    /// The pages S carried (unsettled), by incarnation.
    carried: HashSet<(RelId, u32)>,
}

/// How one table is captured after a start.
#[derive(Debug, Clone)]
pub(crate) struct Resumed {
    pub rel: RelId,
    /// Blocks that may be skipped when their page LSN is at or before this one.
    pub lsn_floor: Option<u64>,
    /// S's size of the table: blocks at or beyond it are always examined.
    pub prev_nblocks: u32,
    /// The blocks S carried: always examined.
    pub carried: HashSet<u32>,
}

impl RestartBase {
    /// The base for a declaration at `lsn` on `timeline`: the newest snapshot that did not
    /// fail, if it is committed (a deleted or capturing one: no base, every table fresh).
    pub fn find(store: &Store, lsn: u64, timeline: u32) -> Result<Option<RestartBase>, StoreError> {
        let Some((snap, SnapshotState::Committed)) = store.latest_not_failed() else {
            return Ok(None);
        };
        let info = store.snapshot(snap)?;
        let same_history =
            info.decl.timeline != 0 && info.decl.timeline == timeline && lsn >= info.decl.wal_lsn;
        let tables = info
            .decl
            .relations
            .iter()
            .map(|r| (r.pg_relid, (r.rel, r.relfilenode, r.nblocks)))
            .collect();
        let carried = store
            .carried_pages(snap)?
            .into_iter()
            .map(|p| (p.rel, p.block))
            .collect();
        Ok(Some(RestartBase {
            lsn_floor: same_history.then_some(info.decl.wal_lsn),
            tables,
            carried,
        }))
    }

    /// How table `relid` (storage `relfilenode`, logged or not) resumes, if S recorded this
    /// storage.
    pub fn resume(&self, relid: u32, relfilenode: u32, logged: bool) -> Option<Resumed> {
        let &(rel, file, nblocks) = self.tables.get(&relid)?;
        (file == relfilenode).then(|| Resumed {
            rel,
            lsn_floor: self.lsn_floor.filter(|_| logged),
            prev_nblocks: nblocks,
            carried: self
                .carried
                .iter()
                .filter(|(r, _)| *r == rel)
                .map(|&(_, b)| b)
                .collect(),
        })
    }
}
