//! The group cache state: which groups sit where in a fixed data area, their pins and last
//! use, and whole-group LRU eviction (GSnap section 4.3), kept entirely inside a caller-given
//! `&mut [u8]` so the PostgreSQL side can place it in shared memory (guarded by its own lock)
//! and this code can be unit-tested on a `Vec<u8>`.
//!
//! The state never holds group bytes: it hands out extents (offset, size) of a separate data
//! area of `data_size` bytes, into which the caller copies a group after `reserve`.
//!
//! Layout (little-endian):
//! ```text
//! header (96 bytes): 0 magic "GSNCACHE"  8 version u32  12 slot_count u32  16 data_size u64
//!   24 tick u64  32 hits u64  40 loads u64  48 evictions u64  56 bytes_loaded u64
//!   64 bytes_evicted u64  72 misses u64  80 reserved [u8; 16]
//! slot (48 bytes) x slot_count: 0 group u64  8 offset u64  16 size u64  24 last_use u64
//!   32 pins u32  36 state u32 (0 free, 1 loading, 2 ready)  40 reserved u64
//! ```
//! Invariants: the extents of occupied slots are disjoint and inside the data area (so the
//! cache never exceeds its budget); a group occupies at most one slot; a pinned or loading
//! slot is never evicted; eviction takes the ready, unpinned slot with the smallest last use.

use crate::bytes::{put_u32, put_u64, read_u32, read_u64};
use crate::error::IndexError;

const MAGIC: [u8; 8] = *b"GSNCACHE";
const VERSION: u32 = 1;
pub const CACHE_HEADER_LEN: usize = 96;
pub const CACHE_SLOT_LEN: usize = 48;

const TICK: usize = 24;
const HITS: usize = 32;
const LOADS: usize = 40;
const EVICTIONS: usize = 48;
const BYTES_LOADED: usize = 56;
const BYTES_EVICTED: usize = 64;
const MISSES: usize = 72;

const FREE: u32 = 0;
const LOADING: u32 = 1;
const READY: u32 = 2;

/// A place in the data area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub size: u64,
}

/// What `pin` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The group is loaded at this extent, and now pinned.
    Hit(Extent),
    /// Another backend is loading it: wait and probe again.
    Loading,
    /// Not cached: `reserve` a place and load it.
    Miss,
}

/// A place reserved for a group, and the groups evicted to make room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub extent: Extent,
    pub evicted: Vec<(u64, Extent)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub loads: u64,
    pub evictions: u64,
    pub bytes_loaded: u64,
    pub bytes_evicted: u64,
    pub used_bytes: u64,
    pub data_size: u64,
    pub groups: u64,
    /// Pins held now, over all groups.
    pub pins: u64,
}

/// One occupied slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub group: u64,
    pub extent: Extent,
    pub last_use: u64,
    pub pins: u32,
    pub loading: bool,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    group: u64,
    offset: u64,
    size: u64,
    last_use: u64,
    pins: u32,
    state: u32,
}

/// An empty slot.
const FREE_SLOT: Slot = Slot {
    group: 0,
    offset: 0,
    size: 0,
    last_use: 0,
    pins: 0,
    state: FREE,
};

/// The cache state over a caller's region.
#[derive(Debug)]
pub struct GroupCache<'a> {
    region: &'a mut [u8],
    slots: usize,
    data_size: u64,
}

impl<'a> GroupCache<'a> {
    /// The region size needed for `slots` slots.
    pub fn region_size(slots: u32) -> usize {
        CACHE_HEADER_LEN + slots as usize * CACHE_SLOT_LEN
    }

    /// Formats `region` as an empty cache of `slots` slots managing `data_size` bytes.
    pub fn init(region: &'a mut [u8], slots: u32, data_size: u64) -> Result<Self, IndexError> {
        let need = Self::region_size(slots);
        if slots == 0 || region.len() < need {
            return Err(IndexError::InvalidArgument(
                "cache region smaller than its header and slots",
            ));
        }
        region[..need].fill(0);
        region[..8].copy_from_slice(&MAGIC);
        put_u32(region, 8, VERSION);
        put_u32(region, 12, slots);
        put_u64(region, 16, data_size);
        Self::attach(region)
    }

    /// Attaches to a region formatted by `init`, checking it.
    pub fn attach(region: &'a mut [u8]) -> Result<Self, IndexError> {
        if region.len() < CACHE_HEADER_LEN || region[..8] != MAGIC {
            return Err(IndexError::corrupt("cache magic", 0));
        }
        let version = read_u32(region, 8, "cache version")?;
        if version != VERSION {
            return Err(IndexError::UnsupportedVersion {
                what: "group cache",
                found: version,
            });
        }
        let slots = read_u32(region, 12, "cache slots")? as usize;
        if slots == 0 || region.len() < Self::region_size(slots as u32) {
            return Err(IndexError::corrupt("cache slot count", 12));
        }
        let data_size = read_u64(region, 16, "cache data size")?;
        let cache = GroupCache {
            region,
            slots,
            data_size,
        };
        let mut extents = Vec::new();
        for i in 0..slots {
            let s = cache.slot(i)?;
            if s.state > READY || (s.state == FREE && (s.pins != 0 || s.size != 0)) {
                return Err(IndexError::corrupt("cache slot state", Self::slot_at(i)));
            }
            if s.state != FREE {
                if s.offset
                    .checked_add(s.size)
                    .is_none_or(|end| end > data_size)
                {
                    return Err(IndexError::corrupt("cache slot extent", Self::slot_at(i)));
                }
                extents.push((s.offset, s.size));
            }
        }
        extents.sort_unstable();
        if extents.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(IndexError::corrupt(
                "cache extents overlap",
                CACHE_HEADER_LEN,
            ));
        }
        Ok(cache)
    }

    fn slot_at(i: usize) -> usize {
        CACHE_HEADER_LEN + i * CACHE_SLOT_LEN
    }

    fn slot(&self, i: usize) -> Result<Slot, IndexError> {
        let at = Self::slot_at(i);
        let r = &*self.region;
        Ok(Slot {
            group: read_u64(r, at, "slot group")?,
            offset: read_u64(r, at + 8, "slot offset")?,
            size: read_u64(r, at + 16, "slot size")?,
            last_use: read_u64(r, at + 24, "slot last use")?,
            pins: read_u32(r, at + 32, "slot pins")?,
            state: read_u32(r, at + 36, "slot state")?,
        })
    }

    fn put_slot(&mut self, i: usize, s: &Slot) {
        let at = Self::slot_at(i);
        put_u64(self.region, at, s.group);
        put_u64(self.region, at + 8, s.offset);
        put_u64(self.region, at + 16, s.size);
        put_u64(self.region, at + 24, s.last_use);
        put_u32(self.region, at + 32, s.pins);
        put_u32(self.region, at + 36, s.state);
    }

    fn counter(&self, at: usize) -> u64 {
        read_u64(self.region, at, "cache counter").unwrap_or(0)
    }

    fn bump(&mut self, at: usize, by: u64) -> u64 {
        let v = self.counter(at).wrapping_add(by);
        put_u64(self.region, at, v);
        v
    }

    fn find(&self, group: u64) -> Result<Option<(usize, Slot)>, IndexError> {
        for i in 0..self.slots {
            let s = self.slot(i)?;
            if s.state != FREE && s.group == group {
                return Ok(Some((i, s)));
            }
        }
        Ok(None)
    }

    fn occupied(&self) -> Result<Vec<(usize, Slot)>, IndexError> {
        let mut v = Vec::new();
        for i in 0..self.slots {
            let s = self.slot(i)?;
            if s.state != FREE {
                v.push((i, s));
            }
        }
        Ok(v)
    }

    /// Looks `group` up; on a hit pins it and marks it used.
    pub fn pin(&mut self, group: u64) -> Result<Probe, IndexError> {
        match self.find(group)? {
            Some((_, s)) if s.state == LOADING => Ok(Probe::Loading),
            Some((i, mut s)) => {
                s.pins += 1;
                s.last_use = self.bump(TICK, 1);
                self.put_slot(i, &s);
                self.bump(HITS, 1);
                Ok(Probe::Hit(Extent {
                    offset: s.offset,
                    size: s.size,
                }))
            }
            None => {
                self.bump(MISSES, 1);
                Ok(Probe::Miss)
            }
        }
    }

    /// First-fit gap of `size` bytes among `extents` (sorted by offset).
    fn gap(&self, extents: &[(u64, u64)], size: u64) -> Option<u64> {
        let mut at = 0u64;
        for &(off, len) in extents {
            if off >= at && off - at >= size {
                return Some(at);
            }
            at = at.max(off + len);
        }
        (self.data_size >= at && self.data_size - at >= size).then_some(at)
    }

    /// Reserves `size` bytes for `group` (pinned, in the loading state), evicting least
    /// recently used unpinned groups as needed. Fails with `CacheFull` if even evicting every
    /// unpinned group would not make room, without evicting anything.
    pub fn reserve(&mut self, group: u64, size: u64) -> Result<Reservation, IndexError> {
        if self.find(group)?.is_some() {
            return Err(IndexError::CacheState(
                "the group is already cached or being loaded",
            ));
        }
        let occupied = self.occupied()?;
        let mut held: Vec<(u64, u64)> = occupied
            .iter()
            .filter(|(_, s)| s.pins > 0 || s.state == LOADING)
            .map(|(_, s)| (s.offset, s.size))
            .collect();
        held.sort_unstable();
        let held_bytes: u64 = held.iter().map(|e| e.1).sum();
        let slots_held = held.len();
        if self.gap(&held, size).is_none() || slots_held >= self.slots {
            return Err(IndexError::CacheFull {
                needed: size,
                free: self.data_size - held_bytes,
                capacity: self.data_size,
            });
        }
        // Evict LRU first until a slot and a gap exist.
        let mut candidates: Vec<(usize, Slot)> = occupied
            .into_iter()
            .filter(|(_, s)| s.pins == 0 && s.state == READY)
            .collect();
        candidates.sort_by_key(|(_, s)| s.last_use);
        let mut evicted = Vec::new();
        let mut candidates = candidates.into_iter();
        loop {
            let live = self.occupied()?;
            let mut extents: Vec<(u64, u64)> =
                live.iter().map(|(_, s)| (s.offset, s.size)).collect();
            extents.sort_unstable();
            let free_slot = (0..self.slots).find(|&i| self.slot(i).is_ok_and(|s| s.state == FREE));
            if let (Some(i), Some(offset)) = (free_slot, self.gap(&extents, size)) {
                let tick = self.bump(TICK, 1);
                self.put_slot(
                    i,
                    &Slot {
                        group,
                        offset,
                        size,
                        last_use: tick,
                        pins: 1,
                        state: LOADING,
                    },
                );
                self.bump(LOADS, 1);
                self.bump(BYTES_LOADED, size);
                return Ok(Reservation {
                    extent: Extent { offset, size },
                    evicted,
                });
            }
            let Some((i, s)) = candidates.next() else {
                return Err(IndexError::CacheFull {
                    needed: size,
                    free: self.data_size - held_bytes,
                    capacity: self.data_size,
                });
            };
            self.put_slot(i, &FREE_SLOT);
            self.bump(EVICTIONS, 1);
            self.bump(BYTES_EVICTED, s.size);
            evicted.push((
                s.group,
                Extent {
                    offset: s.offset,
                    size: s.size,
                },
            ));
        }
    }

    /// Marks a reserved group loaded: other backends now get hits.
    pub fn finish_load(&mut self, group: u64) -> Result<(), IndexError> {
        match self.find(group)? {
            Some((i, mut s)) if s.state == LOADING => {
                s.state = READY;
                self.put_slot(i, &s);
                Ok(())
            }
            _ => Err(IndexError::CacheState(
                "finish_load of a group that is not being loaded",
            )),
        }
    }

    /// Gives up a reservation whose load failed.
    pub fn abort_load(&mut self, group: u64) -> Result<(), IndexError> {
        match self.find(group)? {
            Some((i, s)) if s.state == LOADING => {
                self.put_slot(i, &FREE_SLOT);
                self.bump(LOADS, u64::MAX); // wrapping decrement
                self.bump(BYTES_LOADED, s.size.wrapping_neg());
                Ok(())
            }
            _ => Err(IndexError::CacheState(
                "abort_load of a group that is not being loaded",
            )),
        }
    }

    /// Releases one pin of `group`.
    pub fn unpin(&mut self, group: u64) -> Result<(), IndexError> {
        match self.find(group)? {
            Some((i, mut s)) if s.pins > 0 => {
                s.pins -= 1;
                self.put_slot(i, &s);
                Ok(())
            }
            _ => Err(IndexError::CacheState(
                "unpin of a group that is not pinned",
            )),
        }
    }

    /// Drops an unpinned group (e.g. a sealed group that was merged or deleted).
    pub fn remove(&mut self, group: u64) -> Result<bool, IndexError> {
        match self.find(group)? {
            Some((_, s)) if s.pins > 0 || s.state == LOADING => {
                Err(IndexError::CacheState("cannot remove a pinned group"))
            }
            Some((i, _)) => {
                self.put_slot(i, &FREE_SLOT);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub fn entries(&self) -> Result<Vec<CacheEntry>, IndexError> {
        Ok(self
            .occupied()?
            .into_iter()
            .map(|(_, s)| CacheEntry {
                group: s.group,
                extent: Extent {
                    offset: s.offset,
                    size: s.size,
                },
                last_use: s.last_use,
                pins: s.pins,
                loading: s.state == LOADING,
            })
            .collect())
    }

    pub fn stats(&self) -> Result<CacheStats, IndexError> {
        let occupied = self.occupied()?;
        Ok(CacheStats {
            hits: self.counter(HITS),
            misses: self.counter(MISSES),
            loads: self.counter(LOADS),
            evictions: self.counter(EVICTIONS),
            bytes_loaded: self.counter(BYTES_LOADED),
            bytes_evicted: self.counter(BYTES_EVICTED),
            used_bytes: occupied.iter().map(|(_, s)| s.size).sum(),
            data_size: self.data_size,
            groups: occupied.len() as u64,
            pins: occupied.iter().map(|(_, s)| u64::from(s.pins)).sum(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(c: &mut GroupCache<'_>, g: u64, size: u64) -> Reservation {
        let r = c.reserve(g, size).unwrap();
        c.finish_load(g).unwrap();
        c.unpin(g).unwrap();
        r
    }

    #[test]
    fn hits_pins_and_lru_eviction() {
        let mut region = vec![0u8; GroupCache::region_size(8)];
        let mut c = GroupCache::init(&mut region, 8, 100).unwrap();
        assert_eq!(c.pin(1).unwrap(), Probe::Miss);
        load(&mut c, 1, 40);
        load(&mut c, 2, 40);
        assert_eq!(
            c.pin(1).unwrap(),
            Probe::Hit(Extent {
                offset: 0,
                size: 40
            })
        );
        c.unpin(1).unwrap();
        // 2 is now the least recently used: loading 3 (40 bytes) evicts it, not 1
        let r = load(&mut c, 3, 40);
        assert_eq!(
            r.evicted,
            vec![(
                2,
                Extent {
                    offset: 40,
                    size: 40
                }
            )]
        );
        assert_eq!(
            r.extent,
            Extent {
                offset: 40,
                size: 40
            }
        );
        let s = c.stats().unwrap();
        assert_eq!(
            (s.hits, s.misses, s.loads, s.evictions, s.used_bytes),
            (1, 1, 3, 1, 80)
        );
    }

    #[test]
    fn pinned_groups_are_never_evicted_and_full_is_an_error() {
        let mut region = vec![0u8; GroupCache::region_size(4)];
        let mut c = GroupCache::init(&mut region, 4, 100).unwrap();
        c.reserve(1, 60).unwrap(); // pinned, loading
        load(&mut c, 2, 30);
        let err = c.reserve(3, 50).unwrap_err();
        assert_eq!(
            err,
            IndexError::CacheFull {
                needed: 50,
                free: 40,
                capacity: 100
            }
        );
        assert_eq!(
            c.entries().unwrap().len(),
            2,
            "a failed reserve evicts nothing"
        );
        assert_eq!(c.pin(1).unwrap(), Probe::Loading);
        c.finish_load(1).unwrap();
        let r = c.reserve(3, 40).unwrap();
        assert_eq!(r.evicted.len(), 1);
        assert_eq!(r.evicted[0].0, 2);
        assert!(c.remove(1).is_err(), "1 is still pinned");
        // 1 (loaded by this reservation) and 3 (just reserved) are pinned once each
        assert_eq!(c.stats().unwrap().pins, 2);
        c.unpin(1).unwrap();
        assert_eq!(c.stats().unwrap().pins, 1);
        assert_eq!(c.remove(1), Ok(true));
    }

    #[test]
    fn attach_checks_the_region() {
        let mut region = vec![0u8; GroupCache::region_size(2)];
        GroupCache::init(&mut region, 2, 10).unwrap();
        {
            let mut c = GroupCache::attach(&mut region).unwrap();
            load(&mut c, 7, 6);
        }
        assert!(GroupCache::attach(&mut region).is_ok());
        let mut bad = region.clone();
        bad[CACHE_HEADER_LEN + 16] = 200; // size beyond the data area
        assert!(GroupCache::attach(&mut bad).is_err());
        let mut bad = region.clone();
        bad[8] = 9;
        assert!(matches!(
            GroupCache::attach(&mut bad),
            Err(IndexError::UnsupportedVersion { .. })
        ));
        assert!(GroupCache::attach(&mut region[..50]).is_err());
        let mut small = vec![0u8; 10];
        assert!(GroupCache::init(&mut small, 2, 10).is_err());
    }
}
