//! Index group checking (GSnap section 4.3, Algorithm 2): which groups a request for
//! snapshots `first..=last` needs, and which of them must still be loaded.
//!
//! How we read Algorithm 2: its inputs are AL (the sorted (first, last) spans of the groups,
//! with which are loaded) and NL (the requested span); its outputs are `covered` (the loaded
//! groups already hold every snapshot of the request) and NS (the snapshot segments that must
//! be loaded). The paper's loop compares NL against each span; here the spans are sorted and
//! disjoint, so the overlapping groups are one contiguous run found by binary search, NS is
//! the spans of the unloaded groups in that run (clipped to the request, adjacent ones
//! coalesced), and `covered` is "NS is empty". Requested ids that no group holds (deleted or
//! never taken) need nothing.

use crate::error::IndexError;
use crate::types::SnapId;
use std::ops::Range;

/// The snapshots a group holds: `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSpan {
    pub first: SnapId,
    pub last: SnapId,
}

/// What a request needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadPlan {
    /// Indexes (into the span list) of every group holding snapshots of the request.
    pub groups: Range<usize>,
    /// The subset of `groups` not loaded yet, ascending.
    pub to_load: Vec<usize>,
    /// NS: the requested snapshot segments those groups hold.
    pub segments: Vec<(SnapId, SnapId)>,
    /// Whether the loaded groups already cover the request.
    pub covered: bool,
}

/// Plans the loads for a request over `first..=last` (Algorithm 2). `groups` must be sorted
/// and disjoint; `loaded(i)` tells whether group `i` is in memory.
pub fn plan_load(
    groups: &[GroupSpan],
    loaded: &dyn Fn(usize) -> bool,
    first: SnapId,
    last: SnapId,
) -> Result<LoadPlan, IndexError> {
    if first > last {
        return Err(IndexError::InvalidArgument(
            "the first snapshot of a request is after its last",
        ));
    }
    for (i, g) in groups.iter().enumerate() {
        if g.first > g.last || (i > 0 && groups[i - 1].last >= g.first) {
            return Err(IndexError::InvalidArgument(
                "group spans are not sorted and disjoint",
            ));
        }
    }
    let start = groups.partition_point(|g| g.last < first);
    let end = groups.partition_point(|g| g.first <= last);
    let end = end.max(start);
    let to_load: Vec<usize> = (start..end).filter(|&i| !loaded(i)).collect();
    let mut segments: Vec<(SnapId, SnapId)> = Vec::new();
    let mut prev: Option<usize> = None;
    for &i in &to_load {
        let seg = (groups[i].first.max(first), groups[i].last.min(last));
        match (prev, segments.last_mut()) {
            (Some(p), Some(s)) if p + 1 == i => s.1 = seg.1,
            _ => segments.push(seg),
        }
        prev = Some(i);
    }
    Ok(LoadPlan {
        groups: start..end,
        covered: to_load.is_empty(),
        to_load,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans() -> Vec<GroupSpan> {
        [(1, 10), (11, 20), (21, 30), (35, 40)]
            .iter()
            .map(|&(a, b)| GroupSpan {
                first: SnapId(a),
                last: SnapId(b),
            })
            .collect()
    }

    #[test]
    fn a_request_inside_a_loaded_group_is_covered() {
        let p = plan_load(&spans(), &|i| i == 1, SnapId(12), SnapId(18)).unwrap();
        assert_eq!(p.groups, 1..2);
        assert!(p.covered && p.to_load.is_empty() && p.segments.is_empty());
    }

    #[test]
    fn unloaded_groups_are_listed_and_their_segments_coalesced() {
        let p = plan_load(&spans(), &|i| i == 3, SnapId(5), SnapId(37)).unwrap();
        assert_eq!(p.groups, 0..4);
        assert_eq!(p.to_load, vec![0, 1, 2]);
        assert_eq!(p.segments, vec![(SnapId(5), SnapId(30))]);
        assert!(!p.covered);
        let p = plan_load(&spans(), &|i| i == 1, SnapId(5), SnapId(37)).unwrap();
        assert_eq!(
            p.segments,
            vec![(SnapId(5), SnapId(10)), (SnapId(21), SnapId(37))]
        );
    }

    #[test]
    fn gaps_and_bad_input() {
        let p = plan_load(&spans(), &|_| false, SnapId(31), SnapId(34)).unwrap();
        assert!(p.groups.is_empty() && p.covered);
        let p = plan_load(&spans(), &|_| false, SnapId(41), SnapId(99)).unwrap();
        assert!(p.groups.is_empty());
        assert!(plan_load(&spans(), &|_| false, SnapId(9), SnapId(3)).is_err());
        let mut bad = spans();
        bad.swap(0, 1);
        assert!(plan_load(&bad, &|_| false, SnapId(1), SnapId(3)).is_err());
    }
}
