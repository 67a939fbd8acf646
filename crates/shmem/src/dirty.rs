//! Dirty sets: which pages were written in the current span.
//!
//! Every write to a gsnap table adds its (relation, block) to the dirty set of the current span;
//! declaring a snapshot switches writers to the other set and hands the old one to the capture.
//! The structure lives in shared memory, so it is built only from atomics over memory the
//! caller provides (an ordinary `Vec` in tests, a shared-memory segment in PostgreSQL).
//!
//! Invariants:
//! - A write is never lost. If a set is too full to take a page, the page's relation is
//!   marked for *full capture*; if the list of such relations is full too, the set is marked
//!   "every relation needs a full capture". Both fallbacks are conservative.
//! - [`DirtySets::begin_span`] returns only when no writer can still be adding to the set it
//!   retired: a writer announces itself in `writers[set]` *before* it checks which set is
//!   current, and the switch waits for that counter to drop to zero after changing `current`.
//!   With sequentially consistent atomics either the writer sees the new set, or the switch
//!   sees the writer and waits for it. So the capture never drains a set that is still being
//!   filled, and a write recorded after the switch lands in the next span.
//! - Only the switching process drains and clears a retired set, and it does so before the
//!   next switch makes that set current again.

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

/// The shared header of both sets.
#[repr(C)]
pub struct SpansHeader {
    /// Index (0 or 1) of the set that receives writes.
    current: AtomicU32,
    /// Number of writers currently inside each set.
    writers: [AtomicU32; 2],
    /// Number of spans begun so far (a new span begins with each snapshot).
    spans: AtomicU64,
    sets: [SetHeader; 2],
}

impl SpansHeader {
    /// A zeroed header: set 0 is current, both sets empty.
    pub fn new() -> SpansHeader {
        // SAFETY-free construction: every field is an atomic integer whose zero is valid.
        SpansHeader {
            current: AtomicU32::new(0),
            writers: [AtomicU32::new(0), AtomicU32::new(0)],
            spans: AtomicU64::new(0),
            sets: [SetHeader::new(), SetHeader::new()],
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

/// Both dirty sets: a view over shared memory.
pub struct DirtySets<'a> {
    header: &'a SpansHeader,
    slots: [&'a [AtomicU64]; 2],
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
    /// Views `header` and two equally long slot arrays (zeroed at creation) as the dirty sets.
    ///
    /// # Panics
    /// If the slot arrays are empty or of different lengths.
    pub fn new(header: &'a SpansHeader, set0: &'a [AtomicU64], set1: &'a [AtomicU64]) -> Self {
        assert!(
            !set0.is_empty() && set0.len() == set1.len(),
            "dirty sets need equal capacity"
        );
        DirtySets {
            header,
            slots: [set0, set1],
        }
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

    /// Switches writers to the other set and returns the index of the retired one, once no
    /// writer can still add to it. `pause` is called while waiting for writers to leave.
    ///
    /// The retired set must be drained with [`DirtySets::drain`] before the next switch.
    pub fn begin_span(&self, mut pause: impl FnMut()) -> usize {
        let old = self.header.current.load(SeqCst) as usize;
        self.header.current.store((1 - old) as u32, SeqCst);
        self.header.spans.fetch_add(1, SeqCst);
        while self.header.writers[old].load(SeqCst) != 0 {
            pause();
        }
        old
    }

    /// Takes everything out of the retired set `set` and leaves it empty.
    ///
    /// Only the process that called [`DirtySets::begin_span`] may call this, for the set it
    /// returned, before switching again.
    pub fn drain(&self, set: usize) -> Drained {
        assert_ne!(
            set,
            self.header.current.load(SeqCst) as usize,
            "cannot drain the current dirty set"
        );
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

    /// The blocks of `rel` recorded so far in the current span (sorted), and whether `rel` is
    /// marked for a full capture. For diagnostics and tests; O(capacity).
    pub fn current_for(&self, rel: u32) -> (Vec<u32>, bool) {
        self.with_current(|set| {
            let blocks = self
                .recorded_in(set, |r| r == rel)
                .into_iter()
                .map(|(_, b)| b)
                .collect();
            let header = &self.header.sets[set];
            let full = header.all_full.load(SeqCst) != 0
                || header.full_relations.iter().any(|e| e.load(SeqCst) == rel);
            (blocks, full)
        })
    }

    /// The pages recorded so far in the current span, (relation, block) sorted: what the
    /// worker copies ahead of a periodic snapshot. Relations marked for a full capture are
    /// not expanded (their recorded pages are listed). O(capacity).
    pub fn current_pages(&self) -> Vec<(u32, u32)> {
        self.with_current(|set| self.recorded_in(set, |_| true))
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
        a: Vec<AtomicU64>,
        b: Vec<AtomicU64>,
    }

    fn owned(capacity: usize) -> Owned {
        Owned {
            header: SpansHeader::new(),
            a: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            b: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    impl Owned {
        fn sets(&self) -> DirtySets<'_> {
            DirtySets::new(&self.header, &self.a, &self.b)
        }

        /// The slots of `set` still in use (a drain that stops early must leave none).
        fn left_in(&self, set: usize) -> usize {
            let slots = if set == 0 { &self.a } else { &self.b };
            slots.iter().filter(|s| s.load(SeqCst) != 0).count()
        }
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
        d.record(10, 7);
        let drained = d.drain(old);
        assert_eq!(drained.pages, vec![(10, 1), (10, 3), (11, 0)]);
        assert_eq!(o.left_in(old), 0, "a drained set is empty");
        assert!(!drained.needs_full_capture(10));
        assert_eq!(d.current_for(10), (vec![7], false));
        assert_eq!(d.current_pages(), vec![(10, 7)]);
        assert_eq!(d.spans(), 1);
        // The drained set is empty again and can become current.
        let old2 = d.begin_span(|| {});
        assert_eq!(old2, 1 - old);
        assert_eq!(d.drain(old2).pages, vec![(10, 7)]);
        d.record(12, 1);
        let old3 = d.begin_span(|| {});
        assert_eq!(d.drain(old3).pages, vec![(12, 1)]);
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
        let drained = d.drain(d.begin_span(|| {}));
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
        let drained = d.drain(d.begin_span(|| {}));
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

    /// Writers race with span switches: every write lands in exactly the span it was recorded
    /// in or a later one, and nothing is lost.
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
        while handles.iter().any(|h| !h.is_finished()) {
            let old = d.begin_span(std::thread::yield_now);
            seen.extend(d.drain(old).pages);
        }
        for h in handles {
            h.join().unwrap();
        }
        let old = d.begin_span(|| {});
        seen.extend(d.drain(old).pages);
        let old = d.begin_span(|| {});
        seen.extend(d.drain(old).pages);
        assert_eq!(seen.len(), (writers * per_writer) as usize);
        assert_eq!(
            o.left_in(old),
            0,
            "the drains, ending early, left nothing behind"
        );
        assert_eq!(o.left_in(1 - old), 0);
    }
}
