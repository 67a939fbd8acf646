//! The rows that differ between two snapshots, matched by the table's primary key: the diff
//! behind `gsnap_diff_by_key` and `gsnap_restore`.
//!
//! [`super::diff::diff_rows`] gives the rows removed (at a, not at b) and added (at b, not at
//! a); a removed and an added row with equal keys are one row *updated* (both versions, and
//! the TID of the new one at b), a removed row alone was *removed*, an added row alone was
//! *added*. Keys are hashed and compared with the hash function and equality operator of
//! each key column's type, under the column's collation, as a hash join on the key would.

use super::diff::diff_rows;
use crate::error::error;
use crate::ffi::relation::OpenRelation;
use gsnap_format::diff::{pair_hashed, Change};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// The attribute numbers of the primary key of `rel`, in the key's order; None if it has
/// none.
pub fn primary_key_columns(rel: &OpenRelation) -> Option<Vec<i16>> {
    // SAFETY: an open relation: its primary key index's OID, and that index opened and
    // closed here (its key attribute numbers copied out).
    unsafe {
        let index = pg_sys::RelationGetPrimaryKeyIndex(rel.as_ptr());
        if index == pg_sys::InvalidOid {
            return None;
        }
        let ix = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let form = &*(*ix).rd_index;
        let n = form.indnkeyatts as usize;
        let keys = form.indkey.values.as_slice(n).to_vec();
        pg_sys::index_close(ix, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some(keys)
    }
}

/// A row of the diff by key: what happened to the key from a to b.
pub enum KeyedChange {
    /// At both, with other contents: the row at a, the row at b and its TID at b.
    Updated {
        old: pg_sys::Datum,
        new: pg_sys::Datum,
        at: (u32, u16),
    },
    /// Only at a: the row and its TID at a.
    Removed { old: pg_sys::Datum, at: (u32, u16) },
    /// Only at b: the row and its TID at b.
    Added { new: pg_sys::Datum, at: (u32, u16) },
}

/// A key column: its attribute number, and its type's hash function and equality operator
/// (in the type cache, which lives as long as the process), with its collation.
struct KeyColumn {
    attnum: i16,
    hash: *mut pg_sys::FmgrInfo,
    eq: *mut pg_sys::FmgrInfo,
    collation: pg_sys::Oid,
}

/// The primary key of a table, as its rows are matched.
pub struct Key(Vec<KeyColumn>);

impl Key {
    /// The primary key of `rel`; None if it has none, or if a key column's type has no hash
    /// function or equality operator.
    pub fn of(rel: &OpenRelation) -> Option<Key> {
        let attnums = primary_key_columns(rel)?;
        // SAFETY: the relation is open.
        let attributes = unsafe { crate::ffi::tuple::attributes(rel.descriptor()) };
        let mut columns = Vec::with_capacity(attnums.len());
        for attnum in attnums {
            let a = attributes.get(usize::try_from(attnum).ok()?.checked_sub(1)?)?;
            let flags = pg_sys::TYPECACHE_HASH_PROC_FINFO | pg_sys::TYPECACHE_EQ_OPR_FINFO;
            // SAFETY: a type cache lookup by the OID of an existing column's type; the entry
            // lives as long as the process.
            let entry = unsafe { &mut *pg_sys::lookup_type_cache(a.atttypid, flags as i32) };
            if entry.hash_proc_finfo.fn_oid == pg_sys::InvalidOid
                || entry.eq_opr_finfo.fn_oid == pg_sys::InvalidOid
            {
                return None;
            }
            columns.push(KeyColumn {
                attnum,
                hash: &mut entry.hash_proc_finfo,
                eq: &mut entry.eq_opr_finfo,
                collation: a.attcollation,
            });
        }
        Some(Key(columns))
    }

    /// Appends the key's values in row `rec` (a formed row of row type `desc`) to `out`,
    /// None where NULL. Read with `desc` itself: `GetAttributeByNum` looked the row type's
    /// descriptor up in the type cache for every value (most of the pairing's cost).
    ///
    /// # Safety
    /// `rec` is a composite datum formed with `desc`, the table's current row type.
    unsafe fn values_into(
        &self,
        rec: pg_sys::Datum,
        desc: pg_sys::TupleDesc,
        out: &mut Vec<Option<pg_sys::Datum>>,
    ) {
        let header = rec.cast_mut_ptr::<pg_sys::HeapTupleHeaderData>();
        let mut tuple = pg_sys::HeapTupleData {
            // SAFETY: a formed composite datum: a 4-byte varlena header holding its length.
            t_len: unsafe { pgrx::varlena::varsize_any(header.cast()) } as u32,
            t_self: pg_sys::ItemPointerData::default(),
            t_tableOid: pg_sys::InvalidOid,
            t_data: header,
        };
        for c in &self.0 {
            let mut null = false;
            // SAFETY: the caller's promise; an attribute of that row type.
            let d = unsafe { pg_sys::heap_getattr(&mut tuple, c.attnum.into(), desc, &mut null) };
            out.push((!null).then_some(d));
        }
    }

    /// The hash of key values (NULLs hash alike; they never match, see [`Key::equal`]).
    ///
    /// # Safety
    /// `values` are the key's values of a row of the table.
    unsafe fn hash(&self, values: &[Option<pg_sys::Datum>]) -> u64 {
        let mut h: u64 = 0;
        for (c, v) in self.0.iter().zip(values) {
            let part = match v {
                // SAFETY: the type's hash function on a value of that type.
                Some(d) => unsafe { pg_sys::FunctionCall1Coll(c.hash, c.collation, *d) }.value()
                    as u32 as u64,
                None => 0,
            };
            h = h.rotate_left(21) ^ part.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        h
    }

    /// Whether two rows' key values are equal (no NULL equals anything).
    ///
    /// # Safety
    /// Both are the key's values of rows of the table.
    unsafe fn equal(&self, a: &[Option<pg_sys::Datum>], b: &[Option<pg_sys::Datum>]) -> bool {
        self.0
            .iter()
            .zip(a.iter().zip(b))
            .all(|(c, pair)| match pair {
                (Some(x), Some(y)) => {
                    // SAFETY: the type's equality operator on two values of that type.
                    let eq = unsafe { pg_sys::FunctionCall2Coll(c.eq, c.collation, *x, *y) };
                    eq.value() != 0
                }
                _ => false,
            })
    }
}

/// Calls `emit` for each key that differs between snapshots `a` and `b` of table `relid`
/// (updated rows, then removed ones, then added ones), matched by `key`.
///
/// # Safety
/// `row_desc` is the table's current row type and `key` its primary key; call in a
/// transaction.
pub unsafe fn diff_by_key(
    relid: pg_sys::Oid,
    (a, b): (u64, u64),
    row_desc: pg_sys::TupleDesc,
    key: &Key,
    emit: &mut dyn FnMut(KeyedChange),
) {
    let mut removed: Vec<(pg_sys::Datum, (u32, u16))> = Vec::new();
    let mut added: Vec<(pg_sys::Datum, (u32, u16))> = Vec::new();
    // SAFETY: the caller's promise.
    unsafe {
        diff_rows(relid, a, b, row_desc, &mut |change, rec, at| {
            if change == Change::Added {
                added.push((rec, at));
            } else {
                removed.push((rec, at));
            }
        })
    };
    // Each side's keys, `width` values per row in one vector, and their hashes.
    let width = key.0.len();
    let keys_of = |rows: &[(pg_sys::Datum, (u32, u16))]| {
        let mut values = Vec::with_capacity(rows.len() * width);
        let hashes: Vec<u64> = rows
            .iter()
            .map(|(rec, _)| {
                let start = values.len();
                // SAFETY: the rows are of the table's row type (formed by diff_rows with
                // `row_desc`); the key's values and hash function.
                unsafe {
                    key.values_into(*rec, row_desc, &mut values);
                    key.hash(&values[start..])
                }
            })
            .collect();
        (values, hashes)
    };
    let (removed_keys, removed_hashes) = keys_of(&removed);
    let (added_keys, added_hashes) = keys_of(&added);
    let pairing = pair_hashed(&removed_hashes, &added_hashes, |r, a| {
        let (x, y) = (r * width, a * width);
        // SAFETY: as above; the key's equality.
        unsafe { key.equal(&removed_keys[x..x + width], &added_keys[y..y + width]) }
    });
    for (r, a) in pairing.pairs {
        let (new, at) = added[a];
        emit(KeyedChange::Updated {
            old: removed[r].0,
            new,
            at,
        });
    }
    for r in pairing.removed {
        let (old, at) = removed[r];
        emit(KeyedChange::Removed { old, at });
    }
    for a in pairing.added {
        let (new, at) = added[a];
        emit(KeyedChange::Added { new, at });
    }
}

/// The primary key of `rel`, or an ERROR saying that `function` needs one it can match.
pub fn require_key(rel: &OpenRelation, function: &str) -> Key {
    Key::of(rel).unwrap_or_else(|| {
        error(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "{function} matches rows by primary key, and table {} has none it can hash",
                crate::ffi::relation::relation_name(rel.oid())
            ),
        )
        .hint("Use gsnap_diff, which compares whole rows.")
        .raise()
    })
}
