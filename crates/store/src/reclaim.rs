//! Reclaiming the space of deleted snapshots, one snapshot at a time, in bounded steps that
//! resume after a crash.
//!
//! Liveness is an interval test over the mapping log. A mapping of page P made at snapshot v
//! and next replaced at v' (the page's next mapping) is *live* while a member of R lies in
//! `[v, v')`: that snapshot's page table names it. R is every snapshot of the log not
//! reclaimed yet: the committed ones, and the deleted ones whose reclamation has not run
//! (the newest snapshot of the log is never reclaimed while it is the newest: the next
//! capture compares pages with its page table). Reclaiming deleted snapshot d removes it
//! from R, which kills exactly the mappings whose interval holds d and no other member of R:
//! with p the greatest member of R below d and n the least above it, those *visible at d*
//! (made in `(p, d]`, not replaced by d) and *replaced by n* (the page has a mapping in
//! `(d, n]`). Each mapping dies once, when the last member of R in its interval goes, so
//! deleted snapshots are reclaimed one at a time, each against the R of its moment.
//!
//! A dead mapping takes one off its image's count (`refs.rs`); an image whose count reaches
//! zero is freed with its dedup entry, and takes one off each TOAST value it names.
//!
//! Crash safety: a job's dead mappings are a function of (d, p, n) and the log, which only
//! grows, so the job is computed again after a restart and resumes at the number of dead
//! mappings done. That number, the counts it changed and the content it freed are written
//! in the same batch, and the last batch marks d *reclaimed* and removes the progress
//! record: a crash keeps a prefix of the batches, never half a step.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::codec::{Dec, Enc};
use crate::error::{Result, StoreError};
use crate::estimates::Forget;
use crate::ids::{ImageId, PageKey, SnapId, ToastId};
use crate::keys::{self, Cf};
use crate::records::{self, SnapshotState, RECORD_VERSION};
use crate::refs::{Freed, ESTIMATE_BATCH};
use crate::store::{SnapSummary, SnapshotStore};

/// The reclamation of one deleted snapshot.
#[derive(Debug, Clone)]
pub struct ReclaimJob {
    /// The deleted snapshot.
    pub snap: SnapId,
    /// The greatest retained snapshot below it, if any.
    pub prev: Option<SnapId>,
    /// The least retained snapshot above it.
    pub next: SnapId,
    /// Its dead mappings, by page.
    dead: Vec<(PageKey, ImageId)>,
    /// How many of them are done.
    pub done: usize,
    /// What it freed so far.
    pub freed: Freed,
    /// Per rank, the lowest and highest image freed (in this run of the job): the key ranges
    /// worth compacting afterwards.
    freed_ranges: BTreeMap<u8, (ImageId, ImageId)>,
    /// A step (in this run of the job) left content it decremented named by other live
    /// mappings or images.
    still_named: bool,
}

impl ReclaimJob {
    /// How many dead mappings the job has in all.
    pub fn total(&self) -> usize {
        self.dead.len()
    }

    /// True if a step of this run of the job left content it decremented still named by
    /// other mappings or images: then any snapshot's estimate of what deleting it would free
    /// may have changed; otherwise only those of the job's snapshot and its neighbours did.
    pub fn changed_shared_content(&self) -> bool {
        self.still_named
    }

    /// Per rank, the range of image ids this job freed (lowest, highest).
    pub fn freed_ranges(&self) -> Vec<(ImageId, ImageId)> {
        self.freed_ranges.values().copied().collect()
    }

    fn note_freed(&mut self, id: ImageId) {
        let r = keys::image_rank(id).0;
        let e = self.freed_ranges.entry(r).or_insert((id, id));
        e.0 = e.0.min(id);
        e.1 = e.1.max(id);
    }
}

/// The durable progress of the job in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    snap: SnapId,
    prev: Option<SnapId>,
    next: SnapId,
    done: u64,
    freed: Freed,
}

fn encode_progress(p: &Progress) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .u64(p.snap.0)
        .u64(p.prev.map_or(0, |s| s.0))
        .u64(p.next.0)
        .u64(p.done)
        .u64(p.freed.images)
        .u64(p.freed.toast_values)
        .u64(p.freed.bytes)
        .finish()
}

fn decode_progress(v: &[u8]) -> Result<Progress> {
    let mut d = Dec::new(v, "reclamation progress");
    d.version(RECORD_VERSION)?;
    let p = Progress {
        snap: SnapId(d.u64()?),
        prev: Some(SnapId(d.u64()?)).filter(|s| s.0 != 0),
        next: SnapId(d.u64()?),
        done: d.u64()?,
        freed: Freed {
            images: d.u64()?,
            toast_values: d.u64()?,
            bytes: d.u64()?,
        },
    };
    d.end()?;
    Ok(p)
}

/// [`SnapshotStore::neighbours`] of `d` in R (`r`, in order) whose log's newest snapshot is
/// `newest`: for callers that look up many snapshots against one R.
pub(crate) fn neighbours_in(
    r: &[SnapId],
    newest: Option<SnapId>,
    d: SnapId,
) -> Option<(Option<SnapId>, SnapId)> {
    if Some(d) == newest {
        return None;
    }
    let i = r.binary_search(&d).ok()?;
    let prev = i.checked_sub(1).map(|j| r[j]);
    let next = *r.get(i + 1)?;
    Some((prev, next))
}

/// An image kept with count zero for the capture in progress (`keys::TAG_KEPT_IMAGE`).
fn zero_key(id: ImageId) -> [u8; 9] {
    keys::tagged_u64(keys::TAG_KEPT_IMAGE, id.0)
}

impl<B: KvBackend> SnapshotStore<B> {
    /// The neighbours in R of snapshot `d`, which a deletion of `d` would be reclaimed
    /// against: the greatest member below it (if any) and the least above it. None if `d` is
    /// not in R, is the newest snapshot of the log, or has no member of R above it.
    pub(crate) fn neighbours(&self, d: SnapId) -> Option<(Option<SnapId>, SnapId)> {
        let (r, newest) = self.unreclaimed();
        neighbours_in(&r, newest, d)
    }

    /// R (see the module comment): the snapshots of the log not reclaimed yet, in order,
    /// and the newest snapshot of the log.
    pub(crate) fn unreclaimed(&self) -> (Vec<SnapId>, Option<SnapId>) {
        let cat = self.catalog();
        let r: Vec<SnapId> = cat
            .snaps
            .iter()
            .filter(|(_, s)| matches!(s.state, SnapshotState::Committed | SnapshotState::Deleted))
            .map(|(id, _)| *id)
            .collect();
        let newest = cat
            .snaps
            .iter()
            .rev()
            .find(|(_, s)| s.state.in_log())
            .map(|(id, _)| *id);
        (r, newest)
    }

    /// The snapshots of the log not reclaimed yet (committed and deleted), oldest first.
    pub fn unreclaimed_snapshots(&self) -> Vec<SnapId> {
        self.unreclaimed().0
    }

    /// The deleted snapshots whose space is not reclaimed yet, oldest first.
    pub fn deleted_unreclaimed(&self) -> Vec<SnapId> {
        self.catalog()
            .snaps
            .iter()
            .filter(|(_, s)| s.state == SnapshotState::Deleted)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The reclamation to do next: the one a crash interrupted, or else that of the oldest
    /// deleted snapshot for which `eligible` holds (the newest snapshot of the log is never
    /// reclaimed: the next capture builds on it). None: nothing to do now.
    pub fn reclaim_next(&self, eligible: &dyn Fn(SnapId) -> bool) -> Result<Option<ReclaimJob>> {
        if let Some(v) = self.backend.get(Cf::Catalog, keys::GC_PROGRESS_KEY)? {
            let p = decode_progress(&v)?;
            let mut job = self.job(p.snap, p.prev, p.next)?;
            job.done = usize::try_from(p.done)
                .unwrap_or(usize::MAX)
                .min(job.dead.len());
            job.freed = p.freed;
            return Ok(Some(job));
        }
        let (r, newest) = self.unreclaimed();
        for d in self.deleted_unreclaimed() {
            if Some(d) == newest || !eligible(d) {
                continue;
            }
            // (Deleted and not the newest: in R, so only a missing newer member fails.)
            let (prev, next) = neighbours_in(&r, newest, d).ok_or_else(|| {
                StoreError::corrupt("a deleted snapshot is newer than the newest snapshot")
            })?;
            return Ok(Some(self.job(d, prev, next)?));
        }
        Ok(None)
    }

    /// The dead mappings of deleted snapshot `d` between retained `prev` and `next`.
    fn job(&self, d: SnapId, prev: Option<SnapId>, next: SnapId) -> Result<ReclaimJob> {
        let from = SnapId(prev.map_or(1, |p| p.0 + 1));
        // The mappings visible at d and made after prev: the last of each page in (prev, d].
        let mut visible: BTreeMap<PageKey, ImageId> = BTreeMap::new();
        for m in self.mapping_log(from, d)? {
            visible.insert(m.page, m.image);
        }
        // Those replaced by next die with d.
        let replaced: HashSet<PageKey> = self
            .mapping_log(SnapId(d.0 + 1), next)?
            .into_iter()
            .map(|m| m.page)
            .filter(|p| visible.contains_key(p))
            .collect();
        let dead = visible
            .into_iter()
            .filter(|(page, _)| replaced.contains(page))
            .collect();
        Ok(ReclaimJob {
            snap: d,
            prev,
            next,
            dead,
            done: 0,
            freed: Freed::default(),
            freed_ranges: BTreeMap::new(),
            still_named: false,
        })
    }

    /// Does up to `budget` of `job`'s dead mappings in one batch: their images' counts go
    /// down, content reaching zero is freed, except images `keep` names (the capture in
    /// progress maps them: kept with count zero, freed later by [`Self::release_kept`]).
    /// Returns true when the job is complete: the snapshot is then *reclaimed*.
    pub fn reclaim_step(
        &self,
        job: &mut ReclaimJob,
        budget: usize,
        keep: &dyn Fn(ImageId) -> bool,
    ) -> Result<bool> {
        let end = job.done.saturating_add(budget.max(1)).min(job.dead.len());
        let mut decrements: HashMap<ImageId, u64> = HashMap::new();
        for &(_, image) in &job.dead[job.done..end] {
            *decrements.entry(image).or_default() += 1;
        }
        let items: Vec<(ImageId, [u8; 9])> = decrements
            .keys()
            .map(|&id| (id, keys::image_refs_key(id)))
            .collect();
        let mut batch = WriteBatch::new();
        let mut freed = Freed::default();
        let mut freed_ids = Vec::new();
        let mut toast_decrements = HashMap::new();
        let mut still_named = false;
        for (id, key, count) in self.counts(&items)? {
            let left = count.saturating_sub(decrements[&id]);
            if left > 0 {
                still_named = true;
                batch.put(Cf::Refs, &key, &left.to_be_bytes());
            } else if keep(id) {
                batch.put(Cf::Refs, &key, &0u64.to_be_bytes());
                batch.put(Cf::Catalog, &zero_key(id), &[]);
            } else {
                let f = self.free_image(id, &mut batch, &mut toast_decrements)?;
                if f.images > 0 {
                    freed_ids.push(id);
                }
                freed.add(f);
            }
        }
        let toasts = self.release_toasts(toast_decrements, &mut batch)?;
        freed.add(toasts.freed);
        still_named |= toasts.still_named;
        // Content still named by other live mappings after this step may count in any
        // snapshot's estimate: every kept estimate goes. Otherwise the content it released was
        // named only by the job's dead mappings, which no other snapshot's estimate reads: only
        // the estimates of the snapshot and of its neighbours (whose dead mappings grow once it
        // is reclaimed) go (`estimates.rs`).
        let neighbours = [Some(job.snap), job.prev, Some(job.next)];
        let forget = if still_named {
            Forget::All
        } else {
            Forget::Of(&neighbours)
        };
        // The job changes only once the batch is written: a step whose write failed is done
        // again in full by a retry.
        let mut total = job.freed;
        total.add(freed);
        let complete = end == job.dead.len();
        if complete {
            let mut info = self.snapshot(job.snap)?;
            info.state = SnapshotState::Reclaimed;
            batch.put(
                Cf::Catalog,
                &keys::snapshot_key(job.snap),
                &records::encode_snapshot(&info),
            );
            batch.delete(Cf::Catalog, keys::GC_PROGRESS_KEY);
            self.write_forgetting_estimates(&mut batch, true, forget)?;
            self.catalog_mut().snaps.insert(
                job.snap,
                SnapSummary {
                    state: SnapshotState::Reclaimed,
                    declared_at_us: info.decl.declared_at_us,
                },
            );
        } else {
            let p = Progress {
                snap: job.snap,
                prev: job.prev,
                next: job.next,
                done: end as u64,
                freed: total,
            };
            batch.put(Cf::Catalog, keys::GC_PROGRESS_KEY, &encode_progress(&p));
            self.write_forgetting_estimates(&mut batch, false, forget)?;
        }
        job.done = end;
        job.freed = total;
        job.still_named |= still_named;
        for id in freed_ids {
            job.note_freed(id);
        }
        Ok(complete)
    }

    /// What reclaiming snapshot `d` would free if it were deleted now (or, deleted, if it
    /// were reclaimed next), the other snapshots staying as they are: the images only its
    /// dead mappings name and the TOAST values only those images name. Exact against the
    /// store as it is; reclaiming several snapshots frees at least the sum (content shared
    /// only among them goes too). None for the newest snapshot of the log (never reclaimed
    /// while it is the newest) and for snapshots that are not in it (failed, reclaimed,
    /// capturing). Reads the log from d's retained neighbours; writes nothing.
    pub fn would_free(&self, d: SnapId) -> Result<Option<Freed>> {
        self.would_free_unless(d, &|| false)
    }

    /// [`Self::would_free`], given up (None) as soon as `stop` says so. It is asked after
    /// each read of the log and before each batch of counts and images, so that a thread
    /// computing estimates leaves the cores to a capture within milliseconds of its
    /// declaration instead of finishing a snapshot's estimate (up to a second for a large
    /// one). A caller whose `stop` said so has no estimate, whatever this returned.
    pub fn would_free_unless(&self, d: SnapId, stop: &dyn Fn() -> bool) -> Result<Option<Freed>> {
        let Some((prev, next)) = self.neighbours(d) else {
            return Ok(None);
        };
        let job = self.job(d, prev, next)?;
        if stop() {
            return Ok(None);
        }
        let mut named: HashMap<ImageId, u64> = HashMap::new();
        for (_, image) in &job.dead {
            *named.entry(*image).or_default() += 1;
        }
        let items: Vec<(ImageId, [u8; 9])> = named
            .keys()
            .map(|&i| (i, keys::image_refs_key(i)))
            .collect();
        let mut dying: Vec<ImageId> = Vec::new();
        for part in items.chunks(ESTIMATE_BATCH) {
            if stop() {
                return Ok(None);
            }
            dying.extend(
                self.counts(part)?
                    .into_iter()
                    .filter(|&(image, _, count)| count <= named[&image])
                    .map(|(image, _, _)| image),
            );
        }
        let mut toast_decrements = HashMap::new();
        let Some(mut freed) = self.would_free_images(&dying, &mut toast_decrements, stop)? else {
            return Ok(None);
        };
        // The TOAST values' removals go into a batch that is never written: the same code as
        // a real step, with no capture open (one keeps the values it may reuse until it ends).
        let mut scratch = WriteBatch::new();
        freed.add(
            self.release_toasts_keeping(toast_decrements, &mut scratch, false)?
                .freed,
        );
        Ok(Some(freed))
    }

    /// Frees the images kept with count zero for a capture (see [`Self::reclaim_step`]) whose
    /// count is still zero and that `keep` no longer names, and the TOAST values kept with
    /// count zero while a capture was open (`refs.rs`) whose count is still zero. Does
    /// nothing while a capture is open. Returns what was freed.
    pub fn release_kept(&self, keep: &dyn Fn(ImageId) -> bool) -> Result<Freed> {
        if self.catalog().active.is_some() {
            return Ok(Freed::default());
        }
        let mut batch = WriteBatch::new();
        let mut freed = Freed::default();
        let mut toast_decrements = HashMap::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_KEPT_IMAGE])? {
            let (k, _) = entry?;
            let id = ImageId(keys::decode_tagged_u64(&k, keys::TAG_KEPT_IMAGE)?);
            if keep(id) {
                continue;
            }
            if self.image_refs(id)?.unwrap_or(0) == 0 {
                freed.add(self.free_image(id, &mut batch, &mut toast_decrements)?);
            }
            batch.delete(Cf::Catalog, &k);
        }
        for entry in Scan::prefix(&self.backend, Cf::Catalog, &[keys::TAG_KEPT_TOAST])? {
            let (k, _) = entry?;
            let id = ToastId(keys::decode_tagged_u64(&k, keys::TAG_KEPT_TOAST)?);
            // Not named by a decrement of this batch: those are counted just below.
            if self.toast_refs(id)?.unwrap_or(0) == 0 && !toast_decrements.contains_key(&id) {
                freed.add(self.free_toast(id, &mut batch)?);
            }
            batch.delete(Cf::Catalog, &k);
        }
        freed.add(self.release_toasts(toast_decrements, &mut batch)?.freed);
        if freed != Freed::default() {
            // The TOAST values freed images named lost a reference.
            self.write_forgetting_estimates(&mut batch, true, Forget::All)?;
        } else if !batch.is_empty() {
            self.backend.write(&batch, true)?;
        }
        Ok(freed)
    }
}
