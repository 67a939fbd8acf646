//! The index of the shared image cache: which cache slot holds which stored object.
//!
//! The cache keeps recently read page images and TOAST chunks (each at most one slot of bytes)
//! so that repeated reads of the same snapshots need no trip to the store. It is also how
//! bulk answers reach a backend: the worker loads the objects a backend asked for into slots
//! *pinned* on the backend's behalf, and the backend reads them in place and unpins them.
//!
//! This module manages only the metadata (keys, pins, the clock hand, the hash table); the
//! bytes live beside it in shared memory and are written by the caller. Every method runs
//! under the caller's exclusive lock, except that the bytes of a pinned slot may be read
//! without the lock: a pinned slot is never evicted or rewritten. A slot reserved with
//! [`CacheIndex::insert_loading`] is written by its loader *without* the lock: until
//! [`CacheIndex::finish_loading`] no lookup finds it (a miss), so nobody reads it half
//! written, and its loader's pin keeps it from eviction. A slot pinned by one process only
//! can be turned into a loading slot for another key ([`CacheIndex::rekey_loading`]): how a
//! backend that decompresses an image from its stored record keeps the image in its place.
//!
//! Invariants:
//! - a key is in at most one slot, and the hash table finds exactly the occupied slots;
//! - a slot with pins > 0 is never chosen for eviction;
//! - eviction is CLOCK (second chance): a hit sets the slot's reference bit, the hand clears
//!   it on its first pass and evicts on the second.

/// What a cache slot holds: a page image (`sub == 0`) or TOAST chunk `sub - 1` of value `id`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CacheKey {
    /// Image id or TOAST value id.
    pub id: u64,
    /// 0 for an image, chunk number + 1 for a TOAST chunk.
    pub sub: u32,
}

impl CacheKey {
    /// The key of a page image.
    pub fn image(id: u64) -> CacheKey {
        CacheKey { id, sub: 0 }
    }

    /// The key of chunk `chunk` of a TOAST value.
    pub fn toast_chunk(id: u64, chunk: u32) -> CacheKey {
        CacheKey { id, sub: chunk + 1 }
    }

    fn hash(&self) -> u64 {
        (self.id ^ (u64::from(self.sub) << 40).rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// Per-slot metadata.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SlotMeta {
    key: CacheKey,
    /// Number of valid bytes in the slot.
    len: u32,
    /// Readers (backends) that hold the slot.
    pins: u32,
    /// 0 free, [`OCCUPIED`] while it holds an object, [`LOADING`] while its object is being
    /// written by its loader.
    used: u8,
    /// CLOCK reference bit.
    referenced: u8,
}

/// Counters of the cache (for `gsnap_index_stats()` and benchmarks).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found their object.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Objects inserted.
    pub inserts: u64,
    /// Objects evicted to make room.
    pub evictions: u64,
}

/// The fixed part of the cache index.
#[repr(C)]
#[derive(Debug, Default)]
pub struct CacheHeader {
    hand: u32,
    used: u32,
    stats: CacheStats,
}

/// Free entry in the hash table.
const EMPTY: u32 = u32::MAX;

/// A slot holding its object.
const OCCUPIED: u8 = 1;

/// A slot reserved for an object its loader is still writing.
const LOADING: u8 = 2;

/// Why an object could not be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheError {
    /// Every slot is pinned.
    AllPinned,
    /// The key's object is being loaded by someone else: ask again later.
    Loading,
}

/// The cache index over caller-provided metadata arrays.
pub struct CacheIndex<'a> {
    header: &'a mut CacheHeader,
    slots: &'a mut [SlotMeta],
    /// Open-addressing table of slot numbers, at least twice as long as `slots`.
    table: &'a mut [u32],
}

impl<'a> CacheIndex<'a> {
    /// Table entries needed for `slots` slots.
    pub fn table_len(slots: usize) -> usize {
        (slots * 2).next_power_of_two()
    }

    /// Views the arrays as a cache index. `init` clears them (first use after allocation).
    ///
    /// # Panics
    /// If `slots` is empty or `table` is shorter than [`CacheIndex::table_len`].
    pub fn new(
        header: &'a mut CacheHeader,
        slots: &'a mut [SlotMeta],
        table: &'a mut [u32],
        init: bool,
    ) -> Self {
        assert!(!slots.is_empty() && table.len() >= Self::table_len(slots.len()));
        if init {
            *header = CacheHeader::default();
            slots.fill(SlotMeta::default());
            table.fill(EMPTY);
        }
        CacheIndex {
            header,
            slots,
            table,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Occupied slots.
    pub fn used(&self) -> usize {
        self.header.used as usize
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        self.header.stats
    }

    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    fn find(&self, key: &CacheKey) -> Result<usize, usize> {
        let mut i = key.hash() as usize & self.mask();
        loop {
            match self.table[i] {
                EMPTY => return Err(i),
                s if self.slots[s as usize].key == *key => return Ok(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    /// Finds `key` and pins its slot; returns the slot and the object's length. An object
    /// still being loaded is not found.
    pub fn lookup_pin(&mut self, key: &CacheKey) -> Option<(usize, usize)> {
        match self.find(key) {
            Ok(i) if self.slots[self.table[i] as usize].used == OCCUPIED => {
                let s = self.table[i] as usize;
                let meta = &mut self.slots[s];
                meta.pins += 1;
                meta.referenced = 1;
                self.header.stats.hits += 1;
                Some((s, meta.len as usize))
            }
            _ => {
                self.header.stats.misses += 1;
                None
            }
        }
    }

    /// True if `key` is cached or being loaded (no pin, no statistics).
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.find(key).is_ok()
    }

    /// Reserves a slot for `key` (of `len` bytes), pinned once, evicting an unpinned slot if
    /// needed. The caller then writes the bytes into the returned slot (holding the lock). If
    /// `key` is already cached, its slot is pinned and returned with `false` (nothing to
    /// write); if it is being loaded, [`CacheError::Loading`].
    pub fn insert_pinned(
        &mut self,
        key: CacheKey,
        len: usize,
    ) -> Result<(usize, bool), CacheError> {
        self.insert(key, len, OCCUPIED)
    }

    /// Like [`CacheIndex::insert_pinned`], but a new slot is *loading*: its loader writes the
    /// bytes without holding the lock, then calls [`CacheIndex::finish_loading`] (or
    /// [`CacheIndex::discard`] if the load failed); until then lookups miss it. An object
    /// found cached (`false`) must not be written.
    pub fn insert_loading(
        &mut self,
        key: CacheKey,
        len: usize,
    ) -> Result<(usize, bool), CacheError> {
        self.insert(key, len, LOADING)
    }

    /// Makes the object its loader wrote into slot `s` visible to lookups.
    ///
    /// # Panics
    /// If slot `s` is not loading.
    pub fn finish_loading(&mut self, s: usize) {
        assert_eq!(self.slots[s].used, LOADING, "cache slot {s} is not loading");
        self.slots[s].used = OCCUPIED;
    }

    /// Turns slot `s`, whose object the caller alone pins, into a *loading* slot for `key`:
    /// the old object is gone, and the caller writes `key`'s bytes into the slot without the
    /// lock, then calls [`CacheIndex::finish_loading_as`] (or [`CacheIndex::discard`]).
    /// False, and nothing changes, if someone else pins the slot too, the slot is not
    /// occupied, or `key` is already cached or being loaded.
    pub fn rekey_loading(&mut self, s: usize, key: CacheKey) -> bool {
        let meta = self.slots[s];
        if meta.pins != 1 || meta.used != OCCUPIED || self.find(&key).is_ok() {
            return false;
        }
        self.remove_from_table(s);
        self.slots[s].key = key;
        self.slots[s].used = LOADING;
        let i = self.find(&key).expect_err("key was absent");
        self.table[i] = s as u32;
        true
    }

    /// Like [`CacheIndex::finish_loading`], for an object of `len` bytes (a slot reserved by
    /// [`CacheIndex::rekey_loading`] kept the old object's length).
    ///
    /// # Panics
    /// If slot `s` is not loading.
    pub fn finish_loading_as(&mut self, s: usize, len: usize) {
        self.finish_loading(s);
        self.slots[s].len = u32::try_from(len).expect("cached objects are small");
    }

    fn insert(
        &mut self,
        key: CacheKey,
        len: usize,
        state: u8,
    ) -> Result<(usize, bool), CacheError> {
        if let Ok(i) = self.find(&key) {
            let s = self.table[i] as usize;
            if self.slots[s].used == LOADING {
                return Err(CacheError::Loading);
            }
            self.slots[s].pins += 1;
            self.slots[s].referenced = 1;
            return Ok((s, false));
        }
        let victim = self.choose_victim()?;
        if self.slots[victim].used != 0 {
            self.remove_from_table(victim);
            self.header.stats.evictions += 1;
        } else {
            self.header.used += 1;
        }
        self.slots[victim] = SlotMeta {
            key,
            len: u32::try_from(len).expect("cached objects are small"),
            pins: 1,
            used: state,
            referenced: 1,
        };
        let i = self.find(&key).expect_err("key was absent");
        self.table[i] = victim as u32;
        self.header.stats.inserts += 1;
        Ok((victim, true))
    }

    fn choose_victim(&mut self) -> Result<usize, CacheError> {
        let n = self.slots.len();
        // Two full turns of the clock: the first clears reference bits.
        for _ in 0..2 * n + 1 {
            let s = self.header.hand as usize % n;
            self.header.hand = ((s + 1) % n) as u32;
            let meta = &mut self.slots[s];
            if meta.used == 0 {
                return Ok(s);
            }
            if meta.pins > 0 {
                continue;
            }
            if meta.referenced != 0 {
                meta.referenced = 0;
                continue;
            }
            return Ok(s);
        }
        Err(CacheError::AllPinned)
    }

    /// Deletes slot `s` from the hash table, shifting later entries of its probe run back.
    fn remove_from_table(&mut self, s: usize) {
        let key = self.slots[s].key;
        let Ok(mut hole) = self.find(&key) else {
            unreachable!("an occupied slot is in the table")
        };
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let t = self.table[j];
            if t == EMPTY {
                break;
            }
            let home = self.slots[t as usize].key.hash() as usize & mask;
            // Move t into the hole if its home is not cyclically in (hole, j].
            let in_range = if hole <= j {
                home > hole && home <= j
            } else {
                home > hole || home <= j
            };
            if !in_range {
                self.table[hole] = t;
                hole = j;
            }
        }
        self.table[hole] = EMPTY;
    }

    /// The key of the object slot `s` holds (the caller holds a pin on it).
    pub fn key_of(&self, s: usize) -> CacheKey {
        self.slots[s].key
    }

    /// Releases one pin of slot `s`.
    ///
    /// # Panics
    /// If the slot is not pinned (a pin was released twice).
    pub fn unpin(&mut self, s: usize) {
        let meta = &mut self.slots[s];
        assert!(
            meta.pins > 0,
            "cache slot {s} unpinned more often than pinned"
        );
        meta.pins -= 1;
    }

    /// Drops slot `s`'s object (after a failed load). The slot must be pinned exactly once.
    pub fn discard(&mut self, s: usize) {
        assert_eq!(self.slots[s].pins, 1, "only the loader may discard a slot");
        self.remove_from_table(s);
        self.slots[s] = SlotMeta::default();
        self.header.used -= 1;
    }

    /// Total pins held (diagnostics and leak tests).
    pub fn total_pins(&self) -> u64 {
        self.slots.iter().map(|m| u64::from(m.pins)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    struct Owned {
        header: CacheHeader,
        slots: Vec<SlotMeta>,
        table: Vec<u32>,
    }

    fn owned(n: usize) -> Owned {
        Owned {
            header: CacheHeader::default(),
            slots: vec![SlotMeta::default(); n],
            table: vec![0; CacheIndex::table_len(n)],
        }
    }

    impl Owned {
        fn index(&mut self, init: bool) -> CacheIndex<'_> {
            CacheIndex::new(&mut self.header, &mut self.slots, &mut self.table, init)
        }
    }

    #[test]
    fn insert_lookup_unpin() {
        let mut o = owned(4);
        let mut c = o.index(true);
        assert_eq!(c.lookup_pin(&CacheKey::image(7)), None);
        let (s, fresh) = c.insert_pinned(CacheKey::image(7), 100).unwrap();
        assert!(fresh);
        let (s2, len) = c.lookup_pin(&CacheKey::image(7)).unwrap();
        assert_eq!((s2, len), (s, 100));
        assert_eq!(c.total_pins(), 2);
        c.unpin(s);
        c.unpin(s);
        // An image and a TOAST chunk of the same id are different objects.
        assert!(!c.contains(&CacheKey::toast_chunk(7, 0)));
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.stats().misses, 1);
    }

    #[test]
    fn a_loading_slot_is_missed_until_finished_and_never_evicted() {
        let mut o = owned(2);
        let mut c = o.index(true);
        let (s, fresh) = c.insert_loading(CacheKey::image(5), 300).unwrap();
        assert!(fresh);
        // Half written: a lookup misses it, another loader is told to ask again later, but
        // it counts as cached for prefetching.
        assert_eq!(c.lookup_pin(&CacheKey::image(5)), None);
        assert_eq!(
            c.insert_loading(CacheKey::image(5), 300),
            Err(CacheError::Loading)
        );
        assert!(c.contains(&CacheKey::image(5)));
        // The loader's pin keeps it: the other slot is the only one to give.
        let (t, _) = c.insert_pinned(CacheKey::image(6), 1).unwrap();
        assert_ne!(t, s);
        c.unpin(t);
        let (u, _) = c.insert_pinned(CacheKey::image(7), 1).unwrap();
        assert_eq!(u, t, "the loading slot was not evicted");
        assert_eq!(
            c.insert_pinned(CacheKey::image(8), 1),
            Err(CacheError::AllPinned)
        );
        c.finish_loading(s);
        assert_eq!(c.lookup_pin(&CacheKey::image(5)), Some((s, 300)));
        c.unpin(s);
        c.unpin(s);
        // A failed load gives its slot back.
        let (f, fresh) = c.insert_loading(CacheKey::image(9), 10).unwrap();
        assert!(fresh && f == s);
        c.discard(f);
        assert!(!c.contains(&CacheKey::image(9)));
        assert_eq!(c.total_pins(), 1);
    }

    #[test]
    fn a_slot_its_only_pinner_rekeys_holds_the_new_object_once_finished() {
        let mut o = owned(4);
        let mut c = o.index(true);
        let record = CacheKey::image(5 | 1 << 62);
        let (s, _) = c.insert_pinned(record, 300).unwrap();
        // Pinned twice: another reader may be reading the record.
        let (again, _) = c.lookup_pin(&record).unwrap();
        assert!(!c.rekey_loading(s, CacheKey::image(5)));
        c.unpin(again);
        // The new key cached elsewhere (or being loaded): nothing changes.
        let (other, _) = c.insert_loading(CacheKey::image(6), 10).unwrap();
        assert!(!c.rekey_loading(s, CacheKey::image(6)));
        c.discard(other);
        assert_eq!(c.lookup_pin(&record), Some((s, 300)));
        c.unpin(s);
        // Pinned once: the record goes, the image is loading in its place.
        assert!(c.rekey_loading(s, CacheKey::image(5)));
        assert!(!c.contains(&record));
        assert_eq!(c.lookup_pin(&CacheKey::image(5)), None);
        assert_eq!(
            c.insert_pinned(CacheKey::image(5), 1),
            Err(CacheError::Loading)
        );
        c.finish_loading_as(s, 8192);
        assert_eq!(c.lookup_pin(&CacheKey::image(5)), Some((s, 8192)));
        c.unpin(s);
        c.unpin(s);
        assert_eq!(c.total_pins(), 0);
        // A failed decompression gives the slot back.
        let (t, _) = c.insert_pinned(record, 300).unwrap();
        assert!(c.rekey_loading(t, CacheKey::image(7)));
        c.discard(t);
        assert!(!c.contains(&CacheKey::image(7)) && !c.contains(&record));
        assert_eq!(c.used(), 1);
    }

    #[test]
    #[should_panic(expected = "is not loading")]
    fn only_a_loading_slot_can_finish_loading() {
        let mut o = owned(2);
        let mut c = o.index(true);
        let (s, _) = c.insert_pinned(CacheKey::image(1), 1).unwrap();
        c.finish_loading(s);
    }

    #[test]
    fn pinned_slots_are_never_evicted() {
        let mut o = owned(3);
        let mut c = o.index(true);
        for id in 0..3 {
            c.insert_pinned(CacheKey::image(id), 1).unwrap();
        }
        assert_eq!(
            c.insert_pinned(CacheKey::image(99), 1),
            Err(CacheError::AllPinned)
        );
        let (s, _) = c.lookup_pin(&CacheKey::image(1)).unwrap();
        c.unpin(s);
        c.unpin(s);
        let (v, fresh) = c.insert_pinned(CacheKey::image(99), 1).unwrap();
        assert!(fresh);
        assert_eq!(v, s, "the only unpinned slot is the victim");
        assert!(!c.contains(&CacheKey::image(1)));
        assert!(c.contains(&CacheKey::image(0)) && c.contains(&CacheKey::image(2)));
        assert_eq!(c.stats().evictions, 1);
    }

    #[test]
    fn clock_gives_referenced_slots_a_second_chance() {
        let mut o = owned(2);
        let mut c = o.index(true);
        let (a, _) = c.insert_pinned(CacheKey::image(1), 1).unwrap();
        let (b, _) = c.insert_pinned(CacheKey::image(2), 1).unwrap();
        c.unpin(a);
        c.unpin(b);
        // The hand clears both bits on its first turn and evicts slot 0 on the second.
        c.insert_pinned(CacheKey::image(3), 1).unwrap();
        assert!(!c.contains(&CacheKey::image(1)));
        // Touch 2; the next insertion must evict 3 (unreferenced after the sweep), not 2.
        let (s, _) = c.lookup_pin(&CacheKey::image(2)).unwrap();
        c.unpin(s);
        let (s3, _) = c.lookup_pin(&CacheKey::image(3)).unwrap();
        c.unpin(s3);
        c.insert_pinned(CacheKey::image(4), 1).unwrap();
        assert_eq!(c.used(), 2);
    }

    #[test]
    #[should_panic(expected = "unpinned more often")]
    fn double_unpin_is_caught() {
        let mut o = owned(2);
        let mut c = o.index(true);
        let (s, _) = c.insert_pinned(CacheKey::image(1), 1).unwrap();
        c.unpin(s);
        c.unpin(s);
    }

    proptest! {
        /// Random inserts, lookups, unpins and discards against a model: the index always
        /// finds exactly the keys the model holds, and no pinned key is ever lost.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..4, 0u64..24), 1..400)) {
            let mut o = owned(8);
            let mut c = o.index(true);
            let mut pinned: Vec<(CacheKey, usize)> = Vec::new();
            let mut model: HashMap<CacheKey, usize> = HashMap::new();
            for (op, id) in ops {
                let key = CacheKey::image(id);
                match op {
                    0 => match c.insert_pinned(key, id as usize) {
                        Ok((s, _)) => {
                            model.retain(|_, slot| *slot != s);
                            model.insert(key, s);
                            pinned.push((key, s));
                        }
                        Err(CacheError::AllPinned) => prop_assert!(c.total_pins() >= 8),
                        Err(CacheError::Loading) => prop_assert!(false, "nothing is loading"),
                    },
                    1 => if let Some((s, len)) = c.lookup_pin(&key) {
                        prop_assert_eq!(model.get(&key), Some(&s));
                        prop_assert_eq!(len, id as usize);
                        pinned.push((key, s));
                    } else {
                        prop_assert!(!model.contains_key(&key));
                    },
                    2 => if let Some((_, s)) = pinned.pop() { c.unpin(s) },
                    _ => {
                        if let Some(pos) = pinned.iter().position(|(k, _)| *k == key) {
                            let (_, s) = pinned[pos];
                            if pinned.iter().filter(|(_, t)| *t == s).count() == 1 {
                                pinned.remove(pos);
                                c.discard(s);
                                model.remove(&key);
                            }
                        }
                    }
                }
                for (k, s) in &pinned {
                    prop_assert_eq!(model.get(k), Some(s), "a pinned object was evicted");
                }
                for (k, _) in model.iter() {
                    prop_assert!(c.contains(k));
                }
                prop_assert_eq!(c.used(), model.len());
            }
        }
    }
}
