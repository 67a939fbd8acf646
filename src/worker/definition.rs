//! What the worker records at declaration, for each table, to recreate it after a DROP
//! (`gsnap_format::definition`): defaults, generation expressions, identities, owned
//! sequences and collations of the columns; primary key, unique, exclusion, check and
//! foreign key constraints; other indexes; owner, persistence and row security flags; storage
//! parameters (the table's and its TOAST table's `reloptions`); for a
//! partition, its ancestors, partition constraint and bound (what reading a partitioned
//! table as of a snapshot needs, `read::partitioned`).
//!
//! Everything is read from the relation cache and deparsed by PostgreSQL's own `ruleutils`
//! (as `pg_dump` prints it), so the text is what `CREATE TABLE` and `ALTER TABLE` accept.
//!
//! Deparsing costs ~40 us a table, at every declaration: so definitions are cached per table
//! (and qualified name) and dropped when PostgreSQL invalidates the relation cache entry of
//! the table or of one of its indexes (every change of columns, defaults, constraints,
//! indexes, owner, row security or storage parameters does, its TOAST table's included:
//! `ALTER TABLE ... SET` rewrites the table's own `reloptions` too), or all of them. The one
//! change that sends no such invalidation, `ALTER SEQUENCE ... OWNED BY` alone, is recorded
//! at the table's next change.

use crate::ffi::catalog::partitioning;
use crate::ffi::catalog::{quote_ident, string_from};
use crate::ffi::list;
use crate::ffi::relation::{qualified_name, OpenRelation};
use crate::ffi::tuple;
use gsnap_format::definition::{
    Ancestor, ColumnDefinition, Constraint, ConstraintKind, Identity, IndexDefinition, PartitionOf,
    TableDefinition,
};
use pgrx::{pg_guard, pg_sys};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// A cached definition: the table's name when it was read, and its indexes (whose
/// invalidations drop it too).
struct Cached {
    qualified: String,
    indexes: Vec<pg_sys::Oid>,
    definition: TableDefinition,
}

/// What the relation cache invalidated since the cache was last looked at (None: all).
enum Pending {
    Some(Vec<pg_sys::Oid>),
    All,
}

thread_local! {
    static CACHE: RefCell<HashMap<pg_sys::Oid, Cached>> = RefCell::new(HashMap::new());
    static PENDING: RefCell<Pending> = const { RefCell::new(Pending::Some(Vec::new())) };
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// PostgreSQL's relation cache invalidation callback: notes what to drop (the cache itself
/// is never touched here, so a callback during a lookup cannot disturb it).
#[pg_guard]
unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        match &mut *p {
            Pending::Some(list) if relid != pg_sys::InvalidOid && list.len() < 1024 => {
                list.push(relid)
            }
            _ => *p = Pending::All,
        }
    });
}

/// Applies the invalidations noted since the last lookup.
fn apply_invalidations() {
    let pending =
        PENDING.with(|p| std::mem::replace(&mut *p.borrow_mut(), Pending::Some(Vec::new())));
    CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        match pending {
            Pending::All => cache.clear(),
            Pending::Some(relids) if !relids.is_empty() => cache.retain(|relid, cached| {
                !relids.contains(relid) && !cached.indexes.iter().any(|i| relids.contains(i))
            }),
            Pending::Some(_) => {}
        }
    });
}

/// The definition of an open table whose qualified name (as `quote_qualified_identifier`
/// printed it) is `qualified`, from the cache if nothing changed it since.
///
/// # Safety
/// `rel` is open and locked by this process; call in a transaction.
pub unsafe fn definition_of(rel: &OpenRelation, qualified: &str) -> TableDefinition {
    if !REGISTERED.get() {
        // SAFETY: registers a callback with a static lifetime, once per process.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0usize))
        };
        REGISTERED.set(true);
    }
    apply_invalidations();
    let relid = rel.oid();
    let hit = CACHE.with(|c| {
        c.borrow()
            .get(&relid)
            .filter(|cached| cached.qualified == qualified)
            .map(|cached| cached.definition.clone())
    });
    if let Some(definition) = hit {
        return definition;
    }
    // SAFETY: the open relation's index list (a copy).
    let indexes = unsafe { list::oids(pg_sys::RelationGetIndexList(rel.as_ptr())) };
    // SAFETY: the caller's promise; `indexes` are the table's.
    let definition = unsafe { read_definition(rel, qualified, &indexes) };
    CACHE.with(|c| {
        c.borrow_mut().insert(
            relid,
            Cached {
                qualified: qualified.to_string(),
                indexes,
                definition: definition.clone(),
            },
        )
    });
    definition
}

/// Reads the definition of an open table, whose indexes are `indexes`, from the catalog.
///
/// # Safety
/// As for [`definition_of`].
unsafe fn read_definition(
    rel: &OpenRelation,
    qualified: &str,
    indexes: &[pg_sys::Oid],
) -> TableDefinition {
    let class = rel.class();
    // SAFETY: a catalog lookup that returns NULL for a role that does not exist.
    let owner_name = unsafe { pg_sys::GetUserNameFromId(class.relowner, true) };
    // SAFETY: in a transaction; a deparse context for expressions over this table (defaults,
    // checks).
    let context = unsafe { pg_sys::deparse_context_for(class.relname.data.as_ptr(), rel.oid()) };
    // SAFETY: the caller's promise.
    let (mut constraints, indexes) = unsafe { index_definitions(indexes, qualified) };
    // SAFETY: the caller's promise; the context is this table's.
    unsafe { add_other_constraints(rel, context, &mut constraints) };
    TableDefinition {
        owner: class.relowner.to_u32(),
        owner_name: if owner_name.is_null() {
            String::new()
        } else {
            // SAFETY: a C string just returned.
            unsafe { string_from(owner_name) }
        },
        unlogged: class.relpersistence as u8 == pg_sys::RELPERSISTENCE_UNLOGGED,
        row_security: class.relrowsecurity,
        force_row_security: class.relforcerowsecurity,
        // SAFETY: the caller's promise; the context is this table's.
        columns: unsafe { columns(rel, context) },
        constraints,
        indexes,
        // SAFETY: the caller's promise.
        partition: class.relispartition.then(|| unsafe { partition_of(rel) }),
        // SAFETY: catalog lookups by OID, in the caller's transaction.
        options: unsafe {
            let mut options = reloptions(rel.oid(), "");
            if class.reltoastrelid != pg_sys::InvalidOid {
                options.extend(reloptions(class.reltoastrelid, "toast."));
            }
            options
        },
    }
}

/// The storage parameters of relation `relid` (`pg_class.reloptions`: `name=value` each),
/// each prefixed with `prefix`.
///
/// # Safety
/// In a transaction.
unsafe fn reloptions(relid: pg_sys::Oid, prefix: &str) -> Vec<String> {
    // SAFETY: the caller's promise; reloptions is a text[] without NULLs, split into the
    // current memory context.
    unsafe {
        class_attribute(relid, pg_sys::Anum_pg_class_reloptions, |d| {
            let array = pg_sys::pg_detoast_datum(d.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
            let (mut elems, mut nulls, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
            pg_sys::deconstruct_array(
                array,
                pg_sys::TEXTOID,
                -1,
                false,
                pg_sys::TYPALIGN_INT as std::ffi::c_char,
                &mut elems,
                &mut nulls,
                &mut n,
            );
            (0..n as usize)
                .map(|i| {
                    let text = pg_sys::text_to_cstring((*elems.add(i)).cast_mut_ptr());
                    format!("{prefix}{}", string_from(text))
                })
                .collect()
        })
    }
    .unwrap_or_default()
}

/// Where a partition is: its ancestors (with the attribute each of its columns has in
/// each), its partition constraint and its bound.
///
/// The ancestors cannot change their columns while the partition is locked (column changes
/// of a partitioned table recurse to its partitions), nor detach it.
unsafe fn partition_of(rel: &OpenRelation) -> PartitionOf {
    let relid = rel.oid();
    // SAFETY: the open relation's descriptor.
    let attrs = unsafe { tuple::attributes(rel.descriptor()) };
    // SAFETY: a catalog lookup of the partition's ancestors (pg_inherits).
    let ancestors = unsafe { list::oids(partitioning::get_partition_ancestors(relid)) }
        .into_iter()
        .map(|a| Ancestor {
            relid: a.to_u32(),
            name: qualified_name(a).unwrap_or_default(),
            attnums: attrs
                .iter()
                .map(|att| {
                    if att.attisdropped {
                        0
                    } else {
                        // SAFETY: a catalog lookup of a column by name (0: none).
                        unsafe { pg_sys::get_attnum(a, att.attname.data.as_ptr()) }
                    }
                })
                .collect(),
        })
        .collect();
    // SAFETY: the partition's constraint (the partition is locked), printed in stored form.
    let constraint = unsafe {
        let qual = partitioning::get_partition_qual_relid(relid);
        if qual.is_null() {
            String::new()
        } else {
            string_from(pg_sys::nodeToString(qual.cast()))
        }
    };
    PartitionOf {
        ancestors,
        constraint,
        // SAFETY: the caller's promise.
        bound: unsafe { bound_of(relid) },
    }
}

/// `pg_get_expr(relpartbound, relid)`: the partition's bound as SQL.
unsafe fn bound_of(relid: pg_sys::Oid) -> String {
    // SAFETY: the caller's promise; pg_get_expr of the partition's own bound.
    unsafe {
        class_attribute(relid, pg_sys::Anum_pg_class_relpartbound, |bound| {
            let function = pg_sys::fmgr_internal_function(c"pg_get_expr".as_ptr());
            let d = pg_sys::OidFunctionCall2Coll(
                function,
                pg_sys::InvalidOid,
                bound,
                pg_sys::Datum::from(relid),
            );
            string_from(pg_sys::text_to_cstring(d.cast_mut_ptr()))
        })
    }
    .unwrap_or_default()
}

/// `f` of attribute `attnum` of relation `relid`'s `pg_class` row, read through the catalog
/// cache (None: no such relation, or the attribute is NULL).
///
/// # Safety
/// In a transaction; `f` reads a value of that attribute's type.
unsafe fn class_attribute<T>(
    relid: pg_sys::Oid,
    attnum: u32,
    f: impl FnOnce(pg_sys::Datum) -> T,
) -> Option<T> {
    let cache = pg_sys::SysCacheIdentifier::RELOID as i32;
    // SAFETY: a syscache lookup of the relation's pg_class row, released below, after `f`
    // (the value may point into the cached row).
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(relid));
        if tuple.is_null() {
            return None;
        }
        let mut isnull = false;
        let d = pg_sys::SysCacheGetAttr(cache, tuple, attnum as i16, &mut isnull);
        let out = (!isnull).then(|| f(d));
        pg_sys::ReleaseSysCache(tuple);
        out
    }
}

/// Each attribute's column definition (empty for dropped attributes).
unsafe fn columns(rel: &OpenRelation, context: *mut pg_sys::List) -> Vec<ColumnDefinition> {
    let desc = rel.descriptor();
    let relid = rel.oid();
    // SAFETY: the open relation's descriptor.
    let (attrs, constr) = unsafe { (tuple::attributes(desc), (*desc).constr) };
    let defaults: &[pg_sys::AttrDefault] = if constr.is_null() {
        &[]
    } else {
        // SAFETY: the descriptor's defaults, `num_defval` of them.
        unsafe {
            let c = &*constr;
            if c.defval.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(c.defval, usize::from(c.num_defval))
            }
        }
    };
    // SAFETY: the table's owned sequences; each one's owner looked up in pg_depend.
    let serial_columns: Vec<i32> = unsafe { list::oids(pg_sys::getOwnedSequences(relid)) }
        .into_iter()
        .filter_map(|seq| {
            let (mut table, mut column) = (pg_sys::InvalidOid, 0i32);
            // SAFETY: out-parameters of the lookup.
            let owned = unsafe {
                pg_sys::sequenceIsOwned(
                    seq,
                    pg_sys::DependencyType::DEPENDENCY_AUTO as std::ffi::c_char,
                    &mut table,
                    &mut column,
                )
            };
            (owned && table == relid).then_some(column)
        })
        .collect();
    attrs
        .iter()
        .map(|a| {
            if a.attisdropped {
                return ColumnDefinition::default();
            }
            let default = defaults
                .iter()
                .find(|d| d.adnum == a.attnum && !d.adbin.is_null())
                // SAFETY: the default's expression tree in its stored form, deparsed over
                // this table.
                .map(|d| unsafe { deparse(d.adbin, context) });
            // SAFETY: catalog lookup of the type's default collation.
            let type_collation = unsafe { pg_sys::get_typcollation(a.atttypid) };
            let collation = (a.attcollation != pg_sys::InvalidOid
                && a.attcollation != type_collation)
                // SAFETY: the column's collation, named as ruleutils names it.
                .then(|| unsafe { string_from(pg_sys::generate_collation_name(a.attcollation)) });
            ColumnDefinition {
                serial: serial_columns.contains(&i32::from(a.attnum))
                    && default.as_deref().is_some_and(|d| d.contains("nextval(")),
                default,
                generated: a.attgenerated as u8 == b's',
                identity: match a.attidentity as u8 {
                    b'a' => Some(Identity::Always),
                    b'd' => Some(Identity::ByDefault),
                    _ => None,
                },
                collation,
            }
        })
        .collect()
}

/// An expression in its stored form (`nodeToString`), deparsed.
unsafe fn deparse(stored: *const std::ffi::c_char, context: *mut pg_sys::List) -> String {
    // SAFETY: the caller's promise: a stored expression and a deparse context for it.
    unsafe {
        let node = pg_sys::stringToNode(stored).cast::<pg_sys::Node>();
        string_from(pg_sys::deparse_expression(node, context, false, false))
    }
}

/// `pg_get_constraintdef(conoid)`.
unsafe fn constraint_text(conoid: pg_sys::Oid) -> String {
    // SAFETY: the built-in function found by its name, called with an OID; it returns text.
    unsafe {
        let function = pg_sys::fmgr_internal_function(c"pg_get_constraintdef".as_ptr());
        let d =
            pg_sys::OidFunctionCall1Coll(function, pg_sys::InvalidOid, pg_sys::Datum::from(conoid));
        string_from(pg_sys::text_to_cstring(d.cast_mut_ptr()))
    }
}

/// A constraint, by OID: its name and definition (`pg_get_constraintdef`), of kind `kind` (or,
/// for one an index backs, the kind its definition starts with).
unsafe fn constraint(conoid: pg_sys::Oid, kind: Option<ConstraintKind>) -> Constraint {
    // SAFETY: the constraint's definition and name, by OID.
    let (definition, name) = unsafe {
        (
            constraint_text(conoid),
            string_from(pg_sys::get_constraint_name(conoid)),
        )
    };
    let kind = kind.unwrap_or(if definition.starts_with("PRIMARY KEY") {
        ConstraintKind::PrimaryKey
    } else if definition.starts_with("EXCLUDE") {
        ConstraintKind::Exclusion
    } else {
        ConstraintKind::Unique
    });
    Constraint {
        name,
        kind,
        definition,
    }
}

/// The table's indexes (`indexes`), in one pass: the constraints they back (primary key,
/// unique, exclusion), and the others as index definitions.
unsafe fn index_definitions(
    indexes: &[pg_sys::Oid],
    qualified: &str,
) -> (Vec<Constraint>, Vec<IndexDefinition>) {
    let (mut constraints, mut out) = (Vec::new(), Vec::new());
    for &index in indexes {
        // SAFETY: catalog lookups by OID.
        let conoid = unsafe { pg_sys::get_index_constraint(index) };
        if conoid != pg_sys::InvalidOid {
            // SAFETY: the constraint the index backs.
            constraints.push(unsafe { constraint(conoid, None) });
            continue;
        }
        // SAFETY: catalog lookups by OID; the index exists (the table is locked).
        let (text, name) = unsafe {
            (
                string_from(pg_sys::pg_get_indexdef_string(index)),
                string_from(pg_sys::get_rel_name(index)),
            )
        };
        let unique = text.starts_with("CREATE UNIQUE INDEX ");
        let prefix = format!(
            "CREATE {}INDEX {} ON {qualified} USING ",
            if unique { "UNIQUE " } else { "" },
            quote_ident(&name)
        );
        if let Some(body) = text.strip_prefix(&prefix) {
            out.push(IndexDefinition {
                name,
                unique,
                body: body.to_string(),
            });
        } else {
            pgrx::log!("gsnap: index {name} is not recorded: unexpected definition {text}");
        }
    }
    (constraints, out)
}

/// Adds the table's constraints no index backs: its checks (deparsed with `context`) and
/// its foreign keys.
unsafe fn add_other_constraints(
    rel: &OpenRelation,
    context: *mut pg_sys::List,
    out: &mut Vec<Constraint>,
) {
    let desc = rel.descriptor();
    // SAFETY: the open relation's descriptor and its check constraints.
    let checks: &[pg_sys::ConstrCheck] = unsafe {
        let constr = (*desc).constr;
        if constr.is_null() || (*constr).check.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts((*constr).check, usize::from((*constr).num_check))
        }
    };
    for c in checks {
        // SAFETY: the check's stored expression and name; the caller's context.
        let (expr, name) = unsafe { (deparse(c.ccbin, context), string_from(c.ccname)) };
        let mut definition = format!("CHECK ({expr})");
        if c.ccnoinherit {
            definition.push_str(" NO INHERIT");
        }
        if !c.ccvalid {
            definition.push_str(" NOT VALID");
        }
        out.push(Constraint {
            name,
            kind: ConstraintKind::Check,
            definition,
        });
    }
    // SAFETY: the open relation's foreign keys (relcache entries).
    for fk in unsafe {
        list::iter::<pg_sys::ForeignKeyCacheInfo>(pg_sys::RelationGetFKeyList(rel.as_ptr()))
    } {
        // SAFETY: an entry of that list, and its constraint.
        out.push(unsafe { constraint((*fk).conoid, Some(ConstraintKind::ForeignKey)) });
    }
}
