//! Key maps: for a relation incarnation, which blocks held a row whose key hashes to a given
//! value, and from which snapshot until which, so that a lookup by key AS OF a snapshot (or
//! over a range of them) reads only the pages that can hold it.
//!
//! The store knows nothing of keys: the caller hashes a row's key (its own definition, kept
//! opaque in the key map record) and records the hashes of every page a capture stores with
//! [`Capture::record_keys`](crate::Capture::record_keys). The store compares them with what
//! the block held at its last recording (its open entries, `'O'`): an entry `(rel, map,
//! hash, block, from) -> to` begins for each hash the block gains and ends (its `to` set) at
//! the snapshot where the block lost it. So a capture writes entries only where keys arrive
//! or leave a page (an update that keeps its row on its page writes none; a row that moves
//! writes four small entries), and an entry says: every snapshot in `[from, to)` that maps
//! the block maps a page holding that hash.
//!
//! The map is complete from its start (the capture that recorded every page of the relation)
//! on, as long as every later capture records every page it stores: a snapshot's page table
//! only changes where its capture stored a page. A failed capture's recordings stay: its
//! snapshot is never read, and the next capture compares with them (a page back to its old
//! content begins its entries again). Entries of a map that ended or started again go with
//! the commit that says so; entries no readable snapshot needs (their `[from, to)` holds
//! none) are deleted by [`SnapshotStore::sweep_keys`].

use crate::backend::{KvBackend, Scan, WriteBatch};
use crate::error::{Result, StoreError};
use crate::ids::{RelId, SnapId};
use crate::keys::{self, Cf};
use crate::records::SnapshotState;
use crate::store::SnapshotStore;
use std::collections::HashMap;

/// Key entries up to which a sweep is always worth it: it reads every entry, and this many
/// take milliseconds.
pub const SMALL_KEY_MAP: u64 = 100_000;

/// True if a sweep of `key_entries` entries is worth starting after reclamations killed
/// `killed` mappings of the `log_mappings` in the mapping log since the last sweep.
///
/// A sweep reads every entry, but can delete only those that snapshots reclaimed since
/// needed alone: entries of rows that left a block while only those snapshots mapped it,
/// which go with the mappings they killed (and an update that keeps its row on its page, as
/// most of pgbench's do, ends no entry at all). On the probe's pgbench store (six million
/// entries) the sweep after each reclaimed snapshot took 12 s of the worker's main thread.
/// So a small map is swept after every reclamation, and a larger one once the mappings
/// killed since its last sweep are an eighth of the log: its cost per reclaimed snapshot is
/// then in proportion to what that snapshot killed. Until then an entry no snapshot needs
/// costs only a block that a lookup over its span reads in vain (finding no such row).
pub fn key_sweep_due(killed: u64, key_entries: u64, log_mappings: u64) -> bool {
    killed > 0 && (key_entries <= SMALL_KEY_MAP || killed.saturating_mul(8) >= log_mappings)
}

/// The hash that stands for "a row whose key could not be hashed": a block recorded with it
/// is a candidate for every key.
pub const WILDCARD_KEY: u64 = u64::MAX;

/// A key hash as recorded: any hash but [`WILDCARD_KEY`] (which is moved next to it).
pub fn settle_key_hash(hash: u64) -> u64 {
    hash.min(WILDCARD_KEY - 1)
}

/// A relation incarnation's key map: complete from snapshot `start` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMap {
    pub start: SnapId,
    /// The caller's definition of the key, as given to `start_key_map`.
    pub definition: Vec<u8>,
}

impl<B: KvBackend> SnapshotStore<B> {
    /// The key map of relation incarnation `rel`, if one was started and not ended.
    pub fn key_map(&self, rel: RelId) -> Result<Option<KeyMap>> {
        let Some(v) = self.backend().get(Cf::Catalog, &keys::key_map_key(rel))? else {
            return Ok(None);
        };
        if v.len() < 8 {
            return Err(StoreError::corrupt(format!(
                "the key map record of {rel} has {} bytes",
                v.len()
            )));
        }
        Ok(Some(KeyMap {
            start: SnapId(u64::from_be_bytes(v[..8].try_into().expect("8 bytes"))),
            definition: v[8..].to_vec(),
        }))
    }

    /// The blocks of `rel` that key map `map` says held a row whose key hashes to one of
    /// `hashes` (or a row recorded with [`WILDCARD_KEY`]) at some snapshot of `from..=to`,
    /// ascending, each once.
    pub fn key_candidates(
        &self,
        rel: RelId,
        map: SnapId,
        hashes: &[u64],
        from: SnapId,
        to: SnapId,
    ) -> Result<Vec<u32>> {
        let mut wanted: Vec<u64> = hashes.iter().map(|&h| settle_key_hash(h)).collect();
        wanted.push(WILDCARD_KEY);
        wanted.sort_unstable();
        wanted.dedup();
        let mut found = Vec::new();
        // One cursor for every hash (a cursor costs more to make than to move), moved forward
        // from one hash's entries to the next's: the hashes are in key order.
        let mut cursor = self.backend().cursor(Cf::Keys)?;
        for h in wanted {
            let prefix = keys::key_entry_prefix(rel, map, h);
            cursor.seek(&prefix)?;
            while let Some((k, v)) = cursor.current() {
                if !k.starts_with(&prefix) {
                    break;
                }
                let e = keys::decode_key_entry_key(k)?;
                let until = keys::decode_u64_value(v, "key entry")?;
                if e.from <= to && until > from.0 {
                    found.push(e.block);
                }
                cursor.next()?;
            }
        }
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// True if a sweep of the key entries ([`SnapshotStore::sweep_keys`]) is worth starting
    /// once reclamations killed `killed` mappings since the last one ([`key_sweep_due`]).
    pub fn key_sweep_due(&self, killed: u64) -> Result<bool> {
        if killed == 0 {
            return Ok(false);
        }
        let entries = self.backend().estimate(Cf::Keys)?.entries;
        Ok(key_sweep_due(killed, entries, self.log_mappings()?))
    }

    /// One step of the sweep of key entries: from entry key `after` (None: the first), looks
    /// at up to `budget` entries and deletes those no readable snapshot needs (ended, and no
    /// committed snapshot in `[from, to)`) and those of maps that are not their relation's
    /// current one. Returns the entries deleted and where the next step starts (None: the
    /// sweep is done). The capture in progress may end entries meanwhile: an entry is
    /// deleted only as it was read, ended.
    pub fn sweep_keys(
        &self,
        after: Option<&[u8]>,
        budget: usize,
    ) -> Result<(u64, Option<Vec<u8>>)> {
        let start = after.map_or_else(|| vec![b'E'], <[u8]>::to_vec);
        let mut maps: HashMap<RelId, Option<SnapId>> = HashMap::new();
        let mut batch = WriteBatch::new();
        let mut deleted = 0;
        let mut next = None;
        let committed: Vec<SnapId> = {
            let cat = self.catalog();
            cat.snaps
                .iter()
                .filter(|(_, s)| s.state == SnapshotState::Committed)
                .map(|(id, _)| *id)
                .collect()
        };
        let entries = Scan::range(self.backend(), Cf::Keys, &start, Some(vec![b'P']))?;
        for (seen, entry) in entries.enumerate() {
            let (k, v) = entry?;
            if seen == budget {
                next = Some(k);
                break;
            }
            let (rel, map, ended) = if k.first() == Some(&b'O') {
                let (rel, map, _) = keys::decode_open_key(&k)?;
                (rel, map, None)
            } else {
                let e = keys::decode_key_entry_key(&k)?;
                let until = keys::decode_u64_value(&v, "key entry")?;
                (e.rel, e.map, (until != u64::MAX).then_some((e.from, until)))
            };
            let current = match maps.get(&rel) {
                Some(m) => *m,
                None => {
                    let m = self.key_map(rel)?.map(|m| m.start);
                    maps.insert(rel, m);
                    m
                }
            };
            let needed = current == Some(map)
                && ended.is_none_or(|(from, until)| {
                    let at = committed.partition_point(|s| *s < from);
                    committed.get(at).is_some_and(|s| s.0 < until)
                });
            if !needed {
                batch.delete(Cf::Keys, &k);
                deleted += 1;
            }
        }
        self.backend().write(&batch, false)?;
        Ok((deleted, next))
    }
}
