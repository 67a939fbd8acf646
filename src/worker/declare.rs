//! Declaring a snapshot (DESIGN.md, capture step 2), in this order:
//!
//! 1. ACCESS SHARE session locks on every gsnap table, without waiting: if one is taken by
//!    a rewrite or DROP in progress, the declaration is postponed (never declared in the
//!    middle of one) and retried by the main loop;
//! 2. the MVCC snapshot, registered until the last page of the span is read;
//! 3. the WAL insert LSN, then each table's storage identity, size and row type (after the
//!    snapshot, so a block extended before it is within the recorded size);
//! 4. only then the switch to a fresh dirty set: a write recorded before the switch is in
//!    this snapshot's span, one recorded after it in the next.
//!
//! Then the declaration is made durable in the store and answered; only after the answer is
//! the retired dirty set read into the span's pages (a set of a million slots takes about
//! half a millisecond to read), and the snapshot joins the capture queue. Writers never
//! wait for any of this.

use super::ahead::Ahead;
use super::catalog::{self, TableInfo};
use super::restart::{RestartBase, Resumed};
use super::serve::encode_answer;
use super::xact::{self, RegisteredSnapshot};
use super::{Store, Worker};
use crate::shmem::{self, Phase};
use gsnap_protocol::{ErrorCode, Kind, Reply, SnapId, WorkerError};
use gsnap_shmem::carry::CarryForward;
use gsnap_store::{Rank, RelId, RelIncarnation, RelationSnapshot, SnapshotDecl, StoreError};
use pgrx::pg_sys;
use std::collections::HashMap;
use std::ffi::CStr;

/// A request for a snapshot that is not declared yet. Requests without a label or rank that
/// wait at the same time share one snapshot; one with a label or rank gets its own.
#[derive(Debug, Clone)]
pub(crate) struct PendingDeclare {
    /// The request slot to answer (None for a periodic snapshot).
    pub slot: Option<usize>,
    /// Answer only when the capture is durable.
    pub wait: bool,
    /// Export the MVCC snapshot and hold it until released (test support).
    pub export: bool,
    /// Declared by the interval timer.
    pub periodic: bool,
    /// The user's label for the snapshot.
    pub label: Option<String>,
    /// The rank the user gives it at declaration (it gets at least the rank the retention
    /// levels give it).
    pub rank: Option<u8>,
}

impl PendingDeclare {
    fn shares(&self) -> bool {
        self.label.is_none() && self.rank.is_none()
    }
}

impl PendingDeclare {
    pub fn periodic() -> PendingDeclare {
        PendingDeclare {
            slot: None,
            wait: false,
            export: false,
            periodic: true,
            label: None,
            rank: None,
        }
    }
}

/// What the worker knows about a gsnap table between snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known {
    pub rel: RelId,
    pub relfilenode: u32,
}

/// How a table is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A new incarnation (new table, new storage, or worker restart): every block.
    Fresh,
    /// Every block, compared with the previous page table (the dirty set overflowed, or an
    /// earlier capture failed).
    Rescan,
    /// Only the written and carried pages.
    Incremental,
}

/// A table as declared in a snapshot.
#[derive(Debug, Clone)]
pub(crate) struct DeclaredTable {
    pub relid: u32,
    pub rel: RelId,
    pub nblocks: u32,
    pub mode: Mode,
    /// The first capture after a start, resuming the incarnation of the newest durable
    /// snapshot (`restart.rs`).
    pub resumed: Option<Resumed>,
}

/// A declared snapshot waiting for (or in) its capture.
pub(crate) struct Declared {
    pub snap: u64,
    /// The MVCC snapshot, until every page of the capture has been read (then released:
    /// docs/design.md, third ordering).
    pub mvcc: Option<RegisteredSnapshot>,
    pub declared_at_us: i64,
    pub tables: Vec<DeclaredTable>,
    /// The span's written pages, plus leftovers of failed declarations.
    pub pages: CarryForward,
    /// Pages copied ahead of this snapshot, when its span was split for them (`ahead.rs`).
    pub ahead: Option<Ahead>,
    /// Tables locked for this snapshot (released when its capture ends).
    pub locked: Vec<u32>,
}

/// The PostgreSQL part of a declaration.
struct Prepared {
    lsn: u64,
    timeline: u32,
    declared_at_us: i64,
    tables: Vec<TableInfo>,
}

enum Prepare {
    Ready(Prepared),
    /// A table's lock is taken (by a rewrite or DROP in progress).
    Postponed(u32),
}

/// Steps 1 to 3. Locks taken are pushed to `locked`, the registered snapshot to `mvcc`, so
/// the caller can undo them whatever happens.
///
/// # Safety
/// Must run inside the worker's transaction.
unsafe fn prepare(locked: &mut Vec<u32>, mvcc: &mut Option<RegisteredSnapshot>) -> Prepare {
    // SAFETY: catalog reads, lock requests and snapshot registration inside a transaction.
    unsafe {
        pg_sys::AcceptInvalidationMessages();
        pg_sys::InvalidateCatalogSnapshot();
        for relid in catalog::gsnap_tables() {
            if !xact::try_lock_table(relid) {
                return Prepare::Postponed(relid);
            }
            locked.push(relid);
        }
        // A table dropped (or converted) between listing and locking is no longer one.
        pg_sys::AcceptInvalidationMessages();
        pg_sys::InvalidateCatalogSnapshot();
        let still = catalog::gsnap_tables();
        locked.retain(|r| {
            let keep = still.binary_search(r).is_ok();
            if !keep {
                xact::unlock_table(*r);
            }
            keep
        });
        *mvcc = Some(RegisteredSnapshot::take_latest());
        let lsn = pg_sys::GetXLogInsertRecPtr();
        let timeline = if pg_sys::RecoveryInProgress() {
            0
        } else {
            pg_sys::GetWALInsertionTimeLine()
        };
        let declared_at_us = catalog::now_unix_us();
        let tables = locked
            .iter()
            .filter_map(|&r| catalog::table_info(r))
            .collect();
        Prepare::Ready(Prepared {
            lsn,
            timeline,
            declared_at_us,
            tables,
        })
    }
}

/// Undoes a declaration's locks and releases its MVCC snapshot.
pub(super) fn release(locked: &[u32], mvcc: Option<RegisteredSnapshot>) {
    for &r in locked {
        xact::unlock_table(r);
    }
    if let Some(s) = mvcc {
        s.release();
    }
}

impl Worker {
    /// Tries to declare one snapshot for every pending request.
    pub(super) fn declare_pending(&mut self) {
        self.pending.retain(|p| match p.slot {
            Some(s) if shmem::request_slot(s).abandoned() => {
                shmem::request_slot(s).finish(|_| {});
                false
            }
            _ => true,
        });
        if self.pending.is_empty() {
            // No declaration waits (its requesters gave up): none waits for a table or for
            // room either.
            shmem::progress().set_waiting_for(0);
            shmem::progress().set_held_for_room(0);
            return;
        }
        let Some(store) = self.store.clone() else {
            let error = match self.store_problem.clone() {
                Some((code, message)) => WorkerError::new(code, message),
                None => WorkerError::new(ErrorCode::Io, "the gsnap store is not open"),
            };
            for p in std::mem::take(&mut self.pending) {
                answer_error(p.slot, &error);
            }
            return;
        };
        if self.queue.len() + usize::from(self.job.is_some())
            >= crate::gucs::MAX_QUEUED_SNAPSHOTS.get() as usize
        {
            // Wait for captures to make room; the waiting sessions say so after a while
            // (`sql::snapshots::declare`), and gsnap_progress() shows how many wait.
            shmem::progress().set_held_for_room(self.pending.len() as u32);
            return;
        }
        shmem::progress().set_held_for_room(0);
        self.xact.ensure_open();
        // Whatever happens below, a capture in flight (reading or storing) is what the
        // worker does next.
        let before = shmem::progress().read().phase;
        shmem::progress().set_phase(Phase::Declaring);
        struct Restore(Option<Phase>);
        impl Drop for Restore {
            fn drop(&mut self) {
                if let Some(phase) = self.0 {
                    shmem::progress().set_phase(phase);
                }
            }
        }
        let _restore = Restore(before.filter(|_| self.job.is_some()));
        let mut locked = Vec::new();
        let mut mvcc = None;
        // SAFETY: the transaction is open.
        let prepared = xact::in_subtransaction(|| unsafe { prepare(&mut locked, &mut mvcc) });
        let prepared = match prepared {
            Ok(Prepare::Ready(p)) => p,
            Ok(Prepare::Postponed(relid)) => {
                release(&locked, mvcc);
                shmem::progress().set_waiting_for(relid);
                return;
            }
            Err(message) => {
                release(&locked, mvcc);
                let message = format!("could not declare a snapshot: {message}");
                pgrx::warning!("{message}");
                let error = WorkerError::new(ErrorCode::Internal, message);
                for p in std::mem::take(&mut self.pending) {
                    answer_error(p.slot, &error);
                }
                return;
            }
        };
        shmem::progress().set_waiting_for(0);
        let mvcc = mvcc.expect("a prepared declaration has a snapshot");
        let pause = crate::gucs::DEBUG_DECLARE_PAUSE_MS.get();
        if pause > 0 {
            // SAFETY: test hook: a plain sleep.
            unsafe { pg_sys::pg_usleep(i64::from(pause) * 1000) };
        }

        // Step 4: the span ends here.
        let dirty = shmem::dirty_sets();
        let retired = dirty.begin_span(|| {
            // SAFETY: a short sleep while a writer finishes recording.
            unsafe { pg_sys::pg_usleep(10) }
        });
        // The retired sets are read once the declaration is answered (below): they only tell
        // the capture which pages to read (and which tables overflowed them, captured in
        // full), and no other span begins before this function returns. The pages of a
        // split span's second part also tell which copies made ahead are current.
        let drain = |leftover: &mut CarryForward| {
            let last = dirty.drain(retired.last);
            let earlier = retired.earlier.map(|set| dirty.drain(set));
            let overflowed = earlier.iter().chain([&last]);
            let all = overflowed.clone().any(|d| d.all_full);
            let relations: u32 = overflowed.map(|d| d.overflowed_relations).sum();
            if relations > 0 || all {
                let tables = if all {
                    "every table".to_string()
                } else {
                    format!("{relations} table(s)")
                };
                pgrx::warning!(
                    "gsnap: written pages of {tables} did not fit the dirty set \
                     (gsnap.max_dirty_pages = {}); they are captured completely",
                    crate::gucs::MAX_DIRTY_PAGES.get()
                );
            }
            let mut pages = CarryForward::from_drained(last);
            let written_since_split = earlier.map(|first| {
                let second = pages.clone();
                pages.absorb(CarryForward::from_drained(first));
                second
            });
            pages.absorb(std::mem::take(leftover));
            (pages, written_since_split)
        };

        // The requests this snapshot answers: one with a label or rank, or all without.
        let batch: Vec<PendingDeclare> = if self.pending[0].shares() {
            let (batch, rest) = std::mem::take(&mut self.pending)
                .into_iter()
                .partition(PendingDeclare::shares);
            self.pending = rest;
            batch
        } else {
            vec![self.pending.remove(0)]
        };
        let label = batch[0].label.clone();
        let explicit = Rank(batch[0].rank.unwrap_or(0));
        match self.record(&store, &prepared, label, explicit) {
            Ok((snap, tables)) => {
                let export = if batch.iter().any(|p| p.export) {
                    // SAFETY: at the top level of the worker's transaction (exporting from a
                    // subtransaction is not allowed); the name is a C string.
                    let name = unsafe { CStr::from_ptr(pg_sys::ExportSnapshot(mvcc.as_ptr())) };
                    self.exports.push(snap);
                    Some(name.to_string_lossy().into_owned())
                } else {
                    None
                };
                let mut answered = false;
                for p in batch {
                    match p.slot {
                        Some(s) if p.wait => self.durable_waiters.push((s, snap)),
                        Some(s) => {
                            answer_snapshot(s, snap, export.as_deref());
                            answered = true;
                        }
                        None => {}
                    }
                }
                if answered {
                    // The session just woken needs a core to take its answer, and the worker
                    // is about to keep one busy (the dirty set, then the capture): it steps
                    // aside briefly first. Under pgbench on two cores the answer otherwise
                    // waited for the scheduler: p50 1.4 ms, p90 3.8 ms from the answer to the
                    // session seeing it, against 0.2 / 0.3 ms with this pause.
                    std::thread::sleep(HAND_OVER);
                }
                let (pages, written_since_split) = drain(&mut self.span_leftover);
                // The copies made ahead belong to the snapshot whose span was split for them.
                let ahead = self.ahead.take().and_then(|mut ahead| {
                    ahead.written_since_split(written_since_split?);
                    Some(ahead)
                });
                self.queue.push_back(Declared {
                    snap,
                    mvcc: Some(mvcc),
                    declared_at_us: prepared.declared_at_us,
                    tables,
                    pages,
                    ahead,
                    locked,
                });
                shmem::progress().set_queued(self.queue.len() as u32);
                self.listing_changed();
            }
            Err(e) => {
                self.note_store_error(&e);
                release(&locked, Some(mvcc));
                // The span's pages go to the next one, and the copies made ahead with them:
                // the next span does not record what was written after this split.
                self.span_leftover = drain(&mut self.span_leftover).0;
                self.ahead = None;
                let message = format!("could not declare a snapshot: {}", e.message());
                pgrx::warning!("{message}");
                let error = WorkerError::new(super::code_of(&e), message);
                for p in batch {
                    answer_error(p.slot, &error);
                }
            }
        }
    }

    /// Makes the declaration durable and decides how each table is captured: the snapshot's
    /// id and its tables.
    fn record(
        &mut self,
        store: &Store,
        p: &Prepared,
        label: Option<String>,
        explicit: Rank,
    ) -> Result<(u64, Vec<DeclaredTable>), StoreError> {
        let mut relations = Vec::with_capacity(p.tables.len());
        let mut tables = Vec::with_capacity(p.tables.len());
        let mut known = HashMap::with_capacity(p.tables.len());
        // The first declaration after a start resumes the newest durable snapshot's tables
        // (`restart.rs`); without it, every table is a new incarnation captured in full.
        let base = if self.fresh_start {
            RestartBase::find(store, p.lsn, p.timeline).unwrap_or_else(|e| {
                pgrx::log!(
                    "gsnap: the first capture since the start compares nothing ({}): every \
                     table is captured in full",
                    e.message()
                );
                None
            })
        } else {
            None
        };
        for t in &p.tables {
            let previous = self
                .known
                .get(&t.relid)
                .filter(|k| k.relfilenode == t.relfilenode);
            let resumed = base
                .as_ref()
                .and_then(|b| b.resume(t.relid, t.relfilenode, t.logged));
            let (rel, mode) = match (previous, &resumed) {
                // Its written pages; all of them if they overflowed the dirty set
                // (`start_capture` asks the span's pages).
                (Some(k), _) if !self.fresh_start => (k.rel, Mode::Incremental),
                (_, Some(r)) => (r.rel, Mode::Rescan),
                _ => {
                    let rel = store.allocate_rel(&RelIncarnation {
                        pg_relid: t.relid,
                        relfilenode: t.relfilenode,
                        name: t.name.clone(),
                    })?;
                    (rel, Mode::Fresh)
                }
            };
            let row_type = store.put_row_type(&t.row_type.encode())?;
            relations.push(RelationSnapshot {
                pg_relid: t.relid,
                rel,
                relfilenode: t.relfilenode,
                nblocks: t.nblocks,
                row_type,
                name: t.name.clone(),
            });
            tables.push(DeclaredTable {
                relid: t.relid,
                rel,
                nblocks: t.nblocks,
                mode,
                resumed,
            });
            known.insert(
                t.relid,
                Known {
                    rel,
                    relfilenode: t.relfilenode,
                },
            );
        }
        // Thresher's eager ranking: the retention levels whose bucket this snapshot is the
        // first of are known now (gsnap_lifetimes), and a rank given at declaration raises it.
        let eager =
            gsnap_lifetimes::rank_at_declaration(self.last_declared_at_us, p.declared_at_us);
        let rank = Rank(
            eager
                .value()
                .max(explicit.0)
                .min(gsnap_lifetimes::Rank::MAX.value()),
        );
        let snap = store.declare(SnapshotDecl {
            declared_at_us: p.declared_at_us,
            wal_lsn: p.lsn,
            timeline: p.timeline,
            rank,
            label,
            relations,
        })?;
        self.last_declared_at_us = Some(
            self.last_declared_at_us
                .map_or(p.declared_at_us, |t| t.max(p.declared_at_us)),
        );
        self.known = known;
        self.fresh_start = false;
        Ok((snap.0, tables))
    }
}

/// Answers a declaration request with the snapshot id (and the exported snapshot's name).
pub(super) fn answer_snapshot(slot: usize, snap: u64, exported: Option<&str>) {
    let reply = Reply::Declared {
        snap: SnapId(snap),
        exported: exported.map(str::to_owned),
    };
    deliver(slot, &encode_answer(Kind::Declare, Ok(reply)));
}

/// Answers a declaration request the worker took with an error.
pub(super) fn answer_error(slot: Option<usize>, error: &WorkerError) {
    if let Some(slot) = slot {
        deliver(slot, &error.encode());
    }
}

/// How long the worker steps aside after answering a declaration (see `declare_pending`).
const HAND_OVER: std::time::Duration = std::time::Duration::from_micros(200);

/// Finishes a declaration request the worker took with `answer` (which holds no pins).
fn deliver(slot: usize, answer: &[u8]) {
    let s = shmem::request_slot(slot);
    // SAFETY: the worker took this request and has not finished it.
    let body = unsafe { s.taken_body() };
    body.set_message(answer);
    let requester = body.requester;
    s.finish(|_| {});
    crate::ipc::set_latch_of(requester as usize);
}
