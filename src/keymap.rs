//! Key maps: lookups by key AS OF a snapshot that read only the pages that can hold the key
//! (README, "Lookups by key").
//!
//! A table's *key* is its primary key, or else its first unique B-tree index (lowest OID)
//! on plain columns without a predicate. The capture hashes the key of every row of every
//! page it reads, with the hash function PostgreSQL's hash joins use for the index's
//! equality operator (the hash operator family's, so values the operator finds equal hash
//! equal, across the family's types too), and the store records where each hash enters and
//! leaves a block (`gsnap_store::keymap`). A key that cannot be hashed from the page (an
//! out-of-line TOAST value) is recorded as the wildcard: its page is a candidate for every
//! key.
//!
//! The map of a relation incarnation is complete from the snapshot whose capture started it
//! (it read every page of the table); a lookup AS OF an older snapshot scans. What a reader
//! gets from the map is a superset of the pages holding the key (hash collisions add pages,
//! never remove them); the query's own conditions decide which rows are returned.

use crate::ffi::memcx::OwnedContext;
use gsnap_store::{settle_key_hash, WILDCARD_KEY};
use pgrx::pg_sys;

/// One column of a table's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyColumn {
    pub attnum: i16,
    /// The column's type when the map was started.
    pub type_oid: pg_sys::Oid,
    /// The collation the key is compared (and hashed) with: the index's.
    pub collation: pg_sys::Oid,
    /// The hash function of the index's equality operator, for the column's side.
    pub hash_proc: pg_sys::Oid,
}

/// The definition of a table's key, as recorded with its key map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDef {
    pub columns: Vec<KeyColumn>,
}

/// The version of the encoding of [`KeyDef`] (its first byte).
const DEF_VERSION: u8 = 1;

impl KeyDef {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![DEF_VERSION];
        for c in &self.columns {
            out.extend_from_slice(&c.attnum.to_be_bytes());
            for oid in [c.type_oid, c.collation, c.hash_proc] {
                out.extend_from_slice(&oid.to_u32().to_be_bytes());
            }
        }
        out
    }
}

/// A row's key hash being made from its key columns' hashes, in the definition's order
/// (the capture's and the reader's side fold them alike).
#[derive(Clone, Copy)]
struct KeyHash(u64);

impl KeyHash {
    fn new() -> KeyHash {
        KeyHash(0x243F_6A88_85A3_08D3)
    }

    /// The hash with the next column's hash folded in.
    fn with(self, column: u32) -> KeyHash {
        KeyHash((self.0.rotate_left(23) ^ u64::from(column)).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The key hash as recorded (never the wildcard).
    fn finish(self) -> u64 {
        settle_key_hash(self.0 ^ (self.0 >> 29))
    }
}

/// The key of the open relation `rel` (None: it has none a map can use).
///
/// # Safety
/// `rel` is an open relation; in a transaction.
pub unsafe fn table_key(rel: pg_sys::Relation) -> Option<KeyDef> {
    // SAFETY: the caller's open relation.
    let primary = unsafe { pg_sys::RelationGetPrimaryKeyIndex(rel) };
    let candidates: Vec<pg_sys::Oid> = if primary != pg_sys::InvalidOid {
        vec![primary]
    } else {
        // SAFETY: as above; the list is the relcache's copy, in the current context.
        unsafe { crate::ffi::list::oids(pg_sys::RelationGetIndexList(rel)) }
    };
    // SAFETY: the caller's open relation, whose descriptor lives as long as it.
    let desc = unsafe { (*rel).rd_att };
    candidates
        .into_iter()
        // SAFETY: in the caller's transaction.
        .find_map(|index| unsafe { index_key(index, desc) })
}

/// The key index `index` defines, if it is a valid unique B-tree index on plain columns
/// without a predicate whose equality operators can be hashed. Read from the catalog caches,
/// without locking the index (the worker must never wait for a REINDEX).
///
/// # Safety
/// In a transaction; `desc` is the descriptor of the index's table.
unsafe fn index_key(index: pg_sys::Oid, desc: pg_sys::TupleDesc) -> Option<KeyDef> {
    let index_cache = pg_sys::SysCacheIdentifier::INDEXRELID as i32;
    let class_cache = pg_sys::SysCacheIdentifier::RELOID as i32;
    // SAFETY: catalog cache lookups by OID, released below.
    unsafe {
        let class = pg_sys::SearchSysCache1(class_cache, pg_sys::Datum::from(index));
        if class.is_null() {
            return None;
        }
        let btree = (*pg_sys::GETSTRUCT(class).cast::<pg_sys::FormData_pg_class>()).relam
            == pg_sys::BTREE_AM_OID;
        pg_sys::ReleaseSysCache(class);
        let tuple = pg_sys::SearchSysCache1(index_cache, pg_sys::Datum::from(index));
        if tuple.is_null() {
            return None;
        }
        let def = btree.then(|| key_of_index_tuple(tuple, desc)).flatten();
        pg_sys::ReleaseSysCache(tuple);
        def
    }
}

/// The key a `pg_index` row defines (see [`index_key`]).
///
/// # Safety
/// `tuple` is a `pg_index` row from the catalog cache; `desc` its table's descriptor.
unsafe fn key_of_index_tuple(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Option<KeyDef> {
    let cache = pg_sys::SysCacheIdentifier::INDEXRELID as i32;
    // SAFETY: the caller's pg_index row; its variable-length columns read by the cache.
    unsafe {
        let form = &*pg_sys::GETSTRUCT(tuple).cast::<pg_sys::FormData_pg_index>();
        let plain = pg_sys::heap_attisnull(
            tuple,
            pg_sys::Anum_pg_index_indpred as i32,
            std::ptr::null_mut(),
        ) && pg_sys::heap_attisnull(
            tuple,
            pg_sys::Anum_pg_index_indexprs as i32,
            std::ptr::null_mut(),
        );
        if !form.indisunique || !form.indisvalid || !plain {
            return None;
        }
        let vector = |attno: u32| {
            let mut null = false;
            let d = pg_sys::SysCacheGetAttr(cache, tuple, attno as pg_sys::AttrNumber, &mut null);
            (!null).then(|| d.cast_mut_ptr::<pg_sys::oidvector>())
        };
        let (classes, collations) = (
            vector(pg_sys::Anum_pg_index_indclass)?,
            vector(pg_sys::Anum_pg_index_indcollation)?,
        );
        let keys = form.indnkeyatts as usize;
        let attnums = form.indkey.values.as_slice(keys);
        let classes = (*classes).values.as_slice(keys);
        let collations = (*collations).values.as_slice(keys);
        let atts = crate::ffi::tuple::attributes(desc);
        (0..keys)
            .map(|i| {
                let attnum = attnums[i];
                if attnum <= 0 {
                    return None;
                }
                let opfamily = pg_sys::get_opclass_family(classes[i]);
                let intype = pg_sys::get_opclass_input_type(classes[i]);
                let eq = pg_sys::get_opfamily_member(
                    opfamily,
                    intype,
                    intype,
                    pg_sys::BTEqualStrategyNumber as i16,
                );
                let (mut left, mut right) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
                if eq == pg_sys::InvalidOid
                    || !pg_sys::get_op_hash_functions(eq, &mut left, &mut right)
                {
                    return None;
                }
                Some(KeyColumn {
                    attnum,
                    type_oid: atts.get(attnum as usize - 1)?.atttypid,
                    collation: collations[i],
                    hash_proc: left,
                })
            })
            .collect::<Option<Vec<_>>>()
            .map(|columns| KeyDef { columns })
    }
}

/// Hashes the keys of a table's rows (on the capture's side).
pub struct KeyHasher {
    def: KeyDef,
    functions: Vec<pg_sys::FmgrInfo>,
    /// `attlen` of each key column.
    lengths: Vec<i16>,
    /// Where the functions keep what they cache (they live as long as the hasher).
    _functions_memory: OwnedContext,
    /// What the calls allocate (a detoasted compressed value); reset after each page.
    scratch: OwnedContext,
    /// The call frame of the hash functions: a FunctionCallInfoBaseData and one argument.
    call: Vec<u64>,
}

impl KeyHasher {
    /// A hasher for `def`, the key of the table whose descriptor is `desc`.
    ///
    /// # Safety
    /// In a transaction.
    pub unsafe fn new(def: KeyDef, desc: pg_sys::TupleDesc) -> KeyHasher {
        // SAFETY: the caller's descriptor.
        let atts = unsafe { crate::ffi::tuple::attributes(desc) };
        let memory = OwnedContext::new("gsnap key hash functions");
        let functions = def
            .columns
            .iter()
            .map(|c| {
                // SAFETY: an all-zero FmgrInfo is what fmgr_info fills in.
                let mut f: pg_sys::FmgrInfo = unsafe { std::mem::zeroed() };
                // SAFETY: a hash function found in the catalog; its cache in `memory`.
                memory.run(|| unsafe { pg_sys::fmgr_info(c.hash_proc, &mut f) });
                f
            })
            .collect();
        let lengths = def
            .columns
            .iter()
            .map(|c| atts[c.attnum as usize - 1].attlen)
            .collect();
        KeyHasher {
            def,
            functions,
            lengths,
            _functions_memory: memory,
            scratch: OwnedContext::new("gsnap key hashing"),
            call: vec![
                0;
                (std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
                    + std::mem::size_of::<pg_sys::NullableDatum>())
                .div_ceil(8)
            ],
        }
    }

    /// Frees what the hash functions allocated for the rows hashed so far (call between
    /// pages).
    pub fn end_page(&mut self) {
        // SAFETY: the hashes are computed; nothing the functions allocated is used any more.
        unsafe { self.scratch.reset() };
    }

    /// The key hashes of the heap tuples at `tuples` (pointer and length, each a complete
    /// heap tuple of the table whose descriptor is `desc`, 8-byte aligned), appended to
    /// `out`: none for a row with a NULL key column (no equality finds it), the wildcard for
    /// a row with an out-of-line TOAST value in its key.
    ///
    /// The hash functions are called directly, inside one guard for the whole page (an
    /// ERROR one raises lands there and becomes the capture's error): the per-call guard
    /// costs more than the hashing itself.
    ///
    /// # Safety
    /// As above; on the main thread, in a transaction.
    pub unsafe fn hash_page(
        &mut self,
        tuples: &[(*const u8, usize)],
        desc: pg_sys::TupleDesc,
        out: &mut Vec<u64>,
    ) {
        out.reserve(tuples.len());
        let KeyHasher {
            def,
            functions,
            lengths,
            scratch,
            call,
            ..
        } = self;
        let hash_all = || {
            for &tuple in tuples {
                // SAFETY: the caller's tuples and descriptor.
                let h = unsafe { hash_tuple(def, lengths, functions, call, tuple, desc) };
                out.extend(h);
            }
        };
        // SAFETY: on the main thread (the caller's promise); the closures own nothing that
        // needs dropping (an ERROR skips their frames).
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| scratch.run(hash_all)) };
    }
}

/// The key hash of one heap tuple (see [`KeyHasher::hash_page`]), by the hasher's
/// definition, column lengths, functions and call frame.
///
/// # Safety
/// As for [`KeyHasher::hash_page`], inside its guard.
unsafe fn hash_tuple(
    def: &KeyDef,
    lengths: &[i16],
    functions: &mut [pg_sys::FmgrInfo],
    frame: &mut [u64],
    (p, len): (*const u8, usize),
    desc: pg_sys::TupleDesc,
) -> Option<u64> {
    let mut data = pg_sys::HeapTupleData {
        t_len: len as u32,
        t_self: pg_sys::ItemPointerData::default(),
        t_tableOid: pg_sys::InvalidOid,
        t_data: p.cast_mut().cast(),
    };
    let mut key = KeyHash::new();
    for (i, c) in def.columns.iter().enumerate() {
        let mut null = false;
        // SAFETY: the caller's tuple and descriptor.
        let datum = unsafe { pg_sys::heap_getattr(&mut data, c.attnum.into(), desc, &mut null) };
        if null {
            return None;
        }
        // SAFETY: a varlena's first byte; 0x01 is the header of a TOAST pointer (an
        // external value).
        if lengths[i] == -1 && unsafe { *datum.cast_mut_ptr::<u8>() } == 0x01 {
            return Some(WILDCARD_KEY);
        }
        // SAFETY: the column's hash function, called as FunctionCall1Coll calls it (the
        // caller's guard catches an ERROR).
        key = key.with(unsafe { call1(&mut functions[i], frame, c.collation, datum) });
    }
    Some(key.finish())
}

/// Calls the one-argument function `f` on `arg` with collation `collation`, through the
/// call frame `frame` (room for a FunctionCallInfoBaseData and one argument), without a
/// guard of its own; returns its result as a 32-bit hash.
///
/// # Safety
/// `f` is a filled-in FmgrInfo of a strict one-argument function returning int4; inside a
/// guard that catches an ERROR; in a transaction.
unsafe fn call1(
    f: &mut pg_sys::FmgrInfo,
    frame: &mut [u64],
    collation: pg_sys::Oid,
    arg: pg_sys::Datum,
) -> u32 {
    let fcinfo = frame
        .as_mut_ptr()
        .cast::<pg_sys::FunctionCallInfoBaseData>();
    // SAFETY: `frame` has room for the header and one argument, 8-byte aligned.
    unsafe {
        (*fcinfo).flinfo = f;
        (*fcinfo).context = std::ptr::null_mut();
        (*fcinfo).resultinfo = std::ptr::null_mut();
        (*fcinfo).fncollation = collation;
        (*fcinfo).isnull = false;
        (*fcinfo).nargs = 1;
        let args = (*fcinfo).args.as_mut_slice(1);
        args[0] = pg_sys::NullableDatum {
            value: arg,
            isnull: false,
        };
        let call = f
            .fn_addr
            .expect("fmgr_info fills in the function's address");
        call(fcinfo).value() as u32
    }
}

/// The condition one key column is given by a query.
enum ColumnCondition {
    /// An expression (without the scanned table's columns) the column's value must equal,
    /// or an array it must be in.
    Equal {
        expr: *mut pg_sys::Expr,
        array: bool,
        /// The hash function of the operator's other side (the expression's values).
        hash_proc: pg_sys::Oid,
    },
    /// A lower and an upper bound on an integer column (`id BETWEEN 100 AND 200`): the
    /// lookup hashes every value between them, when there are few enough.
    Between { lower: Bound, upper: Bound },
}

/// One side of a [`ColumnCondition::Between`]: an integer expression without the scanned
/// table's columns, and whether the column may equal it.
struct Bound {
    expr: *mut pg_sys::Expr,
    inclusive: bool,
}

/// A query's conditions that fix the key of the table it scans: an equality (or `= ANY`)
/// for every key column.
pub struct KeyConditions {
    def: KeyDef,
    columns: Vec<ColumnCondition>,
}

/// The most keys (combinations of the columns' values) a lookup hashes; more: the scan
/// reads every page. (The worker is asked for at most `MAX_KEY_HASHES` at a time.)
const MAX_KEYS: usize = 16 * gsnap_protocol::MAX_KEY_HASHES;

/// `node` without the binary-compatible relabelings around it (a varchar column compared
/// as text).
///
/// # Safety
/// `node` is a valid expression node.
unsafe fn strip(mut node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: the caller's node; a RelabelType's argument is a node.
    unsafe {
        while crate::ffi::node::is_a(node, pg_sys::NodeTag::T_RelabelType) {
            node = (*node.cast::<pg_sys::RelabelType>()).arg.cast();
        }
    }
    node
}

/// True if comparing with collation `given` finds equal exactly the values comparing with
/// `key` does, hashed alike: the same collation, or two deterministic ones.
///
/// # Safety
/// In a transaction.
unsafe fn same_equality(given: pg_sys::Oid, key: pg_sys::Oid) -> bool {
    given == key
        || (given != pg_sys::InvalidOid
            && key != pg_sys::InvalidOid
            // SAFETY: catalog lookups of existing collations.
            && unsafe {
                pg_sys::get_collation_isdeterministic(given)
                    && pg_sys::get_collation_isdeterministic(key)
            })
}

/// The condition `clause` gives key column `column`, if it is `column op expr` (or `expr op
/// column`, or `column op ANY (array)`) with an operator hashed by the column's hash function
/// and an expression free of the scan's columns and of volatile functions.
///
/// # Safety
/// `clause` is a valid expression; in a transaction.
unsafe fn condition_of(
    clause: *mut pg_sys::Node,
    column: &KeyColumn,
    column_of: &dyn Fn(*mut pg_sys::Node) -> Option<i16>,
) -> Option<ColumnCondition> {
    use crate::ffi::node::is_a;
    // SAFETY: nodes of the caller's clause.
    let is_column = |n: *mut pg_sys::Node| column_of(unsafe { strip(n) }) == Some(column.attnum);
    let is_value = |n: *mut pg_sys::Node| {
        // SAFETY: as above.
        unsafe { !pg_sys::contain_var_clause(n) && !pg_sys::contain_volatile_functions(n) }
    };
    // SAFETY: the caller's clause, read by its tag.
    unsafe {
        let (opno, collation, args, array) = if is_a(clause, pg_sys::NodeTag::T_OpExpr) {
            let op = &*clause.cast::<pg_sys::OpExpr>();
            (op.opno, op.inputcollid, op.args, false)
        } else if is_a(clause, pg_sys::NodeTag::T_ScalarArrayOpExpr) {
            let op = &*clause.cast::<pg_sys::ScalarArrayOpExpr>();
            if !op.useOr {
                return None;
            }
            (op.opno, op.inputcollid, op.args, true)
        } else {
            return None;
        };
        if crate::ffi::list::len(args) != 2 || !same_equality(collation, column.collation) {
            return None;
        }
        let (left, right) = (
            crate::ffi::list::nth::<pg_sys::Node>(args, 0),
            crate::ffi::list::nth::<pg_sys::Node>(args, 1),
        );
        let (mut lproc, mut rproc) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
        if !pg_sys::get_op_hash_functions(opno, &mut lproc, &mut rproc) {
            return None;
        }
        if is_column(left) && is_value(right) && lproc == column.hash_proc {
            Some(ColumnCondition::Equal {
                expr: right.cast(),
                array,
                hash_proc: rproc,
            })
        } else if !array && is_column(right) && is_value(left) && rproc == column.hash_proc {
            Some(ColumnCondition::Equal {
                expr: left.cast(),
                array,
                hash_proc: lproc,
            })
        } else {
            None
        }
    }
}

/// The values an integer key column can hold, if `column` is one whose map hashes its
/// values with the integer family's own hash function (so a value between two bounds,
/// enumerated, hashes as the capture hashed it).
fn integer_range(column: &KeyColumn) -> Option<(i64, i64)> {
    let (range, hash) = match column.type_oid {
        pg_sys::INT2OID => ((i16::MIN.into(), i16::MAX.into()), pg_sys::F_HASHINT2),
        pg_sys::INT4OID => ((i32::MIN.into(), i32::MAX.into()), pg_sys::F_HASHINT4),
        pg_sys::INT8OID => ((i64::MIN, i64::MAX), pg_sys::F_HASHINT8),
        _ => return None,
    };
    (column.hash_proc == pg_sys::Oid::from(hash)).then_some(range)
}

/// The bound `clause` gives integer key column `column`, if it is `column op expr` (or `expr
/// op column`) with `op` one of the B-tree integer family's `<`, `<=`, `>=`, `>` and an
/// expression free of the scan's columns and of volatile functions: true for a lower bound.
///
/// # Safety
/// `clause` is a valid expression; in a transaction.
unsafe fn bound_of(
    clause: *mut pg_sys::Node,
    column: &KeyColumn,
    column_of: &dyn Fn(*mut pg_sys::Node) -> Option<i16>,
) -> Option<(bool, Bound)> {
    // SAFETY: the caller's clause, read by its tag.
    unsafe {
        if !crate::ffi::node::is_a(clause, pg_sys::NodeTag::T_OpExpr) {
            return None;
        }
        let op = &*clause.cast::<pg_sys::OpExpr>();
        if crate::ffi::list::len(op.args) != 2 {
            return None;
        }
        let strategy = pg_sys::get_op_opfamily_strategy(op.opno, pg_sys::INTEGER_BTREE_FAM_OID);
        let (left, right) = (
            crate::ffi::list::nth::<pg_sys::Node>(op.args, 0),
            crate::ffi::list::nth::<pg_sys::Node>(op.args, 1),
        );
        let is_value = |n: *mut pg_sys::Node| {
            !pg_sys::contain_var_clause(n) && !pg_sys::contain_volatile_functions(n)
        };
        // The strategy as if the column were on the left.
        let (strategy, expr) = if column_of(strip(left)) == Some(column.attnum) && is_value(right) {
            (strategy as u32, right)
        } else if column_of(strip(right)) == Some(column.attnum) && is_value(left) {
            let flipped = match strategy as u32 {
                pg_sys::BTLessStrategyNumber => pg_sys::BTGreaterStrategyNumber,
                pg_sys::BTLessEqualStrategyNumber => pg_sys::BTGreaterEqualStrategyNumber,
                pg_sys::BTGreaterEqualStrategyNumber => pg_sys::BTLessEqualStrategyNumber,
                pg_sys::BTGreaterStrategyNumber => pg_sys::BTLessStrategyNumber,
                _ => return None,
            };
            (flipped, left)
        } else {
            return None;
        };
        let bound = |inclusive| Bound {
            expr: expr.cast(),
            inclusive,
        };
        match strategy {
            pg_sys::BTLessStrategyNumber => Some((false, bound(false))),
            pg_sys::BTLessEqualStrategyNumber => Some((false, bound(true))),
            pg_sys::BTGreaterEqualStrategyNumber => Some((true, bound(true))),
            pg_sys::BTGreaterStrategyNumber => Some((true, bound(false))),
            _ => None,
        }
    }
}

/// The range condition `clauses` give integer key column `column`: the first lower and the
/// first upper bound among them (each further bound only narrows what the query returns; its
/// own conditions decide). None without both, or if both are constants more than
/// [`MAX_KEYS`] values apart (the scan reads every page: no lookup is planned).
///
/// # Safety
/// The clauses are valid expressions; in a transaction.
unsafe fn between(
    clauses: &[*mut pg_sys::Node],
    column: &KeyColumn,
    column_of: &dyn Fn(*mut pg_sys::Node) -> Option<i16>,
) -> Option<ColumnCondition> {
    integer_range(column)?;
    let (mut lower, mut upper) = (None, None);
    for &clause in clauses {
        // SAFETY: the caller's clauses.
        match unsafe { bound_of(clause, column, column_of) } {
            Some((true, b)) if lower.is_none() => lower = Some(b),
            Some((false, b)) if upper.is_none() => upper = Some(b),
            _ => {}
        }
    }
    let (lower, upper) = (lower?, upper?);
    let condition = ColumnCondition::Between { lower, upper };
    // SAFETY: the bounds just found.
    (unsafe { condition.planned_keys(column) } <= MAX_KEYS).then_some(condition)
}

impl ColumnCondition {
    /// How many values the condition allows key column `column` at least, as far as the
    /// plan tells: those between two constant bounds, else one.
    ///
    /// # Safety
    /// The condition's expressions are valid.
    unsafe fn planned_keys(&self, column: &KeyColumn) -> usize {
        let ColumnCondition::Between { lower, upper } = self else {
            return 1;
        };
        // SAFETY: the bounds' expressions, read by their tag.
        let constant = |b: &Bound| unsafe {
            crate::ffi::node::is_a(b.expr.cast(), pg_sys::NodeTag::T_Const)
                .then(|| {
                    let c = &*b.expr.cast::<pg_sys::Const>();
                    (!c.constisnull).then(|| {
                        (
                            integer_value(pg_sys::getBaseType(c.consttype), c.constvalue),
                            b.inclusive,
                        )
                    })
                })
                .flatten()
        };
        match (integer_range(column), constant(lower), constant(upper)) {
            (Some(range), Some(lo), Some(hi)) => count(values_between(range, lo, hi)),
            _ => 1,
        }
    }
}

/// An integer value of type `type_oid` (int2, int4 or int8: the integer family's types).
fn integer_value(type_oid: pg_sys::Oid, d: pg_sys::Datum) -> i64 {
    match type_oid {
        pg_sys::INT2OID => i64::from(d.value() as i16),
        pg_sys::INT4OID => i64::from(d.value() as i32),
        _ => d.value() as i64,
    }
}

/// The values of a column holding `range` between the bounds `lower` and `upper` (value,
/// inclusive): the first and the last (empty if the first is above the last).
fn values_between(range: (i64, i64), lower: (i64, bool), upper: (i64, bool)) -> (i64, i64) {
    let first = i128::from(lower.0) + i128::from(!lower.1);
    let last = i128::from(upper.0) - i128::from(!upper.1);
    let clamp = |v: i128| v.clamp(range.0.into(), range.1.into()) as i64;
    if first > last || first > range.1.into() || last < range.0.into() {
        (1, 0)
    } else {
        (clamp(first), clamp(last))
    }
}

/// How many values `first..=last` holds.
fn count((first, last): (i64, i64)) -> usize {
    if first > last {
        0
    } else {
        usize::try_from(i128::from(last) - i128::from(first) + 1).unwrap_or(usize::MAX)
    }
}

impl KeyConditions {
    /// The conditions among `quals` (a list of implicitly AND-ed clauses, or of
    /// RestrictInfos) that fix the key of the open table `rel`, whose columns `column_of`
    /// recognizes (an expression node: the attribute number of the table's column it is);
    /// None unless every key column has one.
    ///
    /// # Safety
    /// `rel` is open, `quals` NIL or a valid list; in a transaction.
    pub unsafe fn find(
        rel: pg_sys::Relation,
        quals: *mut pg_sys::List,
        column_of: &dyn Fn(*mut pg_sys::Node) -> Option<i16>,
    ) -> Option<KeyConditions> {
        if quals.is_null() {
            return None;
        }
        // SAFETY: the caller's promise.
        let def = unsafe { table_key(rel) }?;
        // SAFETY: the caller's list; a RestrictInfo's clause is an expression.
        let clauses: Vec<*mut pg_sys::Node> = unsafe {
            crate::ffi::list::iter::<pg_sys::Node>(quals)
                .map(|n| {
                    if crate::ffi::node::is_a(n, pg_sys::NodeTag::T_RestrictInfo) {
                        (*n.cast::<pg_sys::RestrictInfo>()).clause.cast()
                    } else {
                        n
                    }
                })
                .collect()
        };
        let columns = def
            .columns
            .iter()
            .map(|c| {
                clauses
                    .iter()
                    // SAFETY: the clauses of the caller's list.
                    .find_map(|&clause| unsafe { condition_of(clause, c, column_of) })
                    // SAFETY: as above.
                    .or_else(|| unsafe { between(&clauses, c, column_of) })
            })
            .collect::<Option<Vec<_>>>()?;
        // Constant ranges of several columns whose combinations are too many: no lookup.
        let planned = def
            .columns
            .iter()
            .zip(&columns)
            .try_fold(1usize, |n, (c, condition)| {
                // SAFETY: the conditions just found.
                n.checked_mul(unsafe { condition.planned_keys(c) })
                    .filter(|&n| n <= MAX_KEYS)
            });
        planned.map(|_| KeyConditions { def, columns })
    }

    /// The key columns' names, for EXPLAIN (`id (range)` for a column given by its bounds).
    ///
    /// # Safety
    /// In a transaction; `relid` is the table.
    pub unsafe fn column_names(&self, relid: pg_sys::Oid) -> String {
        self.def
            .columns
            .iter()
            .zip(&self.columns)
            .map(|(c, condition)| {
                // SAFETY: a column of the table (missing_ok: a name is only shown).
                let name = unsafe { pg_sys::get_attname(relid, c.attnum, true) };
                let name = if name.is_null() {
                    format!("#{}", c.attnum)
                } else {
                    // SAFETY: a palloc'd C string.
                    unsafe { std::ffi::CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned()
                };
                match condition {
                    ColumnCondition::Equal { .. } => name,
                    ColumnCondition::Between { .. } => format!("{name} (range)"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The lookup the conditions ask for: the key and the hashes of the keys they allow,
    /// their expressions evaluated in `planstate`'s context (parameters bound); None if
    /// there are more keys than a lookup takes. A NULL value allows no key (the operators
    /// are strict).
    ///
    /// # Safety
    /// `planstate` is the scan node's state, initialized; in a transaction.
    pub unsafe fn lookup(&self, planstate: *mut pg_sys::PlanState) -> Option<KeyLookup> {
        // SAFETY: the caller's promise.
        let hashes = unsafe { self.hashes(planstate) }?;
        Some(KeyLookup {
            def: self.def.clone(),
            hashes,
        })
    }

    /// The hashes of [`KeyConditions::lookup`].
    ///
    /// # Safety
    /// As for [`KeyConditions::lookup`].
    unsafe fn hashes(&self, planstate: *mut pg_sys::PlanState) -> Option<Vec<u64>> {
        let mut keys = vec![KeyHash::new()];
        for (c, column) in self.columns.iter().zip(&self.def.columns) {
            let room = MAX_KEYS.checked_div(keys.len()).unwrap_or(usize::MAX);
            // SAFETY: the caller's promise.
            let values = unsafe { evaluate(c, column, planstate, room) }?;
            keys = keys
                .iter()
                .flat_map(|k| values.iter().map(|&v| k.with(v)))
                .collect();
        }
        let mut hashes: Vec<u64> = keys.into_iter().map(KeyHash::finish).collect();
        hashes.sort_unstable();
        hashes.dedup();
        Some(hashes)
    }
}

/// A lookup by key: the table's key, and the hashes of the keys sought.
pub struct KeyLookup {
    def: KeyDef,
    pub hashes: Vec<u64>,
}

impl KeyLookup {
    /// The definition of the key, as the table's key map records it.
    pub fn definition(&self) -> Vec<u8> {
        self.def.encode()
    }

    /// The definition of the key as the key map of a partition of the table records it
    /// (the partition's own key: the partition of the table's key index), where the
    /// partition's attribute `i + 1` holds the table's attribute `attnums[i]` (0: none);
    /// None if a key column is not in the partition. The hashes are the same: they are
    /// made from the key's values, with the same functions and collations.
    pub fn definition_in(&self, attnums: &[i16]) -> Option<Vec<u8>> {
        let columns = self
            .def
            .columns
            .iter()
            .map(|c| {
                let at = attnums.iter().position(|&a| a == c.attnum)?;
                Some(KeyColumn {
                    attnum: i16::try_from(at + 1).ok()?,
                    ..*c
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(KeyDef { columns }.encode())
    }
}

/// A column of a table, as a query names it: `var(varno, attno)` is the Var of column `attno`
/// (AS OF: the scan's columns are the table's); a range's `rec` column `rec` (a Var of
/// `varno`) names the table's columns as fields, `(rec).column`. Returns `node`'s attribute
/// number.
///
/// # Safety
/// `node` is a valid expression node.
pub unsafe fn column_of(
    node: *mut pg_sys::Node,
    varno: i32,
    rec: Option<i16>,
    attnum: &dyn Fn(i16) -> Option<i16>,
) -> Option<i16> {
    use crate::ffi::node::is_a;
    // SAFETY: the caller's node, read by its tag.
    unsafe {
        match rec {
            None if is_a(node, pg_sys::NodeTag::T_Var) => {
                let v = &*node.cast::<pg_sys::Var>();
                (v.varno == varno && v.varattno >= 1)
                    .then(|| attnum(v.varattno))
                    .flatten()
            }
            Some(rec) if is_a(node, pg_sys::NodeTag::T_FieldSelect) => {
                let f = &*node.cast::<pg_sys::FieldSelect>();
                let arg = f.arg.cast::<pg_sys::Node>();
                (is_a(arg, pg_sys::NodeTag::T_Var)
                    && (*arg.cast::<pg_sys::Var>()).varno == varno
                    && (*arg.cast::<pg_sys::Var>()).varattno == rec
                    && f.fieldnum >= 1)
                    .then_some(f.fieldnum)
            }
            _ => None,
        }
    }
}

/// The value of `expr` in `planstate`'s context (None: NULL).
///
/// # Safety
/// As for [`KeyConditions::hashes`]; the value lives in the per-tuple memory.
unsafe fn value_of(
    expr: *mut pg_sys::Expr,
    planstate: *mut pg_sys::PlanState,
) -> Option<pg_sys::Datum> {
    // SAFETY: the caller's promise: the node's state and expression context.
    unsafe {
        let state = pg_sys::ExecInitExpr(expr, planstate);
        let econtext = (*planstate).ps_ExprContext;
        let mut null = false;
        let value = pg_sys::ExecEvalExprSwitchContext(state, econtext, &mut null);
        (!null).then_some(value)
    }
}

/// The hashes (by the hash function of the condition's values, with the key column's
/// collation) of the values condition `c` allows key column `column`: its expression's
/// value, the non-NULL elements of its array, or the integers between its bounds; None if
/// there are more than `room`.
///
/// # Safety
/// As for [`KeyConditions::hashes`].
unsafe fn evaluate(
    c: &ColumnCondition,
    column: &KeyColumn,
    planstate: *mut pg_sys::PlanState,
    room: usize,
) -> Option<Vec<u32>> {
    let collation = column.collation;
    let hasher = |proc_: pg_sys::Oid| {
        // SAFETY: an all-zero FmgrInfo is what fmgr_info fills in.
        let mut f: pg_sys::FmgrInfo = unsafe { std::mem::zeroed() };
        // SAFETY: a hash function found in the catalog.
        unsafe { pg_sys::fmgr_info(proc_, &mut f) };
        move |d: pg_sys::Datum| {
            // SAFETY: a strict one-argument function returning int4, on a value of its type.
            unsafe { pg_sys::FunctionCall1Coll(&mut f, collation, d).value() as u32 }
        }
    };
    let (expr, array, hash_proc) = match c {
        &ColumnCondition::Equal {
            expr,
            array,
            hash_proc,
        } => (expr, array, hash_proc),
        ColumnCondition::Between { lower, upper } => {
            // SAFETY: the caller's promise; the bounds are integers of the family's types.
            let bound = |b: &Bound| unsafe {
                let value = value_of(b.expr, planstate)?;
                Some((
                    integer_value(pg_sys::getBaseType(pg_sys::exprType(b.expr.cast())), value),
                    b.inclusive,
                ))
            };
            let (Some(lo), Some(hi)) = (bound(lower), bound(upper)) else {
                return Some(Vec::new());
            };
            let range = integer_range(column).expect("a range is planned on integer keys only");
            let (first, last) = values_between(range, lo, hi);
            if count((first, last)) > room {
                return None;
            }
            let mut hash = hasher(column.hash_proc);
            let datum = |v: i64| match column.type_oid {
                pg_sys::INT2OID => pg_sys::Datum::from(v as i16),
                pg_sys::INT4OID => pg_sys::Datum::from(v as i32),
                _ => pg_sys::Datum::from(v),
            };
            return Some((first..=last).map(|v| hash(datum(v))).collect());
        }
    };
    // SAFETY: the caller's promise; the values are hashed before the per-tuple memory they
    // may live in is reset.
    unsafe {
        let Some(value) = value_of(expr, planstate) else {
            return Some(Vec::new());
        };
        let mut hash = hasher(hash_proc);
        if !array {
            return (room >= 1).then(|| vec![hash(value)]);
        }
        let array = pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
        let element = (*array).elemtype;
        let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
        pg_sys::get_typlenbyvalalign(element, &mut len, &mut byval, &mut align);
        let mut elements = std::ptr::null_mut();
        let mut nulls = std::ptr::null_mut();
        let mut n = 0;
        pg_sys::deconstruct_array(
            array,
            element,
            len.into(),
            byval,
            align,
            &mut elements,
            &mut nulls,
            &mut n,
        );
        let values: Vec<u32> = (0..n as usize)
            .filter(|&i| !*nulls.add(i))
            .map(|i| hash(*elements.add(i)))
            .collect();
        (values.len() <= room).then_some(values)
    }
}
