//! Estimates of what deleting each snapshot would free ([`SnapshotStore::would_free`]), kept
//! in the catalog (`'E'` · snapshot) so that a worker that restarts shows them at once instead
//! of reading every snapshot's dead mappings and their counts again: on a store of a few
//! hundred snapshots that took a core for tens of seconds, while pgbench ran a fifth slower
//! (bench/snapshots/README.md, 2026-11-29).
//!
//! Invariant: an estimate read back ([`SnapshotStore::kept_estimates`]) is what `would_free`
//! would return now. An estimate depends on the reference counts of content its snapshot
//! maps and on the snapshot's neighbours in R (`reclaim.rs`). So:
//! - every batch that changes counts of content an estimate may read deletes the kept
//!   estimates it may change, in the same batch
//!   ([`SnapshotStore::write_forgetting_estimates`]): all of them for the release of kept
//!   content, a repair, a commit that references content stored before it (a commit that does
//!   not only adds counts of its own new content, which no other snapshot maps), and a
//!   reclamation step that leaves content it decremented named by other mappings or images;
//!   a step that does not touches only content named by its job's dead mappings alone, and
//!   deletes the estimates of the job's snapshot and of its two neighbours (whose dead
//!   mappings grow once it is reclaimed);
//! - an estimate is kept only if no such batch was written since it was computed (the
//!   caller passes the [`SnapshotStore::estimates_epoch`] it read before computing it);
//! - the neighbours it was computed against are kept with it, and an estimate whose
//!   snapshot has other neighbours now is not read back.

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::codec::{Dec, Enc};
use crate::error::Result;
use crate::ids::SnapId;
use crate::keys::{self, Cf};
use crate::reclaim::neighbours_in;
use crate::records::RECORD_VERSION;
use crate::refs::Freed;
use crate::store::SnapshotStore;

/// The kept estimates' key range in the catalog.
const RANGE: (&[u8], &[u8]) = (&[keys::TAG_ESTIMATE], &[keys::TAG_ESTIMATE + 1]);

impl<B: KvBackend> SnapshotStore<B> {
    /// How many batches that forget the kept estimates were written since the store was
    /// opened. Read it before computing estimates, and pass it to
    /// [`Self::keep_estimates`].
    pub fn estimates_epoch(&self) -> u64 {
        *self
            .estimates_epoch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the estimates `found` (snapshot, what deleting it would free), computed after
    /// [`Self::estimates_epoch`] returned `epoch`, if no batch forgot the kept estimates
    /// since (returns whether they were kept). Unsynced: a crash loses at most estimates,
    /// which are computed again.
    pub fn keep_estimates(&self, epoch: u64, found: &[(SnapId, Freed)]) -> Result<bool> {
        let current = self
            .estimates_epoch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *current != epoch {
            return Ok(false);
        }
        let (r, newest) = self.unreclaimed();
        let mut batch = WriteBatch::new();
        for &(snap, freed) in found {
            if let Some((prev, next)) = neighbours_in(&r, newest, snap) {
                let value = encode_estimate(prev, next, freed);
                batch.put(Cf::Catalog, &keys::estimate_key(snap), &value);
            }
        }
        if !batch.is_empty() {
            self.backend.write(&batch, false)?;
        }
        Ok(true)
    }

    /// The kept estimates that still hold: those of snapshots whose neighbours in R are the
    /// ones the estimate was computed against.
    pub fn kept_estimates(&self) -> Result<Vec<(SnapId, Freed)>> {
        let (r, newest) = self.unreclaimed();
        let mut out = Vec::new();
        for entry in Scan::prefix(&self.backend, Cf::Catalog, RANGE.0)? {
            let (k, v) = entry?;
            let snap = SnapId(keys::decode_tagged_u64(&k, keys::TAG_ESTIMATE)?);
            let (prev, next, freed) = decode_estimate(&v)?;
            if neighbours_in(&r, newest, snap) == Some((prev, next)) {
                out.push((snap, freed));
            }
        }
        Ok(out)
    }

    /// Writes `batch`, which changes counts an estimate may read, with the deletion of the
    /// kept estimates it may change. The epoch moves on whether the write succeeds or not, so
    /// no estimate computed before it is kept after it.
    pub(crate) fn write_forgetting_estimates(
        &self,
        batch: &mut WriteBatch,
        sync: bool,
        forget: Forget<'_>,
    ) -> Result<()> {
        let mut epoch = self
            .estimates_epoch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *epoch += 1;
        match forget {
            Forget::All => batch.delete_range(Cf::Catalog, RANGE.0, RANGE.1),
            Forget::Of(snaps) => {
                for snap in snaps.iter().flatten() {
                    batch.delete(Cf::Catalog, &keys::estimate_key(*snap));
                }
            }
        }
        self.backend.write(batch, sync)
    }
}

/// Which kept estimates a batch changes.
pub(crate) enum Forget<'a> {
    /// Any of them.
    All,
    /// Only those of these snapshots.
    Of(&'a [Option<SnapId>]),
}

fn encode_estimate(prev: Option<SnapId>, next: SnapId, freed: Freed) -> Vec<u8> {
    Enc::with_version(RECORD_VERSION)
        .u64(prev.map_or(0, |s| s.0))
        .u64(next.0)
        .u64(freed.images)
        .u64(freed.toast_values)
        .u64(freed.bytes)
        .finish()
}

fn decode_estimate(v: &[u8]) -> Result<(Option<SnapId>, SnapId, Freed)> {
    let mut d = Dec::new(v, "kept estimate");
    d.version(RECORD_VERSION)?;
    let prev = Some(SnapId(d.u64()?)).filter(|s| s.0 != 0);
    let next = SnapId(d.u64()?);
    let freed = Freed {
        images: d.u64()?,
        toast_values: d.u64()?,
        bytes: d.u64()?,
    };
    d.end()?;
    Ok((prev, next, freed))
}
