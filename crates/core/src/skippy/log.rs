//! `SkippyLog`: appends snapshots' mappings to the log and its Skippy levels, and builds page
//! tables from it (one snapshot's, or a whole group's).
//!
//! Writer state: per level, the number of sealed nodes, the number of entries, and the tail
//! (the node being filled). A node is sealed when it holds `node_size` entries; sealing a node
//! below the top appends its FEM segment to the next level (which may seal nodes there in
//! turn). Every append ends with one `write_nodes` batch holding the sealed nodes and the
//! changed tails, so the store always holds the whole log and a crash loses a whole append or
//! nothing. A node's uplink is fixed when the node is opened: it is the length of the next
//! level then, i.e. where this node's own FEM segment will begin.

use super::node::LogNode;
use super::store::LogStore;
use crate::builder::GroupBuilder;
use crate::error::IndexError;
use crate::types::{validate_batch, ImageId, Mapping, PageKey, SnapId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Shape of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkippyConfig {
    /// Entries per node, at every level.
    pub node_size: usize,
    /// The top level (0: the mapping log alone).
    pub height: u8,
}

impl Default for SkippyConfig {
    fn default() -> Self {
        SkippyConfig {
            node_size: 2048,
            height: 2,
        }
    }
}

/// When a page-table scan may stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopWhen {
    /// Scan back to the log's start.
    LogStart,
    /// Stop once this many distinct pages were found (the caller knows the relation sizes at
    /// v, and every existing page has a mapping).
    Pages(u64),
}

/// What one page-table construction read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildStats {
    pub entries_scanned: u64,
    pub nodes_read: u64,
    pub top_level_reached: u8,
}

#[derive(Debug)]
pub struct SkippyLog<S: LogStore> {
    store: S,
    config: SkippyConfig,
    tails: Vec<Option<LogNode>>,
    sealed: Vec<u64>,
    lens: Vec<u64>,
    last_snap: Option<SnapId>,
}

impl<S: LogStore> SkippyLog<S> {
    /// Opens the log kept in `store` (empty or written with the same `config`).
    pub fn open(store: S, config: SkippyConfig) -> Result<Self, IndexError> {
        if config.node_size == 0 || config.height > 16 {
            return Err(IndexError::InvalidArgument(
                "skippy node size must be positive and height at most 16",
            ));
        }
        let levels = config.height as usize + 1;
        let mut log = SkippyLog {
            store,
            config,
            tails: vec![None; levels],
            sealed: vec![0; levels],
            lens: vec![0; levels],
            last_snap: None,
        };
        if log.store.node_count(config.height + 1)? != 0 {
            return Err(IndexError::InvalidArgument(
                "the log was written with a greater height",
            ));
        }
        for level in 0..levels {
            let count = log.store.node_count(level as u8)?;
            if count == 0 {
                continue;
            }
            let last = log.read(level as u8, count - 1)?;
            let size = config.node_size as u64;
            if last.start != (count - 1) * size
                || last.entries.len() > config.node_size
                || last.uplink.is_some() != (level < config.height as usize)
            {
                return Err(IndexError::InvalidArgument(
                    "the log was written with another node size or height",
                ));
            }
            if last.entries.len() < config.node_size {
                log.sealed[level] = count - 1;
                log.tails[level] = Some((*last).clone());
            } else {
                log.sealed[level] = count;
            }
            log.lens[level] = last.start + last.entries.len() as u64;
            if level == 0 {
                log.last_snap = last.entries.last().map(|e| e.snap);
            }
        }
        Ok(log)
    }

    pub fn config(&self) -> SkippyConfig {
        self.config
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store under the log (for a caller that buffers writes and must flush them).
    pub fn into_store(self) -> S {
        self.store
    }

    /// The number of entries at `level`.
    pub fn level_len(&self, level: u8) -> u64 {
        self.lens.get(level as usize).copied().unwrap_or(0)
    }

    /// The newest snapshot with mappings in the log.
    pub fn last_snap(&self) -> Option<SnapId> {
        self.last_snap
    }

    /// Appends one snapshot's mappings (sorted by page) and writes the changed nodes.
    pub fn append_snapshot(
        &mut self,
        snap: SnapId,
        mappings: &[Mapping],
    ) -> Result<(), IndexError> {
        self.append_snapshots(&[(snap, mappings)])
    }

    /// Appends several snapshots in order, with one store write at the end.
    pub fn append_snapshots(&mut self, batch: &[(SnapId, &[Mapping])]) -> Result<(), IndexError> {
        let mut last = self.last_snap;
        for (snap, mappings) in batch {
            validate_batch(last, *snap, mappings)?;
            last = Some(*snap);
        }
        let mut out = Vec::new();
        let mut dirty = vec![false; self.tails.len()];
        for (snap, mappings) in batch {
            for m in *mappings {
                self.push(0, *m, &mut out, &mut dirty);
            }
            if !mappings.is_empty() {
                self.last_snap = Some(*snap);
            }
        }
        for (level, tail) in self.tails.iter().enumerate() {
            if let (true, Some(t)) = (dirty[level], tail) {
                out.push(t.clone());
            }
        }
        out.sort_by_key(|n| (n.level, n.number));
        self.store.write_nodes(&out)
    }

    fn push(&mut self, level: usize, e: Mapping, out: &mut Vec<LogNode>, dirty: &mut [bool]) {
        let h = self.config.height as usize;
        let number = self.sealed[level];
        let start = self.lens[level];
        let up = self.lens.get(level + 1).copied();
        let tail = self.tails[level].get_or_insert_with(|| LogNode {
            level: level as u8,
            number,
            start,
            uplink: if level < h { up } else { None },
            inlink: (level == h && number > 0).then(|| number - 1),
            entries: Vec::new(),
        });
        tail.entries.push(e);
        self.lens[level] += 1;
        dirty[level] = true;
        if tail.entries.len() >= self.config.node_size {
            let node = std::mem::replace(
                tail,
                LogNode {
                    level: 0,
                    number: 0,
                    start: 0,
                    uplink: None,
                    inlink: None,
                    entries: Vec::new(),
                },
            );
            self.tails[level] = None;
            self.sealed[level] += 1;
            dirty[level] = false;
            if level < h {
                for fem in fems(&node.entries) {
                    self.push(level + 1, fem, out, dirty);
                }
            }
            out.push(node);
        }
    }

    fn read(&self, level: u8, number: u64) -> Result<Arc<LogNode>, IndexError> {
        let node = self
            .store
            .read_node(level, number)?
            .ok_or(IndexError::Storage(format!(
                "log node ({level}, {number}) is missing"
            )))?;
        if node.level != level
            || node.number != number
            || node.start != number * self.config.node_size as u64
        {
            return Err(IndexError::Storage(format!(
                "log node ({level}, {number}) has another identity"
            )));
        }
        Ok(node)
    }

    /// The level-0 position just after the last mapping of a snapshot at or before `snap`.
    fn end_of(&self, snap: SnapId) -> Result<u64, IndexError> {
        let nodes = self.store.node_count(0)?;
        let (mut lo, mut hi) = (0u64, nodes);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let first = self
                .read(0, mid)?
                .entries
                .first()
                .map_or(SnapId(u64::MAX), |e| e.snap);
            if first > snap {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if lo == 0 {
            return Ok(0);
        }
        let node = self.read(0, lo - 1)?;
        Ok(node.start + node.entries.partition_point(|e| e.snap <= snap) as u64)
    }

    /// SPT(`snap`): the newest mapping at or before `snap` of every page, sorted by page.
    pub fn build_page_table(
        &self,
        snap: SnapId,
        stop: StopWhen,
    ) -> Result<(Vec<(PageKey, ImageId)>, BuildStats), IndexError> {
        let want = match stop {
            StopWhen::LogStart => u64::MAX,
            StopWhen::Pages(n) => n,
        };
        let mut found: HashMap<PageKey, ImageId> = HashMap::new();
        let mut stats = BuildStats::default();
        let mut level = 0u8;
        let mut p = self.end_of(snap)?;
        let size = self.config.node_size as u64;
        'scan: while p > 0 && (found.len() as u64) < want {
            let node = self.read(level, (p - 1) / size)?;
            stats.nodes_read += 1;
            let upto = (p - node.start) as usize;
            let entries = node.entries.get(..upto).ok_or(IndexError::Storage(format!(
                "log node ({level}, {}) is short",
                node.number
            )))?;
            for e in entries.iter().rev() {
                stats.entries_scanned += 1;
                found.entry(e.page).or_insert(e.image);
                if found.len() as u64 >= want {
                    break 'scan;
                }
            }
            if level < self.config.height {
                p = node
                    .uplink
                    .ok_or(IndexError::Storage("log node without uplink".into()))?;
                level += 1;
                stats.top_level_reached = level;
            } else {
                // The in-link leads to the next older node; anything else is damage (and
                // could loop).
                p = match node.inlink {
                    Some(n) if n + 1 == node.number => node.start,
                    None if node.number == 0 => 0,
                    _ => {
                        return Err(IndexError::Storage(format!(
                            "log node ({level}, {}) has a bad in-link",
                            node.number
                        )))
                    }
                };
            }
        }
        let mut table: Vec<(PageKey, ImageId)> = found.into_iter().collect();
        table.sort_unstable_by_key(|e| e.0);
        Ok((table, stats))
    }

    /// The level-0 mappings of snapshots in `after < snap <= upto`, in log order.
    pub fn mappings_between(
        &self,
        after: Option<SnapId>,
        upto: SnapId,
    ) -> Result<Vec<Mapping>, IndexError> {
        let start = match after {
            Some(a) => self.end_of(a)?,
            None => 0,
        };
        let end = self.end_of(upto)?;
        let size = self.config.node_size as u64;
        let mut out = Vec::new();
        let mut p = start;
        while p < end {
            let node = self.read(0, p / size)?;
            let from = (p - node.start) as usize;
            let to = ((end - node.start) as usize).min(node.entries.len());
            out.extend_from_slice(node.entries.get(from..to).unwrap_or(&[]));
            p = node.start + to.max(from + 1) as u64;
        }
        Ok(out)
    }

    /// Rebuilds a group of `snaps` (ascending) from the log: a complete tree for the first
    /// (`stop` bounds its scan), then one partial tree per snapshot from the mappings since its
    /// predecessor in `snaps` (mappings of snapshots not listed, e.g. deleted, fold into the
    /// next listed one).
    pub fn build_group(
        &self,
        snaps: &[SnapId],
        stop: StopWhen,
    ) -> Result<GroupBuilder, IndexError> {
        let mut g = GroupBuilder::new();
        let Some((&first, rest)) = snaps.split_first() else {
            return Ok(g);
        };
        let (base, _) = self.build_page_table(first, stop)?;
        g.add_first_snapshot(first, &mut base.into_iter(), &[])?;
        let mut prev = first;
        for &s in rest {
            let mut latest: HashMap<PageKey, ImageId> = HashMap::new();
            for m in self.mappings_between(Some(prev), s)? {
                latest.insert(m.page, m.image);
            }
            let mut batch: Vec<Mapping> = latest
                .into_iter()
                .map(|(page, image)| Mapping {
                    page,
                    snap: s,
                    image,
                })
                .collect();
            batch.sort_unstable_by_key(|m| m.page);
            g.add_snapshot(s, &batch)?;
            prev = s;
        }
        Ok(g)
    }
}

/// The FEMs of a node in the backward orientation: each page's newest entry, in log order.
fn fems(entries: &[Mapping]) -> Vec<Mapping> {
    let mut seen = HashSet::with_capacity(entries.len());
    let mut out: Vec<Mapping> = entries
        .iter()
        .rev()
        .filter(|e| seen.insert(e.page))
        .copied()
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceIndex;
    use crate::skippy::MemoryLogStore;
    use crate::SnapshotIndex;

    fn m(block: u32, snap: u64, image: u64) -> Mapping {
        Mapping::new(PageKey::new(1, block), SnapId(snap), ImageId(image))
    }

    /// A hot page 0 rewritten every snapshot, cold pages now and then.
    fn fill(config: SkippyConfig, snaps: u64) -> (SkippyLog<MemoryLogStore>, ReferenceIndex) {
        let mut log = SkippyLog::open(MemoryLogStore::new(), config).unwrap();
        let mut r = ReferenceIndex::new();
        for s in 1..=snaps {
            let mut maps = vec![m(0, s, s * 10)];
            if s % 3 == 0 {
                maps.push(m((s % 17) as u32 + 1, s, s * 10 + 1));
            }
            log.append_snapshot(SnapId(s), &maps).unwrap();
            r.add_snapshot(SnapId(s), &maps).unwrap();
        }
        (log, r)
    }

    fn reference_table(r: &ReferenceIndex, s: u64) -> Vec<(PageKey, ImageId)> {
        r.page_table_at(SnapId(s))
            .unwrap()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    #[test]
    fn page_tables_match_the_reference_at_every_height() {
        for height in 0..=3 {
            let (log, r) = fill(
                SkippyConfig {
                    node_size: 4,
                    height,
                },
                120,
            );
            for s in [1, 2, 3, 17, 64, 99, 120] {
                let (t, _) = log.build_page_table(SnapId(s), StopWhen::LogStart).unwrap();
                assert_eq!(t, reference_table(&r, s), "height {height} snap {s}");
            }
            assert!(log
                .build_page_table(SnapId(0), StopWhen::LogStart)
                .unwrap()
                .0
                .is_empty());
        }
    }

    #[test]
    fn higher_levels_skip_the_hot_page() {
        let (flat, _) = fill(
            SkippyConfig {
                node_size: 8,
                height: 0,
            },
            400,
        );
        let (tall, _) = fill(
            SkippyConfig {
                node_size: 8,
                height: 3,
            },
            400,
        );
        let (a, sa) = flat
            .build_page_table(SnapId(400), StopWhen::Pages(18))
            .unwrap();
        let (b, sb) = tall
            .build_page_table(SnapId(400), StopWhen::Pages(18))
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 18);
        assert!(
            sb.entries_scanned * 2 < sa.entries_scanned,
            "{sa:?} vs {sb:?}"
        );
        assert_eq!(sb.top_level_reached, 3);
    }

    #[test]
    fn reopening_continues_the_same_log() {
        let config = SkippyConfig {
            node_size: 5,
            height: 2,
        };
        let (log, mut r) = fill(config, 50);
        let mut log = SkippyLog::open(log.store.clone(), config).unwrap();
        assert_eq!(log.last_snap(), Some(SnapId(50)));
        for s in 51..=90 {
            let maps = [m(0, s, s * 10), m(100 + (s % 4) as u32, s, s)];
            log.append_snapshot(SnapId(s), &maps).unwrap();
            r.add_snapshot(SnapId(s), &maps).unwrap();
        }
        for s in [50, 51, 77, 90] {
            assert_eq!(
                log.build_page_table(SnapId(s), StopWhen::LogStart)
                    .unwrap()
                    .0,
                reference_table(&r, s)
            );
        }
        assert!(SkippyLog::open(
            log.store.clone(),
            SkippyConfig {
                node_size: 6,
                height: 2
            }
        )
        .is_err());
        assert!(SkippyLog::open(
            log.store.clone(),
            SkippyConfig {
                node_size: 5,
                height: 1
            }
        )
        .is_err());
        assert!(log.append_snapshot(SnapId(90), &[]).is_err());
    }

    #[test]
    fn a_damaged_in_link_is_an_error_not_a_loop() {
        let config = SkippyConfig {
            node_size: 4,
            height: 0,
        };
        let (log, _) = fill(config, 30);
        let mut store = log.store.clone();
        let n = store.node_count(0).unwrap() - 1;
        let mut tail = (*store.read_node(0, n).unwrap().unwrap()).clone();
        tail.inlink = Some(n);
        store.write_nodes(&[tail]).unwrap();
        let log = SkippyLog::open(store, config).unwrap();
        assert!(matches!(
            log.build_page_table(SnapId(30), StopWhen::LogStart),
            Err(IndexError::Storage(_))
        ));
    }

    #[test]
    fn a_group_rebuilt_from_the_log_equals_the_reference() {
        let (log, r) = fill(
            SkippyConfig {
                node_size: 6,
                height: 2,
            },
            60,
        );
        let snaps: Vec<SnapId> = [20, 21, 25, 26, 40].into_iter().map(SnapId).collect();
        let g = log.build_group(&snaps, StopWhen::LogStart).unwrap();
        for &s in &snaps {
            for b in 0..20 {
                let p = PageKey::new(1, b);
                assert_eq!(
                    g.view().lookup(s, p),
                    r.lookup(s, p),
                    "snap {s:?} block {b}"
                );
            }
        }
        let between = log.mappings_between(Some(SnapId(20)), SnapId(22)).unwrap();
        assert_eq!(between, vec![m(0, 21, 210), m(5, 21, 211), m(0, 22, 220)]);
    }
}
