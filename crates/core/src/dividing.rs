//! Group-Based Dividing (GBD, GSnap section 4.2, Algorithm 1): when to seal the active group
//! and what budgets the next group gets, plus the recent average continuous access length C.
//!
//! How we read Algorithm 1 (the paper's pseudo-code, with the names of its Output list):
//! ```text
//! while O_n* > O_n && L_n* >= L_n:  take a snapshot, O_n += its mappings, L_n += 1
//! if O_n >= O_n*:  L_{n+1}* = max(L_n, C)          // budget exhausted: length reward
//! else:            L_{n+1}* = max(p * L_n, C)      // length reached first: length punish
//! split the group;  O_{n+1}* = L_{n+1}* * P_n;  return L_{n+1}*, O_{n+1}*
//! ```
//! - `O_n` is the group's page counter: the number of mappings added to the group (one per
//!   changed page per snapshot, the first snapshot's own mappings included, its copied base
//!   not), which is what path copying costs memory for.
//! - `L_n` is the number of snapshots in the group. The loop's `L_n* >= L_n` read literally
//!   admits L_n* + 1 snapshots; we take L_n* as the group's maximum length, so the group is
//!   sealed as soon as `L_n >= L_n*` (or `O_n >= O_n*`) after a snapshot is added.
//! - `P_n` is the group's average update ratio in pages per snapshot, `O_n / L_n`, so
//!   `O_{n+1}* = L_{n+1}* x P_n` is the page count the next group may change if it keeps the
//!   rate of this one for its whole length budget.
//! - `C` is the average length (in snapshots) of the recent continuous accesses
//!   (`record_access`, over a window of the last `access_window` accesses); until any access
//!   is recorded it is `initial_length`. Lengths are rounded up to whole snapshots and clamped
//!   to `[min_length, max_length]`; `p` is `punish_factor` (the paper's 3/4).
//! - The first group has `L_1* = initial_length` and `O_1* = initial_page_budget` (unlimited by
//!   default, so the first group is cut by length and sets the rate for the next).
//! - gsnap adds one safety bound the paper does not have: a group is also sealed when its node
//!   area reaches `max_group_bytes`, so one group always fits a cache slot.

use std::collections::VecDeque;

/// The knobs of Algorithm 1.
#[derive(Clone, Debug, PartialEq)]
pub struct DividingConfig {
    /// L_1*: the first group's length budget, and C until an access is recorded.
    pub initial_length: u32,
    /// O_1*: the first group's page budget (`None`: unlimited).
    pub initial_page_budget: Option<u64>,
    /// p: the punish factor applied to the length when the page budget was not used up.
    pub punish_factor: f64,
    pub min_length: u32,
    pub max_length: u32,
    /// How many recent accesses C averages over.
    pub access_window: usize,
    /// Seal when the group's node area reaches this many bytes.
    pub max_group_bytes: usize,
}

impl Default for DividingConfig {
    fn default() -> Self {
        DividingConfig {
            initial_length: 20,
            initial_page_budget: None,
            punish_factor: 0.75,
            min_length: 1,
            max_length: 4096,
            access_window: 64,
            max_group_bytes: 256 << 20,
        }
    }
}

/// The recent average continuous access length C, over a sliding window of accesses.
#[derive(Clone, Debug)]
pub struct AccessTracker {
    window: VecDeque<u64>,
    capacity: usize,
    sum: u64,
}

impl AccessTracker {
    pub fn new(capacity: usize) -> Self {
        AccessTracker {
            window: VecDeque::new(),
            capacity: capacity.max(1),
            sum: 0,
        }
    }

    /// Records a query over snapshots `first..=last`, counted in snapshot ids (ids are
    /// assigned one per declared snapshot, so the span is the number of snapshots the query
    /// needed to find in one group, deleted ones included).
    pub fn record_access(&mut self, first: crate::SnapId, last: crate::SnapId) {
        let (lo, hi) = if first <= last {
            (first.0, last.0)
        } else {
            (last.0, first.0)
        };
        self.record_access_len(hi - lo + 1);
    }

    /// Records a query that needed `len` consecutive snapshots.
    pub fn record_access_len(&mut self, len: u64) {
        let len = len.max(1);
        if self.window.len() == self.capacity {
            self.sum -= self.window.pop_front().unwrap_or(0);
        }
        self.window.push_back(len);
        self.sum += len;
    }

    /// The average of the window, `None` before any access.
    pub fn average(&self) -> Option<f64> {
        (!self.window.is_empty()).then(|| self.sum as f64 / self.window.len() as f64)
    }
}

/// What the policy says after a snapshot was added to the active group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Continue,
    Seal,
}

/// What Algorithm 1 computed when a group was split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupOutcome {
    /// L_n and O_n of the sealed group.
    pub length: u32,
    pub pages: u64,
    /// P_n: pages per snapshot.
    pub update_ratio: f64,
    /// Whether the page budget was exhausted (length reward) or not (length punish).
    pub rewarded: bool,
    /// L_{n+1}* and O_{n+1}*.
    pub next_length_budget: u32,
    pub next_page_budget: u64,
}

/// The dividing policy: budgets of the active group and the access statistics.
#[derive(Clone, Debug)]
pub struct GroupDividing {
    config: DividingConfig,
    length_budget: u32,
    page_budget: u64,
    access: AccessTracker,
}

impl GroupDividing {
    pub fn new(config: DividingConfig) -> Self {
        let length_budget = config
            .initial_length
            .clamp(config.min_length.max(1), config.max_length.max(1));
        let page_budget = config.initial_page_budget.unwrap_or(u64::MAX);
        let access = AccessTracker::new(config.access_window);
        GroupDividing {
            config,
            length_budget,
            page_budget,
            access,
        }
    }

    pub fn config(&self) -> &DividingConfig {
        &self.config
    }

    /// The policy as it was after a group was split with `outcome` (the budgets a restarted
    /// process continues with; the access window starts empty).
    pub fn resume(config: DividingConfig, length_budget: u32, page_budget: u64) -> Self {
        let mut d = GroupDividing::new(config);
        d.length_budget =
            length_budget.clamp(d.config.min_length.max(1), d.config.max_length.max(1));
        d.page_budget = page_budget.max(1);
        d
    }

    /// (L_n*, O_n*) of the active group.
    pub fn budgets(&self) -> (u32, u64) {
        (self.length_budget, self.page_budget)
    }

    /// C: the recent average continuous access length (`initial_length` before any access).
    pub fn access_length(&self) -> f64 {
        self.access
            .average()
            .unwrap_or(f64::from(self.config.initial_length))
    }

    pub fn record_access(&mut self, first: crate::SnapId, last: crate::SnapId) {
        self.access.record_access(first, last);
    }

    pub fn record_access_len(&mut self, len: u64) {
        self.access.record_access_len(len);
    }

    /// The loop condition of Algorithm 1, checked after each snapshot added to the active
    /// group of `length` snapshots, `pages` mappings and `node_bytes` bytes.
    pub fn after_snapshot(&self, length: u32, pages: u64, node_bytes: usize) -> Decision {
        if pages >= self.page_budget
            || length >= self.length_budget
            || node_bytes >= self.config.max_group_bytes
        {
            Decision::Seal
        } else {
            Decision::Continue
        }
    }

    /// The tail of Algorithm 1: the group of `length` snapshots and `pages` mappings is split;
    /// sets and returns the next group's budgets.
    pub fn split(&mut self, length: u32, pages: u64) -> GroupOutcome {
        let length = length.max(1);
        let c = self.access_length();
        let rewarded = pages >= self.page_budget;
        let base = if rewarded {
            f64::from(length)
        } else {
            self.config.punish_factor * f64::from(length)
        };
        let next = base.max(c).ceil();
        let next =
            (next as u32).clamp(self.config.min_length.max(1), self.config.max_length.max(1));
        let update_ratio = pages as f64 / f64::from(length);
        let next_pages = (f64::from(next) * update_ratio).ceil().max(1.0) as u64;
        self.length_budget = next;
        self.page_budget = next_pages;
        GroupOutcome {
            length,
            pages,
            update_ratio,
            rewarded,
            next_length_budget: next,
            next_page_budget: next_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapId;

    #[test]
    fn resume_continues_with_the_saved_budgets() {
        let mut d = GroupDividing::new(DividingConfig::default());
        let out = d.split(20, 400);
        let r = GroupDividing::resume(
            DividingConfig::default(),
            out.next_length_budget,
            out.next_page_budget,
        );
        assert_eq!(r.budgets(), d.budgets());
        assert_eq!(r.after_snapshot(1, out.next_page_budget, 0), Decision::Seal);
        assert_eq!(r.after_snapshot(1, 0, 0), Decision::Continue);
    }

    #[test]
    fn access_length_is_a_sliding_average() {
        let mut t = AccessTracker::new(3);
        assert_eq!(t.average(), None);
        t.record_access(SnapId(40), SnapId(60));
        assert_eq!(t.average(), Some(21.0));
        t.record_access(SnapId(5), SnapId(5));
        t.record_access(SnapId(9), SnapId(7));
        assert_eq!(t.average(), Some(25.0 / 3.0));
        t.record_access_len(100); // pushes out the 21
        assert_eq!(t.average(), Some(104.0 / 3.0));
    }

    #[test]
    fn first_group_is_cut_by_length_then_budgets_follow_the_rate() {
        let mut p = GroupDividing::new(DividingConfig {
            initial_length: 10,
            ..Default::default()
        });
        assert_eq!(p.after_snapshot(9, 1_000_000, 0), Decision::Continue);
        assert_eq!(p.after_snapshot(10, 1_000_000, 0), Decision::Seal);
        // no accesses: C = 10; length reached with budget unused: punish 7.5 -> max(7.5, 10)
        let o = p.split(10, 500);
        assert!(!o.rewarded);
        assert_eq!((o.next_length_budget, o.next_page_budget), (10, 500));
        assert_eq!(o.update_ratio, 50.0);
    }

    #[test]
    fn reward_keeps_the_length_and_punish_shrinks_it_to_c() {
        let mut p = GroupDividing::new(DividingConfig {
            initial_length: 40,
            initial_page_budget: Some(100),
            ..Default::default()
        });
        p.record_access_len(4);
        // budget exhausted after 20 snapshots: reward, L* = max(20, 4) = 20, O* = 20 * (120/20)
        assert_eq!(p.after_snapshot(20, 120, 0), Decision::Seal);
        let o = p.split(20, 120);
        assert!(o.rewarded);
        assert_eq!((o.next_length_budget, o.next_page_budget), (20, 120));
        // the next group reaches its length with few pages: punish, 0.75 * 20 = 15
        assert_eq!(p.after_snapshot(20, 30, 0), Decision::Seal);
        let o = p.split(20, 30);
        assert!(!o.rewarded);
        assert_eq!((o.next_length_budget, o.next_page_budget), (15, 23));
        // larger recent accesses lift the length again
        p.record_access_len(200);
        let o = p.split(15, 23);
        assert_eq!(o.next_length_budget, 102); // C = (4 + 200) / 2
    }

    #[test]
    fn byte_bound_and_length_clamps() {
        let cfg = DividingConfig {
            max_group_bytes: 1000,
            max_length: 8,
            ..Default::default()
        };
        let mut p = GroupDividing::new(cfg);
        assert_eq!(p.budgets().0, 8);
        assert_eq!(p.after_snapshot(1, 1, 1000), Decision::Seal);
        p.record_access_len(1000);
        assert_eq!(p.split(3, 3).next_length_budget, 8);
    }
}
