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
use std::sync::Arc;

use gsnap_core::skippy::{LogNode, LogStore, MemoryLogStore, SkippyLog, StopWhen};
use gsnap_core::{GroupBuilder, IndexError, Mapping};

use crate::backend::{KvBackend, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{ImageId, PageKey, SnapId};
use crate::keys::{self, Cf};
use crate::store::SnapshotStore;

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
            for node in &log.store().staged {
                batch.put(
                    Cf::MapLog,
                    &keys::log_node_key(node.level, node.number),
                    &node.encode(),
                );
            }
            Ok(())
        })
    }

    /// How many mappings the log holds (level 0), live and dead.
    pub fn log_mappings(&self) -> Result<u64> {
        self.with_log(|log| Ok(log.level_len(0)))
    }

    /// The log rewritten without its dead mappings (see [`LogRewrite`]), computed from the log
    /// and the catalog as they are now; None while a reclamation is in flight (its progress
    /// counts positions in its own list, which the log's dead mappings do not enter, but
    /// there is no need to find out), or if more than `max_live` mappings would stay (the new
    /// log is built in memory, about 50 bytes a mapping: the bound keeps that memory). Reads
    /// only: the caller applies it with [`SnapshotStore::apply_log_rewrite`] (it may run on
    /// another thread).
    pub fn rewrite_log(&self, max_live: u64) -> Result<Option<LogRewrite>> {
        if self.reclaiming()? {
            return Ok(None);
        }
        let (r, _) = self.unreclaimed();
        let config = self.identity.mapping_log;
        self.with_log(|log| {
            let before = log.level_len(0);
            let last = log.last_snap();
            let mut new = SkippyLog::open(MemoryLogStore::new(), config)?;
            // The window's last mapping of each page (memory: the pages, not the snapshots).
            let mut window: HashMap<PageKey, Mapping> = HashMap::new();
            let mut window_end: Option<Option<SnapId>> = None;
            let mut next_r = 0;
            let count = log.store().node_count(0)?;
            for number in 0..count {
                let Some(node) = log.store().read_node(0, number)? else {
                    return Err(IndexError::Storage(format!(
                        "mapping log node {number} is missing"
                    )));
                };
                for m in &node.entries {
                    while r.get(next_r).is_some_and(|&s| s < m.snap) {
                        next_r += 1;
                    }
                    // The mapping's window: the snapshots after the member of R before it,
                    // up to the first member of R at or after it (None: after all of R).
                    let end = r.get(next_r).copied();
                    if window_end != Some(end) {
                        append_live(&mut new, &mut window)?;
                        if new.level_len(0) > max_live {
                            return Ok(None);
                        }
                        window_end = Some(end);
                    }
                    window.insert(m.page, *m);
                }
            }
            append_live(&mut new, &mut window)?;
            if new.level_len(0) > max_live {
                return Ok(None);
            }
            let mut batch = WriteBatch::new();
            for level in 0..=config.height {
                for number in 0..log.store().node_count(level)? {
                    batch.delete(Cf::MapLog, &keys::log_node_key(level, number));
                }
            }
            for node in new.store().nodes() {
                batch.put(
                    Cf::MapLog,
                    &keys::log_node_key(node.level, node.number),
                    &node.encode(),
                );
            }
            Ok(Some(LogRewrite {
                last,
                before,
                after: new.level_len(0),
                batch,
            }))
        })
    }

    /// Replaces the log with `rewrite` if the log is still the one it was computed from (no
    /// snapshot committed since); returns whether it did. One atomic batch: a crash leaves
    /// the old log or the new one.
    pub fn apply_log_rewrite(&self, rewrite: &LogRewrite) -> Result<bool> {
        let same = self.with_log(|log| {
            Ok(log.level_len(0) == rewrite.before && log.last_snap() == rewrite.last)
        })?;
        if !same || self.reclaiming()? {
            return Ok(false);
        }
        self.backend.write(&rewrite.batch, false)?;
        Ok(true)
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
        let error = RefCell::new(None);
        let nodes = LogNodes {
            backend: &self.backend,
            staged: Vec::new(),
            error: &error,
        };
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

/// The log's nodes in the `maplog` column family, as `gsnap_core`'s Skippy log reads and
/// writes them. Writes are only collected (`staged`), for the caller to put into its batch.
pub(crate) struct LogNodes<'s, B: KvBackend> {
    backend: &'s B,
    /// Nodes written by an append, newest version last.
    staged: Vec<LogNode>,
    /// The store error behind the last `IndexError::Storage` this returned.
    error: &'s RefCell<Option<StoreError>>,
}

impl<B: KvBackend> LogNodes<'_, B> {
    fn fail(&self, e: StoreError) -> IndexError {
        let message = e.message().to_string();
        *self.error.borrow_mut() = Some(e);
        IndexError::Storage(message)
    }
}

impl<B: KvBackend> LogStore for LogNodes<'_, B> {
    fn node_count(&self, level: u8) -> Result<u64, IndexError> {
        let start = keys::log_node_key(level, 0);
        let end = keys::prefix_end(&[level]).unwrap_or_else(|| vec![0xff; 10]);
        let stored = match self
            .backend
            .last_in_range(Cf::MapLog, &start, &end)
            .map_err(|e| self.fail(e))?
        {
            Some((k, _)) => {
                let (_, number) = keys::decode_log_node_key(&k).map_err(|e| self.fail(e))?;
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
        let Some(bytes) = self
            .backend
            .get(Cf::MapLog, &keys::log_node_key(level, number))
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
            self.staged.push(n.clone());
        }
        Ok(())
    }
}

/// The mapping log without its dead mappings, ready to replace it ([`SnapshotStore::rewrite_log`]).
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
    last: Option<SnapId>,
    /// Mappings before and after.
    pub before: u64,
    pub after: u64,
    batch: WriteBatch,
}

/// Appends the live mappings of a window (the last of each page) to `log`, snapshot by
/// snapshot, and empties the window.
fn append_live(
    log: &mut SkippyLog<MemoryLogStore>,
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

    /// Commits snapshots with a hot block 0 and a few cold blocks each; page tables, the
    /// mappings and rebuilt groups equal the reference index's, before and after reopening.
    #[test]
    fn the_log_answers_like_the_reference_at_every_snapshot() {
        let store = small_log_store();
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
                nblocks: 40,
                row_type,
                name: "t".into(),
            }],
            ..SnapshotDecl::default()
        };
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

    /// Damage in a log node is reported as corruption, naming the node.
    #[test]
    fn a_damaged_node_is_corrupt() {
        let store = small_log_store();
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
                nblocks: 1,
                row_type,
                name: "t".into(),
            }],
            ..SnapshotDecl::default()
        };
        let mut cap = store.declare_and_begin(decl).unwrap();
        let image = cap.put_image(b"x", &[]).unwrap();
        cap.add_mapping(PageKey { rel, block: 0 }, image).unwrap();
        let snap = cap.commit().unwrap().id;
        let key = keys::log_node_key(0, 0);
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
