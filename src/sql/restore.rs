//! `gsnap_restore`: makes a live table equal to its content at a snapshot, inside the
//! caller's transaction (all or nothing, and rolled back with it), changing only the rows that
//! differ; or writes the snapshot's rows into a new table (`into_table`).
//!
//! How (README, "Restore"):
//! 1. locks the table ACCESS SHARE (as a SELECT does, before its columns are read), and
//!    checks: an ordinary or partitioned table (every partition a gsnap table: its rows are
//!    those of the partitions it had at the snapshot, `read::partitioned`, matched across
//!    partitions, changed by partition and `ctid`, inserted through the partitioned table);
//!    SELECT, INSERT, UPDATE and DELETE on it, all named at once (the statements below would
//!    each need one anyway); gsnap_asof's own checks (the snapshot holds the table, RLS);
//! 2. locks the table EXCLUSIVE until the transaction ends, as Oracle's FLASHBACK TABLE does:
//!    readers go on, writers wait, so the diff stays true until the rows are changed. Under
//!    REPEATABLE READ or SERIALIZABLE the transaction's snapshot is older than the lock unless
//!    the lock came first, and rows committed in between would be missed: refused unless the
//!    transaction already holds the lock;
//! 3. the diff, one statement into a temporary table. When the table has a primary key and
//!    the restore may take a snapshot (see [`may_take_snapshot`]: READ COMMITTED, nothing written
//!    yet in the transaction, EXECUTE on gsnap_snapshot), it takes one of the table as it is
//!    now (with the lock held, no one can change it in between) and the diff is
//!    `gsnap_diff_at` from the snapshot to that one, which reads only the pages that changed
//!    (from their page deltas); only the live rows it names are fetched, by the TID the new
//!    snapshot gives them. Otherwise
//!    the whole snapshot is compared with the whole table: rows matched by the primary key (same
//!    key, other content: an UPDATE, which keeps the row's identity for the foreign keys that
//!    reference it; a left join of the snapshot's rows with the live ones, which PostgreSQL
//!    runs in parallel, then an anti join for the live rows to delete unless counts show there
//!    are none, see [`add_removed`]), or, without a primary key, by their whole content as a
//!    multiset (duplicates count). The diff is written with the memory of a maintenance
//!    operation (`work_mem` raised to `maintenance_work_mem` for that statement). Contents
//!    are compared byte for byte (the record image operator `*=`, or `record_send` where a
//!    hash is needed), the way REFRESH MATERIALIZED VIEW CONCURRENTLY compares rows by image,
//!    on the columns the snapshot has: a column added since has no value there, so it is
//!    neither compared nor written (a row put back takes its default, a row updated keeps
//!    its value; [`Table::mark_added_since`]);
//! 4. refused if the changes would run the ON DELETE/ON UPDATE action (CASCADE, SET NULL,
//!    SET DEFAULT) of a foreign key of a table outside the restore and reach a row of it,
//!    unless `cascade => true` ([`check_cascades`]: counted from the diff before anything
//!    is written);
//! 5. DELETE, then UPDATE, then INSERT, each one statement by row identity (ctid: a TID scan
//!    reads only the rows that change), so that a unique value moving from one row to another
//!    is free before it is taken again;
//! 6. user triggers are off while it restores, unless `triggers => true` (Oracle's default;
//!    turning them off is ALTER TABLE, which needs ownership); foreign keys are always checked,
//!    and their actions run (within the restored tables, or as `cascade` allowed);
//! 7. the sequences owned by the table's columns are moved past the values restored
//!    ([`advance_sequences`]).
//!
//! Every statement runs through SPI as the caller: PostgreSQL checks its privileges, fires its
//! constraint triggers and logs it as it would the caller's own SQL.

use crate::error::{error, null_argument};
use crate::ffi::catalog::quote_ident;
use crate::ffi::regclass::RegClass;
use crate::ffi::relation::{relation_kind, relation_name, OpenRelation};
use crate::read::by_key::Key;
use crate::sql::access::require_gsnap_database;
use crate::sql::asof::resolve_time;
use gsnap_format::definition::ConstraintKind;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a restore did: the rows it deleted, updated and inserted.
type Counts = (i64, i64, i64);

/// Makes table `rel` hold what it held at snapshot `snap_id` (only the rows matching
/// `condition`, if given), or writes those rows into the new table `into_table`.
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_restore(
    rel: Option<RegClass>,
    snap_id: Option<i64>,
    condition: default!(Option<&str>, "NULL"),
    into_table: default!(Option<&str>, "NULL"),
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let snap = snap_id.unwrap_or_else(|| null_argument("the snapshot id of gsnap_restore"));
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore");
    TableIterator::once(restore(rel, snap, condition, into_table, options))
}

/// [`gsnap_restore`] as of the latest snapshot taken at or before `taken_at`.
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_restore")]
fn gsnap_restore_time(
    rel: Option<RegClass>,
    taken_at: Option<TimestampWithTimeZone>,
    condition: default!(Option<&str>, "NULL"),
    into_table: default!(Option<&str>, "NULL"),
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let t = taken_at.unwrap_or_else(|| null_argument("the time of gsnap_restore"));
    let snap = resolve_time(pg_sys::TimestampTz::from(t));
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore");
    TableIterator::once(restore(rel, snap as i64, condition, into_table, options))
}

/// [`gsnap_restore`] of the snapshot written as text: its id, its label or a time
/// (`sql::asof::resolve_text`).
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_restore")]
fn gsnap_restore_text(
    rel: Option<RegClass>,
    snapshot: Option<&str>,
    condition: default!(Option<&str>, "NULL"),
    into_table: default!(Option<&str>, "NULL"),
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let text = snapshot.unwrap_or_else(|| null_argument("the snapshot of gsnap_restore"));
    let snap = crate::sql::asof::resolve_text(text, crate::sql::asof::Bound::At);
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore");
    TableIterator::once(restore(rel, snap as i64, condition, into_table, options))
}

/// What [`gsnap_restore_tables`] returns: a row per table.
type TablesCounts = TableIterator<'static, (String, i64, i64, i64)>;

fn tables_counts(rows: Vec<(String, Counts)>) -> TablesCounts {
    TableIterator::new(rows.into_iter().map(|(t, (d, u, i))| (t, d, u, i)))
}

/// Makes several tables hold what they held at snapshot `snap_id` at once: the foreign keys
/// between them are checked once all their rows are back (parents and children restored
/// together).
#[pg_extern(volatile, parallel_unsafe)]
fn gsnap_restore_tables(
    tables: Option<Vec<Option<String>>>,
    snap_id: Option<i64>,
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(table_name, String),
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let snap = snap_id.unwrap_or_else(|| null_argument("the snapshot of gsnap_restore_tables"));
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore_tables");
    tables_counts(restore_tables(tables, snap, options))
}

/// [`gsnap_restore_tables`] as of the latest snapshot taken at or before `taken_at`.
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_restore_tables")]
fn gsnap_restore_tables_time(
    tables: Option<Vec<Option<String>>>,
    taken_at: Option<TimestampWithTimeZone>,
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(table_name, String),
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let t = taken_at.unwrap_or_else(|| null_argument("the snapshot of gsnap_restore_tables"));
    let snap = resolve_time(pg_sys::TimestampTz::from(t));
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore_tables");
    tables_counts(restore_tables(tables, snap as i64, options))
}

/// [`gsnap_restore_tables`] of the snapshot written as text: its id, its label or a time.
#[pg_extern(volatile, parallel_unsafe, name = "gsnap_restore_tables")]
fn gsnap_restore_tables_text(
    tables: Option<Vec<Option<String>>>,
    snapshot: Option<&str>,
    triggers: default!(Option<bool>, false),
    dry_run: default!(Option<bool>, false),
    cascade: default!(Option<bool>, false),
) -> TableIterator<
    'static,
    (
        name!(table_name, String),
        name!(deleted, i64),
        name!(updated, i64),
        name!(inserted, i64),
    ),
> {
    let text = snapshot.unwrap_or_else(|| null_argument("the snapshot of gsnap_restore_tables"));
    let snap = crate::sql::asof::resolve_text(text, crate::sql::asof::Bound::At);
    let options = Options::of(triggers, dry_run, cascade, "gsnap_restore_tables");
    tables_counts(restore_tables(tables, snap as i64, options))
}

/// A column of the restored table.
struct Column {
    /// Quoted for SQL.
    name: String,
    attnum: i16,
    /// GENERATED ALWAYS AS (...) STORED: computed, never written.
    generated: bool,
    /// In the primary key.
    key: bool,
    /// Added since the snapshot restored (it has no value there): not compared, not
    /// written; a row put back takes its default, a row updated keeps its value
    /// ([`Table::mark_added_since`]).
    added: bool,
}

/// What the statements need to know of the table.
struct Table {
    relid: pg_sys::Oid,
    /// Schema-qualified and quoted.
    name: String,
    /// Its access method's name, quoted (gsnap for a partitioned table, whose partitions
    /// are gsnap tables).
    access_method: String,
    columns: Vec<Column>,
    /// A partitioned table: its rows are in its partitions, each row named by its
    /// partition (`tableoid`) and its `ctid` there.
    partitioned: bool,
}

impl Table {
    /// Table `relid` to restore at snapshot `snap` (`in_place`: into itself, else copied
    /// into a new table; `writes`: its rows, else the restore only reads), checked: locked
    /// ACCESS SHARE first, as a SELECT's parse analysis locks it, so that a schema change
    /// the restore queues behind is over before its columns are read (none can start until
    /// the transaction ends); an ordinary or partitioned table (every partition a gsnap
    /// table); the privileges the restore needs (before what the snapshot held is read); the
    /// columns added since marked.
    fn to_restore(relid: pg_sys::Oid, snap: u64, in_place: bool, writes: bool) -> Table {
        // SAFETY: a lock by OID; it raises an ERROR (a deadlock, a timeout) or returns
        // locked. A table dropped meanwhile is found below.
        unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
        match relation_kind(relid) {
            Some(pg_sys::RELKIND_RELATION) => crate::read::partitioned::note_inheriting_tables(
                relid,
                "restores",
                "Restore each of them with gsnap_restore too.",
            ),
            Some(pg_sys::RELKIND_PARTITIONED_TABLE) => {
                crate::read::partitioned::require_gsnap_partitions(relid)
            }
            Some(_) => error(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("{} is not a table", relation_name(relid)),
            )
            .raise(),
            None => error(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {} does not exist", relid.to_u32()),
            )
            .raise(),
        }
        let mut table = Table::read(relid);
        if writes {
            require_privileges(relid);
        } else {
            crate::sql::access::require_read_access(relid);
        }
        table.mark_added_since(snap, in_place);
        table
    }

    /// The table as it is, from the relation cache: the caller has locked it, so the
    /// definition is the one the schema changes it waited for left (a query of the catalog
    /// would see it as of the statement's snapshot, taken before the wait).
    fn read(relid: pg_sys::Oid) -> Table {
        let rel =
            OpenRelation::open(relid, pg_sys::NoLock as pg_sys::LOCKMODE).unwrap_or_else(|| {
                error(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                    format!("relation with OID {} does not exist", relid.to_u32()),
                )
                .raise()
            });
        let class = rel.class();
        let partitioned = class.relkind as u8 == pg_sys::RELKIND_PARTITIONED_TABLE;
        let access_method = match class.relam {
            am if am == pg_sys::InvalidOid => {
                if partitioned { "gsnap" } else { "heap" }.to_string()
            }
            // SAFETY: a catalog lookup of the table's access method (NULL: none).
            am => unsafe {
                let name = pg_sys::get_am_name(am);
                if name.is_null() {
                    "heap".to_string()
                } else {
                    crate::ffi::catalog::string_from(name)
                }
            },
        };
        let key = crate::read::by_key::primary_key_columns(&rel).unwrap_or_default();
        // SAFETY: the open relation's descriptor, read while it is open.
        let columns = unsafe { crate::ffi::tuple::attributes(rel.descriptor()) }
            .iter()
            .filter(|a| !a.attisdropped)
            .map(|a| Column {
                name: quote_ident(&crate::ffi::catalog::name_of(&a.attname).to_string_lossy()),
                generated: a.attgenerated != 0,
                key: key.contains(&a.attnum),
                attnum: a.attnum,
                added: false,
            })
            .collect();
        Table {
            relid,
            name: crate::ffi::relation::qualified_name(relid).unwrap_or_default(),
            access_method: quote_ident(&access_method),
            columns,
            partitioned,
        }
    }

    /// The columns an update back writes: neither generated (computed again), in the
    /// primary key (rows are matched by it), nor added since the snapshot.
    fn updated_columns(&self) -> Vec<&Column> {
        self.columns
            .iter()
            .filter(|c| !c.generated && !c.key && !c.added)
            .collect()
    }

    /// `ONLY` for a table, nothing for a partitioned table (whose rows are in its
    /// partitions).
    fn only(&self) -> &'static str {
        if self.partitioned {
            ""
        } else {
            "ONLY"
        }
    }

    /// Marks the columns added since snapshot `snap`: those of the table now whose attribute
    /// number no column had at the snapshot (in no partition, for a partitioned table), as
    /// `gsnap_asof` reads them as NULL, and says so in a NOTICE (`in_place`: a restore of
    /// the table, else a copy into a new one). Nothing is marked if the
    /// snapshot does not hold the table (the restore's first read says so).
    fn mark_added_since(&mut self, snap: u64, in_place: bool) {
        let then: Vec<i16> = if self.partitioned {
            crate::read::partitioned::leaves(snap, self.relid)
                .iter()
                .flat_map(|leaf| leaf.attnums.iter().copied())
                .filter(|&a| a > 0)
                .collect()
        } else {
            crate::read::recorded::columns_at(snap, self.relid.to_u32()).unwrap_or_default()
        };
        if then.is_empty() {
            return;
        }
        let mut added = Vec::new();
        for c in &mut self.columns {
            c.added = !then.contains(&c.attnum);
            if c.added {
                added.push(c.name.as_str());
            }
        }
        if !added.is_empty() {
            let (what, whose) = match added.as_slice() {
                [one] => (format!("column {one} was"), "its"),
                _ => (format!("columns {} were", added.join(", ")), "their"),
            };
            crate::error::notice(format!(
                "{what} added to {} after snapshot {snap}, which has no value for {}",
                self.name,
                if added.len() == 1 { "it" } else { "them" }
            ))
            .detail(if in_place {
                format!(
                    "The rows put back take {whose} default; the rows updated keep {whose} \
                     value now."
                )
            } else {
                format!("The rows copied take {whose} default.")
            })
            .send();
        }
    }

    /// The columns a statement writes (not the generated ones, nor those added since the
    /// snapshot), comma-separated, each through `each`.
    fn written(&self, each: impl Fn(&str) -> String) -> String {
        let names: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !c.generated && !c.added)
            .map(|c| each(&c.name))
            .collect();
        names.join(", ")
    }

    /// The condition that a snapshot row and a live row have the same contents, byte for
    /// byte: `whole` (their whole rows compared) when the table has only the snapshot's
    /// columns, else the snapshot's columns of each (`a`, `b`: a column of each side).
    fn same_contents(
        &self,
        whole: String,
        a: impl Fn(&str) -> String,
        b: impl Fn(&str) -> String,
    ) -> String {
        if self.any_added() {
            format!(
                "{} OPERATOR(pg_catalog.*=) {}",
                self.compared_row(a),
                self.compared_row(b)
            )
        } else {
            whole
        }
    }

    /// Whether a column was added since the snapshot.
    fn any_added(&self) -> bool {
        self.columns.iter().any(|c| c.added)
    }

    /// `ROW(...)::record` of the columns the snapshot has (those not added since), each
    /// through `each`: what two rows are compared on when columns were added since. (The
    /// cast keeps `ROW(..) op ROW(..)` from being a row-wise comparison, column by column.)
    fn compared_row(&self, each: impl Fn(&str) -> String) -> String {
        let names: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !c.added)
            .map(|c| each(&c.name))
            .collect();
        format!("ROW({})::record", names.join(", "))
    }

    /// A condition over the primary key's columns: `each` of every key column, joined by
    /// `AND` (the equalities that match a row by key).
    fn key_equal(&self, each: impl Fn(&str) -> String) -> String {
        let terms: Vec<String> = self
            .columns
            .iter()
            .filter(|c| c.key)
            .map(|c| each(&c.name))
            .collect();
        terms.join(" AND ")
    }

    /// Whether rows are matched by the primary key: the table has one, on columns the
    /// snapshot has (a key on a column added since has no value there: rows are then
    /// matched by their contents).
    fn has_key(&self) -> bool {
        self.columns.iter().any(|c| c.key) && !self.columns.iter().any(|c| c.key && c.added)
    }
}

fn spi<T>(r: Result<T, pgrx::spi::SpiError>) -> T {
    super::spi_result("gsnap_restore", r)
}

/// How a restore runs: whether the tables' user triggers fire, whether it only says what it
/// would do (`dry_run`: the diffs are read, nothing is written), and whether it may change
/// rows of tables outside the restore through their foreign keys' actions (`cascade`).
#[derive(Clone, Copy)]
struct Options {
    triggers: bool,
    dry_run: bool,
    cascade: bool,
}

impl Options {
    fn of(
        triggers: Option<bool>,
        dry_run: Option<bool>,
        cascade: Option<bool>,
        function: &str,
    ) -> Options {
        let given = |v: Option<bool>, name: &str| {
            v.unwrap_or_else(|| null_argument(&format!("{name} of {function}")))
        };
        Options {
            triggers: given(triggers, "triggers"),
            dry_run: given(dry_run, "dry_run"),
            cascade: given(cascade, "cascade"),
        }
    }
}

fn restore(
    rel: Option<RegClass>,
    snap: i64,
    condition: Option<&str>,
    into_table: Option<&str>,
    options: Options,
) -> Counts {
    require_gsnap_database();
    let relid = rel
        .unwrap_or_else(|| null_argument("the table of gsnap_restore"))
        .0;
    // The caller's condition, as SQL over the table's columns (evaluated as the caller).
    let filter = condition.map(|c| format!("coalesce(({c}), false)"));
    // Its statements read and write the live table, whatever gsnap.as_of says.
    let _live = crate::plan::as_of::Suspended::new();
    Spi::connect_mut(|client| {
        let writes = into_table.is_none() && !options.dry_run;
        let table = Table::to_restore(relid, snap as u64, into_table.is_none(), writes);
        // (Its NOTICE about inheriting tables sent, the queries reading the table send none.)
        let _quiet = crate::read::partitioned::QuietInheritance::new();
        match into_table {
            Some(target) if options.dry_run => {
                note_existing_target(client, target);
                (0, 0, count_rows(client, &table, snap, filter))
            }
            Some(target) => (0, 0, copy_into(client, &table, snap, filter, target)),
            None => restore_in_place(client, &[table], snap, filter, options, false)[0],
        }
    })
}

/// Makes every table of `tables` (names, as `regclass` reads them) hold what it held at
/// snapshot `snap`, in one statement: returns each table's counts, in the order given.
fn restore_tables(
    tables: Option<Vec<Option<String>>>,
    snap: i64,
    options: Options,
) -> Vec<(String, Counts)> {
    require_gsnap_database();
    let _live = crate::plan::as_of::Suspended::new();
    let names = tables.unwrap_or_else(|| null_argument("the tables of gsnap_restore_tables"));
    let mut relids: Vec<pg_sys::Oid> = Vec::with_capacity(names.len());
    for name in names {
        let name = name.unwrap_or_else(|| null_argument("a table of gsnap_restore_tables"));
        let relid = crate::ffi::regclass::regclass_in(&name);
        if relids.contains(&relid) {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "gsnap_restore_tables names table {} twice",
                    relation_name(relid)
                ),
            )
            .raise();
        }
        relids.push(relid);
    }
    if relids.is_empty() {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "gsnap_restore_tables was given no table",
        )
        .raise();
    }
    Spi::connect_mut(|client| {
        let tables: Vec<Table> = relids
            .iter()
            .map(|&relid| Table::to_restore(relid, snap as u64, true, !options.dry_run))
            .collect();
        let _quiet = crate::read::partitioned::QuietInheritance::new();
        require_disjoint(&tables);
        let counts = restore_in_place(client, &tables, snap, None, options, true);
        tables.iter().map(|t| t.name.clone()).zip(counts).collect()
    })
}

/// Raises an ERROR if a table of `tables` is a partition of another of them (its rows would
/// be restored twice).
fn require_disjoint(tables: &[Table]) {
    for parent in tables.iter().filter(|t| t.partitioned) {
        // SAFETY: the tables below a locked partitioned table (locked as a SELECT would).
        let below = unsafe {
            crate::ffi::list::oids(crate::ffi::catalog::partitioning::find_all_inheritors(
                parent.relid,
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
                std::ptr::null_mut(),
            ))
        };
        if let Some(t) = tables
            .iter()
            .find(|t| t.relid != parent.relid && below.contains(&t.relid))
        {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "gsnap_restore_tables names {} and its partition {}",
                    parent.name, t.name
                ),
            )
            .hint("Name the partitioned table alone: it restores its partitions.")
            .raise();
        }
    }
}

/// Creates `target` like the table and inserts the snapshot's rows (matching `filter`).
fn copy_into(
    client: &mut SpiClient<'_>,
    table: &Table,
    snap: i64,
    filter: Option<String>,
    target: &str,
) -> i64 {
    let target: String = spi(client
        .select(
            "SELECT string_agg(quote_ident(p), '.') FROM unnest(parse_ident($1)) p",
            Some(1),
            &[target.into()],
        )
        .and_then(|t| t.first().get_one()))
    .unwrap_or_default();
    let create = format!(
        "CREATE TABLE {target} (LIKE {} INCLUDING ALL) USING {}",
        table.name, table.access_method
    );
    spi(client.update(&create, None, &[]));
    let columns = table.written(|c| c.to_string());
    let insert = format!(
        "INSERT INTO {target} ({columns}) OVERRIDING SYSTEM VALUE \
         SELECT {columns} FROM gsnap_asof(NULL::{}, $1) x WHERE {}",
        table.name,
        filter.as_deref().unwrap_or("true")
    );
    let copied = spi(client.update(&insert, None, &[snap.into()])).len() as i64;
    // The copy's identity columns have sequences of their own, which start over.
    advance_sequences(
        client,
        &Table::read(crate::ffi::regclass::regclass_in(&target)),
        None,
    );
    copied
}

/// Says in a NOTICE that a copy into `target` would be refused because a relation of that
/// name exists (the dry run of `into_table`; the copy itself fails with 42P07).
fn note_existing_target(client: &SpiClient<'_>, target: &str) {
    let existing: Option<String> = spi(client
        .select("SELECT to_regclass($1)::text", Some(1), &[target.into()])
        .and_then(|t| t.first().get::<String>(1)));
    if let Some(name) = existing {
        refuse(
            true,
            PgSqlErrorCode::ERRCODE_DUPLICATE_TABLE,
            format!("relation {name} already exists"),
            None,
            "into_table names a new table; choose another name, or drop that one first.",
        );
    }
}

/// How many rows of the snapshot (matching `filter`) a copy into a new table would insert.
fn count_rows(client: &SpiClient<'_>, table: &Table, snap: i64, filter: Option<String>) -> i64 {
    let count = format!(
        "SELECT count(*) FROM gsnap_asof(NULL::{}, $1) x WHERE {}",
        table.name,
        filter.as_deref().unwrap_or("true")
    );
    spi(client
        .select(&count, Some(1), &[snap.into()])
        .and_then(|t| t.first().get_one()))
    .unwrap_or_default()
}

/// Names the temporary tables of the diffs of this backend (several restores may run in one
/// transaction).
static DIFFS: AtomicU64 = AtomicU64::new(0);

/// The temporary table a restore's diff is written to: one row per row to change, `op` 'd'
/// (delete the live row at `tid`), 'u' (update the live row at `tid` to the snapshot's
/// values) or 'i' (insert the snapshot's values), in partition `toid`, then the snapshot's
/// row in the table's own columns (NULL for 'd'). The three first columns' names are
/// prefixed so that they are none of the table's.
struct DiffTable {
    name: String,
    op: String,
    tid: String,
    toid: String,
}

impl DiffTable {
    fn new(table: &Table) -> DiffTable {
        let mut prefix = String::from("gsnap_");
        while ["op", "tid", "toid"].iter().any(|n| {
            table
                .columns
                .iter()
                .any(|c| c.name == format!("{prefix}{n}"))
        }) {
            prefix.push('_');
        }
        DiffTable {
            name: format!(
                "pg_temp.gsnap_restore_{}",
                DIFFS.fetch_add(1, Ordering::Relaxed)
            ),
            op: format!("{prefix}op"),
            tid: format!("{prefix}tid"),
            toid: format!("{prefix}toid"),
        }
    }

    /// A condition true of the live rows `alias` of the table (`partitioned`: a partitioned
    /// table) that the diff names with `op`, by their identity (a TID scan of a table).
    fn names(&self, partitioned: bool, alias: &str, op: &str) -> String {
        let (tid, toid, diff, o) = (&self.tid, &self.toid, &self.name, &self.op);
        if partitioned {
            format!(
                "({alias}.tableoid, {alias}.ctid) IN (SELECT {toid}, {tid} FROM {diff} \
                 WHERE {o} = '{op}')"
            )
        } else {
            format!("{alias}.ctid = ANY(ARRAY(SELECT {tid} FROM {diff} WHERE {o} = '{op}'))")
        }
    }

    /// The columns of a diff query whose rows are (`op`, `tid`, `toid`, `r`), `r` a row of
    /// the table's type: `r` spread into the table's columns (the subquery kept whole, so
    /// that `r` is computed once per row).
    fn spread(&self, query: &str) -> String {
        format!(
            "SELECT q.op AS {}, q.tid AS {}, q.toid AS {}, (q.r).* FROM ({query} OFFSET 0) q",
            self.op, self.tid, self.toid
        )
    }
}

/// How many rows of each kind a diff names, per partition.
struct Summary(Vec<(String, i64, i64)>);

impl Summary {
    fn read(client: &SpiClient<'_>, diff: &DiffTable) -> Summary {
        let rows = spi(client.select(
            &format!(
                "SELECT {op}, coalesce({toid}::oid::int8, 0), count(*) FROM {t} GROUP BY 1, 2",
                op = diff.op,
                toid = diff.toid,
                t = diff.name
            ),
            None,
            &[],
        ))
        .map(|row| {
            (
                spi(row.get::<String>(1)).unwrap_or_default(),
                spi(row.get::<i64>(2)).unwrap_or_default(),
                spi(row.get::<i64>(3)).unwrap_or_default(),
            )
        })
        .collect();
        Summary(rows)
    }

    fn count(&self, op: &str) -> i64 {
        self.0.iter().filter(|r| r.0 == op).map(|r| r.2).sum()
    }

    /// The partitions (OIDs) holding rows to `op` ('d' or 'u').
    fn partitions(&self, op: &str) -> Vec<i64> {
        self.0.iter().filter(|r| r.0 == op).map(|r| r.1).collect()
    }
}

/// Restores `tables` in place at snapshot `snap` (only the rows `filter` matches, if given):
/// locks them all (in OID order, so that two restores of overlapping sets queue rather than
/// deadlock), writes each one's diff, then changes the rows ([`apply`], in one statement if
/// `one_statement`). Returns each table's counts, in order. A dry run takes no lock beyond
/// the ACCESS SHARE the tables have and no snapshot, and returns the counts of the diffs.
fn restore_in_place(
    client: &mut SpiClient<'_>,
    tables: &[Table],
    snap: i64,
    filter: Option<String>,
    options: Options,
    one_statement: bool,
) -> Vec<Counts> {
    if options.dry_run {
        let mut prepared: Vec<Prepared> = tables
            .iter()
            .map(|table| prepare(client, table, snap, filter.as_deref(), None, false))
            .collect();
        check_before_writing(client, &mut prepared, snap, filter.as_deref(), options);
        let counts = prepared
            .iter()
            .map(|p| {
                let (deleted, updated) = p.to_change();
                (deleted, updated, p.summary.count("i"))
            })
            .collect();
        drop_diffs(client, &prepared);
        for table in tables {
            advance_sequences(
                client,
                table,
                Some((snap, filter.as_deref().unwrap_or("true"))),
            );
        }
        return counts;
    }
    // Whether a snapshot may be taken is decided before the locks (which assign the
    // transaction an id); it is taken after them all, once. The diff of two snapshots,
    // without a condition, of a table whose key can be hashed is matched by key in one pass
    // (`gsnap_diff_by_key`); with one, the rows it matches are found in SQL.
    let plans: Vec<(bool, bool)> = tables
        .iter()
        .map(|table| {
            let may_snapshot = may_take_snapshot(client, table, snap);
            let by_key = may_snapshot
                && filter.is_none()
                && OpenRelation::open(table.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
                    .is_some_and(|r| Key::of(&r).is_some());
            (may_snapshot, by_key)
        })
        .collect();
    let mut by_oid: Vec<&Table> = tables.iter().collect();
    by_oid.sort_by_key(|t| t.relid.to_u32());
    for table in by_oid {
        lock(client, table);
    }
    let taken = plans
        .iter()
        .any(|&(may, _)| may)
        .then(|| super::snapshots::declare(true, false, None, None).0 .0 as i64);
    let mut prepared: Vec<Prepared> = tables
        .iter()
        .zip(&plans)
        .map(|(table, &(may, by_key))| {
            let taken = taken.filter(|_| may);
            prepare(client, table, snap, filter.as_deref(), taken, by_key)
        })
        .collect();
    check_before_writing(client, &mut prepared, snap, filter.as_deref(), options);
    let disabled: Vec<Trigger> = if options.triggers {
        Vec::new()
    } else {
        tables
            .iter()
            .flat_map(|t| disable_triggers(client, t))
            .collect()
    };
    // Rows put back by a delete and an insert: in one statement, so that the foreign keys
    // that reference them (NO ACTION) are checked once they are back.
    let replaced = prepared.iter().any(|p| p.summary.count("r") > 0);
    let counts = apply(client, &prepared, one_statement || replaced);
    enable_triggers(client, &disabled);
    drop_diffs(client, &prepared);
    for table in tables {
        advance_sequences(client, table, None);
    }
    counts
}

/// Moves each sequence owned by an integer column of `table` (`serial`, identity) past the
/// values its rows now hold, so that the next insert does not collide with a restored row:
/// after `TRUNCATE ... RESTART IDENTITY`, `ALTER SEQUENCE ... RESTART` or a `setval` back.
/// A sequence never moves backwards, and one that is already past them is left alone. A
/// caller without SELECT and UPDATE on a sequence that needs it is warned, with the
/// statement to run. A partition's rows take their values from the sequences of its
/// partitioned tables' columns: those count too.
///
/// With `dry_run` (the snapshot and the restore's condition), nothing moves: each sequence
/// the restore would advance is named in a NOTICE, from what the table would hold after it
/// (the snapshot's rows the condition matches, and the live rows it does not).
fn advance_sequences(client: &mut SpiClient<'_>, table: &Table, dry_run: Option<(i64, &str)>) {
    // The sequences that depend on a column automatically (serial) or internally
    // (identity), as pg_get_serial_sequence finds them, of the table or of a table it is a
    // partition of (by column name: a partition's columns may be numbered otherwise).
    let owned = "SELECT d.objid::regclass::text, quote_ident(a.attname::text), \
                 s.seqincrement, has_sequence_privilege(d.objid, 'SELECT') \
                 AND has_sequence_privilege(d.objid, 'UPDATE') \
                 FROM pg_depend d JOIN pg_sequence s ON s.seqrelid = d.objid \
                 JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid \
                 WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass \
                 AND d.refobjid IN (SELECT $1 UNION SELECT relid FROM pg_partition_ancestors($1)) \
                 AND d.deptype IN ('a', 'i') \
                 AND a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) \
                 ORDER BY 2, 1";
    let sequences: Vec<(String, String, i64, bool)> = spi(client
        .select(owned, None, &[table.relid.into()])
        .and_then(|rows| {
            rows.map(|row| {
                Ok((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                    row.get::<i64>(3)?.unwrap_or(1),
                    row.get::<bool>(4)?.unwrap_or(false),
                ))
            })
            .collect()
        }));
    for (sequence, name, increment, allowed) in sequences {
        // (A column added since the snapshot gets no value from the restore: its default.)
        let Some(column) = table
            .columns
            .iter()
            .find(|c| c.name == name && !(dry_run.is_some() && c.added))
        else {
            continue;
        };
        // The value the next nextval would return must be beyond every value of the column
        // (above the greatest for an ascending sequence, below the least for a descending).
        let extreme = if increment > 0 { "max" } else { "min" };
        let (col, only, name) = (&column.name, table.only(), &table.name);
        let rows = match dry_run {
            None => format!("SELECT {col} AS v FROM {only} {name}"),
            Some((snap, filter)) => format!(
                "SELECT {col} AS v FROM gsnap_asof(NULL::{name}, {snap}) x WHERE {filter} \
                 UNION ALL SELECT {col} FROM {only} {name} x WHERE NOT {filter}"
            ),
        };
        let sql = format!(
            "SELECT t.v::int8, s.last_value, s.is_called FROM \
             (SELECT {extreme}(v) AS v FROM ({rows}) r) t, {sequence} s WHERE t.v IS NOT NULL"
        );
        if !allowed {
            let value = format!("(SELECT {extreme}({col}) FROM {name})");
            crate::error::notice(format!(
                "sequence {sequence} of {name}.{col} may give values the restored rows hold"
            ))
            .detail("The restore may not read or change it (it needs SELECT and UPDATE on it).")
            .hint(format!(
                "Its owner can run SELECT setval('{sequence}', {value}) if the next value is \
                 among them."
            ))
            .warn();
            continue;
        }
        let state: Option<(i64, i64, bool)> =
            spi(client.select(&sql, None, &[]).and_then(|rows| {
                rows.map(|row| {
                    Ok((
                        row.get::<i64>(1)?.unwrap_or_default(),
                        row.get::<i64>(2)?.unwrap_or_default(),
                        row.get::<bool>(3)?.unwrap_or(false),
                    ))
                })
                .next()
                .transpose()
            }));
        let Some((value, last, called)) = state else {
            continue;
        };
        let next = if called {
            last.saturating_add(increment)
        } else {
            last
        };
        let collides = if increment > 0 {
            value >= next
        } else {
            value <= next
        };
        if !collides {
            continue;
        }
        let which = if increment > 0 { "greatest" } else { "least" };
        if dry_run.is_some() {
            crate::error::notice(format!(
                "sequence {sequence} would be advanced to {value}, the {which} value of \
                 {name}.{col} the restore would put back"
            ))
            .detail(format!(
                "Its next value is {next}, which a restored row would hold or pass."
            ))
            .send();
            continue;
        }
        spi(client.select(
            "SELECT setval($1::regclass, $2)",
            None,
            &[sequence.as_str().into(), value.into()],
        ));
        crate::error::notice(format!(
            "sequence {sequence} advanced to {value}, the {which} value of {name}.{col} restored"
        ))
        .detail(format!(
            "Its next value was {next}, which a restored row holds or passed."
        ))
        .send();
    }
}

/// What a restore checks in its diffs before it writes (a dry run says in NOTICEs what the
/// restore would be refused for): the rows its changes would reach in other tables through
/// their foreign keys, unique values exchanged between rows since snapshot `snap` (the rows
/// then put back by a delete and an insert, or the restore refused), and unique values
/// that rows the restore leaves alone hold (`filter`: its condition).
fn check_before_writing(
    client: &mut SpiClient<'_>,
    prepared: &mut [Prepared],
    snap: i64,
    filter: Option<&str>,
    options: Options,
) {
    check_cascades(client, prepared, options);
    for p in prepared {
        let indexes = unique_indexes(client, p.table);
        replace_exchanged_rows(client, p, &indexes, snap, options.dry_run);
        check_values_held_by_rows_left_alone(client, p, &indexes, filter, options.dry_run);
    }
}

/// A foreign key of a table outside a restore whose action (CASCADE, SET NULL, SET DEFAULT)
/// the restore's deletes or updates would run, and the rows it would change (None: the
/// caller cannot count them: it may not read the table, or row-level security hides rows
/// from it that the action would reach).
struct Cascade {
    child: String,
    constraint: String,
    /// `ON DELETE CASCADE` and the like.
    action: String,
    rows: Option<i64>,
}

impl Cascade {
    fn describe(&self) -> String {
        let rows = match self.rows {
            Some(n) => rows_counted(n),
            None => "rows this role cannot count".to_string(),
        };
        format!(
            "{rows} of {} (foreign key {}, {})",
            self.child, self.constraint, self.action
        )
    }
}

/// The foreign keys of tables outside the restore (`prepared`: every table of it, with its
/// diff) whose actions its deletes and updates would run, with the rows each would change.
fn cascades(client: &SpiClient<'_>, prepared: &[Prepared]) -> Vec<Cascade> {
    // The restored tables and their partitions: a foreign key from one of them changes rows
    // the restore puts back itself.
    let inside: Vec<pg_sys::Oid> = prepared
        .iter()
        // SAFETY: the tables below a locked table, locked as a SELECT would.
        .flat_map(|p| unsafe {
            crate::ffi::list::oids(crate::ffi::catalog::partitioning::find_all_inheritors(
                p.table.relid,
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
                std::ptr::null_mut(),
            ))
        })
        .collect();
    let inside_list = inside
        .iter()
        .map(|o| o.to_u32().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut found = Vec::new();
    for p in prepared {
        let (deleted, updated) = p.to_change();
        if deleted == 0 && updated == 0 {
            continue;
        }
        // The keys referencing the table, with their columns as SQL lists, in the key's
        // order: a partitioned table's own, not the copies in its partitions (whose rows it
        // counts), but those PostgreSQL made for a referenced partition (a restore of a
        // partition reaches them), named as the key they copy.
        let keys = format!(
            "SELECT (WITH RECURSIVE up(parent, name) AS (SELECT c.conparentid, c.conname \
              UNION ALL SELECT p.conparentid, p.conname FROM pg_constraint p \
              JOIN up ON p.oid = up.parent) SELECT name::text FROM up WHERE parent = 0), \
             c.conrelid::regclass::text, c.conrelid::int8, \
             c.confdeltype::text, c.confupdtype::text, c.confkey, \
             (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.i) \
              FROM unnest(c.conkey) WITH ORDINALITY k(n, i) \
              JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n), \
             (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.i) \
              FROM unnest(c.confkey) WITH ORDINALITY k(n, i) \
              JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n) \
             FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid \
             WHERE c.contype = 'f' AND (c.conparentid = 0 OR NOT r.relispartition) \
             AND c.confrelid = $1 AND c.conrelid NOT IN ({inside_list}) \
             AND (c.confdeltype IN ('c', 'n', 'd') OR c.confupdtype IN ('c', 'n', 'd')) \
             ORDER BY c.conrelid, c.conname"
        );
        type Key = (
            String,
            String,
            i64,
            String,
            String,
            Vec<i16>,
            String,
            String,
        );
        let rows: Vec<Key> = spi(client
            .select(&keys, None, &[p.table.relid.into()])
            .and_then(|rows| {
                rows.map(|r| {
                    Ok((
                        r.get::<String>(1)?.unwrap_or_default(),
                        r.get::<String>(2)?.unwrap_or_default(),
                        r.get::<i64>(3)?.unwrap_or_default(),
                        r.get::<String>(4)?.unwrap_or_default(),
                        r.get::<String>(5)?.unwrap_or_default(),
                        r.get::<Vec<i16>>(6)?.unwrap_or_default(),
                        r.get::<String>(7)?.unwrap_or_default(),
                        r.get::<String>(8)?.unwrap_or_default(),
                    ))
                })
                .collect()
            }));
        let (table, d) = (p.table, &p.diff);
        // The rows of the table the restore deletes, by their identity in the live table.
        let at = |op: &str| d.names(table.partitioned, "x", op);
        let action = |t: &str| match t {
            "c" => Some("CASCADE"),
            "n" => Some("SET NULL"),
            "d" => Some("SET DEFAULT"),
            _ => None,
        };
        for (constraint, child, child_oid, on_delete, on_update, referenced, fk, refs) in rows {
            let child_oid = pg_sys::Oid::from(child_oid as u32);
            let mut sources = Vec::new();
            if let (Some(a), true) = (action(&on_delete), deleted > 0) {
                sources.push((
                    format!("ON DELETE {a}"),
                    format!(
                        "SELECT {refs} FROM {} {} x WHERE {}",
                        table.only(),
                        table.name,
                        at("d")
                    ),
                ));
            }
            // The referenced columns an update back writes (not the key it matches by).
            let changed: Vec<&str> = table
                .updated_columns()
                .into_iter()
                .filter(|c| referenced.contains(&c.attnum))
                .map(|c| c.name.as_str())
                .collect();
            if let (Some(a), true) = (action(&on_update), updated > 0 && !changed.is_empty()) {
                let olds: Vec<String> = refs.split(", ").map(|c| format!("x.{c}")).collect();
                let join = if table.partitioned {
                    format!("n.{} = x.tableoid AND n.{} = x.ctid", d.toid, d.tid)
                } else {
                    format!("n.{} = x.ctid", d.tid)
                };
                sources.push((
                    format!("ON UPDATE {a}"),
                    format!(
                        "SELECT {olds} FROM {only} {t} x JOIN {diff} n ON {join} \
                         WHERE n.{o} = 'u' AND ({old}) IS DISTINCT FROM ({new})",
                        olds = olds.join(", "),
                        old = changed
                            .iter()
                            .map(|c| format!("x.{c}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        new = changed
                            .iter()
                            .map(|c| format!("n.{c}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        only = table.only(),
                        t = table.name,
                        diff = d.name,
                        o = d.op
                    ),
                ));
            }
            // SAFETY: a privilege check and a row-security check by OIDs in the catalog.
            let countable = unsafe {
                pg_sys::pg_class_aclcheck(child_oid, pg_sys::GetUserId(), pg_sys::ACL_SELECT)
                    == pg_sys::AclResult::ACLCHECK_OK
                    && pg_sys::check_enable_rls(child_oid, pg_sys::InvalidOid, true)
                        != pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
            };
            for (what, source) in sources {
                let rows = countable.then(|| {
                    spi(client
                        .select(
                            &format!("SELECT count(*) FROM {child} WHERE ({fk}) IN ({source})"),
                            Some(1),
                            &[],
                        )
                        .and_then(|t| t.first().get_one::<i64>()))
                    .unwrap_or_default()
                });
                if rows != Some(0) {
                    found.push(Cascade {
                        child: child.clone(),
                        constraint: constraint.clone(),
                        action: what,
                        rows,
                    });
                }
            }
        }
    }
    found
}

/// Refuses a restore whose changes would run the actions of foreign keys of tables outside
/// it (rows deleted or changed there that the caller did not name), unless `cascade`; says
/// what they change in a NOTICE otherwise (and in a dry run).
fn check_cascades(client: &SpiClient<'_>, prepared: &[Prepared], options: Options) {
    let found = cascades(client, prepared);
    if found.is_empty() {
        return;
    }
    let list = found
        .iter()
        .map(Cascade::describe)
        .collect::<Vec<_>>()
        .join("; ");
    if options.dry_run || options.cascade {
        let verb = if options.dry_run {
            "would change"
        } else {
            "changes"
        };
        crate::error::notice(format!(
            "the restore {verb}, through foreign keys of tables it does not restore: {list}"
        ))
        .hint(if options.dry_run && !options.cascade {
            "The restore itself is refused unless cascade => true, or the tables are restored \
             together with gsnap_restore_tables."
        } else {
            "Restore those tables with it (gsnap_restore_tables) to put their rows back too."
        })
        .send();
        return;
    }
    error(
        PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
        format!(
            "the restore would change rows of tables it does not restore, through their \
             foreign keys: {list}"
        ),
    )
    .hint(
        "Restore those tables with it (gsnap_restore_tables), or pass cascade => true to let \
         their foreign keys' actions change them.",
    )
    .raise()
}

/// Rows whose updates would give them values of a unique index checked row by row (not
/// DEFERRABLE) that other rows the restore updates still hold when they get them: values
/// exchanged between rows since snapshot `snap`, which one UPDATE cannot put back
/// (PostgreSQL's own error would come from its middle, naming one value). Those rows are
/// put back by a delete (before the updates) and an insert (after them) instead: the diff
/// names them 'r', and a NOTICE says so (a dry run, that it would). Where that would change
/// what the restore does, it is refused instead (23505, before anything is written; a dry
/// run says it would be): a foreign key referencing the table with an action other than NO
/// ACTION (a delete would run it; a NO ACTION key is checked once the row is back, at the
/// end of the statement), or a column added since the snapshot (an insert would lose its
/// value). An index holding the whole primary key is left out (rows are matched by it:
/// theirs never meet).
fn replace_exchanged_rows(
    client: &mut SpiClient<'_>,
    p: &mut Prepared,
    indexes: &[UniqueIndex],
    snap: i64,
    dry_run: bool,
) {
    let (table, d) = (p.table, &p.diff);
    if p.to_change().1 == 0 {
        return;
    }
    let updated: Vec<i16> = table.updated_columns().iter().map(|c| c.attnum).collect();
    let mut replaced = Vec::new();
    for unique in indexes {
        if !unique.immediate || !unique.columns.iter().any(|c| updated.contains(&c.attnum)) {
            continue;
        }
        let (index, columns) = (&unique.name, unique.names());
        // Rows of a partitioned table are updated in the order of a hash join: any other
        // row the restore updates may still hold the value.
        let other = if table.partitioned {
            format!("(x.tableoid, x.ctid) <> (n.{}, n.{})", d.toid, d.tid)
        } else {
            // The UPDATE visits the rows in the diff's order, the table's: a row meets the
            // value of one it has not updated yet, one further on.
            format!("x.ctid > n.{}", d.tid)
        };
        let other = format!("{other} AND {}", d.names(table.partitioned, "x", "u"));
        let meeting = format!(
            "FROM {only} {t} x WHERE ({x}) = ({n}) AND n.{op} = 'u' AND {other}",
            only = table.only(),
            t = table.name,
            x = unique.list("x"),
            n = unique.list("n"),
            op = d.op
        );
        let meets = format!("EXISTS (SELECT 1 {meeting})");
        let rows: i64 = spi(client
            .select(
                &format!("SELECT count(*) FROM {} n WHERE {meets}", d.name),
                Some(1),
                &[],
            )
            .and_then(|t| t.first().get_one()))
        .unwrap_or_default();
        if rows == 0 {
            continue;
        }
        if let Some(why) = replacing_would_change(client, table) {
            refuse(
                dry_run,
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!(
                    "gsnap_restore of {}: {} would take values of unique index {index} that \
                     other rows it updates hold now",
                    table.name,
                    rows_counted(rows)
                ),
                Some(format!(
                    "Rows exchanged values of ({columns}) since snapshot {snap}. PostgreSQL \
                     checks a unique constraint that is not DEFERRABLE row by row, so one \
                     UPDATE cannot put them back. Deleting them and inserting them back would \
                     {why}."
                )),
                "Make the constraint DEFERRABLE (even INITIALLY IMMEDIATE: it is then checked \
                 at the end of each statement) and restore again, or give those rows other \
                 values first.",
            );
            continue;
        }
        spi(client.update(
            &format!("UPDATE {} n SET {} = 'r' WHERE {meets}", d.name, d.op),
            None,
            &[],
        ));
        replaced.push(format!("{index} ({columns})"));
    }
    if replaced.is_empty() {
        return;
    }
    p.summary = Summary::read(client, &p.diff);
    let rows = p.summary.count("r");
    let indexes = replaced.join(", ");
    let them = if rows == 1 { "it" } else { "them" };
    let (delete, insert) = if dry_run {
        ("would delete", "insert")
    } else {
        ("deleted", "inserted")
    };
    crate::error::notice(format!(
        "gsnap_restore of {} {delete} {} and {insert} {them} back: other rows held their \
         values of unique index {indexes}",
        table.name,
        rows_counted(rows)
    ))
    .detail(format!(
        "Rows exchanged those values since snapshot {snap}. PostgreSQL checks a unique \
         constraint that is not DEFERRABLE row by row, so an UPDATE cannot put them back: \
         those rows are deleted before the other changes and inserted after them, in one \
         statement (with triggers => true, their delete and insert triggers fire)."
    ))
    .send();
}

/// A unique index a restore's rows must keep to: not the primary key nor one holding all of
/// it (rows are matched by their key: theirs never meet), valid, without a predicate or
/// expressions.
struct UniqueIndex<'t> {
    name: String,
    columns: Vec<&'t Column>,
    /// Checked row by row (not DEFERRABLE).
    immediate: bool,
}

impl UniqueIndex<'_> {
    /// Its columns over `alias`, as a SQL list.
    fn list(&self, alias: &str) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{alias}.{}", c.name))
            .collect();
        columns.join(", ")
    }

    /// Its columns' names, for messages.
    fn names(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        names.join(", ")
    }
}

fn unique_indexes<'t>(client: &SpiClient<'_>, table: &'t Table) -> Vec<UniqueIndex<'t>> {
    let indexes = "SELECT i.indexrelid::regclass::text, \
                   ((i.indkey::int2[])[0:i.indnkeyatts - 1])::int2[], i.indimmediate \
                   FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique \
                   AND NOT i.indisprimary AND i.indisvalid \
                   AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY 1";
    let found: Vec<(String, Vec<i16>, bool)> = spi(client
        .select(indexes, None, &[table.relid.into()])
        .and_then(|rows| {
            rows.map(|r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<Vec<i16>>(2)?.unwrap_or_default(),
                    r.get::<bool>(3)?.unwrap_or(true),
                ))
            })
            .collect()
        }));
    found
        .into_iter()
        .filter(|(_, attnums, _)| {
            !table
                .columns
                .iter()
                .filter(|c| c.key)
                .all(|c| attnums.contains(&c.attnum))
        })
        .filter_map(|(name, attnums, immediate)| {
            let columns = attnums
                .iter()
                .map(|&a| table.columns.iter().find(|c| c.attnum == a))
                .collect::<Option<Vec<_>>>()?;
            Some(UniqueIndex {
                name,
                columns,
                immediate,
            })
        })
        .collect()
}

/// Refuses (23505, before anything is written; a dry run says so in a NOTICE) a restore
/// whose rows would take values of a unique index that rows it leaves as they are hold now:
/// rows its condition does not match (the usual case), or rows unchanged since the
/// snapshot where the snapshot's rows break an index made since. PostgreSQL's own error
/// would come from the middle of the restore, naming one value, not why.
fn check_values_held_by_rows_left_alone(
    client: &SpiClient<'_>,
    p: &Prepared,
    indexes: &[UniqueIndex],
    filter: Option<&str>,
    dry_run: bool,
) {
    let (table, d) = (p.table, &p.diff);
    let (_, updated) = p.to_change();
    if updated == 0 && p.summary.count("i") == 0 {
        return;
    }
    // A live row the diff names (to delete, update or put back) is not left alone; the
    // row a diff row updates is itself.
    let (same_row, named) = if table.partitioned {
        (
            format!(
                "(x.tableoid, x.ctid) IS NOT DISTINCT FROM (n.{}, n.{})",
                d.toid, d.tid
            ),
            format!("o.{} = x.ctid AND o.{} = x.tableoid", d.tid, d.toid),
        )
    } else {
        (
            format!("x.ctid IS NOT DISTINCT FROM n.{}", d.tid),
            format!("o.{} = x.ctid", d.tid),
        )
    };
    for unique in indexes {
        let sql = format!(
            "SELECT count(*) FROM {diff} n WHERE n.{op} IN ('u', 'r', 'i') AND EXISTS (\
             SELECT 1 FROM {only} {t} x WHERE ({x}) = ({n}) AND NOT {same_row} \
             AND NOT EXISTS (SELECT 1 FROM {diff} o WHERE {named}))",
            diff = d.name,
            op = d.op,
            only = table.only(),
            t = table.name,
            x = unique.list("x"),
            n = unique.list("n"),
        );
        let rows: i64 = spi(client
            .select(&sql, Some(1), &[])
            .and_then(|t| t.first().get_one()))
        .unwrap_or_default();
        if rows == 0 {
            continue;
        }
        let (detail, hint) = match filter {
            Some(_) => (
                format!(
                    "Rows its condition does not match hold those values of ({}).",
                    unique.names()
                ),
                "Widen the condition to take those rows in, or change their values first.",
            ),
            None => (
                format!(
                    "Rows unchanged since the snapshot hold those values of ({}): the \
                     snapshot's rows break the index, made since.",
                    unique.names()
                ),
                "Restore into a new table (into_table) to see the snapshot's rows.",
            ),
        };
        refuse(
            dry_run,
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "gsnap_restore of {}: {} it would put back take values of unique index {} that \
                 rows it leaves as they are hold now",
                table.name,
                rows_counted(rows),
                unique.name
            ),
            Some(detail),
            hint,
        );
    }
}

/// Refuses the restore (an ERROR with SQLSTATE `code`), or in a dry run says in a NOTICE that
/// it would be refused, and goes on.
fn refuse(
    dry_run: bool,
    code: PgSqlErrorCode,
    message: String,
    detail: Option<String>,
    hint: &str,
) {
    let raise = if dry_run {
        crate::error::notice(format!("the restore would be refused: {message}"))
    } else {
        error(code, message)
    };
    let raise = match detail {
        Some(detail) => raise.detail(detail),
        None => raise,
    }
    .hint(hint);
    if dry_run {
        raise.send();
    } else {
        raise.raise();
    }
}

/// "1 row", "`n` rows".
fn rows_counted(n: i64) -> String {
    if n == 1 {
        "1 row".to_string()
    } else {
        format!("{n} rows")
    }
}

/// Why putting rows of `table` back by a delete and an insert would do something an update
/// does not (None: it would not): a foreign key referencing the table whose action on a
/// delete or an update is not NO ACTION, or a column added since the snapshot (the insert
/// would give it its default, not the row's value).
fn replacing_would_change(client: &SpiClient<'_>, table: &Table) -> Option<String> {
    if let Some(c) = table.columns.iter().find(|c| c.added) {
        return Some(format!(
            "lose their values of {}, a column added since the snapshot",
            c.name
        ));
    }
    let keys = "SELECT c.conname::text, c.conrelid::regclass::text FROM pg_constraint c \
                WHERE c.contype = 'f' AND c.confrelid = $1 \
                AND (c.confdeltype <> 'a' OR c.confupdtype <> 'a') ORDER BY 2, 1 LIMIT 1";
    let key: Option<(String, String)> = spi(client
        .select(keys, Some(1), &[table.relid.into()])
        .and_then(|rows| {
            rows.map(|r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<String>(2)?.unwrap_or_default(),
                ))
            })
            .next()
            .transpose()
        }));
    key.map(|(name, child)| {
        format!("run the action of foreign key {name} of {child} (it is not NO ACTION)")
    })
}

/// Drops the prepared tables' diffs.
fn drop_diffs(client: &mut SpiClient<'_>, prepared: &[Prepared]) {
    for p in prepared {
        spi(client.update(&format!("DROP TABLE {}", p.diff.name), None, &[]));
    }
}

/// A table's part of a restore in place, once its diff is written.
struct Prepared<'a> {
    table: &'a Table,
    diff: DiffTable,
    summary: Summary,
    /// The snapshot of the table as it is now that the diff was read from, if it was.
    now: Option<i64>,
}

impl Prepared<'_> {
    /// The rows the diff names to delete and to update (those put back by a delete and an
    /// insert, 'r', count as updated). With every column in the key or generated, rows of
    /// one key can only differ in a generated column (one added since the snapshot reads as
    /// NULL there), which is computed again: none to update.
    fn to_change(&self) -> (i64, i64) {
        let to_update = if self.table.updated_columns().is_empty() {
            0
        } else {
            self.summary.count("u") + self.summary.count("r")
        };
        (self.summary.count("d"), to_update)
    }
}

/// Writes the diff of `table` (locked) from snapshot `snap`: from the snapshot `taken` of
/// the table as it is now if its definition is the snapshot's (`by_key`: matched by key in
/// one pass), else by comparing the whole snapshot with the whole table.
fn prepare<'a>(
    client: &mut SpiClient<'_>,
    table: &'a Table,
    snap: i64,
    filter: Option<&str>,
    taken: Option<i64>,
    by_key: bool,
) -> Prepared<'a> {
    let diff = DiffTable::new(table);
    // The diff of two snapshots compares pages: it only stands for the comparison of rows if
    // the table's columns (and definition) are those of the snapshot restored (a column
    // added since reads as NULL at the snapshot, on pages that did not change).
    let now = taken
        .filter(|&now| crate::read::diff::same_definition(table.relid, snap as u64, now as u64));
    if let Some(taken) = taken {
        let how = match now {
            Some(_) => format!("read only the rows that changed since snapshot {snap}"),
            None => {
                format!("compared the whole table (its definition changed since snapshot {snap})")
            }
        };
        pgrx::notice!(
            "gsnap_restore took snapshot {taken} of {} as it was before the restore, and {how}",
            table.name
        );
    }
    let whole_by_key = now.is_none() && filter.is_none() && table.has_key();
    let query = match now {
        Some(_) if by_key => diff.spread(&diff_keyed(table)),
        Some(_) => diff.spread(&diff_since(table, filter)),
        None if whole_by_key => diff_whole_by_key(table, &diff),
        None if table.has_key() => diff.spread(&diff_by_key(table, filter.unwrap_or("true"))),
        None => diff.spread(&diff_by_content(table, filter)),
    };
    let mut args = vec![snap.into()];
    args.extend(now.map(Into::into));
    // In the table's physical order (partition, then TID): the DELETE and UPDATE below then
    // visit its pages and their index entries in order. In the join's hash order each change
    // touched a random page and index leaf: a million updates took twice as long.
    let order = if table.partitioned {
        format!("{}, {}", diff.toid, diff.tid)
    } else {
        diff.tid.clone()
    };
    maintenance_settings(|| {
        spi(client.update(
            &format!(
                "CREATE TEMP TABLE {} ON COMMIT DROP AS {query} ORDER BY {order}",
                diff.name
            ),
            None,
            &args,
        ))
    });
    let mut summary = Summary::read(client, &diff);
    if whole_by_key && add_removed(client, table, snap, &diff, &summary) {
        summary = Summary::read(client, &diff);
    }
    if let Some(now) = now {
        let lost = summary.count("x");
        if lost > 0 {
            error(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!(
                    "gsnap_restore of {}: {lost} rows of snapshot {now} are not in the table",
                    table.name
                ),
            )
            .detail("The snapshot taken for the restore should hold exactly the table's rows.")
            .raise();
        }
    }
    if table.partitioned {
        // Statistics of the rows to change, so the UPDATE below joins them by hash with a
        // TID scan of each partition: without them the planner guesses a handful of rows and
        // loops, checking each row against the whole TID array (quadratic: minutes at 1M
        // rows).
        spi(client.update(&format!("ANALYZE {}", diff.name), None, &[]));
    }
    Prepared {
        table,
        diff,
        summary,
        now,
    }
}

/// What a statement of a restore does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    Delete,
    Update,
    Insert,
    /// The delete of rows put back by a delete and an insert (their insert counts as an
    /// update).
    Remove,
}

/// One statement of a restore: of the `at`-th table, its change, its SQL, and whether it
/// must run as a nested loop over the diff (hash and merge joins off).
struct Step {
    at: usize,
    change: Change,
    sql: String,
    nested_loop: bool,
}

/// The statements that change the tables' rows to the diffs': every table's DELETEs, then
/// its UPDATEs, then its INSERTs, each by row identity (ctid: a TID scan reads only the
/// rows that change), so that a unique value moving from one row to another is free before
/// it is taken again.
fn steps(prepared: &[Prepared]) -> Vec<Step> {
    let (mut deletes, mut updates, mut inserts) = (Vec::new(), Vec::new(), Vec::new());
    for (at, p) in prepared.iter().enumerate() {
        let (table, d, summary) = (p.table, &p.diff, &p.summary);
        let (t, only) = (&table.name, table.only());
        let step = |change, sql: String, nested_loop| Step {
            at,
            change,
            sql,
            nested_loop,
        };
        // Partition by partition (one for a table): a TID scan of each. Rows put back by a
        // delete and an insert ('r') leave before the updates too.
        for (op, change) in [("d", Change::Delete), ("r", Change::Remove)] {
            for toid in summary.partitions(op) {
                deletes.push(step(
                    change,
                    format!(
                        "DELETE FROM {only} {t} WHERE tableoid = {toid}::oid AND ctid = ANY(\
                         ARRAY(SELECT {tid} FROM {diff} WHERE {o} = '{op}' \
                         AND {toid_c} = {toid}::oid))",
                        tid = d.tid,
                        diff = d.name,
                        o = d.op,
                        toid_c = d.toid
                    ),
                    false,
                ));
            }
        }
        let set = table.updated_columns();
        let names: Vec<&str> = set.iter().map(|c| c.name.as_str()).collect();
        let values: Vec<String> = set.iter().map(|c| format!("d.{}", c.name)).collect();
        let assign = format!("({}) = ROW({})", names.join(", "), values.join(", "));
        if p.to_change().1 == 0 {
            // Nothing to update.
        } else if !table.partitioned {
            // Each row to change is fetched by its TID, in the diff's order (the table's): a
            // nested loop over the diff with a TID scan of the table inside, which the
            // planner would not pick by cost (it hashes the diff's TIDs, and changes rows in
            // the hash's order, batch after batch: 1.5 times as long for a million rows).
            // TIDs from a snapshot the restore took: the key is checked too (and
            // require_changed counts the rows). TIDs from the live scan of the whole
            // comparison need not be.
            let same_key = match p.now {
                Some(_) => format!(" AND {}", table.key_equal(|c| format!("x.{c} = d.{c}"))),
                None => String::new(),
            };
            updates.push(step(
                Change::Update,
                format!(
                    "UPDATE ONLY {t} x SET {assign} FROM {diff} d \
                     WHERE d.{op} = 'u' AND x.ctid = d.{tid}{same_key}",
                    diff = d.name,
                    op = d.op,
                    tid = d.tid
                ),
                true,
            ));
        } else {
            // A partition's TID scan inside a nested loop would be one per partition and
            // row: the TIDs of each partition are hashed instead.
            for toid in summary.partitions("u") {
                updates.push(step(
                    Change::Update,
                    format!(
                        "UPDATE {t} x SET {assign} FROM {diff} d \
                         WHERE d.{op} = 'u' AND x.ctid = d.{tid} AND d.{toid_c} = {toid}::oid \
                         AND x.tableoid = {toid}::oid AND x.ctid = ANY(ARRAY(\
                         SELECT {tid} FROM {diff} WHERE {op} = 'u' AND {toid_c} = {toid}::oid))",
                        diff = d.name,
                        op = d.op,
                        tid = d.tid,
                        toid_c = d.toid
                    ),
                    false,
                ));
            }
        }
        for (op, change) in [("i", Change::Insert), ("r", Change::Update)] {
            if summary.count(op) == 0 {
                continue;
            }
            let columns = table.written(|c| c.to_string());
            let values = table.written(|c| format!("d.{c}"));
            inserts.push(step(
                change,
                format!(
                    "INSERT INTO {t} ({columns}) OVERRIDING SYSTEM VALUE \
                     SELECT {values} FROM {diff} d WHERE d.{o} = '{op}'",
                    diff = d.name,
                    o = d.op
                ),
                false,
            ));
        }
    }
    deletes.append(&mut updates);
    deletes.append(&mut inserts);
    deletes
}

/// Changes the rows of the prepared tables to their diffs' ([`steps`]); returns each one's
/// counts. The statements run one after another (`gsnap_restore`), or as one statement
/// (`one_statement`, `gsnap_restore_tables`: each a data-modifying `WITH` query, run in that
/// order), so that the foreign keys between the tables are checked once all their rows are
/// back, as PostgreSQL checks a statement's: a child row moved from a parent added since to
/// one deleted since, or a row put back under a parent put back, is checked against the
/// tables' final rows.
fn apply(client: &mut SpiClient<'_>, prepared: &[Prepared], one_statement: bool) -> Vec<Counts> {
    let steps = steps(prepared);
    let mut counts: Vec<Counts> = vec![(0, 0, 0); prepared.len()];
    let mut add = |step: &Step, n: i64| {
        let c = &mut counts[step.at];
        match step.change {
            Change::Delete => c.0 += n,
            Change::Update => c.1 += n,
            Change::Insert => c.2 += n,
            Change::Remove => {}
        }
    };
    if !one_statement {
        for step in &steps {
            let n = nested_loop_if(step.nested_loop, || {
                spi(client.update(&step.sql, None, &[])).len() as i64
            });
            add(step, n);
        }
    } else if !steps.is_empty() {
        let with: Vec<String> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| format!("c{i} AS ({} RETURNING 1)", s.sql))
            .collect();
        let read: Vec<String> = (0..steps.len())
            .map(|i| format!("(SELECT count(*) FROM c{i})"))
            .collect();
        let sql = format!("WITH {} SELECT {}", with.join(", "), read.join(", "));
        // The updates of tables fetch rows by TID in a nested loop, unless a partitioned
        // table's are hashed (the settings are the statement's).
        let partitioned = prepared.iter().any(|p| p.table.partitioned);
        let nested_loop = steps.iter().any(|s| s.nested_loop) && !partitioned;
        let row = nested_loop_if(nested_loop, || {
            spi(client.update(&sql, Some(1), &[])).first()
        });
        for (i, step) in steps.iter().enumerate() {
            add(step, spi(row.get::<i64>(i + 1)).unwrap_or_default());
        }
    }
    for (p, c) in prepared.iter().zip(&counts) {
        require_changed(p.table, p.to_change(), (c.0, c.1));
    }
    counts
}

/// Runs `f` (a statement changing rows) as a nested loop over the diff if `on`: hash and
/// merge joins off (and no JIT) for it alone.
fn nested_loop_if<R>(on: bool, f: impl FnOnce() -> R) -> R {
    if !on {
        return f();
    }
    crate::ffi::settings::with_settings(
        &[
            (c"enable_hashjoin", c"off"),
            (c"enable_mergejoin", c"off"),
            (c"jit", c"off"),
        ],
        f,
    )
}

/// Runs `f` (the statement writing a restore's diff) with the settings of a maintenance
/// operation: `work_mem` as large as `maintenance_work_mem` (the hash join and sort of up to
/// every row of the table, as CREATE INDEX sorts with that much), and no JIT compilation
/// (the statement runs once; compiling it took longer than it saved).
fn maintenance_settings<R>(f: impl FnOnce() -> R) -> R {
    // Both in kB, as GetConfigOption prints integer settings (in their own unit).
    let kb = |name: &std::ffi::CStr| -> i64 {
        // SAFETY: reads a setting's current value, a C string PostgreSQL owns, copied here.
        let v = unsafe {
            std::ffi::CStr::from_ptr(pg_sys::GetConfigOption(name.as_ptr(), false, false))
        };
        v.to_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let memory = kb(c"work_mem").max(kb(c"maintenance_work_mem"));
    let memory = std::ffi::CString::new(memory.to_string()).unwrap_or_default();
    crate::ffi::settings::with_settings(&[(c"work_mem", &memory), (c"jit", c"off")], f)
}

/// The rows to change, matched by primary key: `op` 'd' (a live row the snapshot lacks), 'u'
/// (same key, other content) or 'i' (a snapshot row the table lacks), the live row's `tid`
/// and the snapshot's row `r`, for the keys condition `m` matches in either (without one, the
/// whole table: [`diff_whole_by_key`]).
fn diff_by_key(table: &Table, m: &str) -> String {
    let (t, only) = (&table.name, table.only());
    format!(
        "WITH s AS (SELECT x.* FROM gsnap_asof(NULL::{t}, $1) x), \
         o AS (SELECT s::{t} AS r, true AS here, {m} AS m FROM s), \
         l AS (SELECT x AS r, x.ctid AS tid, x.tableoid AS toid, {m} AS m FROM {only} {t} x) \
         SELECT CASE WHEN l.tid IS NULL THEN 'i' WHEN o.here IS NULL THEN 'd' ELSE 'u' END AS op, \
         l.tid, l.toid, o.r FROM o FULL JOIN l ON {} \
         WHERE (coalesce(o.m, false) OR coalesce(l.m, false)) \
         AND (l.tid IS NULL OR o.here IS NULL OR NOT {same})",
        table.key_equal(|c| format!("(o.r).{c} = (l.r).{c}")),
        same = table.same_contents(
            "o.r OPERATOR(pg_catalog.*=) l.r".to_string(),
            |c| format!("(o.r).{c}"),
            |c| format!("(l.r).{c}")
        )
    )
}

/// Whether the restore may take a snapshot of the table as it is once locked, to diff against
/// (a diff that reads only the pages changed since the snapshot restored): the table has a
/// primary key and is not partitioned (the rows are matched by key, fetched by TID); no
/// row-level security applies to the caller (the diff is read by a function scan, which
/// cannot apply policies); the transaction is READ COMMITTED and has written nothing yet (the
/// snapshot holds committed rows: with the EXCLUSIVE lock held, those are exactly the rows the
/// restore's statements see); the caller may take snapshots (EXECUTE on gsnap_snapshot, which
/// a restore must not grant by the back door); the transaction holds no ACCESS EXCLUSIVE lock
/// on a gsnap table (a declaration would wait for it to end); and fewer than half of the
/// table's pages changed since `snap` ([`few_pages_changed`]). If not, the whole snapshot is
/// compared with the whole table.
fn may_take_snapshot(client: &SpiClient<'_>, table: &Table, snap: i64) -> bool {
    // SAFETY: reads of the session's isolation level and transaction state, and of whether
    // row-level security applies to the current user (a catalog lookup by OID).
    let (read_committed, written, rls) = unsafe {
        (
            pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32,
            pg_sys::GetTopTransactionIdIfAny() != pg_sys::InvalidTransactionId,
            pg_sys::check_enable_rls(table.relid, pg_sys::InvalidOid, true)
                == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32,
        )
    };
    if table.partitioned || !table.has_key() || !read_committed || written || rls {
        return false;
    }
    let allowed: bool = spi(client
        .select(
            "SELECT coalesce(bool_and(has_function_privilege(p.oid, 'EXECUTE')), false) \
             FROM pg_proc p JOIN pg_extension e ON e.extname = 'gsnap' \
             AND p.pronamespace = e.extnamespace WHERE p.proname = 'gsnap_snapshot'",
            Some(1),
            &[],
        )
        .and_then(|t| t.first().get_one()))
    .unwrap_or(false);
    if !allowed {
        return false;
    }
    // SAFETY: in the caller's transaction; the tables a declaration locks.
    let gsnap_tables = unsafe { crate::worker::catalog::gsnap_tables() };
    if gsnap_tables
        .iter()
        .any(|&relid| crate::locks::holds_access_exclusive(relid))
    {
        return false;
    }
    few_pages_changed(table.relid, snap)
}

/// The blocks of the table that changed since snapshot `snap`, as far as the index (up to
/// the newest snapshot) and the pages written since that snapshot say; None if the snapshot
/// does not hold the table's storage as it is now (it does not hold the table, or something
/// rewrote it since). An estimate: a page written since may not have changed (a rolled-back
/// write); the span a capture is storing now is not counted.
fn same_storage_since(relid: pg_sys::Oid, snap: i64) -> Option<Vec<u32>> {
    let mut changed = crate::read::diff::blocks_changed_since(relid, snap as u64)?;
    let (written, full) = crate::shmem::dirty_sets().current_for(relid.to_u32());
    if full {
        return None;
    }
    changed.extend(written);
    changed.sort_unstable();
    changed.dedup();
    Some(changed)
}

/// True if fewer than half of the table's pages changed since snapshot `snap`
/// ([`same_storage_since`]). A diff of two snapshots reads the changed pages and matches the
/// rows it removed and added by key: measured on 2M rows, about 2.3 times cheaper than
/// comparing the whole snapshot with the whole table when 5% of the rows changed on every page
/// (0.69 against 1.6 s), but 1.4 times dearer when half of them did (1M rows matched and
/// written out, about 7 against 4.9 s). The pages say how far a change spread, not how many
/// rows it changed; fewer than half of them is the side where the diff is sure to win.
fn few_pages_changed(relid: pg_sys::Oid, snap: i64) -> bool {
    let Some(changed) = same_storage_since(relid, snap) else {
        return false;
    };
    let nblocks =
        OpenRelation::open(relid, pg_sys::AccessShareLock as i32).map_or(0, |r| r.nblocks());
    2 * changed.len() < nblocks as usize
}

/// Raises an ERROR unless the DELETE and UPDATE of a restore changed as many rows as its
/// diff named (`deleted`, `updated`): the TIDs come from the live scan, or from the snapshot
/// the restore took under its lock, and name exactly the live rows (the UPDATE checks their
/// key too when they come from a snapshot). What can make them disagree is a foreign key of
/// the table on itself whose ON DELETE action (CASCADE, SET NULL, SET DEFAULT) changed a row
/// the restore was to update, once the DELETE removed its parent: the table would not end as
/// the snapshot had it.
fn require_changed(table: &Table, want: (i64, i64), (deleted, updated): (i64, i64)) {
    if want != (deleted, updated) {
        error(
            PgSqlErrorCode::ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION,
            format!(
                "gsnap_restore of {}: {} rows deleted and {} updated, where its diff named {} \
                 and {}",
                table.name, deleted, updated, want.0, want.1
            ),
        )
        .detail(
            "Rows the restore was to update were changed or deleted by an action its own \
             DELETE triggered, such as a foreign key of the table on itself with ON DELETE \
             CASCADE: the table would not end as the snapshot had it.",
        )
        .hint(
            "Restore with that foreign key's action out of the way (restore the rows it would \
             remove first, with a condition), or restore into a new table with into_table.",
        )
        .raise();
    }
}

/// The rows to change from `gsnap_diff_by_key` of snapshot `$1` with snapshot `$2`, the table
/// as it is now ([`may_take_snapshot`]): a key at both with other contents is updated back
/// ('u', the live row by its TID in `$2`, which is its TID now: the snapshot was taken under
/// the restore's lock, and nothing moves a row without a stronger one), a key only in `$2` is
/// deleted ('d'), a key only in `$1` inserted ('i').
fn diff_keyed(table: &Table) -> String {
    format!(
        "SELECT CASE d.change WHEN 'updated' THEN 'u' WHEN 'added' THEN 'd' ELSE 'i' END AS op, \
         CASE WHEN d.change <> 'removed' THEN d.at END AS tid, \
         CASE WHEN d.change <> 'removed' THEN {}::oid END AS toid, d.old AS r \
         FROM gsnap_diff_by_key(NULL::{}, $1, $2) d",
        table.relid.to_u32(),
        table.name
    )
}

/// The rows to change as [`diff_by_key`] finds them, from the diff of snapshot `$1` with
/// snapshot `$2`, the table as it is now ([`may_take_snapshot`]): the rows the diff removed are
/// the snapshot's rows to put back, the rows it added are live rows, fetched by the TID they
/// have in snapshot `$2` (`gsnap_diff_at`), which is their TID now: the snapshot was taken
/// under the restore's lock, and nothing moves a row without a stronger one. A row the diff
/// added that the table lacks at that TID, with that key, is `op` 'x' (the caller refuses to
/// go on: the snapshot and the table would disagree).
fn diff_since(table: &Table, filter: Option<&str>) -> String {
    let (t, m) = (&table.name, filter.unwrap_or("true"));
    format!(
        "WITH d AS MATERIALIZED (SELECT change, rec, at FROM gsnap_diff_at(NULL::{t}, $1, $2)), \
         s AS (SELECT (d.rec).* FROM d WHERE d.change = 'removed'), \
         o AS (SELECT s::{t} AS r, true AS here, {m} AS m FROM s), \
         n AS (SELECT d.rec AS gsnap_n, d.at AS gsnap_at FROM d WHERE d.change = 'added'), \
         l AS (SELECT n.gsnap_n, x.r, x.tid, x.toid, x.m FROM n LEFT JOIN LATERAL \
         (SELECT y AS r, y.ctid AS tid, y.tableoid AS toid, {m} AS m FROM ONLY {t} y \
         WHERE y.ctid = n.gsnap_at AND {}) x ON true) \
         SELECT op, tid, toid, r FROM (SELECT CASE WHEN l.gsnap_n IS NOT NULL AND l.tid IS NULL \
         THEN 'x' WHEN l.tid IS NULL THEN 'i' WHEN o.here IS NULL THEN 'd' ELSE 'u' END AS op, \
         l.tid, l.toid, o.r, coalesce(o.m, false) OR coalesce(l.m, false) AS m \
         FROM o FULL JOIN l ON {}) c WHERE op = 'x' OR m",
        table.key_equal(|c| format!("y.{c} = (n.gsnap_n).{c}")),
        table.key_equal(|c| format!("(o.r).{c} = (l.gsnap_n).{c}"))
    )
}

/// [`diff_by_key`] of the whole table, without the rows to delete ([`add_removed`]): each
/// snapshot row joined to the live row with its key, 'u' if their contents differ, 'i' if
/// there is none. A left join, which PostgreSQL 15 runs in parallel (a full join it cannot);
/// the snapshot's side is the AS OF custom scan with plain columns, its row formed only where
/// it is compared.
fn diff_whole_by_key(table: &Table, diff: &DiffTable) -> String {
    let (t, only) = (&table.name, table.only());
    let all: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("o.{}", c.name))
        .collect();
    format!(
        "SELECT CASE WHEN l.tid IS NULL THEN 'i' ELSE 'u' END AS {op}, l.tid AS {tid}, \
         l.toid AS {toid}, {columns} FROM gsnap_asof(NULL::{t}, $1) o \
         LEFT JOIN (SELECT x AS r, x.ctid AS tid, x.tableoid AS toid FROM {only} {t} x) l ON {on} \
         WHERE l.tid IS NULL OR NOT {same}",
        op = diff.op,
        tid = diff.tid,
        toid = diff.toid,
        columns = all.join(", "),
        on = table.key_equal(|c| format!("o.{c} = (l.r).{c}")),
        same = table.same_contents(
            format!("ROW({})::{t} OPERATOR(pg_catalog.*=) l.r", all.join(", ")),
            |c| format!("o.{c}"),
            |c| format!("(l.r).{c}")
        )
    )
}

/// Adds to the diff of [`diff_whole_by_key`] the live rows whose key the snapshot lacks ('d'),
/// found by an anti join of the table with the snapshot (true if it found any); skipped when
/// the counts say there are none: with keys unique at the snapshot, each of its rows matched
/// at most one live row and each live row at most one of its rows, so the live rows without
/// one are the live rows less the snapshot's rows with one (those not to insert). Keys are
/// known unique at the snapshot if the table had the same primary key then
/// ([`same_key_at`]); otherwise the anti join always runs, and finding another number of rows
/// than the counts is an ERROR: the snapshot holds rows with equal keys, which the table
/// cannot hold again.
fn add_removed(
    client: &mut SpiClient<'_>,
    table: &Table,
    snap: i64,
    diff: &DiffTable,
    summary: &Summary,
) -> bool {
    let (t, only) = (&table.name, table.only());
    let row = spi(client.select(
        &format!(
            "SELECT (SELECT count(*) FROM {only} {t}), \
             (SELECT count(*) FROM gsnap_asof(NULL::{t}, $1))"
        ),
        Some(1),
        &[snap.into()],
    ))
    .first();
    let (live, then): (i64, i64) = (
        spi(row.get(1)).unwrap_or_default(),
        spi(row.get(2)).unwrap_or_default(),
    );
    let missing = live - (then - summary.count("i"));
    // Whether the key was the table's at the snapshot matters only when the counts say there
    // is nothing to delete (it asks the worker for the recorded definition).
    if missing == 0 && same_key_at(client, table, snap) {
        return false;
    }
    let found = maintenance_settings(|| {
        spi(client.update(
            &format!(
                "INSERT INTO {diff} ({op}, {tid}, {toid}) SELECT 'd', x.ctid, x.tableoid \
                 FROM {only} {t} x WHERE NOT EXISTS \
                 (SELECT FROM gsnap_asof(NULL::{t}, $1) o WHERE {on})",
                diff = diff.name,
                op = diff.op,
                tid = diff.tid,
                toid = diff.toid,
                on = table.key_equal(|c| format!("o.{c} = x.{c}"))
            ),
            None,
            &[snap.into()],
        ))
        .len() as i64
    });
    if found != missing {
        error(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "gsnap_restore of {t}: snapshot {snap} holds rows with equal primary keys, \
                 which the table cannot hold again"
            ),
        )
        .detail(format!(
            "Its {then} rows match {} of the table's {live} rows by key.",
            live - found
        ))
        .hint(
            "The primary key was added or changed after the snapshot. Read the snapshot's \
             rows with gsnap_asof, or restore with a condition that selects rows of distinct \
             keys.",
        )
        .raise();
    }
    found > 0
}

/// Whether the table had its primary key at snapshot `snap`, on the same columns: the
/// snapshot recorded a primary key with the same definition, and each key column had the
/// same name and attribute number then (so its rows, committed under that key, have
/// distinct keys). False for a partitioned table (its definition is its partitions') and
/// for a snapshot that recorded no definition.
fn same_key_at(client: &SpiClient<'_>, table: &Table, snap: i64) -> bool {
    if table.partitioned {
        return false;
    }
    let at = crate::read::recorded::at(snap as u64, table.relid.to_u32());
    let Some(definition) = &at.row_type.definition else {
        return false;
    };
    let Some(key) = definition
        .constraints
        .iter()
        .find(|c| c.kind == ConstraintKind::PrimaryKey)
    else {
        return false;
    };
    let oid = i64::from(table.relid.to_u32());
    let now: Option<String> = spi(client
        .select(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = $1::oid AND contype = 'p'",
            Some(1),
            &[oid.into()],
        )
        .and_then(|r| r.first().get_one()));
    if now.as_deref() != Some(key.definition.as_str()) {
        return false;
    }
    spi(client.select(
        "SELECT a.attnum, a.attname::text FROM pg_attribute a \
         JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
         WHERE a.attrelid = $1::oid AND a.attnum = ANY(i.indkey::int2[])",
        None,
        &[oid.into()],
    ))
    .all(|row| {
        let attnum: i16 = spi(row.get(1)).unwrap_or_default();
        let name: String = spi(row.get(2)).unwrap_or_default();
        usize::try_from(attnum)
            .ok()
            .and_then(|n| at.row_type.attributes.get(n.checked_sub(1)?))
            .is_some_and(|a| !a.dropped && a.name == name)
    })
}

/// The rows to change, matched by content as multisets (the n-th copy of a row matches the
/// n-th copy): 'd' or 'i' as in [`diff_by_key`]. With a filter: the rows it matches.
fn diff_by_content(table: &Table, filter: Option<&str>) -> String {
    let (t, only) = (&table.name, table.only());
    let m = filter.unwrap_or("true");
    // Rows are compared on the columns the snapshot has.
    let (o_img, l_img) = if table.any_added() {
        (
            format!("record_send({})", table.compared_row(|c| format!("s.{c}"))),
            format!("record_send({})", table.compared_row(|c| format!("x.{c}"))),
        )
    } else {
        (format!("record_send(s::{t})"), "record_send(x)".to_string())
    };
    format!(
        "WITH s AS (SELECT x.* FROM gsnap_asof(NULL::{t}, $1) x WHERE {m}), \
         o AS (SELECT s::{t} AS r, {o_img} AS img, \
         row_number() OVER (PARTITION BY {o_img}) AS n FROM s), \
         l AS (SELECT x.ctid AS tid, x.tableoid AS toid, {l_img} AS img, \
         row_number() OVER (PARTITION BY {l_img}) AS n FROM {only} {t} x WHERE {m}) \
         SELECT CASE WHEN l.tid IS NULL THEN 'i' ELSE 'd' END AS op, l.tid, l.toid, o.r \
         FROM o FULL JOIN l ON o.img = l.img AND o.n = l.n \
         WHERE o.img IS NULL OR l.img IS NULL"
    )
}

/// Raises an ERROR naming every privilege the caller lacks among those a restore uses.
fn require_privileges(relid: pg_sys::Oid) {
    // SAFETY: the current user's id, set for every session.
    let user = unsafe { pg_sys::GetUserId() };
    let missing: Vec<&str> = [
        (pg_sys::ACL_SELECT, "SELECT"),
        (pg_sys::ACL_INSERT, "INSERT"),
        (pg_sys::ACL_UPDATE, "UPDATE"),
        (pg_sys::ACL_DELETE, "DELETE"),
    ]
    .into_iter()
    // SAFETY: a privilege check by OIDs in the catalog.
    .filter(|(mode, _)| unsafe { pg_sys::pg_class_aclcheck(relid, user, *mode) } != pg_sys::AclResult::ACLCHECK_OK)
    .map(|(_, name)| name)
    .collect();
    if !missing.is_empty() {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", relation_name(relid)),
        )
        .detail(format!(
            "gsnap_restore needs SELECT, INSERT, UPDATE and DELETE on the table; this role lacks {}.",
            missing.join(", ")
        ))
        .raise();
    }
}

/// Locks the table EXCLUSIVE until the transaction ends; under REPEATABLE READ or
/// SERIALIZABLE the transaction must have locked it before its snapshot (see the module).
fn lock(client: &mut SpiClient<'_>, table: &Table) {
    // SAFETY: reads of the session's isolation level.
    let snapshot_per_transaction =
        unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    if snapshot_per_transaction {
        let Some(open) = OpenRelation::open(table.relid, pg_sys::AccessShareLock as i32) else {
            return;
        };
        // SAFETY: an open relation; asks the lock manager about this backend's own locks.
        let held = unsafe {
            pg_sys::CheckRelationLockedByMe(open.as_ptr(), pg_sys::ExclusiveLock as i32, true)
        };
        drop(open);
        if !held {
            error(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "gsnap_restore of {} in a REPEATABLE READ or SERIALIZABLE transaction needs \
                     the table locked first",
                    table.name
                ),
            )
            .detail(
                "The transaction's snapshot was taken before the restore could lock the table: \
                 rows other transactions changed since would be missed.",
            )
            .hint(format!(
                "Begin the transaction with LOCK TABLE {} IN EXCLUSIVE MODE.",
                table.name
            ))
            .raise();
        }
    }
    // A partitioned table: its partitions too (writers may name them directly).
    spi(client.update(
        &format!(
            "LOCK TABLE {} {} IN EXCLUSIVE MODE",
            table.only(),
            table.name
        ),
        None,
        &[],
    ));
}

/// A user trigger turned off while restoring: its table (quoted), name (quoted) and the mode
/// to turn it back on in.
struct Trigger {
    table: String,
    name: String,
    mode: String,
}

/// Turns the table's enabled user triggers off (ownership needed, as for ALTER TABLE); of a
/// partitioned table, those of every table of its tree (a trigger defined on a partitioned
/// table is turned off there, which turns off its clones on the partitions). Returns them.
fn disable_triggers(client: &mut SpiClient<'_>, table: &Table) -> Vec<Trigger> {
    let oid = i64::from(table.relid.to_u32());
    let enabled: Vec<Trigger> = spi(client.select(
        "SELECT t.tgrelid::regclass::text, quote_ident(t.tgname), t.tgenabled::text \
         FROM pg_trigger t WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' AND t.tgparentid = 0 \
         AND t.tgrelid IN (SELECT $1::oid UNION SELECT relid FROM pg_partition_tree($1::oid)) \
         ORDER BY 1, 2",
        None,
        &[oid.into()],
    ))
    .map(|row| Trigger {
        table: spi(row.get::<String>(1)).unwrap_or_default(),
        name: spi(row.get::<String>(2)).unwrap_or_default(),
        mode: spi(row.get::<String>(3)).unwrap_or_default(),
    })
    .collect();
    if enabled.is_empty() {
        return enabled;
    }
    // SAFETY: an ownership check by OIDs in the catalog.
    if !unsafe { pg_sys::pg_class_ownercheck(table.relid, pg_sys::GetUserId()) } {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "gsnap_restore turns the triggers of {} off while it restores, which needs \
                 ownership of the table",
                table.name
            ),
        )
        .hint("Pass triggers => true to fire them instead, or ask the table's owner.")
        .raise();
    }
    for t in &enabled {
        spi(client.update(
            &format!("ALTER TABLE {} DISABLE TRIGGER {}", t.table, t.name),
            None,
            &[],
        ));
    }
    enabled
}

fn enable_triggers(client: &mut SpiClient<'_>, triggers: &[Trigger]) {
    for t in triggers {
        let how = match t.mode.as_str() {
            "A" => "ENABLE ALWAYS",
            "R" => "ENABLE REPLICA",
            _ => "ENABLE",
        };
        spi(client.update(
            &format!("ALTER TABLE {} {how} TRIGGER {}", t.table, t.name),
            None,
            &[],
        ));
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION gsnap_restore(regclass, bigint, text, text, boolean, boolean, boolean) IS
    'makes a table hold its rows at a snapshot (only those matching condition, if given), or copies them into a new table: SELECT * FROM gsnap_restore(''t'', 42)';
COMMENT ON FUNCTION gsnap_restore(regclass, timestamptz, text, text, boolean, boolean, boolean) IS
    'gsnap_restore as of the latest snapshot taken at or before a time';
COMMENT ON FUNCTION gsnap_restore_tables(text[], bigint, boolean, boolean, boolean) IS
    'makes several tables hold their rows at a snapshot at once, foreign keys between them checked when all are back: SELECT * FROM gsnap_restore_tables(ARRAY[''orders'', ''order_lines''], 42)';
"#,
    name = "gsnap_restore_comments",
    requires = [gsnap_restore, gsnap_restore_time, gsnap_restore_tables],
);
