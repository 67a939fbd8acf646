//! The Skippy mapping log's nodes kept in the store: [`StoreLogStore`] implements
//! `gsnap_core::skippy::LogStore` over the `skippy` column family, so the levels that let
//! page-table construction skip the repeated mappings of hot pages are as durable as the
//! snapshots themselves.
//!
//! Invariant: `write_nodes` is one synced batch (all nodes or none), as the trait requires;
//! node counts are read from the store (the highest node number of a level, plus one) and
//! cached, and the cache is only advanced after a write succeeded.

use std::sync::Arc;

use gsnap_core::skippy::{LogNode, LogStore};
use gsnap_core::IndexError;

use crate::backend::KvBackend;
use crate::keys::{self, Cf};
use crate::store::SnapshotStore;

/// Levels the log may have (level 0 and up to this many above it).
const MAX_LEVELS: usize = 8;

/// A `LogStore` over a snapshot store.
pub struct StoreLogStore<'s, B: KvBackend> {
    store: &'s SnapshotStore<B>,
    counts: [Option<u64>; MAX_LEVELS + 1],
}

impl<'s, B: KvBackend> StoreLogStore<'s, B> {
    /// The Skippy nodes of `store`.
    pub fn new(store: &'s SnapshotStore<B>) -> Self {
        StoreLogStore {
            store,
            counts: [None; MAX_LEVELS + 1],
        }
    }
}

fn io(e: crate::error::StoreError) -> IndexError {
    IndexError::Storage(e.message().to_string())
}

impl<B: KvBackend> LogStore for StoreLogStore<'_, B> {
    fn node_count(&self, level: u8) -> Result<u64, IndexError> {
        if let Some(Some(n)) = self.counts.get(level as usize) {
            return Ok(*n);
        }
        let start = keys::skippy_key(level, 0);
        let end = keys::prefix_end(&[level]).unwrap_or_else(|| vec![0xff; 10]);
        match self
            .store
            .backend
            .last_in_range(Cf::Skippy, &start, &end)
            .map_err(io)?
        {
            Some((k, _)) => Ok(keys::decode_tagged_u64(&k, level).map_err(io)? + 1),
            None => Ok(0),
        }
    }

    fn read_node(&self, level: u8, number: u64) -> Result<Option<Arc<LogNode>>, IndexError> {
        match self.store.skippy_node(level, number).map_err(io)? {
            Some(bytes) => Ok(Some(Arc::new(LogNode::decode(&bytes)?))),
            None => Ok(None),
        }
    }

    fn write_nodes(&mut self, nodes: &[LogNode]) -> Result<(), IndexError> {
        let encoded: Vec<(u8, u64, Vec<u8>)> = nodes
            .iter()
            .map(|n| (n.level, n.number, n.encode()))
            .collect();
        let refs: Vec<(u8, u64, &[u8])> = encoded
            .iter()
            .map(|(l, n, b)| (*l, *n, b.as_slice()))
            .collect();
        self.store.put_skippy_nodes(&refs).map_err(io)?;
        for n in nodes {
            let level = n.level as usize;
            if level <= MAX_LEVELS {
                let count = self.node_count(n.level)?.max(n.number + 1);
                self.counts[level] = Some(count);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gsnap_core::skippy::{SkippyConfig, SkippyLog, StopWhen};
    use gsnap_core::{ImageId, Mapping, PageKey, SnapId};

    /// The Skippy log over the store builds the same page tables as over memory, and a
    /// reopened log continues where it stopped.
    #[test]
    fn skippy_over_the_store_builds_page_tables_and_survives_reopening() {
        let store = SnapshotStore::open_in_memory(1);
        let config = SkippyConfig {
            node_size: 4,
            height: 2,
        };
        let snaps: Vec<(SnapId, Vec<Mapping>)> = (1..=20u64)
            .map(|s| {
                let hot = Mapping::new(PageKey::new(1, 0), SnapId(s), ImageId(s * 10));
                let cold = Mapping::new(PageKey::new(1, s as u32), SnapId(s), ImageId(s * 10 + 1));
                (SnapId(s), vec![hot, cold])
            })
            .collect();
        {
            let mut log = SkippyLog::open(StoreLogStore::new(&store), config).unwrap();
            for (s, m) in &snaps[..12] {
                log.append_snapshot(*s, m).unwrap();
            }
        }
        let mut log = SkippyLog::open(StoreLogStore::new(&store), config).unwrap();
        assert_eq!(log.last_snap(), Some(SnapId(12)));
        for (s, m) in &snaps[12..] {
            log.append_snapshot(*s, m).unwrap();
        }
        let (table, _) = log
            .build_page_table(SnapId(15), StopWhen::LogStart)
            .unwrap();
        let hot = table
            .iter()
            .find(|(p, _)| *p == PageKey::new(1, 0))
            .map(|(_, i)| *i);
        assert_eq!(
            hot,
            Some(ImageId(150)),
            "the latest mapping at or before 15"
        );
        assert_eq!(table.len(), 16, "the hot page and blocks 1..=15");
        assert!(table.iter().all(|(p, _)| p.block <= 15));
    }
}
