//! Dropped tables: reading a table as a snapshot recorded it, without the live relation, and
//! recreating it (README, "Dropped tables").
//!
//! - `gsnap_asof_dropped(name, snap) AS t(columns)`: the rows a table named `name` held at the
//!   snapshot (the name it had *then*, qualified or not), in the row type recorded then;
//! - `gsnap_table_definition(name, snap)`: the SQL that recreates it (`CREATE TABLE`, its
//!   constraints and indexes), as recorded at the snapshot;
//! - `gsnap_undrop(name, snap [, new_name])`: recreates it `USING gsnap` inside the caller's
//!   transaction, loads its rows, adds its constraints and indexes, continues its sequences,
//!   gives it back to its owner.
//!
//! Who may read a table without the live relation: its owner at the snapshot (a member of
//! that role, which must still exist under the same name) and superusers. The grants died with
//! the table, and the snapshot records its owner, not its grants. A table that had FORCE ROW
//! LEVEL SECURITY is readable only by superusers and BYPASSRLS roles (its policies are not
//! recorded, and they applied to its owner).

use crate::am::load::PageLoad;
use crate::error::{error, null_argument};
use crate::ffi::catalog::{quote_ident, string_from};
use crate::ffi::fcinfo::Call;
use crate::ffi::list;
use crate::ffi::relation::{relation_kind, OpenRelation};
use crate::ffi::tuple;
use crate::ipc;
use crate::read::asof::{AsofRows, Row};
use crate::read::current_columns;
use crate::read::recorded::{self, RecordedRows, TableAtSnapshot};
use crate::sql::access::require_gsnap_database;
use crate::sql::asof::resolve_time;
use crate::sql::snapshot_argument;
use crate::v1_function_info;
use gsnap_format::columns::in_place;
use gsnap_format::definition::{recreation, Names, Recreation};
use gsnap_format::rowtype::{Attribute, RowType};
use gsnap_format::FormatError;
use gsnap_protocol::SnapId;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use std::ffi::CString;

/// A table found in a snapshot by name: its OID then, its name then, and what the snapshot
/// holds of it.
struct Recorded {
    relid: u32,
    name: String,
    snap: u64,
    table: TableAtSnapshot,
}

impl Recorded {
    fn row_type(&self) -> &RowType {
        &self.table.row_type
    }
}

/// The parts of a (possibly qualified) name, as PostgreSQL parses it (quotes kept case).
fn name_parts(name: &str) -> Vec<String> {
    let c = CString::new(name).unwrap_or_else(|_| {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_NAME,
            "a table name must not contain a NUL byte",
        )
        .raise()
    });
    // SAFETY: parses a C string into a list of String nodes (an ERROR for bad syntax).
    let parts = unsafe { pg_sys::stringToQualifiedNameList(c.as_ptr()) };
    // SAFETY: a list of String nodes, just made.
    unsafe { list::iter::<pg_sys::String>(parts) }
        // SAFETY: each a String node whose value is a C string.
        .map(|s| unsafe { string_from((*s).sval) })
        .collect()
}

/// The table of snapshot `snap` that `name` names: a qualified name must match schema and
/// name, an unqualified one the name of exactly one table of the snapshot.
fn find(snap: u64, name: &str) -> Recorded {
    let wanted = name_parts(name);
    let tables = ipc::snapshot_tables(SnapId(snap));
    let matching: Vec<_> = tables
        .iter()
        .filter(|t| {
            let parts = name_parts(&t.name);
            match wanted.as_slice() {
                [table] => parts.last() == Some(table),
                _ => parts == wanted,
            }
        })
        .collect();
    let found = match matching.as_slice() {
        [one] => *one,
        [] => error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("snapshot {snap} holds no table named {name}"),
        )
        .hint(crate::error::HINT_TABLES_OF_SNAPSHOT)
        .raise(),
        many => error(
            PgSqlErrorCode::ERRCODE_AMBIGUOUS_ALIAS,
            format!(
                "snapshot {snap} holds {} tables named {name}: {}",
                many.len(),
                many.iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .hint("Qualify the name with its schema.")
        .raise(),
    };
    let table = recorded::at(snap, found.relid);
    Recorded {
        relid: found.relid,
        name: found.name.clone(),
        snap,
        table,
    }
}

/// Raises an ERROR unless the current user may read `t` without the live relation (see the
/// module's comment).
fn require_reader(t: &Recorded) {
    // SAFETY: the current user's attributes, from the catalog.
    let (superuser, user) = unsafe { (pg_sys::superuser(), pg_sys::GetUserId()) };
    if superuser {
        return;
    }
    let (snap, name) = (t.snap, &t.name);
    let Some(def) = &t.row_type().definition else {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("snapshot {snap} does not record the owner of table {name}"),
        )
        .detail("The snapshot was taken by an older gsnap; only a superuser may read it.")
        .raise()
    };
    let owner = pg_sys::Oid::from(def.owner);
    // SAFETY: catalog lookups by role OID (NULL for a role that no longer exists).
    let (owner_now, member) = unsafe {
        let n = pg_sys::GetUserNameFromId(owner, true);
        let now = (!n.is_null()).then(|| string_from(n));
        (now, pg_sys::has_privs_of_role(user, owner))
    };
    let is_owner = owner_now.as_deref() == Some(def.owner_name.as_str()) && member;
    if !is_owner {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to read table {name} as snapshot {snap} recorded it"),
        )
        .detail(format!(
            "Without the live table, its rows are readable by its owner at the snapshot \
             (role \"{}\") and by superusers.",
            def.owner_name
        ))
        .raise();
    }
    // SAFETY: a catalog lookup of the current user.
    if def.force_row_security && !unsafe { pg_sys::has_bypassrls_privilege(user) } {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("table {name} had FORCE ROW LEVEL SECURITY at snapshot {snap}"),
        )
        .detail(
            "Its policies applied to its owner, and they are not recorded: only superusers \
             and roles with BYPASSRLS may read it without the live table.",
        )
        .raise();
    }
}

/// Quoting and type names as PostgreSQL prints them now.
struct PgNames;

impl Names for PgNames {
    fn ident(&self, name: &str) -> String {
        quote_ident(name)
    }

    fn type_name(&self, a: &Attribute) -> Result<String, FormatError> {
        let oid = pg_sys::Oid::from(a.type_oid);
        // SAFETY: catalog lookups by type OID ('\0' for a type that does not exist).
        unsafe {
            if pg_sys::get_typtype(oid) == 0 {
                return Err(FormatError::TypeGone {
                    attnum: a.attnum,
                    column: a.name.clone(),
                    type_name: a.type_name.clone(),
                });
            }
            Ok(string_from(pg_sys::format_type_with_typemod(oid, a.typmod)))
        }
    }
}

/// The statements recreating `t` as `target`.
fn plan(t: &Recorded, target: &str, keep_names: bool) -> Recreation {
    recreation(t.row_type(), target, keep_names, &PgNames).unwrap_or_else(|e| match e {
        FormatError::TypeGone {
            column, type_name, ..
        } => error(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!(
                "column \"{column}\" of table {} had type {type_name} at snapshot {}, which no \
                 longer exists",
                t.name, t.snap
            ),
        )
        .hint("Create the type again (same name and definition) to read or recreate the table.")
        .raise(),
        e => crate::error::corrupt(format_args!("snapshot {}: {e}", t.snap)),
    })
}

/// A text argument that must not be NULL.
fn text_argument(call: Call, i: usize, what: &str) -> String {
    let d = call.arg(i).unwrap_or_else(|| null_argument(what));
    // SAFETY: a text datum (the function's declared argument type).
    unsafe { string_from(pg_sys::text_to_cstring(d.cast_mut_ptr())) }
}

/// A call of `gsnap_asof_dropped`: the rows of the table its first argument names at the
/// snapshot `snapshot` finds, into the call's result set.
///
/// # Safety
/// `fcinfo` is the call info of a `gsnap_asof_dropped` call (text, then the snapshot).
unsafe fn asof_dropped(
    fcinfo: pg_sys::FunctionCallInfo,
    snapshot: impl FnOnce(Call) -> u64,
) -> pg_sys::Datum {
    // SAFETY: the caller's promise.
    let call = unsafe { Call::new(fcinfo) };
    require_gsnap_database();
    let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
    // SAFETY: the call's info; the lookup resolves a record result from the column
    // definition list the call site gave, if any (the descriptor is not kept).
    let kind = unsafe { pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc) };
    if kind != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE {
        error(
            PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
            "gsnap_asof_dropped must be called in FROM with a column definition list",
        )
        .hint(
            "SELECT * FROM gsnap_asof_dropped('public.orders', 42) AS t(id int, note text);              gsnap_table_definition() shows the columns.",
        )
        .raise();
    }
    let name = text_argument(call, 0, "the table name of gsnap_asof_dropped");
    let snap = snapshot(call);
    let t = find(snap, &name);
    require_reader(&t);
    let columns = plan(&t, "t", false).row_columns;
    let result = call.materialize();
    // SAFETY: the result's descriptor, valid during the call.
    let asked = unsafe { crate::ffi::tuple::attributes(result.desc) };
    let live: Vec<&Attribute> = t
        .row_type()
        .attributes
        .iter()
        .filter(|a| !a.dropped)
        .collect();
    let matches = asked.len() == live.len()
        && asked.iter().zip(&live).all(|(q, a)| {
            q.atttypid.to_u32() == a.type_oid && (q.atttypmod == -1 || q.atttypmod == a.typmod)
        });
    if !matches {
        error(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "the column definition list does not match table {} at snapshot {snap}",
                t.name
            ),
        )
        .hint(format!(
            "Read it with: SELECT * FROM gsnap_asof_dropped('{}', {snap}) AS t({columns})",
            t.name.replace('\'', "''")
        ))
        .raise();
    }
    // SAFETY: in a transaction; the recorded types exist (checked by `plan` above).
    let mut rows = unsafe { RecordedRows::open(t.relid, snap, t.table) };
    while let Some((values, nulls)) = rows.next() {
        // SAFETY: values of the recorded live columns, whose types the result's are.
        unsafe { result.put_values(values, nulls) };
    }
    pg_sys::Datum::from(0usize)
}

v1_function_info!(pg_finfo_gsnap_asof_dropped_id);

/// `gsnap_asof_dropped(text, bigint)`, and `(text, text)`: a snapshot id, label or time.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_dropped_id(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    let snapshot = |call| {
        snapshot_argument(
            call,
            1,
            "the snapshot of gsnap_asof_dropped",
            crate::sql::asof::Bound::At,
        )
    };
    // SAFETY: PostgreSQL calls this with the call info of gsnap_asof_dropped(text, bigint).
    unsafe { asof_dropped(fcinfo, snapshot) }
}

v1_function_info!(pg_finfo_gsnap_asof_dropped_time);

/// `gsnap_asof_dropped(text, timestamptz)`.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gsnap_asof_dropped_time(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    let snapshot = |call: Call| {
        let t = call.arg_i64(1);
        resolve_time(t.unwrap_or_else(|| null_argument("the time of gsnap_asof_dropped")))
    };
    // SAFETY: PostgreSQL calls this with the call info of gsnap_asof_dropped(text, timestamptz).
    unsafe { asof_dropped(fcinfo, snapshot) }
}

extension_sql!(
    r#"
CREATE FUNCTION gsnap_asof_dropped(table_name text, snap_id bigint) RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'gsnap_asof_dropped_id' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_asof_dropped(text, bigint) IS
    'rows of a table as a snapshot recorded it, even dropped since: SELECT * FROM gsnap_asof_dropped(''public.orders'', 42) AS t(id int, note text)';
CREATE FUNCTION gsnap_asof_dropped(table_name text, taken_at timestamptz) RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'gsnap_asof_dropped_time' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_asof_dropped(text, timestamptz) IS
    'rows of a table as the latest snapshot taken at or before a time recorded it';
CREATE FUNCTION gsnap_asof_dropped(table_name text, snapshot text) RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'gsnap_asof_dropped_id' LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gsnap_asof_dropped(text, text) IS
    'gsnap_asof_dropped of a snapshot written as its id, its label or a time';
"#,
    name = "gsnap_asof_dropped",
    requires = ["gsnap_preload_check_call"],
);

/// The statements that recreate a table as snapshot `snap_id` recorded it (under its name
/// then; constraints and indexes keep their names), one per line.
#[pg_extern(stable, parallel_safe)]
fn gsnap_table_definition(table_name: Option<&str>, snap_id: Option<i64>) -> String {
    require_gsnap_database();
    let name = table_name.unwrap_or_else(|| null_argument("the table name"));
    let snap = snapshot_id(snap_id, "gsnap_table_definition");
    let t = find(snap, name);
    require_reader(&t);
    let r = plan(&t, &t.name, true);
    let mut out: Vec<String> = std::iter::once(r.create)
        .chain(r.after)
        .map(|s| format!("{s};"))
        .collect();
    out.extend(r.notes.iter().map(|n| format!("-- {n}")));
    out.join("\n")
}

/// A snapshot id argument of `function`: not NULL, positive.
fn snapshot_id(snap_id: Option<i64>, function: &str) -> u64 {
    let snap = snap_id.unwrap_or_else(|| null_argument(&format!("the snapshot of {function}")));
    if snap <= 0 {
        crate::error::no_such_snapshot(snap);
    }
    snap as u64
}

/// Recreates the table `table_name` named at snapshot `snap_id` (as `new_name`, if given)
/// and loads its rows as of the snapshot; returns the number of rows loaded.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_undrop(
    table_name: Option<&str>,
    snap_id: Option<i64>,
    new_name: default!(Option<&str>, "NULL"),
) -> i64 {
    undrop(table_name, snapshot_id(snap_id, "gsnap_undrop"), new_name)
}

/// [`gsnap_undrop`] as of the latest snapshot taken at or before `taken_at`.
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_undrop")]
fn gsnap_undrop_time(
    table_name: Option<&str>,
    taken_at: Option<TimestampWithTimeZone>,
    new_name: default!(Option<&str>, "NULL"),
) -> i64 {
    let t = taken_at.unwrap_or_else(|| null_argument("the time of gsnap_undrop"));
    let snap = resolve_time(pg_sys::TimestampTz::from(t));
    undrop(table_name, snap, new_name)
}

/// [`gsnap_undrop`] of the snapshot written as text: its id, its label or a time
/// (`sql::asof::resolve_text`).
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_undrop")]
fn gsnap_undrop_text(
    table_name: Option<&str>,
    snapshot: Option<&str>,
    new_name: default!(Option<&str>, "NULL"),
) -> i64 {
    let text = snapshot.unwrap_or_else(|| null_argument("the snapshot of gsnap_undrop"));
    let snap = crate::sql::asof::resolve_text(text, crate::sql::asof::Bound::At);
    undrop(table_name, snap, new_name)
}

fn spi<T>(r: Result<T, pgrx::spi::SpiError>) -> T {
    super::spi_result("gsnap_undrop", r)
}

fn undrop(table_name: Option<&str>, snap: u64, new_name: Option<&str>) -> i64 {
    require_gsnap_database();
    let name = table_name.unwrap_or_else(|| null_argument("the table name of gsnap_undrop"));
    let t = find(snap, name);
    require_reader(&t);
    let target = match new_name {
        Some(n) => name_parts(n)
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join("."),
        None => t.name.clone(),
    };
    let r = plan(&t, &target, new_name.is_none());
    // Its statements read and write the live tables, whatever gsnap.as_of says.
    let _live = crate::plan::as_of::Suspended::new();
    Spi::connect_mut(|client| {
        require_free_name(client, &t, &target, new_name.is_some());
        spi(client.update(&r.create, None, &[]));
        let overriding = if r.overriding {
            "OVERRIDING SYSTEM VALUE "
        } else {
            ""
        };
        let loaded = match load_pages(client, &t, &target) {
            Some((rows, pages)) => {
                pgrx::notice!(
                    "gsnap_undrop: loaded {rows} rows into {target} as of snapshot {snap} \
                     ({pages} pages copied whole)"
                );
                rows as i64
            }
            None => {
                let load = format!(
                    "INSERT INTO {target} ({cols}) {overriding}SELECT {cols} FROM \
                     gsnap_asof_dropped($1, $2::bigint) AS t({defs})",
                    cols = r.insert_columns,
                    defs = r.row_columns
                );
                let args = [t.name.as_str().into(), (snap as i64).into()];
                let loaded = spi(client.update(&load, None, &args)).len() as i64;
                pgrx::notice!(
                    "gsnap_undrop: loaded {loaded} rows into {target} as of snapshot {snap}"
                );
                loaded
            }
        };
        for statement in &r.after {
            spi(client.update(statement, None, &[]));
        }
        for column in &r.sequences {
            let sql = format!(
                "SELECT setval(pg_get_serial_sequence($1, $2), max({})) FROM {target} \
                 HAVING max({}) IS NOT NULL",
                quote_ident(column),
                quote_ident(column)
            );
            spi(client.update(
                &sql,
                None,
                &[target.as_str().into(), column.as_str().into()],
            ));
        }
        give_back(client, &t, &target);
        for note in &r.notes {
            pgrx::notice!("gsnap_undrop: {note}");
        }
        loaded
    })
}

/// Loads the rows of `t` into the table `target` just created for them page by page
/// (`am::load`): the rows and the pages written whole. None, and nothing loaded, unless
/// the new table is a gsnap table whose row type is the one recorded as stored (the same
/// attributes, types and typmods; none dropped, none with a missing value) without a stored
/// generated column (which INSERT computes again): then the rows go through INSERT. Either
/// way no constraint is checked while loading (the INSERT's values already have the columns'
/// types, domains included; constraints are added after).
fn load_pages(client: &SpiClient<'_>, t: &Recorded, target: &str) -> Option<(u64, u64)> {
    let relid: pg_sys::Oid = spi(client
        .select("SELECT $1::regclass::oid", Some(1), &[target.into()])
        .and_then(|r| r.first().get_one()))?;
    let rel = OpenRelation::open(relid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)?;
    let desc = rel.descriptor();
    // SAFETY: the relation is open (its descriptor valid while it is).
    let current = unsafe { current_columns(desc) };
    // SAFETY: the relation is open; type lookups by OID.
    let usable = unsafe { crate::am::is_gsnap(rel.as_ptr()) }
        && rel.class().relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char
        && t.row_type().attributes.len() == current.len()
        && in_place(t.row_type(), &current)
        // SAFETY: as above.
        && unsafe { (*desc).constr.is_null() || !(*(*desc).constr).has_generated_stored };
    if !usable {
        return None;
    }
    let table = recorded::at(t.snap, t.relid);
    // SAFETY: in a transaction; `desc` is the new table's, valid while it is open; the
    // row type is the recorded one (checked above), so stored tuples come as they are.
    let mut rows =
        unsafe { AsofRows::open_at(pg_sys::Oid::from(t.relid), desc, t.snap, table, true) };
    let mut load = PageLoad::new(&rel);
    while let Some(row) = rows.next() {
        match row {
            Row::Tuple { bytes, .. } => load.copy(bytes),
            Row::Values {
                values,
                nulls,
                scratch,
                ..
            } => scratch.run(|| {
                // SAFETY: the values are a row of the new table's row type (the recorded
                // one); the tuple is formed in the reader's scratch context.
                unsafe { load.insert(tuple::form(desc, values, nulls)) }
            }),
        }
    }
    Some(load.finish())
}

/// Raises an ERROR if `target` is taken, or its schema does not exist, with what to do.
fn require_free_name(client: &mut SpiClient<'_>, t: &Recorded, target: &str, renamed: bool) {
    let example = format!(
        "SELECT gsnap_undrop('{}', {}, 'new_name')",
        t.name.replace('\'', "''"),
        t.snap
    );
    let hint = format!("Give gsnap_undrop a new name: {example}.");
    let taken: Option<pg_sys::Oid> = spi(client
        .select("SELECT to_regclass($1)::oid", None, &[target.into()])
        .and_then(|r| r.first().get(1)));
    if let Some(oid) = taken {
        let still = oid.to_u32() == t.relid && relation_kind(oid).is_some();
        error(
            PgSqlErrorCode::ERRCODE_DUPLICATE_TABLE,
            if still {
                format!("table {target} was not dropped")
            } else {
                format!("relation {target} already exists")
            },
        )
        .hint(if still && !renamed {
            format!("gsnap_restore() puts back its rows in place. {hint}")
        } else {
            hint
        })
        .raise();
    }
    let parts = name_parts(target);
    if parts.len() > 1 {
        let schema = &parts[parts.len() - 2];
        let exists: Option<pg_sys::Oid> = spi(client
            .select(
                "SELECT to_regnamespace($1)::oid",
                None,
                &[quote_ident(schema).as_str().into()],
            )
            .and_then(|r| r.first().get(1)));
        if exists.is_none() {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_SCHEMA_NAME,
                format!("schema \"{schema}\" does not exist"),
            )
            .hint(format!(
                "Create the schema again, or give gsnap_undrop a new name: {example}."
            ))
            .raise();
        }
    }
}

/// Gives the recreated table back to its recorded owner, if that role still exists, and
/// turns its row security back on (its policies are not recorded: say so).
fn give_back(client: &mut SpiClient<'_>, t: &Recorded, target: &str) {
    let Some(def) = &t.row_type().definition else {
        pgrx::notice!(
            "gsnap_undrop: snapshot {} was taken by an older gsnap and records only the \
             columns of {}: its constraints, indexes and owner are not recreated",
            t.snap,
            t.name
        );
        return;
    };
    let owner = pg_sys::Oid::from(def.owner);
    // SAFETY: catalog lookups by role OID.
    let (name_now, me) = unsafe {
        let n = pg_sys::GetUserNameFromId(owner, true);
        ((!n.is_null()).then(|| string_from(n)), pg_sys::GetUserId())
    };
    if name_now.as_deref() == Some(def.owner_name.as_str()) && owner != me {
        let sql = format!(
            "ALTER TABLE {target} OWNER TO {}",
            quote_ident(&def.owner_name)
        );
        spi(client.update(&sql, None, &[]));
    }
    if def.row_security {
        let force = if def.force_row_security {
            ", FORCE ROW LEVEL SECURITY"
        } else {
            ""
        };
        spi(client.update(
            &format!("ALTER TABLE {target} ENABLE ROW LEVEL SECURITY{force}"),
            None,
            &[],
        ));
        pgrx::notice!(
            "gsnap_undrop: row level security is on again for {target}, but its policies are \
             not recorded: until they are created again, only its owner reads its rows"
        );
    }
}
