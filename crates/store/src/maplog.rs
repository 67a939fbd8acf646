//! The mapping log: every mapping (page, snapshot) -> image, stored once, in snapshot order,
//! with Skippy levels over it (docs/design.md, The index; `gsnap_core::skippy`).
//!
//! The `maplog` column family holds the log as `gsnap_core` Skippy nodes keyed by (level,
//! node number). Level 0 *is* the mapping log (the only copy of the mappings: there is no
//! other mapping record in the store); each level above holds, per sealed node below, the
//! newest mapping of each page in it, so that building a page table skips the repeated
//! mappings of hot pages. Everything the index needs comes from here: a snapshot's mappings
//! ([`SnapshotStore::mapping_log`]), a page table, i.e. which image every page has at a
//! snapshot ([`SnapshotStore::page_table`]), and a whole index group
//! ([`SnapshotStore::build_group`]).
//!
//! Invariants:
//! - only a snapshot's commit writes the log: the capture keeps its mappings in memory and the
//!   commit batch carries the log nodes they change (new nodes, and the rewritten last node of
//!   each level) with the committed snapshot record. The batch is atomic, so the log holds
//!   exactly the mappings of the snapshots committed so far (later deleted ones included:
//!   later page tables are built on them), a crash never leaves a part of a snapshot in it,
//!   and an aborted or interrupted capture has nothing to remove from it;
//! - snapshots enter the log in id order (captures commit one at a time, oldest first), each
//!   snapshot's mappings sorted by page, one per page;
//! - every operation opens the log as stored (a few reads: the last node of each level) and
//!   keeps nothing of it in memory afterwards, so a commit whose write failed leaves no state
//!   a later commit could build on;
//! - a position in a level never changes once written and a node only grows until it is
//!   full, so a reader running while a commit writes sees a consistent prefix of the log.
//!
//! Why one copy: format version 1 also kept every mapping in a `page_versions` column family
//! (page order, for seeks nobody made) and in a mapping log written during the capture, and
//! appended Skippy level 0 after the commit in a batch of its own, to be caught up after a
//! crash. Writing the Skippy log in the commit batch makes it the truth by itself;
//! `docs/format.md` ("One copy of each mapping") has the trade-offs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gsnap_core::skippy::{LogNode, LogStore, SkippyLog, StopWhen};
use gsnap_core::{GroupBuilder, IndexError, Mapping};

use crate::backend::{KvBackend, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, PageKey, SnapId};
use crate::keys::{self, Cf};
use crate::records::{self, StoreIdentity, FORMAT_VERSION};
use crate::store::SnapshotStore;

/// The id of the next mapping log rewrite, unique in the process (so that a rewrite begun on
/// a store opened before is stale on one opened again).
static NEXT_REWRITE: AtomicU64 = AtomicU64::new(1);

impl<B: KvBackend> SnapshotStore<B> {
    /// The mappings of snapshots `first..=last` in log order: by snapshot, then by page. Only
    /// committed snapshots have mappings in the log; deleted ones keep theirs.
    pub fn mapping_log(&self, first: SnapId, last: SnapId) -> Result<Vec<Mapping>> {
        if first > last {
            return Ok(Vec::new());
        }
        let after = first.0.checked_sub(1).map(SnapId);
        self.with_log(|log| log.mappings_between(after, last))
    }

    /// The page table of committed snapshot `snap`: for every page with a mapping at or
    /// before `snap`, the image of its latest one, sorted by page. Pages of relations `snap`
    /// does not declare (dropped tables) and blocks beyond a relation's size at `snap` (it
    /// shrank) are included: the caller filters with the declaration.
    pub fn page_table(&self, snap: SnapId) -> Result<Vec<(PageKey, ImageId)>> {
        self.check_readable(snap)?;
        self.with_log(|log| {
            log.build_page_table(snap, StopWhen::LogStart)
                .map(|(table, _)| table)
        })
    }

    /// Rebuilds from the log the index group of `snaps` (ascending; committed or deleted
    /// snapshots): a complete tree for the first, then one partial tree per snapshot
    /// (mappings of snapshots not listed fold into the next listed one).
    pub fn build_group(&self, snaps: &[SnapId]) -> Result<GroupBuilder> {
        self.with_log(|log| log.build_group(snaps, StopWhen::LogStart))
    }

    /// Appends snapshot `snap`'s mappings (sorted by page, one per page) to the log: the
    /// nodes this creates or changes are put into `batch`, the snapshot's commit batch.
    pub(crate) fn append_to_log(
        &self,
        snap: SnapId,
        mappings: &[Mapping],
        batch: &mut WriteBatch,
    ) -> Result<()> {
        self.with_log(|log| {
            log.append_snapshot(snap, mappings)?;
            let nodes = log.store();
            for node in &nodes.staged {
                nodes.put(batch, node);
            }
            Ok(())
        })
    }

    /// How many mappings the log holds (level 0), live and dead.
    pub fn log_mappings(&self) -> Result<u64> {
        self.with_log(|log| Ok(log.level_len(0)))
    }

    /// The log rewritten without its dead mappings (see [`LogRewrite`]) into the other key
    /// generation, computed from the log and the catalog as they are now; None while a
    /// reclamation is in flight (its progress counts positions in its own list, which the
    /// log's dead mappings do not enter, but there is no need to find out). Streams: the
    /// sealed nodes of the new log are written as they fill, in unsynced batches of about
    /// `batch_bytes` that no reader sees (the log stays in its generation until the switch),
    /// so memory holds one window's pages, a batch and the last node of each level, whatever
    /// the log's size. The caller switches to it with [`SnapshotStore::apply_log_rewrite`]
    /// (this may run on another thread; snapshots may commit meanwhile). One rewrite at a
    /// time: beginning one makes those begun before it stale (their switch is refused).
    pub fn rewrite_log(&self, batch_bytes: usize) -> Result<Option<LogRewrite>> {
        if self.reclaiming()? {
            return Ok(None);
        }
        let (r, _) = self.unreclaimed();
        self.rewrite_log_for(&r, batch_bytes)
    }

    /// [`Self::rewrite_log`] with `r`, the snapshots not reclaimed as read from the catalog,
    /// oldest first (snapshots may have committed since).
    fn rewrite_log_for(&self, r: &[SnapId], batch_bytes: usize) -> Result<Option<LogRewrite>> {
        let id = NEXT_REWRITE.fetch_add(1, Ordering::Relaxed);
        self.log_rewrite.store(id, Ordering::Relaxed);
        let reclaimed = self.reclaimed_count();
        let from = self.log_generation()?;
        let to = 1 - from;
        self.clear_log_generation(to)?;
        let config = self.identity.mapping_log;
        self.with_log(|log| {
            let before = log.level_len(0);
            let last = log.last_snap();
            let spill = Spill::new(config.node_size, batch_bytes);
            let nodes = LogNodes::new(
                &self.backend,
                to,
                Vec::new(),
                Some(spill),
                log.store().error,
            );
            let mut new = SkippyLog::open(nodes, config)?;
            // The window's last mapping of each page (memory: the pages, not the snapshots).
            let mut window: HashMap<PageKey, Mapping> = HashMap::new();
            let mut window_end: Option<SnapId> = None;
            let mut next_r = 0;
            let count = log.store().node_count(0)?;
            'scan: for number in 0..count {
                let Some(node) = log.store().read_node(0, number)? else {
                    return Err(IndexError::Storage(format!(
                        "mapping log node {number} is missing"
                    )));
                };
                for m in &node.entries {
                    // Snapshots committed since the log was opened: for the switch to add.
                    if last.is_none_or(|l| m.snap > l) {
                        break 'scan;
                    }
                    while r.get(next_r).is_some_and(|&s| s < m.snap) {
                        next_r += 1;
                    }
                    // The mapping's window: the snapshots after the member of R before it,
                    // up to the first member of R at or after it. A snapshot newer than every
                    // member of R read above committed since: it is not reclaimed, so a
                    // member of R too (each is a window of its own).
                    let end = r.get(next_r).copied().unwrap_or(m.snap);
                    if window_end != Some(end) {
                        append_live(&mut new, &mut window)?;
                        window_end = Some(end);
                    }
                    window.insert(m.page, *m);
                }
            }
            append_live(&mut new, &mut window)?;
            let after = new.level_len(0);
            let mut nodes = new.into_store();
            nodes.flush()?;
            Ok(Some(LogRewrite {
                id,
                reclaimed,
                from,
                to,
                last,
                before,
                after,
                tails: nodes.staged,
            }))
        })
    }

    /// Switches the log to `rewrite`'s generation if it is the rewrite begun last on this
    /// store, the log is still in the generation it was computed from and no reclamation is
    /// in flight, after appending to the new log the
    /// mappings of the snapshots committed since it was computed (they are all live: newer
    /// than every window). One batch puts the new log's last nodes and the generation record
    /// and deletes the old generation, so a crash keeps the old log or the new one, never a
    /// mix. Returns the mappings the log now holds, or None if it was not switched (the
    /// rewrite's nodes are then removed).
    pub fn apply_log_rewrite(&self, rewrite: &LogRewrite) -> Result<Option<u64>> {
        if self.log_rewrite.load(Ordering::Relaxed) != rewrite.id
            || self.log_generation()? != rewrite.from
        {
            // Stale: a later rewrite writes `to`, or it switched (`to` is the live log).
            return Ok(None);
        }
        let newer = self.with_log(|log| {
            if log.level_len(0) < rewrite.before || log.last_snap() < rewrite.last {
                return Err(IndexError::Storage(
                    "the mapping log shrank while it was being rewritten".into(),
                ));
            }
            log.mappings_between(rewrite.last, SnapId(u64::MAX))
        })?;
        if self.reclaiming()? {
            self.clear_log_generation(rewrite.to)?;
            return Ok(None);
        }
        let (mut batch, after) = self.with_log_in(rewrite.to, rewrite.tails.clone(), |log| {
            let groups: Vec<(SnapId, &[Mapping])> = newer
                .chunk_by(|a, b| a.snap == b.snap)
                .map(|g| (g[0].snap, g))
                .collect();
            log.append_snapshots(&groups)?;
            let after = log.level_len(0);
            let nodes = log.store();
            let mut batch = WriteBatch::new();
            for node in &nodes.staged {
                nodes.put(&mut batch, node);
            }
            Ok((batch, after))
        })?;
        let mut record = vec![rewrite.to];
        record.extend_from_slice(&rewrite.reclaimed.to_be_bytes());
        batch.put(Cf::Catalog, keys::LOG_GENERATION_KEY, &record);
        let (start, end) = keys::log_generation_range(rewrite.from);
        batch.delete_range(Cf::MapLog, &start, &end);
        // A store of format 3 becomes the current format here: builds older than format 4
        // cannot read generation 1.
        let identity = StoreIdentity {
            format_version: FORMAT_VERSION,
            ..self.identity
        };
        batch.put(
            Cf::Meta,
            keys::FORMAT_KEY,
            &records::encode_format(&identity),
        );
        self.backend.write(&batch, false)?;
        Ok(Some(after))
    }

    /// Asks the backend to rewrite the files that held the log's `generation` before a
    /// rewrite switched away from it ([`LogRewrite::retired_generation`]), so that its space
    /// returns to the file system now (on a thread: the worker's compaction thread). Refused
    /// for the generation that holds the log.
    pub fn compact_retired_log(&self, generation: u8) -> Result<()> {
        if generation == self.log_generation()? {
            return Err(StoreError::invalid(
                "the mapping log's current generation is not retired",
            ));
        }
        let (start, end) = keys::log_generation_range(generation);
        self.backend.compact_range(Cf::MapLog, &start, &end)
    }

    /// Removes every node of `generation` (what a rewrite that was not switched, or a crash
    /// during one, left), and compacts their files.
    fn clear_log_generation(&self, generation: u8) -> Result<()> {
        let (start, end) = keys::log_generation_range(generation);
        if self
            .backend
            .last_in_range(Cf::MapLog, &start, &end)?
            .is_none()
        {
            return Ok(());
        }
        let mut batch = WriteBatch::new();
        batch.delete_range(Cf::MapLog, &start, &end);
        self.backend.write(&batch, false)?;
        self.backend.compact_range(Cf::MapLog, &start, &end)
    }

    /// The generation of the `maplog` keys that hold the log (`keys::LOG_GENERATION_KEY`).
    fn log_generation(&self) -> Result<u8> {
        Ok(self.log_generation_record()?.0)
    }

    /// The generation record: the generation, and how many snapshots were reclaimed when
    /// the log was last rewritten (None: never rewritten, or by a build that did not record
    /// the count, whose one-byte record is read as it is).
    fn log_generation_record(&self) -> Result<(u8, Option<u64>)> {
        match self
            .backend
            .get(Cf::Catalog, keys::LOG_GENERATION_KEY)?
            .as_deref()
        {
            None => Ok((0, None)),
            // Written by builds before the count was kept: the log may hold dead mappings.
            Some(&[g]) if g < 2 => Ok((g, None)),
            Some(&[g, ref count @ ..]) if g < 2 && count.len() == 8 => Ok((
                g,
                Some(u64::from_be_bytes(count.try_into().expect("8 bytes"))),
            )),
            Some(other) => Err(StoreError::corrupt(format!(
                "{}: the mapping log's generation record is damaged ({other:?})",
                self.backend.describe()
            ))),
        }
    }

    /// How many snapshots of the catalog are reclaimed.
    fn reclaimed_count(&self) -> u64 {
        self.catalog()
            .snaps
            .values()
            .filter(|s| s.state == crate::SnapshotState::Reclaimed)
            .count() as u64
    }

    /// True if the log may hold mappings no retained snapshot needs that no rewrite dropped:
    /// a snapshot was reclaimed since the last rewrite computed the log (or, never
    /// rewritten, any was). The worker rewrites the log at start only then.
    pub fn log_rewrite_due(&self) -> Result<bool> {
        let reclaimed = self.reclaimed_count();
        Ok(match self.log_generation_record()?.1 {
            Some(at_rewrite) => reclaimed != at_rewrite,
            None => reclaimed > 0,
        })
    }

    /// True while a reclamation is in flight (its progress record is stored).
    fn reclaiming(&self) -> Result<bool> {
        Ok(self
            .backend
            .get(Cf::Catalog, keys::GC_PROGRESS_KEY)?
            .is_some())
    }

    /// Runs `f` over the log as stored now. An error of the store under the log is returned
    /// as it was; anything else the log reports is damage.
    fn with_log<T>(
        &self,
        f: impl FnOnce(&mut SkippyLog<LogNodes<'_, B>>) -> Result<T, IndexError>,
    ) -> Result<T> {
        let generation = self.log_generation()?;
        self.with_log_in(generation, Vec::new(), f)
    }

    /// Runs `f` over the log of `generation` with the nodes `staged` (newer than the stored
    /// ones).
    fn with_log_in<T>(
        &self,
        generation: u8,
        staged: Vec<LogNode>,
        f: impl FnOnce(&mut SkippyLog<LogNodes<'_, B>>) -> Result<T, IndexError>,
    ) -> Result<T> {
        let error = RefCell::new(None);
        let nodes = LogNodes::new(&self.backend, generation, staged, None, &error);
        let result =
            SkippyLog::open(nodes, self.identity.mapping_log).and_then(|mut log| f(&mut log));
        result.map_err(|e| match error.take() {
            Some(stored) => stored,
            None => StoreError::corrupt(format!(
                "{}: the mapping log is damaged: {e}",
                self.backend.describe()
            )),
        })
    }
}

/// The log's nodes of one key generation in the `maplog` column family, as `gsnap_core`'s
/// Skippy log reads and writes them. Writes are only collected (`staged`), for the caller to
/// put into its batch; with a [`Spill`], sealed nodes (full: they never change again) go
/// into its batch instead, written whenever it is big enough (a log rewrite).
pub(crate) struct LogNodes<'s, B: KvBackend> {
    backend: &'s B,
    generation: u8,
    /// Nodes written, newest version last (with a spill: only the last node of each level).
    staged: Vec<LogNode>,
    spill: Option<Spill>,
    /// The store error behind the last `IndexError::Storage` this returned.
    error: &'s RefCell<Option<StoreError>>,
}

/// Sealed nodes waiting to be written in one batch.
struct Spill {
    node_size: usize,
    batch_bytes: usize,
    batch: WriteBatch,
}

impl Spill {
    fn new(node_size: usize, batch_bytes: usize) -> Self {
        Spill {
            node_size,
            batch_bytes,
            batch: WriteBatch::new(),
        }
    }
}

impl<'s, B: KvBackend> LogNodes<'s, B> {
    fn new(
        backend: &'s B,
        generation: u8,
        staged: Vec<LogNode>,
        spill: Option<Spill>,
        error: &'s RefCell<Option<StoreError>>,
    ) -> Self {
        LogNodes {
            backend,
            generation,
            staged,
            spill,
            error,
        }
    }

    fn fail(&self, e: StoreError) -> IndexError {
        let message = e.message().to_string();
        *self.error.borrow_mut() = Some(e);
        IndexError::Storage(message)
    }

    /// Puts `node` into `batch`, under this generation's key.
    fn put(&self, batch: &mut WriteBatch, node: &LogNode) {
        batch.put(
            Cf::MapLog,
            &keys::log_node_key(self.generation, node.level, node.number),
            &node.encode(),
        );
    }

    /// Writes the spilled nodes not written yet (unsynced: nothing reads this generation
    /// before a later batch switches to it, which makes them durable with it).
    fn flush(&mut self) -> Result<(), IndexError> {
        let Some(spill) = self.spill.as_mut() else {
            return Ok(());
        };
        if spill.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut spill.batch);
        self.backend.write(&batch, false).map_err(|e| self.fail(e))
    }
}

impl<B: KvBackend> LogStore for LogNodes<'_, B> {
    fn node_count(&self, level: u8) -> Result<u64, IndexError> {
        let (start, end) = keys::log_level_range(self.generation, level);
        let stored = match self
            .backend
            .last_in_range(Cf::MapLog, &start, &end)
            .map_err(|e| self.fail(e))?
        {
            Some((k, _)) => {
                let (_, _, number) = keys::decode_log_node_key(&k).map_err(|e| self.fail(e))?;
                number + 1
            }
            None => 0,
        };
        let staged = self
            .staged
            .iter()
            .filter(|n| n.level == level)
            .map(|n| n.number + 1)
            .max()
            .unwrap_or(0);
        Ok(stored.max(staged))
    }

    fn read_node(&self, level: u8, number: u64) -> Result<Option<Arc<LogNode>>, IndexError> {
        if let Some(n) = self
            .staged
            .iter()
            .rev()
            .find(|n| n.level == level && n.number == number)
        {
            return Ok(Some(Arc::new(n.clone())));
        }
        let key = keys::log_node_key(self.generation, level, number);
        let Some(bytes) = self
            .backend
            .get(Cf::MapLog, &key)
            .map_err(|e| self.fail(e))?
        else {
            return Ok(None);
        };
        match LogNode::decode(&bytes) {
            Ok(node) => Ok(Some(Arc::new(node))),
            Err(e) => Err(self.fail(StoreError::corrupt(format!(
                "{}: mapping log node {number} of level {level} is damaged: {e}",
                self.backend.describe()
            )))),
        }
    }

    fn write_nodes(&mut self, nodes: &[LogNode]) -> Result<(), IndexError> {
        for n in nodes {
            self.staged
                .retain(|s| (s.level, s.number) != (n.level, n.number));
            match &mut self.spill {
                Some(spill) if n.entries.len() >= spill.node_size => {
                    let key = keys::log_node_key(self.generation, n.level, n.number);
                    spill.batch.put(Cf::MapLog, &key, &n.encode());
                }
                _ => self.staged.push(n.clone()),
            }
        }
        if self
            .spill
            .as_ref()
            .is_some_and(|s| s.batch.size_bytes() >= s.batch_bytes)
        {
            self.flush()?;
        }
        Ok(())
    }
}

/// The mapping log without its dead mappings, written into the other key generation and
/// ready to be switched to ([`SnapshotStore::rewrite_log`]).
///
/// Reclamation kills mappings (it frees their images) but leaves them in the log, which would
/// otherwise grow with every snapshot ever taken. A mapping of page P made at v is live while a
/// snapshot of R (the snapshots of the log not reclaimed, see `reclaim.rs`) lies between v and
/// P's next mapping. With the log cut into windows, each ending at a member of R and starting
/// after the one before, that is: the mapping is the last of P in its window. The rewrite keeps
/// exactly those, in log order, so every page table of a member of R, every group built from
/// the log and every later reclamation (whose dead mappings are all visible at a member of R)
/// read the same mappings as before.
pub struct LogRewrite {
    /// Which rewrite this is (`NEXT_REWRITE`).
    id: u64,
    /// How many snapshots were reclaimed when it was computed.
    reclaimed: u64,
    /// The generation read, and the one written.
    from: u8,
    to: u8,
    /// The newest snapshot of the log read.
    last: Option<SnapId>,
    /// Mappings before and after.
    pub before: u64,
    pub after: u64,
    /// The new log's nodes not written yet: the last of each level (not full).
    tails: Vec<LogNode>,
}

impl LogRewrite {
    /// The generation the switch to this rewrite leaves (to compact:
    /// [`SnapshotStore::compact_retired_log`]).
    pub fn retired_generation(&self) -> u8 {
        self.from
    }
}

/// Appends the live mappings of a window (the last of each page) to `log`, snapshot by
/// snapshot, and empties the window.
fn append_live<B: KvBackend>(
    log: &mut SkippyLog<LogNodes<'_, B>>,
    window: &mut HashMap<PageKey, Mapping>,
) -> Result<(), IndexError> {
    let mut live: Vec<Mapping> = window.drain().map(|(_, m)| m).collect();
    live.sort_by_key(|m| (m.snap, m.page));
    let groups: Vec<(SnapId, &[Mapping])> = live
        .chunk_by(|a, b| a.snap == b.snap)
        .map(|g| (g[0].snap, g))
        .collect();
    log.append_snapshots(&groups)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RelIncarnation, RelationSnapshot, SnapshotDecl, StoreOptions};
    use gsnap_core::skippy::SkippyConfig;
    use gsnap_core::{reference::ReferenceIndex, SnapshotIndex};

    /// Small nodes and three levels, so that a few snapshots seal nodes at every level.
    fn small_log_store() -> SnapshotStore<crate::MemBackend> {
        let options = StoreOptions {
            mapping_log: SkippyConfig {
                node_size: 4,
                height: 2,
            },
            ..StoreOptions::new(1)
        };
        SnapshotStore::open(crate::MemBackend::new(), options).unwrap()
    }

    /// One table of `nblocks` blocks in `store`, and a declaration of it.
    fn one_table(
        store: &SnapshotStore<crate::MemBackend>,
        nblocks: u32,
    ) -> (crate::RelId, SnapshotDecl) {
        let rel = store
            .allocate_rel(&RelIncarnation {
                pg_relid: 1,
                relfilenode: 1,
                name: "t".into(),
            })
            .unwrap();
        let row_type = store.put_row_type(b"rt").unwrap();
        let decl = SnapshotDecl {
            relations: vec![RelationSnapshot {
                pg_relid: 1,
                rel,
                relfilenode: 1,
                nblocks,
                row_type,
                name: "t".into(),
            }],
            ..SnapshotDecl::default()
        };
        (rel, decl)
    }

    /// Commits snapshots with a hot block 0 and a few cold blocks each; page tables, the
    /// mappings and rebuilt groups equal the reference index's, before and after reopening.
    #[test]
    fn the_log_answers_like_the_reference_at_every_snapshot() {
        let store = small_log_store();
        let (rel, decl) = one_table(&store, 40);
        let mut reference = ReferenceIndex::new();
        let mut snaps = Vec::new();
        for s in 0..30u32 {
            let mut cap = store.declare_and_begin(decl.clone()).unwrap();
            let snap = cap.snapshot();
            let mut mine = Vec::new();
            for block in [0, 1 + s % 7, 10 + s % 13]
                .into_iter()
                .take(1 + (s % 3) as usize)
            {
                let image = cap
                    .put_image(format!("{s}/{block}").as_bytes(), &[])
                    .unwrap();
                cap.add_mapping(PageKey { rel, block }, image).unwrap();
                mine.push(Mapping::new(PageKey { rel, block }, snap, image));
            }
            mine.sort_by_key(|m| m.page);
            cap.commit().unwrap();
            reference.add_snapshot(snap, &mine).unwrap();
            snaps.push((snap, mine));
        }
        let check = |store: &SnapshotStore<crate::MemBackend>| {
            for (snap, mine) in &snaps {
                let want: Vec<_> = reference
                    .page_table_at(*snap)
                    .unwrap()
                    .iter()
                    .map(|(p, i)| (*p, *i))
                    .collect();
                assert_eq!(store.page_table(*snap).unwrap(), want, "{snap}");
                assert_eq!(&store.mapping_log(*snap, *snap).unwrap(), mine);
            }
            let all: Vec<Mapping> = snaps.iter().flat_map(|(_, m)| m.clone()).collect();
            assert_eq!(store.mapping_log(SnapId(0), SnapId(u64::MAX)).unwrap(), all);
            let group: Vec<SnapId> = snaps[11..17].iter().map(|(s, _)| *s).collect();
            let built = store.build_group(&group).unwrap();
            for s in &group {
                for block in 0..25 {
                    let page = PageKey { rel, block };
                    assert_eq!(
                        built.view().lookup(*s, page).unwrap(),
                        reference.lookup(*s, page).unwrap()
                    );
                }
            }
        };
        check(&store);
        let levels: Vec<u8> = crate::backend::Scan::range(&store.backend, Cf::MapLog, &[], None)
            .unwrap()
            .map(|e| e.unwrap().0[0])
            .collect();
        assert!(levels.contains(&2), "the test must reach the top level");
        let reopened = SnapshotStore::open(
            store.into_backend(),
            StoreOptions::new(1), // the log's shape comes from the store, not the options
        )
        .unwrap();
        check(&reopened);
    }

    /// Snapshots that committed after the rewrite read the catalog are members of R too (they
    /// are not reclaimed): each ends a window of its own, so a page changed by two of them
    /// keeps both mappings.
    #[test]
    fn a_rewrite_keeps_what_snapshots_committed_after_it_read_the_catalog_need() {
        let store = small_log_store();
        let (rel, decl) = one_table(&store, 2);
        let mut snaps = Vec::new();
        for content in [b"a", b"b", b"c"] {
            let mut cap = store.declare_and_begin(decl.clone()).unwrap();
            let image = cap.put_image(content, &[]).unwrap();
            cap.add_mapping(PageKey { rel, block: 0 }, image).unwrap();
            snaps.push(cap.commit().unwrap().id);
        }
        let tables: Vec<_> = snaps
            .iter()
            .map(|s| store.page_table(*s).unwrap())
            .collect();
        // As if the last two committed after the catalog was read.
        let rewrite = store.rewrite_log_for(&snaps[..1], 1).unwrap().unwrap();
        assert_eq!(rewrite.after, 3);
        assert_eq!(store.apply_log_rewrite(&rewrite).unwrap(), Some(3));
        for (snap, table) in snaps.iter().zip(&tables) {
            assert_eq!(&store.page_table(*snap).unwrap(), table, "{snap}");
        }
    }

    /// Damage in a log node is reported as corruption, naming the node.
    #[test]
    fn a_damaged_node_is_corrupt() {
        let store = small_log_store();
        let (rel, decl) = one_table(&store, 1);
        let mut cap = store.declare_and_begin(decl).unwrap();
        let image = cap.put_image(b"x", &[]).unwrap();
        cap.add_mapping(PageKey { rel, block: 0 }, image).unwrap();
        let snap = cap.commit().unwrap().id;
        let key = keys::log_node_key(0, 0, 0);
        let mut bytes = store.backend.get(Cf::MapLog, &key).unwrap().unwrap();
        bytes[30] ^= 1;
        let mut batch = WriteBatch::new();
        batch.put(Cf::MapLog, &key, &bytes);
        store.backend.write(&batch, true).unwrap();
        let e = store.mapping_log(snap, snap).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt);
        assert!(e.message().contains("node 0 of level 0"), "{e}");
    }
}
