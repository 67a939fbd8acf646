//! Dirty sets: which pages were written in the current span.
//!
//! Every write to a gsnap table adds its (relation, block) to the dirty set of the current span;
//! declaring a snapshot switches writers to an empty set and hands the old one to the capture.
//! A span may also be *split* once before its end ([`DirtySets::split_span`]): writers move to
//! another set while the first part of the span stays held, so the worker can copy the pages
//! written so far and later tell which of them were written again after the split (a page
//! not recorded after it is unchanged since, apart from what the design's correctness
//! argument allows: pruning, freezing, hint bits). Hence three sets: the current one, the
//! held first part of a split span, and the one that was drained last. The structure lives in
//! shared memory, so it is built only from atomics over memory the caller provides (an
//! ordinary `Vec` in tests, a shared-memory segment in PostgreSQL).
//!
//! Invariants:
//! - A write is never lost. If a set is too full to take a page, the page's relation is
//!   marked for *full capture*; if the list of such relations is full too, the set is marked
//!   "every relation needs a full capture". Both fallbacks are conservative.
//! - A switch ([`DirtySets::begin_span`], [`DirtySets::split_span`]) returns only when no
//!   writer can still be adding to the set it left: a writer announces itself in
//!   `writers[set]` *before* it checks which set is current, and the switch waits for that
//!   counter to drop to zero after changing `current`. With sequentially consistent atomics
//!   either the writer sees the new set, or the switch sees the writer and waits for it. So
//!   the capture never drains a set that is still being filled, a write recorded after the
//!   span's end lands in the next span, and a write recorded after a split lands in the
//!   split span's second part (or a later span).
//! - A switch always moves writers to a set that is neither current nor held, which is empty:
//!   only the switching process drains and clears the sets a span's end retired, and it does
//!   so before the next switch.

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Relations that one set can mark for full capture before falling back to "all relations".
pub const FULL_CAPTURE_RELATIONS: usize = 64;

/// Longest probe sequence before a page falls back to a full capture of its relation.
const MAX_PROBES: usize = 256;

/// The header of one dirty set.
#[repr(C)]
pub struct SetHeader {
    /// Number of occupied slots.
    used: AtomicU32,
    /// Relations marked for a full capture because one of their pages did not fit.
    overflowed_relations: AtomicU32,
    /// Non-zero when every relation needs a full capture.
    all_full: AtomicU32,
    /// Relations marked for full capture (0 = free entry).
    full_relations: [AtomicU32; FULL_CAPTURE_RELATIONS],
}

/// The number of dirty sets: the current one, the held first part of a split span, and a
/// drained one for the next switch.
pub const SETS: usize = 3;

/// The shared header of the sets.
#[repr(C)]
pub struct SpansHeader {
    /// Index of the set that receives writes.
    current: AtomicU32,
    /// 1 + index of the set holding the first part of the current span once it was split,
    /// 0 while it is not.
    held: AtomicU32,
    /// Number of writers currently inside each set.
    writers: [AtomicU32; SETS],
    /// Number of spans begun so far (a new span begins with each snapshot; a split does not
    /// begin one).
    spans: AtomicU64,
    sets: [SetHeader; SETS],
}

impl SpansHeader {
    /// A zeroed header: set 0 is current, every set empty, the span not split.
    pub fn new() -> SpansHeader {
        // SAFETY-free construction: every field is an atomic integer whose zero is valid.
        SpansHeader {
            current: AtomicU32::new(0),
            held: AtomicU32::new(0),
            writers: std::array::from_fn(|_| AtomicU32::new(0)),
            spans: AtomicU64::new(0),
            sets: std::array::from_fn(|_| SetHeader::new()),
        }
    }
}

impl Default for SpansHeader {
    fn default() -> Self {
        SpansHeader::new()
    }
}

impl SetHeader {
    fn new() -> SetHeader {
        SetHeader {
            used: AtomicU32::new(0),
            overflowed_relations: AtomicU32::new(0),
            all_full: AtomicU32::new(0),
            full_relations: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

/// What a retired set held: the input of one capture.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Written pages as (relation, block), sorted, without duplicates.
    pub pages: Vec<(u32, u32)>,
    /// Relations that need a full capture (sorted).
    pub full_relations: Vec<u32>,
    /// Every relation needs a full capture.
    pub all_full: bool,
    /// Relations marked for a full capture because one of their written pages did not fit
    /// (each counted once per span, however many of its writes overflowed).
    pub overflowed_relations: u32,
}

impl Drained {
    /// True if `rel` must be captured completely.
    pub fn needs_full_capture(&self, rel: u32) -> bool {
        self.all_full || self.full_relations.binary_search(&rel).is_ok()
    }
}

/// The sets a span's end retired, to be drained before the next switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    /// The first part of the span, when it was split.
    pub earlier: Option<usize>,
    /// The span's (last part's) set.
    pub last: usize,
}

/// The dirty sets: a view over shared memory.
pub struct DirtySets<'a> {
    header: &'a SpansHeader,
    slots: [&'a [AtomicU64]; SETS],
}

fn key_of(rel: u32, block: u32) -> u64 {
    (u64::from(rel) << 32) | u64::from(block)
}

fn home_slot(key: u64, capacity: usize) -> usize {
    // Fibonacci hashing spreads consecutive blocks of one relation over the table.
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((u128::from(h) * capacity as u128) >> 64) as usize
}

impl<'a> DirtySets<'a> {
    /// Views `header` and [`SETS`] equally long slot arrays (zeroed at creation) as the dirty
    /// sets.
    ///
    /// # Panics
    /// If the slot arrays are empty or of different lengths.
    pub fn new(header: &'a SpansHeader, slots: [&'a [AtomicU64]; SETS]) -> Self {
        assert!(
            !slots[0].is_empty() && slots.iter().all(|s| s.len() == slots[0].len()),
            "dirty sets need equal capacity"
        );
        DirtySets { header, slots }
    }

    /// Slots per set.
    pub fn capacity(&self) -> usize {
        self.slots[0].len()
    }

    /// Number of spans begun so far.
    pub fn spans(&self) -> u64 {
        self.header.spans.load(SeqCst)
    }

    /// Runs `f` on the current set, registered as a writer so a concurrent switch waits.
    fn with_current<R>(&self, f: impl FnOnce(usize) -> R) -> R {
        let set = loop {
            let set = self.header.current.load(SeqCst) as usize;
            self.header.writers[set].fetch_add(1, SeqCst);
            if self.header.current.load(SeqCst) as usize == set {
                break set;
            }
            self.header.writers[set].fetch_sub(1, SeqCst);
        };
        let result = f(set);
        self.header.writers[set].fetch_sub(1, SeqCst);
        result
    }

    /// Records that `block` of `rel` was written in the current span. Never fails.
    pub fn record(&self, rel: u32, block: u32) {
        debug_assert!(rel != 0, "relation 0 is not a relation");
        self.with_current(|set| {
            if !self.insert(set, key_of(rel, block)) && self.mark_full_in(set, rel) {
                self.header.sets[set]
                    .overflowed_relations
                    .fetch_add(1, SeqCst);
            }
        });
    }

    /// Marks `rel` for a full capture at the end of the current span.
    pub fn mark_full(&self, rel: u32) {
        self.with_current(|set| {
            self.mark_full_in(set, rel);
        });
    }

    fn insert(&self, set: usize, key: u64) -> bool {
        let slots = self.slots[set];
        let header = &self.header.sets[set];
        let capacity = slots.len();
        let mut i = home_slot(key, capacity);
        for _ in 0..MAX_PROBES.min(capacity) {
            match slots[i].load(SeqCst) {
                k if k == key => return true,
                0 => {
                    // Keep a seventh of the table free so probe sequences stay short.
                    if header.used.load(SeqCst) as usize >= capacity - capacity / 8 {
                        return false;
                    }
                    match slots[i].compare_exchange(0, key, SeqCst, SeqCst) {
                        Ok(_) => {
                            header.used.fetch_add(1, SeqCst);
                            return true;
                        }
                        Err(k) if k == key => return true,
                        Err(_) => {}
                    }
                }
                _ => {}
            }
            i = (i + 1) % capacity;
        }
        false
    }

    /// Marks `rel` for a full capture in `set`; true if it was not marked before (an
    /// overflow of the mark table marks every relation, once).
    fn mark_full_in(&self, set: usize, rel: u32) -> bool {
        let header = &self.header.sets[set];
        for entry in &header.full_relations {
            match entry.compare_exchange(0, rel, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(r) if r == rel => return false,
                Err(_) => {}
            }
        }
        header.all_full.swap(1, SeqCst) == 0
    }

    /// Ends the current span: switches writers to an empty set and returns the sets the span
    /// filled, once no writer can still add to them. `pause` is called while waiting for
    /// writers to leave.
    ///
    /// Both retired sets must be drained with [`DirtySets::drain`] before the next switch.
    pub fn begin_span(&self, pause: impl FnMut()) -> Retired {
        let earlier = self.held();
        let last = self.switch(pause, false);
        Retired { earlier, last }
    }

    /// Splits the current span (once): writers move to an empty set while the pages recorded
    /// so far stay held, as the span's first part, until the span ends. Returns the pages
    /// of the first part, sorted, once no writer can still add to it; a page written again
    /// after the split is also recorded in the second part. If the span is split already,
    /// the first part's pages (the second part goes on).
    pub fn split_span(&self, pause: impl FnMut()) -> Vec<(u32, u32)> {
        let held = match self.held() {
            Some(held) => held,
            None => self.switch(pause, true),
        };
        self.recorded_in(held, |_| true)
    }

    /// The set holding the first part of a split span.
    fn held(&self) -> Option<usize> {
        match self.header.held.load(SeqCst) {
            0 => None,
            h => Some(h as usize - 1),
        }
    }

    /// Moves writers from the current set to the set that is neither current nor held, which
    /// is empty, and returns the old set once no writer is in it. `hold`: a split, which holds
    /// the old set as the span's first part (the span must not be split yet); else the end
    /// of the span, which lets the held set go (the caller drains it).
    fn switch(&self, mut pause: impl FnMut(), hold: bool) -> usize {
        let old = self.header.current.load(SeqCst) as usize;
        let held = self.held();
        debug_assert!(!(hold && held.is_some()), "a span is split once");
        let next = (0..SETS)
            .find(|&s| s != old && Some(s) != held)
            .expect("three sets leave one free");
        debug_assert_eq!(
            self.header.sets[next].used.load(SeqCst),
            0,
            "the next set was drained"
        );
        if hold {
            // Held before writers leave it, so that a look at the span (`current_for`) in
            // between sees its pages twice rather than not at all.
            self.header.held.store(old as u32 + 1, SeqCst);
            self.header.current.store(next as u32, SeqCst);
        } else {
            self.header.current.store(next as u32, SeqCst);
            self.header.held.store(0, SeqCst);
            self.header.spans.fetch_add(1, SeqCst);
        }
        while self.header.writers[old].load(SeqCst) != 0 {
            pause();
        }
        old
    }

    /// Takes everything out of the retired set `set` and leaves it empty.
    ///
    /// Only the process that called [`DirtySets::begin_span`] may call this, for the sets it
    /// returned, before switching again.
    pub fn drain(&self, set: usize) -> Drained {
        assert_ne!(
            set,
            self.header.current.load(SeqCst) as usize,
            "cannot drain the current dirty set"
        );
        assert_ne!(Some(set), self.held(), "cannot drain the held dirty set");
        let header = &self.header.sets[set];
        // The set is retired: no writer records into it any more, so `used` is the number of
        // used slots (a writer counts a slot after claiming it), and the scan ends when it
        // has found them all: an idle span's set is not read at all.
        let used = header.used.load(SeqCst) as usize;
        let mut pages = Vec::with_capacity(used);
        // A plain load finds the used slots, and only those are written (most of a large set
        // is empty, and an atomic swap of every slot costs several times a sequential read).
        for slot in self.slots[set] {
            if pages.len() == used {
                break;
            }
            let key = slot.load(Relaxed);
            if key != 0 {
                slot.store(0, Relaxed);
                pages.push(((key >> 32) as u32, key as u32));
            }
        }
        std::sync::atomic::fence(SeqCst);
        pages.sort_unstable();
        let mut full_relations: Vec<u32> = header
            .full_relations
            .iter()
            .map(|e| e.swap(0, SeqCst))
            .filter(|&r| r != 0)
            .collect();
        full_relations.sort_unstable();
        header.used.store(0, SeqCst);
        Drained {
            pages,
            full_relations,
            all_full: header.all_full.swap(0, SeqCst) != 0,
            overflowed_relations: header.overflowed_relations.swap(0, SeqCst),
        }
    }

    /// The blocks of `rel` recorded so far in the current span, both parts of it if it was
    /// split (sorted, distinct), and whether `rel` is marked for a full capture. For
    /// diagnostics and estimates; O(capacity).
    pub fn current_for(&self, rel: u32) -> (Vec<u32>, bool) {
        let (pages, full) = self.span(|r| r == rel);
        (pages.into_iter().map(|(_, b)| b).collect(), full)
    }

    /// The pages recorded so far in the current span, both parts of it if it was split,
    /// (relation, block) sorted and distinct. Relations marked for a full capture are not
    /// expanded (their recorded pages are listed). O(capacity). For the tests: the worker
    /// takes its copy list from [`DirtySets::split_span`].
    #[cfg(test)]
    pub fn current_pages(&self) -> Vec<(u32, u32)> {
        self.span(|_| true).0
    }

    /// The pages recorded since the current span was split (its second part so far), sorted;
    /// none if it was not split. O(capacity).
    pub fn second_part_pages(&self) -> Vec<(u32, u32)> {
        self.with_current(|set| match self.held() {
            Some(held) if held != set => self.recorded_in(set, |_| true),
            _ => Vec::new(),
        })
    }

    /// The pages of the current span whose relation `rel` accepts, and whether one of them
    /// is marked for a full capture.
    fn span(&self, rel: impl Fn(u32) -> bool) -> (Vec<(u32, u32)>, bool) {
        self.with_current(|set| {
            let parts = [Some(set), self.held().filter(|&h| h != set)];
            let mut pages = Vec::new();
            let mut full = false;
            for part in parts.into_iter().flatten() {
                pages.extend(self.recorded_in(part, &rel));
                let header = &self.header.sets[part];
                full |= header.all_full.load(SeqCst) != 0
                    || header
                        .full_relations
                        .iter()
                        .any(|e| matches!(e.load(SeqCst), r if r != 0 && rel(r)));
            }
            pages.sort_unstable();
            pages.dedup();
            (pages, full)
        })
    }

    /// The pages recorded in `set` whose relation `rel` accepts, sorted.
    fn recorded_in(&self, set: usize, rel: impl Fn(u32) -> bool) -> Vec<(u32, u32)> {
        let mut pages: Vec<(u32, u32)> = self.slots[set]
            .iter()
            .map(|s| s.load(SeqCst))
            .filter(|&k| k != 0 && rel((k >> 32) as u32))
            .map(|k| ((k >> 32) as u32, k as u32))
            .collect();
        pages.sort_unstable();
        pages
    }

    /// Occupied slots of the current set (for the fill-level statistics).
    pub fn current_used(&self) -> u32 {
        self.with_current(|set| self.header.sets[set].used.load(SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    struct Owned {
        header: SpansHeader,
        slots: [Vec<AtomicU64>; SETS],
    }

    fn owned(capacity: usize) -> Owned {
        Owned {
            header: SpansHeader::new(),
            slots: std::array::from_fn(|_| (0..capacity).map(|_| AtomicU64::new(0)).collect()),
        }
    }

    impl Owned {
        fn sets(&self) -> DirtySets<'_> {
            DirtySets::new(&self.header, std::array::from_fn(|i| &self.slots[i][..]))
        }

        /// The slots of `set` still in use (a drain that stops early must leave none).
        fn left_in(&self, set: usize) -> usize {
            self.slots[set]
                .iter()
                .filter(|s| s.load(SeqCst) != 0)
                .count()
        }
    }

    /// Ends the span and drains what it retired: (first part if split, last part).
    fn end_span(d: &DirtySets<'_>) -> (Option<Drained>, Drained) {
        let r = d.begin_span(|| {});
        (r.earlier.map(|s| d.drain(s)), d.drain(r.last))
    }

    #[test]
    fn records_distinct_pages_per_span() {
        let o = owned(1024);
        let d = o.sets();
        d.record(10, 3);
        d.record(10, 3);
        d.record(10, 1);
        d.record(11, 0);
        assert_eq!(d.current_for(10), (vec![1, 3], false));
        assert_eq!(d.current_pages(), vec![(10, 1), (10, 3), (11, 0)]);
        let old = d.begin_span(|| {});
        assert_eq!(old.earlier, None, "the span was not split");
        d.record(10, 7);
        let drained = d.drain(old.last);
        assert_eq!(drained.pages, vec![(10, 1), (10, 3), (11, 0)]);
        assert_eq!(o.left_in(old.last), 0, "a drained set is empty");
        assert!(!drained.needs_full_capture(10));
        assert_eq!(d.current_for(10), (vec![7], false));
        assert_eq!(d.current_pages(), vec![(10, 7)]);
        assert_eq!(d.spans(), 1);
        // The drained set is empty again and can become current.
        let (_, second) = end_span(&d);
        assert_eq!(second.pages, vec![(10, 7)]);
        d.record(12, 1);
        let (_, third) = end_span(&d);
        assert_eq!(third.pages, vec![(12, 1)]);
        assert_eq!(d.spans(), 3);
    }

    #[test]
    fn a_split_span_tells_the_pages_written_again_after_the_split() {
        let o = owned(1024);
        let d = o.sets();
        d.record(10, 1);
        d.record(10, 2);
        d.record(11, 5);
        assert_eq!(d.second_part_pages(), vec![], "not split");
        let first = d.split_span(|| {});
        assert_eq!(first, vec![(10, 1), (10, 2), (11, 5)]);
        assert_eq!(d.spans(), 0, "a split begins no span");
        d.record(10, 2); // written again after the split
        d.record(10, 9);
        d.mark_full(12);
        assert_eq!(d.second_part_pages(), vec![(10, 2), (10, 9)]);
        // The span is both parts.
        assert_eq!(d.current_for(10), (vec![1, 2, 9], false));
        assert_eq!(d.current_for(12), (vec![], true));
        assert_eq!(d.current_pages(), vec![(10, 1), (10, 2), (10, 9), (11, 5)]);
        // A second split goes on with the same parts.
        assert_eq!(d.split_span(|| {}), first);
        d.record(11, 6);
        let (earlier, last) = end_span(&d);
        assert_eq!(earlier.expect("split").pages, first);
        assert_eq!(last.pages, vec![(10, 2), (10, 9), (11, 6)]);
        assert!(last.needs_full_capture(12));
        assert_eq!(d.spans(), 1);
        for set in 0..SETS {
            assert_eq!(o.left_in(set), 0, "set {set} drained");
        }
        // The next spans, split or not, rotate through the sets.
        for round in 0..6u32 {
            d.record(20, round);
            if round % 2 == 0 {
                assert_eq!(d.split_span(|| {}), vec![(20, round)]);
                d.record(20, 100 + round);
            }
            let (earlier, last) = end_span(&d);
            if round % 2 == 0 {
                assert_eq!(earlier.expect("split").pages, vec![(20, round)]);
                assert_eq!(last.pages, vec![(20, 100 + round)]);
            } else {
                assert!(earlier.is_none());
                assert_eq!(last.pages, vec![(20, round)]);
            }
            assert_eq!(d.current_pages(), vec![]);
        }
    }

    #[test]
    #[should_panic(expected = "cannot drain the held dirty set")]
    fn draining_the_held_set_is_refused() {
        let o = owned(8);
        let d = o.sets();
        d.record(1, 1);
        d.split_span(|| {});
        d.drain(0);
    }

    #[test]
    fn overflow_falls_back_to_full_capture_never_losing_a_page() {
        let o = owned(16);
        let d = o.sets();
        d.record(6, 1);
        for _ in 0..3 {
            for b in 0..100 {
                d.record(5, b);
            }
        }
        let (_, drained) = end_span(&d);
        assert_eq!(
            drained.overflowed_relations, 1,
            "one relation overflowed, however many of its writes did not fit"
        );
        assert!(drained.needs_full_capture(5));
        // Every page is either listed or covered by its relation's full capture.
        let listed: BTreeSet<_> = drained.pages.iter().copied().collect();
        for b in 0..100 {
            assert!(listed.contains(&(5, b)) || drained.needs_full_capture(5));
        }
        assert!(listed.contains(&(6, 1)) || drained.needs_full_capture(6));
    }

    #[test]
    fn too_many_full_relations_means_all() {
        let o = owned(64);
        let d = o.sets();
        for rel in 1..=(FULL_CAPTURE_RELATIONS as u32 + 1) {
            d.mark_full(rel);
        }
        let (_, drained) = end_span(&d);
        assert!(drained.all_full);
        assert!(drained.needs_full_capture(9999));
    }

    #[test]
    #[should_panic(expected = "cannot drain the current dirty set")]
    fn draining_the_current_set_is_refused() {
        let o = owned(8);
        let d = o.sets();
        d.drain(0);
    }

    /// Writers race with span switches and splits: every write lands in exactly the span it
    /// was recorded in or a later one, and nothing is lost.
    #[test]
    fn concurrent_writers_and_switches_lose_nothing() {
        let o = Arc::new(owned(1 << 16));
        let writers = 4;
        let per_writer = 5000u32;
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let o = Arc::clone(&o);
                std::thread::spawn(move || {
                    let d = o.sets();
                    for b in 0..per_writer {
                        d.record(w + 1, b);
                    }
                })
            })
            .collect();
        let d = o.sets();
        let mut seen = BTreeSet::new();
        let mut split = false;
        while handles.iter().any(|h| !h.is_finished()) {
            // Every other span is split in the middle.
            split = !split;
            if split {
                let first = d.split_span(std::thread::yield_now);
                let (earlier, last) = end_span(&d);
                assert_eq!(earlier.expect("split").pages, first);
                seen.extend(first);
                seen.extend(last.pages);
            } else {
                seen.extend(end_span(&d).1.pages);
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        seen.extend(end_span(&d).1.pages);
        seen.extend(end_span(&d).1.pages);
        assert_eq!(seen.len(), (writers * per_writer) as usize);
        for set in 0..SETS {
            assert_eq!(
                o.left_in(set),
                0,
                "the drains, ending early, left nothing behind"
            );
        }
    }

    /// A write finished before a split began is in the split span's first part, and a write
    /// begun after the split returned is not (it is in the second part).
    #[test]
    fn a_split_holds_exactly_the_writes_before_it() {
        let o = Arc::new(owned(1 << 16));
        let done = Arc::new(AtomicU32::new(0));
        let total = 20_000u32;
        let writer = {
            let (o, done) = (Arc::clone(&o), Arc::clone(&done));
            std::thread::spawn(move || {
                let d = o.sets();
                for b in 0..total {
                    d.record(1, b);
                    done.store(b + 1, SeqCst);
                }
            })
        };
        let d = o.sets();
        let mut splits = 0;
        while !writer.is_finished() {
            let before = done.load(SeqCst);
            let first = d.split_span(std::thread::yield_now);
            let after = done.load(SeqCst);
            let (earlier, last) = end_span(&d);
            let earlier = earlier.expect("split").pages;
            assert_eq!(earlier, first);
            let span_start = [first.first(), last.pages.first()]
                .into_iter()
                .flatten()
                .map(|p| p.1)
                .min();
            if let Some(start) = span_start {
                // Writes of this span finished before the split: in its first part.
                for b in start..before {
                    assert!(
                        first.binary_search(&(1, b)).is_ok(),
                        "write {b} before the split"
                    );
                }
            }
            // Writes begun after the split returned: in the second part only.
            assert!(
                first.iter().all(|p| p.1 <= after),
                "a later write in the first part"
            );
            splits += 1;
        }
        writer.join().unwrap();
        assert!(splits > 0);
    }
}
