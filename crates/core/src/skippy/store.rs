//! Where log nodes live: the `LogStore` trait (the store keeps them durably, e.g. in a RocksDB
//! column family keyed by (level, number)) and an in-memory implementation.
//!
//! Contract: `write_nodes` writes all its nodes or none (one batch); within a level nodes are
//! written in number order, and only a level's newest node is ever rewritten (the tail grows
//! until it holds `node_size` entries, then it never changes again).

use super::node::LogNode;
use crate::error::IndexError;
use std::sync::Arc;

pub trait LogStore {
    /// The number of nodes written at `level`.
    fn node_count(&self, level: u8) -> Result<u64, IndexError>;
    /// Node `number` of `level`, if written.
    fn read_node(&self, level: u8, number: u64) -> Result<Option<Arc<LogNode>>, IndexError>;
    /// Creates or replaces nodes, atomically.
    fn write_nodes(&mut self, nodes: &[LogNode]) -> Result<(), IndexError>;
}

/// Nodes in memory.
#[derive(Debug, Default, Clone)]
pub struct MemoryLogStore {
    levels: Vec<Vec<Arc<LogNode>>>,
}

impl MemoryLogStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every node, level by level, in number order.
    pub fn nodes(&self) -> impl Iterator<Item = &LogNode> {
        self.levels.iter().flatten().map(|n| n.as_ref())
    }

    /// Total entries stored over all levels (for space reports).
    pub fn entries(&self) -> usize {
        self.levels.iter().flatten().map(|n| n.entries.len()).sum()
    }
}

impl LogStore for MemoryLogStore {
    fn node_count(&self, level: u8) -> Result<u64, IndexError> {
        Ok(self
            .levels
            .get(level as usize)
            .map_or(0, |l| l.len() as u64))
    }

    fn read_node(&self, level: u8, number: u64) -> Result<Option<Arc<LogNode>>, IndexError> {
        Ok(self
            .levels
            .get(level as usize)
            .and_then(|l| l.get(number as usize))
            .cloned())
    }

    fn write_nodes(&mut self, nodes: &[LogNode]) -> Result<(), IndexError> {
        // Check the whole batch first: all or none.
        let mut counts: Vec<u64> = self.levels.iter().map(|l| l.len() as u64).collect();
        for n in nodes {
            let level = n.level as usize;
            if counts.len() <= level {
                counts.resize(level + 1, 0);
            }
            let have = counts[level];
            if n.number > have || n.number + 1 < have {
                return Err(IndexError::Storage(format!(
                    "node ({}, {}) written out of order",
                    n.level, n.number
                )));
            }
            counts[level] = have.max(n.number + 1);
        }
        for n in nodes {
            let level = n.level as usize;
            if self.levels.len() <= level {
                self.levels.resize_with(level + 1, Vec::new);
            }
            let l = &mut self.levels[level];
            if (n.number as usize) < l.len() {
                l[n.number as usize] = Arc::new(n.clone());
            } else {
                l.push(Arc::new(n.clone()));
            }
        }
        Ok(())
    }
}
