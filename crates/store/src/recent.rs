//! The stored records of the newest images of the pages the last committed captures stored,
//! kept in memory for the next captures: each page a capture stores again is given a delta
//! from the image its block had (`Capture::base_image`), the one the page's last capture
//! stored. Under pgbench, reading those bases from the store (a RocksDB point lookup each) was
//! a sixth of phase two's CPU.
//!
//! Invariants:
//! - an entry is the record stored under its image id, and image ids are never reused: an
//!   entry is never stale, only unused (a capture's images are remembered at its commit, so
//!   an abandoned capture leaves nothing);
//! - at most `budget` bytes of records are held; past it, the records remembered first are
//!   forgotten first. A base is taken out when a page is stored again (the page then has a
//!   newer image), so what stays is mostly the newest image of pages that did not change.

use std::collections::{HashMap, VecDeque};

use crate::ids::ImageId;

#[derive(Debug, Default)]
pub(crate) struct RecentImages {
    budget: usize,
    bytes: usize,
    records: HashMap<ImageId, Vec<u8>>,
    /// The ids remembered, oldest first (some taken since).
    order: VecDeque<ImageId>,
    /// Records taken from the cache since the store was opened (for tests and statistics).
    hits: u64,
}

/// Records of one capture, gathered while it stores them and given to the cache at its
/// commit: no more than the cache's budget.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    budget: usize,
    bytes: usize,
    records: Vec<(ImageId, Vec<u8>)>,
}

impl Gathered {
    pub fn new(budget: usize) -> Self {
        Gathered {
            budget,
            ..Gathered::default()
        }
    }

    /// Keeps `record`, the record of new image `id`, if it fits.
    pub fn offer(&mut self, id: ImageId, record: Vec<u8>) {
        if self.bytes + record.len() <= self.budget {
            self.bytes += record.len();
            self.records.push((id, record));
        }
    }
}

impl RecentImages {
    pub fn new(budget: usize) -> Self {
        RecentImages {
            budget,
            ..RecentImages::default()
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Changes the budget, forgetting the oldest records past it (0: all of them).
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.forget_past_budget();
    }

    /// Takes the record of image `id`, if it is held.
    pub fn take(&mut self, id: ImageId) -> Option<Vec<u8>> {
        let record = self.records.remove(&id)?;
        self.bytes -= record.len();
        self.hits += 1;
        Some(record)
    }

    /// Adds the records a committed capture gathered, forgetting the oldest ones past the
    /// budget.
    pub fn add(&mut self, gathered: Gathered) {
        for (id, record) in gathered.records {
            self.bytes += record.len();
            if let Some(old) = self.records.insert(id, record) {
                self.bytes -= old.len();
            }
            self.order.push_back(id);
        }
        self.forget_past_budget();
    }

    fn forget_past_budget(&mut self) {
        while self.bytes > self.budget {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.records.remove(&id) {
                self.bytes -= old.len();
            }
        }
        // Ids taken since they were remembered: dropped once they are most of the queue.
        if self.order.len() > 2 * self.records.len() + 1024 {
            let records = &self.records;
            self.order.retain(|id| records.contains_key(id));
        }
    }

    /// (Records held, their bytes, records taken since the store was opened.)
    pub fn stats(&self) -> (usize, usize, u64) {
        (self.records.len(), self.bytes, self.hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_records_go_first_and_a_record_is_taken_once() {
        let mut g = Gathered::new(10);
        g.offer(ImageId(1), vec![1; 4]);
        g.offer(ImageId(2), vec![2; 7]); // 11 bytes: does not fit
        g.offer(ImageId(3), vec![3; 6]);
        g.offer(ImageId(6), vec![6; 1]); // 11 bytes again
        let mut cache = RecentImages::new(10);
        cache.add(g);
        assert_eq!(cache.stats(), (2, 10, 0));
        assert_eq!(cache.take(ImageId(2)), None);
        assert_eq!(cache.take(ImageId(3)), Some(vec![3; 6]));
        assert_eq!(cache.take(ImageId(3)), None, "a record is taken once");
        assert_eq!(cache.stats(), (1, 4, 1));
        // 4 + 3 + 5 bytes: over the budget, the oldest (1) goes.
        let mut next = Gathered::new(10);
        next.offer(ImageId(4), vec![4; 3]);
        next.offer(ImageId(5), vec![5; 5]);
        cache.add(next);
        assert_eq!(cache.stats(), (2, 8, 1));
        assert_eq!(cache.take(ImageId(1)), None, "forgotten first");
        assert_eq!(cache.take(ImageId(4)), Some(vec![4; 3]));
        assert_eq!(cache.take(ImageId(5)), Some(vec![5; 5]));
        assert_eq!(cache.stats(), (0, 0, 3));
    }

    #[test]
    fn a_smaller_budget_forgets_the_oldest_and_zero_forgets_all() {
        let mut cache = RecentImages::new(100);
        let mut g = Gathered::new(100);
        for i in 0..5 {
            g.offer(ImageId(i), vec![0; 10]);
        }
        cache.add(g);
        cache.set_budget(25);
        assert_eq!(cache.stats(), (2, 20, 0));
        assert_eq!(cache.take(ImageId(2)), None);
        assert!(cache.take(ImageId(3)).is_some());
        cache.set_budget(0);
        assert_eq!(cache.stats(), (0, 0, 1));
        assert_eq!(cache.take(ImageId(4)), None);
    }

    /// Many captures whose records are all taken: the queue of ids does not grow with them.
    #[test]
    fn taken_ids_do_not_pile_up() {
        let mut cache = RecentImages::new(1 << 20);
        for capture in 0..100u64 {
            let mut g = Gathered::new(1 << 20);
            for i in 0..100 {
                g.offer(ImageId(capture * 100 + i), vec![0; 8]);
            }
            cache.add(g);
            for i in 0..100 {
                assert!(cache.take(ImageId(capture * 100 + i)).is_some());
            }
        }
        assert!(cache.order.len() <= 1024 + 100, "{}", cache.order.len());
        assert_eq!(cache.stats(), (0, 0, 10_000));
    }
}
