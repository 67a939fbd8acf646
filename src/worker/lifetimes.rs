//! Lifetimes (docs/design.md, "Lifetimes"): the retention policy, explicit deletion, pins and
//! ranks, and the reclamation of deleted snapshots' space in the background.
//!
//! - The policy (`gsnap.retention`, `gsnap.min_snapshots`, `gsnap.max_store_size`) is decided
//!   by `gsnap_lifetimes::decide` over the live snapshots; the preview
//!   (`gsnap_retention_preview()`) and the worker call the same [`decisions`], so what the
//!   preview shows is what the worker does. The worker applies it after every commit, when
//!   the settings are reloaded, and every few seconds (pins expire).
//! - Deleting is logical and immediate: one synced catalog batch; new reads get an ERROR.
//! - Reclamation runs a bounded step per loop iteration (`gsnap.reclaim_batch` dead mappings,
//!   in one store batch, resumable after a crash: `gsnap_store::reclaim`). A deleted snapshot
//!   is reclaimed only once `gsnap.reclaim_delay` has passed since its deletion and no reader
//!   pins an index group that holds it: queries that were reading it when it was deleted
//!   finish with their images in place (their pins are their lease). Images the capture in
//!   progress maps are never freed under it.
//! - Once a batch of deletions is reclaimed, the freed image key ranges are compacted on a
//!   thread (`background.rs`), so space returns to the file system, and index groups holding
//!   deleted snapshots are rebuilt without them, or merged (GSnap 4.5-4.6, `index.rs`).
//! - What deleting each snapshot would free is estimated on a thread too, once the catalog is
//!   quiet and no capture or reclamation runs.

use super::background::{CompactionThread, FoundFree, FreesThread, LogRewriteThread};
use super::{Store, Worker};
use crate::gucs;
use crate::shmem::{self, groups};
use gsnap_lifetimes::{self as lifetimes, Decision, Policy};
use gsnap_protocol::listing::{self, DecisionRow, ReportRow};
use gsnap_protocol::{ErrorCode, Kind, Reply, Request, SnapId, WorkerError};
use gsnap_store::{Freed, ImageId, Pin, Rank, ReclaimJob, SnapshotInfo, SnapshotState, StoreError};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a search for reclamation that found none stands (`Worker::reclaim_search_at`).
const RECLAIM_SEARCH_PAUSE: Duration = Duration::from_millis(200);

/// How often the policy is applied when nothing else triggers it (pins expire).
const RETENTION_PERIOD: Duration = Duration::from_secs(5);

/// The size of the batches a rewrite of the mapping log writes the new log in (unsynced; its
/// memory is one window's pages plus one such batch, whatever the log's size).
const REWRITE_BATCH_BYTES: usize = 4 << 20;

fn store_error(e: StoreError) -> WorkerError {
    WorkerError::new(super::code_of(&e), e.message().to_string())
}

fn now_us() -> i64 {
    super::catalog::now_unix_us()
}

/// The configured policy (`gsnap.retention`).
pub(super) fn configured_policy() -> Result<Policy, WorkerError> {
    let text = gucs::retention();
    Policy::parse(&text)
        .map_err(|e| WorkerError::new(ErrorCode::InvalidArgument, format!("gsnap.retention: {e}")))
}

/// The snapshots a policy decides about (committed: neither deleted, failed, nor being
/// captured), and what the policy decides for each. The one function behind both the
/// preview and the worker.
pub(super) fn decisions(
    store: &Store,
    policy: &Policy,
    now: i64,
) -> Result<(Vec<SnapshotInfo>, Vec<Decision>), WorkerError> {
    let live: Vec<SnapshotInfo> = store
        .snapshots()
        .map_err(store_error)?
        .into_iter()
        .filter(|s| s.state == SnapshotState::Committed)
        .collect();
    let input: Vec<lifetimes::SnapshotInfo> =
        live.iter().map(|s| as_policy_input(s, now)).collect();
    let min = gucs::MIN_SNAPSHOTS.get().max(0) as usize;
    let decided = lifetimes::decide(&input, policy, min);
    Ok((live, decided))
}

fn effective_rank(s: &SnapshotInfo) -> u8 {
    s.decl.rank.0.max(s.explicit_rank.0)
}

fn pinned(s: &SnapshotInfo, now: i64) -> bool {
    s.pins.iter().any(|p| p.until_us > now)
}

fn as_policy_input(s: &SnapshotInfo, now: i64) -> lifetimes::SnapshotInfo {
    lifetimes::SnapshotInfo {
        id: s.id.0,
        taken_at_us: s.decl.declared_at_us,
        rank: lifetimes::Rank::new(effective_rank(s)).unwrap_or(lifetimes::Rank::MAX),
        pinned: pinned(s, now),
    }
}

/// Key map entries one step of the sweep looks at.
const KEY_SWEEP_BATCH: usize = 4096;

impl Worker {
    /// Answers the requests of lifetimes (deletion, pins, ranks, preview, verification, space).
    pub(super) fn answer_lifetimes(
        &mut self,
        store: &Store,
        request: Request,
    ) -> Result<Reply, WorkerError> {
        match request {
            Request::Delete { snaps, force } => {
                self.delete(store, &snaps, force)?;
                Ok(Reply::Done)
            }
            Request::Pin {
                snap,
                tag,
                until_us,
            } => {
                let info = live_snapshot(store, snap, "pinned")?;
                let mut pins = info.pins;
                pins.retain(|p| p.tag != tag);
                pins.push(Pin { tag, until_us });
                store.set_pins(snap, pins).map_err(store_error)?;
                self.listing_changed();
                Ok(Reply::Done)
            }
            Request::Unpin { snap, tag } => {
                let info = store.snapshot(snap).map_err(|_| unknown(snap))?;
                if !info.pins.iter().any(|p| p.tag == tag) {
                    return Err(WorkerError::new(
                        ErrorCode::InvalidArgument,
                        format!("snapshot {} has no pin \"{tag}\"", snap.0),
                    )
                    .with_hint(pins_hint(&info)));
                }
                let pins = info.pins.into_iter().filter(|p| p.tag != tag).collect();
                store.set_pins(snap, pins).map_err(store_error)?;
                self.listing_changed();
                Ok(Reply::Done)
            }
            Request::SetRank { snap, rank } => {
                if rank > lifetimes::Rank::MAX.value() {
                    return Err(WorkerError::new(
                        ErrorCode::InvalidArgument,
                        format!(
                            "rank {rank} does not exist; ranks go from 0 to {}",
                            lifetimes::Rank::MAX.value()
                        ),
                    ));
                }
                live_snapshot(store, snap, "ranked")?;
                store
                    .set_explicit_rank(snap, Rank(rank))
                    .map_err(store_error)?;
                self.listing_changed();
                Ok(Reply::Done)
            }
            Request::RetentionPreview { policy, offset } => {
                self.report_page(Kind::RetentionPreview, offset, |_| {
                    preview(store, policy.as_deref())
                })
            }
            Request::Verify { repair, offset } => {
                if offset == 0 && self.job.is_some() {
                    return Err(WorkerError::new(
                        ErrorCode::Capturing,
                        "a capture is in progress; the store is verified between captures",
                    ));
                }
                if repair && offset == 0 {
                    self.catalog_changed();
                }
                self.report_page(Kind::Verify, offset, |w| {
                    verify(store, repair, &w.capture_keeps())
                })
            }
            Request::StoreStats { offset } => {
                self.frees_wanted();
                self.report_page(Kind::StoreStats, offset, |w| {
                    space(store, w.reclaimed_total, w.deleted_bytes(store))
                })
            }
            Request::CopyStore { directory } => {
                let newest = store
                    .copy_to(std::path::Path::new(&directory))
                    .map_err(store_error)?;
                pgrx::log!(
                    "gsnap: the store was copied to \"{directory}\" (newest snapshot in the copy: {})",
                    newest.map_or("none".to_string(), |s| s.0.to_string())
                );
                Ok(Reply::Resolved {
                    snap: newest.unwrap_or(SnapId(0)),
                })
            }
            _ => unreachable!("serve.rs hands only the requests of lifetimes here"),
        }
    }

    /// The page at `offset` of a report built afresh for each first page (`build`), kept
    /// for the pages after it.
    fn report_page(
        &mut self,
        kind: Kind,
        offset: u64,
        build: impl FnOnce(&Self) -> Result<Vec<u8>, WorkerError>,
    ) -> Result<Reply, WorkerError> {
        let key = super::serve::answer_key(kind, 0);
        if offset == 0 || !self.answers.contains_key(&key) {
            let blob = build(self)?;
            self.answers.insert(key, Rc::new(blob));
        }
        super::serve::page(&self.answers[&key], offset)
    }

    /// Deletes `snaps` (logically, at once): the checks of an explicit deletion first (all or
    /// nothing).
    fn delete(&mut self, store: &Store, snaps: &[SnapId], force: bool) -> Result<(), WorkerError> {
        let now = now_us();
        let all = store.snapshots().map_err(store_error)?;
        let mut wanted: Vec<SnapId> = snaps.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        for &s in &wanted {
            match all.iter().find(|i| i.id == s) {
                None => return Err(unknown(s)),
                Some(i) if i.state == SnapshotState::Capturing => {
                    return Err(WorkerError::new(
                        ErrorCode::Capturing,
                        format!("snapshot {} is still being captured; delete it once its capture ends", s.0),
                    ))
                }
                Some(i) if pinned(i, now) => {
                    return Err(WorkerError::new(
                        ErrorCode::Protected,
                        format!(
                            "snapshot {} is pinned ({}) and cannot be deleted",
                            s.0,
                            pin_list(i, now)
                        ),
                    )
                    .with_hint(format!(
                        "gsnap_pins() says until when; remove them first with SELECT gsnap_unpin({}, tag).",
                        s.0
                    )))
                }
                Some(_) => {}
            }
        }
        let live: Vec<lifetimes::SnapshotInfo> = all
            .iter()
            .filter(|i| i.state == SnapshotState::Committed)
            .map(|i| as_policy_input(i, now))
            .collect();
        let ids: Vec<u64> = wanted.iter().map(|s| s.0).collect();
        let check = lifetimes::check_deletion(&live, &ids);
        if check.needs_force() && !force {
            let what = if check.every_snapshot {
                "every readable snapshot".to_string()
            } else {
                format!(
                    "snapshot {}, the newest",
                    lifetimes::newest_snapshot(&live).unwrap_or(0)
                )
            };
            return Err(WorkerError::new(
                ErrorCode::Protected,
                format!("gsnap_delete would delete {what}"),
            )
            .with_hint("Pass force => true to delete it anyway."));
        }
        store.delete_snapshots(&wanted, now).map_err(store_error)?;
        // A deleted snapshot stays in the log until it is reclaimed: no estimate changes yet.
        self.listing_changed();
        Ok(())
    }

    /// Applies the retention policy (and the size cap) when it is due: after a commit, after
    /// a reload, and every few seconds.
    pub(super) fn apply_retention(&mut self, now: Instant, force: bool) {
        if !force && now < self.retention_due {
            return;
        }
        self.retention_due = now + RETENTION_PERIOD;
        let Some(store) = self.store.clone() else {
            return;
        };
        let policy = match configured_policy() {
            Ok(p) => p,
            Err(e) => {
                if self.policy_warned.as_deref() != Some(e.message.as_str()) {
                    pgrx::warning!(
                        "{}; every snapshot is kept until it is corrected",
                        e.message
                    );
                    self.policy_warned = Some(e.message);
                }
                return;
            }
        };
        self.policy_warned = None;
        let cap = gucs::max_store_size_bytes();
        if policy.is_keep_all() && cap == 0 {
            return;
        }
        let t = now_us();
        let result = decisions(&store, &policy, t).and_then(|(live, mut decided)| {
            if cap > 0 {
                let disk = store.disk_bytes().map_err(store_error)?;
                let freed_of = |d: &Decision| {
                    live.iter()
                        .find(|s| s.id.0 == d.id)
                        .map_or(0, |s| s.stats.bytes_stored())
                };
                let thinning = lifetimes::thin_to_cap(&mut decided, disk, cap, freed_of);
                if !thinning.cap_met && !self.cap_warned {
                    pgrx::warning!(
                        "gsnap: the store takes {disk} bytes, more than gsnap.max_store_size ({cap} \
                         bytes), and deleting more snapshots would touch pinned or the newest ones"
                    );
                }
                self.cap_warned = !thinning.cap_met;
            }
            let doomed: Vec<SnapId> = decided
                .iter()
                .filter(|d| !d.keep())
                .map(|d| SnapId(d.id))
                .collect();
            if !doomed.is_empty() {
                store.delete_snapshots(&doomed, t).map_err(store_error)?;
                let list: Vec<String> = decided
                    .iter()
                    .filter(|d| !d.keep())
                    .map(|d| format!("{} ({})", d.id, d.rule))
                    .collect();
                pgrx::log!("gsnap: retention deleted snapshots {}", list.join(", "));
            }
            Ok(doomed.len())
        });
        match result {
            Ok(0) => {}
            Ok(_) => self.listing_changed(),
            Err(e) => pgrx::warning!("gsnap: retention could not be applied: {}", e.message),
        }
    }

    /// Images the capture in progress maps that existed before it (reclamation keeps them).
    fn capture_keeps(&self) -> impl Fn(ImageId) -> bool + '_ {
        move |id| self.job.as_ref().is_some_and(|j| j.keeps(id))
    }

    /// One bounded step of reclamation; true while there is more to do now.
    pub(super) fn reclaim(&mut self) -> bool {
        let Some(store) = self.store.clone() else {
            return false;
        };
        if self.job.as_ref().is_some_and(|j| j.storing()) {
            // Phase two's thread may map any stored image (a dedup hit) at any moment:
            // reclamation waits for its commit.
            return false;
        }
        if self.job.is_none() && self.release_kept {
            let keep = |_: ImageId| false;
            match store.release_kept(&keep) {
                Ok(freed) => {
                    self.reclaimed_total.add(freed);
                    if freed != Freed::default() {
                        // The TOAST values the freed content named lost a reference.
                        self.catalog_changed();
                    }
                }
                Err(e) => {
                    self.note_store_error(&e);
                    return false;
                }
            }
            self.release_kept = false;
        }
        if self.reclaim_job.is_none() {
            let now = Instant::now();
            if now < self.reclaim_search_at {
                return false;
            }
            match self.next_reclaim_job(&store) {
                Ok(Some(job)) => self.reclaim_job = Some(job),
                Ok(None) => {
                    shmem::progress().reclaim_idle();
                    if self.tidy_due {
                        self.tidy_after_reclaim(&store);
                    }
                    self.reclaim_search_at = now + RECLAIM_SEARCH_PAUSE;
                    return false;
                }
                Err(e) => {
                    self.note_store_error(&e);
                    pgrx::warning!("gsnap: reclamation cannot start: {}", e.message());
                    self.reclaim_search_at = now + RECLAIM_SEARCH_PAUSE;
                    return false;
                }
            }
        }
        let pause = gucs::DEBUG_RECLAIM_PAUSE_MS.get();
        if pause > 0 {
            let now = std::time::Instant::now();
            if now < self.next_reclaim_at {
                return false;
            }
            self.next_reclaim_at = now + std::time::Duration::from_millis(pause as u64);
        }
        let budget = gucs::RECLAIM_BATCH.get().max(1) as usize;
        let mut job: ReclaimJob = self.reclaim_job.take().expect("set above");
        let result = {
            let keep = self.capture_keeps();
            store.reclaim_step(&mut job, budget, &keep)
        };
        shmem::progress().reclaiming(
            job.snap.0,
            job.done as u64,
            job.total() as u64,
            self.reclaimed_total.bytes + job.freed.bytes,
        );
        match result {
            Ok(true) => {
                self.reclaimed_total.add(job.freed);
                self.killed_mappings = self.killed_mappings.saturating_add(job.total() as u64);
                self.killed_since_sweep =
                    self.killed_since_sweep.saturating_add(job.total() as u64);
                for (from, to) in job.freed_ranges() {
                    let e = self
                        .freed_ranges
                        .entry(gsnap_store::keys::image_rank(from).0)
                        .or_insert((from, to));
                    *e = (e.0.min(from), e.1.max(to));
                }
                self.tidy_due = true;
                self.snapshot_reclaimed(&job);
                true
            }
            Ok(false) => {
                self.reclaim_job = Some(job);
                true
            }
            Err(e) => {
                self.note_store_error(&e);
                pgrx::warning!(
                    "gsnap: reclaiming snapshot {} failed ({}); it resumes later",
                    job.snap.0,
                    e.message()
                );
                false
            }
        }
    }

    /// One bounded step of the sweep of key map entries no readable snapshot needs any more
    /// (due after reclamation); true while there is more to do now. Not while a capture is
    /// open: it may be starting a map the catalog does not name yet.
    pub(super) fn sweep_keys(&mut self) -> bool {
        let (Some(store), Some(after)) = (self.store.clone(), self.key_sweep.take()) else {
            return false;
        };
        if self.job.is_some() {
            self.key_sweep = Some(after);
            return false;
        }
        match store.sweep_keys(after.as_deref(), KEY_SWEEP_BATCH) {
            Ok((_, None)) => false,
            Ok((_, Some(next))) => {
                self.key_sweep = Some(Some(next));
                true
            }
            Err(e) => {
                self.note_store_error(&e);
                pgrx::warning!("gsnap: sweeping the key maps failed: {}", e.message());
                false
            }
        }
    }

    /// The reclamation to start (or resume) now: the oldest deleted snapshot whose delay has
    /// passed and that no reader's pinned index group holds. Readers check the generation
    /// bumped here (`read::table::confirm_readable`): a reader that found a snapshot readable
    /// and pins its groups only after the check sees the bump and looks again.
    fn next_reclaim_job(&mut self, store: &Store) -> Result<Option<ReclaimJob>, StoreError> {
        let delay = gucs::RECLAIM_DELAY.get().max(0) as i64 * 1_000_000;
        let now = now_us();
        let due = |s: SnapId| {
            store
                .snapshot(s)
                .ok()
                .and_then(|i| i.deleted_at_us)
                .is_some_and(|t| now.saturating_sub(t) >= delay)
        };
        let pinned = self.pinned_spans();
        let leased =
            |spans: &[(u64, u64)], s: SnapId| spans.iter().any(|&(a, b)| a <= s.0 && s.0 <= b);
        let Some(job) = store.reclaim_next(&|s| due(s) && !leased(&pinned, s))? else {
            return Ok(None);
        };
        // Pins are registered by this process while it serves requests, so every pin taken
        // after the check above is taken after this bump.
        shmem::progress().bump_reclaim_generation();
        Ok(Some(job))
    }

    /// Once no reclamation is left to do now (not after each snapshot: a batch of deletions
    /// costs one pass): the key ranges of the freed images compacted (per rank, on a thread:
    /// `background.rs`), index groups holding deleted snapshots rebuilt or merged.
    fn tidy_after_reclaim(&mut self, store: &Store) {
        self.tidy_due = false;
        // The key entries are swept when enough mappings died for it to pay (a sweep reads
        // them all); one under way goes on (what died since it began counts for the next).
        if self.key_sweep.is_none() {
            match store.key_sweep_due(self.killed_since_sweep) {
                Ok(true) => {
                    self.key_sweep = Some(None);
                    self.killed_since_sweep = 0;
                }
                Ok(false) => {}
                Err(e) => self.note_store_error(&e),
            }
        }
        self.poll_compaction();
        if let Some(index) = self.index.as_mut() {
            let deleted = |s: SnapId| {
                matches!(
                    store.snapshot_state(s),
                    Some(SnapshotState::Deleted | SnapshotState::Reclaimed)
                )
            };
            match index.drop_deleted(&deleted) {
                Ok(replaced) => {
                    self.replaced_groups.extend(replaced.iter().map(|g| g.0));
                    self.retire_replaced_groups();
                }
                Err(e) => pgrx::warning!(
                    "gsnap: rebuilding index groups without deleted snapshots failed: {e}"
                ),
            }
        }
    }

    /// Switches to the mapping log's rewrite once its thread has written it and no
    /// reclamation is in flight (the switch adds the snapshots committed meanwhile), and
    /// starts a rewrite when the mappings reclamation killed since the last are half the log,
    /// between reclamations. The log then holds what the retained snapshots need, not every
    /// mapping of every snapshot ever taken (`gsnap_store::LogRewrite`); the generation it
    /// leaves is compacted on the compaction thread.
    pub(super) fn poll_log_rewrite(&mut self) {
        let idle = self.reclaim_job.is_none();
        if let Some(thread) = self.log_rewrite.take_if(|t| idle && t.finished()) {
            let Some(store) = self.store.clone() else {
                return;
            };
            match thread.join() {
                Ok(Some(rewrite)) => match store.apply_log_rewrite(&rewrite) {
                    Ok(Some(after)) => {
                        self.killed_mappings = 0;
                        self.retired_log = Some(rewrite.retired_generation());
                        // The rewrite keeps every mapping a snapshot not reclaimed needs, so
                        // no estimate changes (the store's seeded model checks the kept ones
                        // across rewrites); only the cached listings go.
                        self.listing_changed();
                        self.poll_compaction();
                        pgrx::log!(
                            "gsnap: mapping log rewritten without the mappings no retained \
                             snapshot needs: {after} mappings, {} before",
                            rewrite.before
                        );
                    }
                    // Stale, or a reclamation is in flight: computed again later.
                    Ok(None) => {}
                    Err(e) => self.note_store_error(&e),
                },
                Ok(None) => {} // a reclamation is in flight: computed again later
                Err(e) => pgrx::warning!("gsnap: rewriting the mapping log failed: {e}"),
            }
            return;
        }
        if self.log_rewrite.is_some() || !idle || self.killed_mappings < 4096 {
            return;
        }
        let Some(store) = self.store.clone() else {
            return;
        };
        match store.log_mappings() {
            Ok(total) if self.killed_mappings.saturating_mul(2) >= total => {}
            Ok(_) => return,
            Err(e) => {
                self.note_store_error(&e);
                return;
            }
        }
        match LogRewriteThread::start(store, REWRITE_BATCH_BYTES) {
            Ok(thread) => self.log_rewrite = Some(thread),
            Err(e) => pgrx::log!("gsnap: cannot start the log rewrite thread yet: {e}"),
        }
    }

    /// Reports the compaction thread's end, and starts the next one when ranges freed by a
    /// batch of deletions whose reclamation has ended (tidied) wait for it (one at a time).
    pub(super) fn poll_compaction(&mut self) {
        if let Some(thread) = self.compaction.take_if(|t| t.finished()) {
            for e in thread.join() {
                pgrx::warning!("gsnap: compacting freed images failed: {e}");
            }
        }
        if self.compaction.is_some() {
            return;
        }
        let Some(store) = self.store.clone() else {
            return;
        };
        if let Some(generation) = self.retired_log.take() {
            match CompactionThread::start_log(store, generation) {
                Ok(thread) => self.compaction = Some(thread),
                Err(e) => {
                    self.retired_log = Some(generation);
                    pgrx::log!("gsnap: cannot start the compaction thread yet: {e}");
                }
            }
            return;
        }
        if self.tidy_due || self.freed_ranges.is_empty() {
            return;
        }
        let ranges = std::mem::take(&mut self.freed_ranges);
        match CompactionThread::start(store, ranges.clone()) {
            Ok(thread) => self.compaction = Some(thread),
            // No thread now (resources): tried again on the next iteration.
            Err(e) => {
                self.freed_ranges = ranges;
                pgrx::log!("gsnap: cannot start the compaction thread yet: {e}");
            }
        }
    }

    /// Someone read the estimates: they are kept up to date for the next ten minutes.
    pub(super) fn frees_wanted(&mut self) {
        self.frees_wanted_until = Instant::now() + std::time::Duration::from_secs(600);
    }

    /// Brings the estimates of what deleting each snapshot would free (`would_free`) up to
    /// date on a thread (`background.rs`), between captures and reclamations once the catalog
    /// has been quiet for a moment, and only while someone reads them (`gsnap_snapshots()`,
    /// `gsnap_store_stats()` in the last ten minutes): each costs a read of the snapshot's
    /// dead mappings and their images' counts, which a worker taking a snapshot every few
    /// seconds should not spend for nobody. The thread is stopped when a capture or a
    /// reclamation starts or the catalog changes again.
    pub(super) fn refresh_frees(&mut self) {
        let now = Instant::now();
        let quiet = self.job.is_none()
            && self.reclaim_job.is_none()
            && now >= self.frees_quiet_at
            && now < self.frees_wanted_until;
        if let Some(thread) = self.frees_thread.take() {
            if !quiet || thread.generation != self.frees_generation {
                thread.cancel();
            }
            // Asked before the estimates are taken, so none sent before the end is left.
            let finished = thread.finished();
            let found = thread.take_found();
            if thread.generation == self.frees_generation && !found.is_empty() {
                self.found_frees(found);
            }
            if !finished {
                self.frees_thread = Some(thread);
                return;
            }
        }
        let Some(store) = self.store.clone() else {
            return;
        };
        if !quiet {
            return;
        }
        let generation = self.frees_generation;
        let todo: Vec<SnapId> = store
            .unreclaimed_snapshots()
            .into_iter()
            .filter(|s| self.frees.get(&s.0).is_none_or(|e| e.0 != generation))
            .collect();
        if todo.is_empty() {
            return;
        }
        match FreesThread::start(store, generation, todo) {
            Ok(thread) => self.frees_thread = Some(thread),
            Err(e) => pgrx::log!("gsnap: cannot start the estimates' thread yet: {e}"),
        }
    }

    /// Records the estimates a thread computed at the current generation, and keeps them in
    /// the store too (if no count changed meanwhile), so that a restarted worker starts from
    /// them instead of computing them all again (`gsnap_store::SnapshotStore::keep_estimates`).
    fn found_frees(&mut self, found: Vec<FoundFree>) {
        let generation = self.frees_generation;
        let mut known: BTreeMap<u64, Vec<(SnapId, Freed)>> = BTreeMap::new();
        for f in found {
            self.frees
                .insert(f.snap.0, (generation, f.freed.map(|f| f.bytes)));
            if let Some(freed) = f.freed {
                known.entry(f.epoch).or_default().push((f.snap, freed));
            }
        }
        self.answers
            .remove(&super::serve::answer_key(Kind::Snapshots, 0));
        let Some(store) = self.store.clone() else {
            return;
        };
        for (epoch, estimates) in known {
            if let Err(e) = store.keep_estimates(epoch, &estimates) {
                self.note_store_error(&e);
                pgrx::log!("gsnap: the estimates could not be kept in the store: {e}");
                return;
            }
        }
    }

    /// Starts from the estimates the store kept (`SnapshotStore::kept_estimates`), once it is
    /// open: only the others are computed when someone reads them.
    pub(super) fn load_kept_frees(&mut self, store: &Store) {
        match store.kept_estimates() {
            Ok(kept) => {
                let generation = self.frees_generation;
                for (snap, freed) in kept {
                    self.frees.insert(snap.0, (generation, Some(freed.bytes)));
                }
            }
            Err(e) => pgrx::log!("gsnap: the kept estimates could not be read: {e}"),
        }
    }

    /// Stops the estimates' thread now, if one runs: a capture is starting, and its phase
    /// one, which holds back VACUUM, should have the cores (an estimate under way competed
    /// with it for up to a second; bench/snapshots/README.md, 2026-11-29). The thread is
    /// joined, and started again once the worker is quiet, by [`Self::refresh_frees`].
    pub(super) fn stop_frees(&self) {
        if let Some(thread) = &self.frees_thread {
            thread.cancel();
        }
    }

    /// True while a thread works for the worker (it is polled soon).
    pub(super) fn threads_running(&self) -> bool {
        self.frees_thread.is_some() || self.compaction.is_some()
    }

    /// The estimates known (possibly from before the last change: refreshed in the background).
    pub(super) fn frees_known(&self) -> std::collections::HashMap<u64, u64> {
        self.frees
            .iter()
            .filter_map(|(&s, &(_, b))| b.map(|b| (s, b)))
            .collect()
    }

    /// What reclaiming the deleted snapshots will free, at least (each alone, summed).
    fn deleted_bytes(&self, store: &Store) -> u64 {
        let known = self.frees_known();
        store
            .deleted_unreclaimed()
            .iter()
            .filter_map(|s| known.get(&s.0))
            .sum()
    }

    /// Removes replaced index groups from the group cache once no reader pins them.
    pub(super) fn retire_replaced_groups(&mut self) {
        if self.replaced_groups.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        groups::with_groups(|c| {
            for &k in &self.replaced_groups {
                // An error means a reader still pins it: tried again after the next step.
                if c.remove(k).is_err() {
                    keep.push(k);
                }
            }
        });
        self.replaced_groups = keep;
    }

    /// The snapshot spans of the index groups some reader pins: their snapshots are leased
    /// (reclamation waits for them). Spans of groups no longer in the cache are forgotten.
    fn pinned_spans(&mut self) -> Vec<(u64, u64)> {
        let entries = groups::with_groups(|c| c.entries()).unwrap_or_default();
        self.group_spans
            .retain(|k, _| entries.iter().any(|e| e.group == *k));
        entries
            .iter()
            .filter(|e| e.pins > 0)
            .filter_map(|e| self.group_spans.get(&e.group).copied())
            .collect()
    }
}

fn unknown(snap: SnapId) -> WorkerError {
    WorkerError::new(
        ErrorCode::UnknownSnapshot,
        format!("snapshot {} does not exist", snap.0),
    )
}

/// A snapshot that may be pinned or ranked: it exists and is not deleted.
fn live_snapshot(store: &Store, snap: SnapId, what: &str) -> Result<SnapshotInfo, WorkerError> {
    let info = store.snapshot(snap).map_err(|_| unknown(snap))?;
    match info.state {
        SnapshotState::Committed | SnapshotState::Capturing => Ok(info),
        SnapshotState::Deleted | SnapshotState::Reclaimed => Err(WorkerError::new(
            ErrorCode::NotReadable,
            format!("snapshot {} was deleted and cannot be {what}", snap.0),
        )),
        SnapshotState::Failed => Err(WorkerError::new(
            ErrorCode::NotReadable,
            format!("snapshot {} failed and cannot be {what}", snap.0),
        )),
    }
}

fn pin_list(info: &SnapshotInfo, now: i64) -> String {
    info.pins
        .iter()
        .filter(|p| p.until_us > now)
        .map(|p| format!("\"{}\"", p.tag))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pins_hint(info: &SnapshotInfo) -> String {
    if info.pins.is_empty() {
        format!("Snapshot {} has no pins.", info.id.0)
    } else {
        let tags: Vec<String> = info.pins.iter().map(|p| format!("\"{}\"", p.tag)).collect();
        format!("Its pins: {}.", tags.join(", "))
    }
}

fn preview(store: &Store, policy: Option<&str>) -> Result<Vec<u8>, WorkerError> {
    let policy = match policy {
        Some(text) => Policy::parse(text).map_err(|e| {
            WorkerError::new(ErrorCode::InvalidArgument, format!("retention policy {e}"))
        })?,
        None => configured_policy()?,
    };
    let now = now_us();
    let (live, decided) = decisions(store, &policy, now)?;
    let rows: Vec<DecisionRow> = decided
        .iter()
        .zip(&live)
        .map(|(d, s)| DecisionRow {
            snap: SnapId(d.id),
            taken_at_us: d.taken_at_us,
            rank: d.rank.value(),
            label: s.decl.label.clone(),
            pinned: pinned(s, now),
            keep: d.keep(),
            rule: d.rule.to_string(),
        })
        .collect();
    listing::encode_decisions(&rows).map_err(|e| super::serve::unencodable("retention preview", e))
}

fn report(lines: &[(&str, i64)]) -> Result<Vec<u8>, WorkerError> {
    let rows: Vec<ReportRow> = lines
        .iter()
        .map(|&(name, value)| ReportRow {
            name: name.to_string(),
            value,
        })
        .collect();
    listing::encode_report(&rows).map_err(|e| super::serve::unencodable("report", e))
}

fn verify(
    store: &Store,
    repair: bool,
    keep: &dyn Fn(ImageId) -> bool,
) -> Result<Vec<u8>, WorkerError> {
    let r = store.verify(repair, keep).map_err(store_error)?;
    if !r.missing_images.is_empty() || !r.missing_toast_values.is_empty() {
        pgrx::warning!(
            "gsnap: verification found {} missing images and {} missing TOAST values (the store \
             is damaged: snapshots naming them cannot be read)",
            r.missing_images.len(),
            r.missing_toast_values.len()
        );
    }
    report(&[
        ("images", r.images as i64),
        ("toast_values", r.toast_values as i64),
        ("content_bytes", r.content_bytes as i64),
        ("live_mappings", r.live_mappings as i64),
        ("leaked_images", r.leaked_images as i64),
        ("leaked_toast_values", r.leaked_toast_values as i64),
        ("leaked_deltas", r.leaked_deltas as i64),
        ("leaked_bytes", r.leaked_bytes as i64),
        ("missing_images", r.missing_images.len() as i64),
        ("missing_toast_values", r.missing_toast_values.len() as i64),
        ("wrong_counts", r.wrong_counts as i64),
        ("repaired", i64::from(r.repaired)),
    ])
}

fn space(
    store: &Store,
    freed: gsnap_store::Freed,
    deleted_bytes: u64,
) -> Result<Vec<u8>, WorkerError> {
    let s = store.space().map_err(store_error)?;
    report(&[
        ("content_bytes", s.content_bytes as i64),
        ("disk_bytes", s.disk_bytes as i64),
        ("images", s.images as i64),
        ("deleted_unreclaimed", s.deleted_unreclaimed as i64),
        ("deleted_bytes", deleted_bytes as i64),
        ("reclaimed_bytes", freed.bytes as i64),
        ("reclaimed_images", freed.images as i64),
        ("key_map_entries", s.key_map_entries as i64),
        ("key_map_bytes", s.key_map_bytes as i64),
        ("delta_entries", s.delta_entries as i64),
        ("delta_bytes", s.delta_bytes as i64),
    ])
}
