"""Dropped tables (issue 10, point 2): each snapshot records what recreating a table needs
(columns, defaults, identity, serial and generated columns, collations, constraints, indexes,
owner), so a table dropped since can be listed, read and recreated from SQL.

Differential: the rows gsnap_asof_dropped and gsnap_undrop give back equal the rows the table
held at the snapshot (read with gsnap_asof before the DROP), after DROP, after DROP + CREATE of
another table with the same name, after DROP SCHEMA CASCADE, with TOASTed values and dropped
columns. Then the definition (constraints enforced again, sequences continuing), privileges
(owner only), rollback, types gone, bad input.
"""

import random
from collections import Counter

import psycopg
import pytest

from cluster import gsnap_cluster, snapshot, rows, sqlstate


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("undrop")


@pytest.fixture()
def conn(cluster):
    with cluster.connect() as c:
        c.autocommit = True
        yield c


def big(rng: random.Random) -> str:
    return "".join(f"{rng.getrandbits(64):016x}" for _ in range(300))  # TOASTed, incompressible


def notices(conn) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    return seen


def test_a_dropped_table_is_listed_read_and_recreated_with_its_rows(conn):
    rng = random.Random(1)
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, gone int, note text, pad text) USING gsnap")
    conn.execute("INSERT INTO orders SELECT g, g, 'n' || g, NULL FROM generate_series(1, 2000) g")
    for i in rng.sample(range(1, 2001), 40):
        conn.execute("UPDATE orders SET pad = %s WHERE id = %s", (big(rng), i))
    conn.execute("ALTER TABLE orders DROP COLUMN gone")
    conn.execute("DELETE FROM orders WHERE id % 17 = 0")
    s = snapshot(conn)
    truth = rows(conn, "SELECT * FROM gsnap_asof(NULL::orders, %s)", s)
    assert sum(truth.values()) == 2000 - 2000 // 17
    conn.execute("DROP TABLE orders")

    listed = conn.execute("SELECT table_name, dropped FROM gsnap_snapshot_tables(%s) "
                          "WHERE table_name = 'public.orders'", (s,)).fetchall()
    assert listed == [("public.orders", True)]
    read = rows(conn, "SELECT * FROM gsnap_asof_dropped('public.orders', %s) "
                      "AS t(id int, note text, pad text)", s)
    assert read == truth
    # An unqualified name finds the table too; the time form finds the same snapshot.
    assert rows(conn, "SELECT * FROM gsnap_asof_dropped('orders', %s) AS t(id int, note text, pad text)",
                s) == truth
    taken = conn.execute("SELECT taken_at FROM gsnap_snapshots() WHERE snap_id = %s", (s,)).fetchone()[0]
    assert rows(conn, "SELECT * FROM gsnap_asof_dropped('orders', %s::timestamptz) "
                      "AS t(id int, note text, pad text)", taken) == truth

    seen = notices(conn)
    assert conn.execute("SELECT gsnap_undrop('public.orders', %s)", (s,)).fetchone()[0] == len(list(truth.elements()))
    assert any("loaded" in n for n in seen)
    assert rows(conn, "SELECT * FROM orders") == truth
    assert conn.execute("SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
                        "WHERE c.oid = 'orders'::regclass").fetchone()[0] == "gsnap"
    # The primary key is back under its name, and enforced.
    assert conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'orders'::regclass "
                        "AND contype = 'p'").fetchone()[0] == "orders_pkey"
    assert sqlstate(conn, "INSERT INTO orders VALUES (1, 'x', NULL)") == "23505"
    # The recreated table is captured like any other.
    s2 = snapshot(conn)
    assert rows(conn, "SELECT * FROM gsnap_asof(NULL::orders, %s)", s2) == truth


def page_headers(conn, table: str) -> list[tuple]:
    """Every line pointer of `table`: (block, lp, flags, xmin, xmax, infomask, infomask2, ctid)."""
    return conn.execute(
        f"SELECT b, h.lp, h.lp_flags, h.t_xmin::text::bigint, h.t_xmax::text::bigint, h.t_infomask, "
        f"h.t_infomask2, h.t_ctid::text FROM generate_series(0, pg_relation_size('{table}') / 8192 - 1) b, "
        f"LATERAL heap_page_items(get_raw_page('{table}', b::int)) h").fetchall()


def test_undrop_copies_pages_as_inserts_of_its_transaction(conn):
    """A table whose row type is the recorded one as stored is loaded page by page: its tuples
    are those an INSERT of the undropping transaction would have stored (xmin, no xmax, no
    hint or HOT bits, ctid pointing at itself), out-of-line values go through heap_insert, a
    rollback leaves nothing, and the pages are captured, updated, vacuumed and indexed like
    any other."""
    rng = random.Random(7)
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    conn.execute("CREATE TABLE pc (id int PRIMARY KEY, k int, note text, pad text, n numeric) USING gsnap")
    conn.execute("INSERT INTO pc SELECT g, g % 7, CASE WHEN g % 5 <> 0 THEN 'n' || g END, NULL, g * 1.5 "
                 "FROM generate_series(1, 6000) g")
    for i in rng.sample(range(1, 6001), 30):
        conn.execute("UPDATE pc SET pad = %s WHERE id = %s", (big(rng), i))  # out of line
    conn.execute("UPDATE pc SET k = -k WHERE id % 3 = 0")  # HOT chains and moved rows
    conn.execute("DELETE FROM pc WHERE id % 11 = 0")
    conn.execute("CREATE INDEX pc_k ON pc (k)")
    s = snapshot(conn)
    truth = rows(conn, "SELECT * FROM gsnap_asof(NULL::pc, %s)", s)
    conn.execute("DROP TABLE pc")

    seen = notices(conn)
    conn.execute("BEGIN")
    xid = conn.execute("SELECT txid_current()").fetchone()[0]
    assert conn.execute("SELECT gsnap_undrop('pc', %s)", (s,)).fetchone()[0] == sum(truth.values())
    copied = [n for n in seen if "pages copied whole" in n]
    assert copied and f"loaded {sum(truth.values())} rows" in copied[0], seen
    assert rows(conn, "SELECT * FROM pc") == truth
    items = page_headers(conn, "pc")
    normal = [i for i in items if i[2] == 1]
    assert len(normal) == sum(truth.values()), "one tuple per row, no dead or redirect items"
    for block, lp, _, xmin, xmax, mask, mask2, ctid in normal:
        assert (xmin, xmax) == (xid, 0)
        assert mask & 0x0800, "HEAP_XMAX_INVALID"
        assert (mask & 0xFFF0) == 0x0800, f"no hint, lock or update bits: {mask:#06x}"
        assert (mask2 & 0xE000) == 0, f"no HOT or key-update bits: {mask2:#06x}"
        assert ctid == f"({block},{lp})"
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT to_regclass('pc')").fetchone()[0] is None

    conn.execute("SELECT gsnap_undrop('pc', %s)", (s,))
    # The loaded pages are in the dirty set: the next snapshot holds them.
    s2 = snapshot(conn)
    assert rows(conn, "SELECT * FROM gsnap_asof(NULL::pc, %s)", s2) == truth
    conn.execute("UPDATE pc SET note = 'changed' WHERE id % 10 = 1")
    conn.execute("DELETE FROM pc WHERE id % 10 = 2")
    conn.execute("VACUUM pc")
    live = rows(conn, "SELECT * FROM pc")
    assert sum(live.values()) == sum(1 for r in truth.elements() if r[0] % 10 != 2)
    conn.execute("SELECT bt_index_parent_check('pc_pkey', true)")
    conn.execute("SELECT bt_index_parent_check('pc_k', true)")
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        assert conn.execute("SELECT count(*) FROM pc WHERE k = 3").fetchone()[0] == \
            sum(1 for r in live if r[1] == 3 for _ in range(live[r]))
    assert rows(conn, "SELECT * FROM gsnap_asof(NULL::pc, %s)", snapshot(conn)) == live


def test_undrop_inserts_rows_whose_recorded_row_type_is_not_stored_as_the_new_one(conn):
    """Rows go through INSERT (decoded into the new row type) when the recorded row type is
    not the new table's as stored (a dropped column), or the table has a stored generated
    column (computed again)."""
    seen = notices(conn)
    conn.execute("CREATE TABLE dg (id int PRIMARY KEY, v int, twice int GENERATED ALWAYS AS (v * 2) STORED) "
                 "USING gsnap")
    conn.execute("INSERT INTO dg (id, v) SELECT g, g FROM generate_series(1, 40) g")
    s = snapshot(conn)
    conn.execute("DROP TABLE dg")
    conn.execute("SELECT gsnap_undrop('dg', %s)", (s,))
    assert conn.execute("SELECT count(*), sum(twice) FROM dg").fetchone() == (40, 2 * 820)
    assert any("loaded 40 rows" in n for n in seen) and not any("pages copied" in n for n in seen)
    conn.execute("CREATE TABLE dc (id int PRIMARY KEY, gone text, v text) USING gsnap")
    conn.execute("INSERT INTO dc SELECT g, 'x', 'v' || g FROM generate_series(1, 300) g")
    conn.execute("ALTER TABLE dc DROP COLUMN gone")
    s = snapshot(conn)
    truth = rows(conn, "SELECT * FROM gsnap_asof(NULL::dc, %s)", s)
    conn.execute("DROP TABLE dc")
    conn.execute("SELECT gsnap_undrop('dc', %s)", (s,))
    assert rows(conn, "SELECT * FROM dc") == truth
    assert any("loaded 300 rows" in n for n in seen) and not any("pages copied" in n for n in seen)


def test_undrop_after_another_table_took_the_name_needs_a_new_name(conn):
    conn.execute("CREATE TABLE reused (id int PRIMARY KEY, v text) USING gsnap")
    conn.execute("CREATE INDEX reused_v ON reused (v)")
    conn.execute("INSERT INTO reused SELECT g, 'old' || g FROM generate_series(1, 500) g")
    s = snapshot(conn)
    conn.execute("DROP TABLE reused")
    conn.execute("CREATE TABLE reused (id int PRIMARY KEY, v text, w int) USING gsnap")
    conn.execute("INSERT INTO reused VALUES (1, 'new', 1)")
    s2 = snapshot(conn)
    assert sqlstate(conn, "SELECT gsnap_undrop('reused', %s)", s) == "42P07"
    assert conn.execute("SELECT gsnap_undrop('reused', %s, 'reused_old')", (s,)).fetchone()[0] == 500
    assert rows(conn, "SELECT * FROM reused_old") == Counter((g, f"old{g}") for g in range(1, 501))
    # PostgreSQL chose the names of the constraint and index of the copy; the live table kept its own.
    idx = sorted(r[0] for r in conn.execute(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'reused_old'::regclass"))
    assert idx == ["reused_old_pkey", "reused_old_v_idx"]
    assert rows(conn, "SELECT * FROM reused") == Counter([(1, "new", 1)])
    # Each snapshot resolves the name to the table it held then.
    assert rows(conn, "SELECT * FROM gsnap_asof_dropped('reused', %s) AS t(id int, v text, w int)",
                s2) == Counter([(1, "new", 1)])
    assert conn.execute("SELECT dropped FROM gsnap_snapshot_tables(%s) WHERE table_name = 'public.reused'",
                        (s2,)).fetchone()[0] is False


def test_undrop_after_drop_schema_cascade(conn):
    conn.execute("CREATE SCHEMA shop")
    conn.execute('CREATE TABLE shop."Items" (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
                 "name text NOT NULL COLLATE \"C\", qty int DEFAULT 1 CHECK (qty >= 0), "
                 "total int GENERATED ALWAYS AS (qty * 10) STORED)")
    conn.execute('ALTER TABLE shop."Items" SET ACCESS METHOD gsnap')
    conn.execute('INSERT INTO shop."Items" (name, qty) SELECT \'i\' || g, g % 5 FROM generate_series(1, 300) g')
    conn.execute('CREATE UNIQUE INDEX items_name ON shop."Items" (lower(name)) WHERE qty > 0')
    s = snapshot(conn)
    truth = rows(conn, 'SELECT * FROM gsnap_asof(NULL::shop."Items", %s)', s)
    conn.execute("DROP SCHEMA shop CASCADE")
    assert sqlstate(conn, "SELECT gsnap_undrop('shop.\"Items\"', %s)", s) == "3F000"
    conn.execute("CREATE SCHEMA shop")
    conn.execute("SELECT gsnap_undrop('shop.\"Items\"', %s)", (s,))
    assert rows(conn, 'SELECT * FROM shop."Items"') == truth
    # Identity continues after the highest id, the default, check, collation and generated
    # column are back, and so is the partial unique index under its name.
    conn.execute('INSERT INTO shop."Items" (name) VALUES (\'added\')')
    assert conn.execute('SELECT id, qty, total FROM shop."Items" WHERE name = \'added\'').fetchone() == (301, 1, 10)
    assert sqlstate(conn, 'INSERT INTO shop."Items" (name, qty) VALUES (\'neg\', -1)') == "23514"
    assert sqlstate(conn, 'INSERT INTO shop."Items" (id, name) VALUES (999, \'x\')') == "428C9"
    assert sqlstate(conn, 'INSERT INTO shop."Items" (name, qty) VALUES (\'I1\', 3)') == "23505"
    assert conn.execute("SELECT collation_name FROM information_schema.columns WHERE table_schema = 'shop' "
                        "AND column_name = 'name'").fetchone()[0] == "C"
    definition = conn.execute("SELECT gsnap_table_definition('shop.\"Items\"', %s)", (s,)).fetchone()[0]
    assert "GENERATED ALWAYS AS IDENTITY" in definition and "items_name" in definition


def test_serial_columns_foreign_keys_and_rollback(conn):
    conn.execute("CREATE TABLE parent_p (id int PRIMARY KEY)")
    conn.execute("INSERT INTO parent_p VALUES (1), (2)")
    conn.execute("CREATE TABLE child_c (id serial PRIMARY KEY, p int REFERENCES parent_p, "
                 "at date DEFAULT current_date) USING gsnap")
    conn.execute("INSERT INTO child_c (p) SELECT 1 + g % 2 FROM generate_series(1, 100) g")
    s = snapshot(conn)
    truth = rows(conn, "SELECT * FROM gsnap_asof(NULL::child_c, %s)", s)
    conn.execute("DROP TABLE child_c")
    seen = notices(conn)
    conn.execute("SELECT gsnap_undrop('child_c', %s)", (s,))
    assert rows(conn, "SELECT * FROM child_c") == truth
    assert any("foreign key child_c_p_fkey is not recreated" in n for n in seen)
    # The serial column has a sequence of its own again, continuing after the rows loaded.
    assert conn.execute("INSERT INTO child_c (p) VALUES (1) RETURNING id").fetchone()[0] == 101
    # All or nothing: undone with its transaction.
    conn.execute("DROP TABLE child_c")
    conn.execute("BEGIN")
    conn.execute("SELECT gsnap_undrop('child_c', %s)", (s,))
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT to_regclass('child_c')").fetchone()[0] is None


def test_only_the_owner_and_superusers_read_a_dropped_table(cluster, conn):
    conn.execute("CREATE ROLE ud_owner LOGIN")
    conn.execute("CREATE ROLE ud_reader LOGIN")
    conn.execute("GRANT CREATE ON SCHEMA public TO ud_owner, ud_reader")
    with cluster.connect(user="ud_owner") as o:
        o.execute("CREATE TABLE secret (id int, v text) USING gsnap")
        o.execute("INSERT INTO secret VALUES (1, 'hidden')")
        o.execute("GRANT SELECT ON secret TO ud_reader")
    s = snapshot(conn)
    with cluster.connect(user="ud_reader") as r:
        assert r.execute("SELECT count(*) FROM gsnap_asof(NULL::secret, %s)", (s,)).fetchone()[0] == 1
    conn.execute("DROP TABLE secret")
    with cluster.connect(user="ud_reader") as r:
        # The grant died with the table: only its owner at the snapshot may read it now.
        assert sqlstate(r, "SELECT * FROM gsnap_asof_dropped('secret', %s) AS t(id int, v text)", s) == "42501"
        assert sqlstate(r, "SELECT gsnap_undrop('secret', %s)", s) == "42501"
        assert sqlstate(r, "SELECT gsnap_table_definition('secret', %s)", s) == "42501"
    with cluster.connect(user="ud_owner") as o:
        assert o.execute("SELECT * FROM gsnap_asof_dropped('secret', %s) AS t(id int, v text)",
                         (s,)).fetchall() == [(1, "hidden")]
    # A superuser's undrop gives the table back to its owner.
    conn.execute("SELECT gsnap_undrop('secret', %s)", (s,))
    assert conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'secret'").fetchone()[0] == "ud_owner"


def test_a_forced_row_security_table_is_readable_by_superusers_only(cluster, conn):
    conn.execute("CREATE ROLE ud_rls LOGIN")
    conn.execute("GRANT CREATE ON SCHEMA public TO ud_rls")
    with cluster.connect(user="ud_rls") as o:
        o.execute("CREATE TABLE forced (id int, owner_name text) USING gsnap")
        o.execute("INSERT INTO forced VALUES (1, 'a'), (2, 'b')")
        o.execute("ALTER TABLE forced ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY")
        o.execute("CREATE POLICY only_a ON forced USING (owner_name = 'a')")
    s = snapshot(conn)
    conn.execute("DROP TABLE forced")
    with cluster.connect(user="ud_rls") as o:
        assert sqlstate(o, "SELECT * FROM gsnap_asof_dropped('forced', %s) AS t(id int, o text)", s) == "42501"
    seen = notices(conn)
    conn.execute("SELECT gsnap_undrop('forced', %s)", (s,))
    assert any("policies are not recorded" in n for n in seen)
    assert conn.execute("SELECT relrowsecurity, relforcerowsecurity FROM pg_class "
                        "WHERE oid = 'forced'::regclass").fetchone() == (True, True)


def test_bad_input_and_types_gone(conn):
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    conn.execute("CREATE TABLE moods (id int, m mood) USING gsnap")
    conn.execute("INSERT INTO moods VALUES (1, 'ok')")
    s = snapshot(conn)
    conn.execute("DROP TABLE moods")
    conn.execute("DROP TYPE mood")
    for query in ("SELECT * FROM gsnap_asof_dropped('moods', %s) AS t(id int, m text)",
                  "SELECT gsnap_undrop('moods', %s)"):
        with pytest.raises(psycopg.Error) as e:
            conn.execute(query, (s,))
        assert e.value.sqlstate == "42704" and "mood" in e.value.diag.message_primary
    conn.execute("CREATE TABLE shape (id int, v text) USING gsnap")
    s2 = snapshot(conn)
    conn.execute("DROP TABLE shape")
    # A column list that does not match the recorded columns says which one would.
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT * FROM gsnap_asof_dropped('shape', %s) AS t(id int)", (s2,))
    assert e.value.sqlstate == "42804" and "AS t(id integer, v text)" in e.value.diag.message_hint
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped('nosuch', %s) AS t(id int)", s2) == "42P01"
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped(NULL, %s) AS t(id int)", s2) == "22004"
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped('shape', NULL::bigint) AS t(id int)") == "22004"
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped('shape', 0) AS t(id int)") == "22023"
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped('\"unterminated', %s) AS t(id int)", s2) == "42602"
    assert sqlstate(conn, "SELECT * FROM gsnap_asof_dropped('shape', %s)", s2) == "42601"
    assert sqlstate(conn, "SELECT gsnap_undrop('shape', %s, 'a.b.c.d')", s2) is not None


def test_each_snapshot_records_the_definition_the_table_had_then(cluster, conn):
    """The worker caches definitions between declarations: every kind of change must reach
    the next snapshot (relation cache invalidations of the table or of its indexes)."""
    conn.execute("CREATE ROLE ud_next LOGIN")
    conn.execute("CREATE TABLE evolving (id int, v text) USING gsnap")
    changes = [
        ("ALTER TABLE evolving ADD PRIMARY KEY (id)", "PRIMARY KEY (id)"),
        ("CREATE INDEX ev_v ON evolving (v)", "CREATE INDEX ev_v ON"),
        ("ALTER INDEX ev_v RENAME TO ev_v2", "CREATE INDEX ev_v2 ON"),
        ("ALTER TABLE evolving ALTER v SET DEFAULT 'd'", "DEFAULT 'd'::text"),
        ("ALTER TABLE evolving ADD CONSTRAINT v_short CHECK (length(v) < 9)", "v_short CHECK"),
        ("ALTER TABLE evolving RENAME CONSTRAINT v_short TO v_shorter", "v_shorter CHECK"),
        ("ALTER TABLE evolving SET (fillfactor = 60)", "WITH (fillfactor = '60')"),
        # (a parameter of the TOAST table: ALTER TABLE invalidates the table too)
        ("ALTER TABLE evolving SET (toast.autovacuum_enabled = false)", "toast.autovacuum_enabled = 'false'"),
        ("ALTER TABLE evolving ALTER v TYPE varchar(20)", "character varying(20)"),
        ("ALTER TABLE evolving RENAME TO evolved", "CREATE TABLE public.evolved"),
    ]
    before = conn.execute("SELECT gsnap_table_definition('evolving', %s)", (snapshot(conn),)).fetchone()[0]
    for change, expected in changes:
        conn.execute(change)
        name = "evolved" if "RENAME TO evolved" in change else "evolving"
        after = conn.execute("SELECT gsnap_table_definition(%s, %s)", (name, snapshot(conn))).fetchone()[0]
        assert expected in after and expected not in before, (change, after)
        before = after
    conn.execute("ALTER TABLE evolved OWNER TO ud_next")
    s = snapshot(conn)
    conn.execute("DROP TABLE evolved")
    with cluster.connect(user="ud_next") as o:
        assert o.execute("SELECT count(*) FROM gsnap_asof_dropped('evolved', %s) AS t(id int, v varchar(20))",
                         (s,)).fetchone()[0] == 0


def test_undrop_gives_the_table_its_storage_parameters_back(conn):
    """Each snapshot records the table's storage parameters and its TOAST table's; the
    undropped table has them again, and its pages are filled to its fillfactor."""
    conn.execute("CREATE TABLE stored (id int PRIMARY KEY, note text) USING gsnap "
                 "WITH (fillfactor = 50, autovacuum_enabled = false, toast.autovacuum_enabled = false)")
    conn.execute("INSERT INTO stored SELECT g, repeat('n', 40) FROM generate_series(1, 3000) g")
    size = conn.execute("SELECT pg_relation_size('stored')").fetchone()[0]
    s = snapshot(conn)
    conn.execute("DROP TABLE stored")
    definition = conn.execute("SELECT gsnap_table_definition('stored', %s)", (s,)).fetchone()[0]
    assert ("USING gsnap WITH (fillfactor = '50', autovacuum_enabled = 'false', "
            "toast.autovacuum_enabled = 'false');") in definition
    assert conn.execute("SELECT gsnap_undrop('stored', %s)", (s,)).fetchone()[0] == 3000
    options = conn.execute("SELECT c.reloptions, t.reloptions FROM pg_class c "
                           "JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.oid = 'stored'::regclass").fetchone()
    assert options == (["fillfactor=50", "autovacuum_enabled=false"], ["autovacuum_enabled=false"])
    # Half-filled pages, as the table had (at the default fillfactor they would be half as many).
    assert abs(conn.execute("SELECT pg_relation_size('stored')").fetchone()[0] - size) <= 8192


def test_a_table_made_again_under_the_name_points_at_the_one_the_snapshot_holds(conn):
    """The engineer's deploy dropped the table and created it again (or renamed it and made
    a new one): the snapshot follows tables, not names, so reading or restoring the new table
    at the old snapshot is 42P01, and the error names the table the snapshot holds under
    that name and how to read it; following the hint gives the rows."""
    conn.execute("CREATE TABLE made_again (id int PRIMARY KEY, v text) USING gsnap")
    conn.execute("CREATE TABLE \"made's\" (id int) USING gsnap")
    conn.execute("CREATE TABLE renamed_away (id int) USING gsnap")
    conn.execute("INSERT INTO made_again SELECT g, 'old' || g FROM generate_series(1, 50) g")
    conn.execute("INSERT INTO renamed_away VALUES (7)")
    s = snapshot(conn)
    conn.execute("DROP TABLE made_again, \"made's\"")
    conn.execute("CREATE TABLE made_again (id int PRIMARY KEY, v text) USING gsnap")
    conn.execute("CREATE TABLE \"made's\" (id int) USING gsnap")
    conn.execute("ALTER TABLE renamed_away RENAME TO renamed_now")
    conn.execute("CREATE TABLE renamed_away (id int) USING gsnap")
    for query in (f"SELECT * FROM gsnap_asof(NULL::made_again, {s})",
                  f"SELECT * FROM gsnap_restore('made_again', {s})"):
        with pytest.raises(psycopg.errors.UndefinedTable) as e:
            conn.execute(query)
        assert "dropped since" in e.value.diag.message_detail
        hint = e.value.diag.message_hint
        assert f"gsnap_asof_dropped('public.made_again', {s}) AS t(...)" in hint
        assert f"gsnap_undrop('public.made_again', {s}, 'new_name')" in hint
    # The hint's call, with the columns filled in, reads the dropped table's rows.
    assert rows(conn, f"SELECT * FROM gsnap_asof_dropped('public.made_again', {s}) AS t(id int, v text)") == \
        Counter((g, f"old{g}") for g in range(1, 51))
    # A name that needs quoting is written as a literal SQL accepts.
    with pytest.raises(psycopg.errors.UndefinedTable) as e:
        conn.execute(f"SELECT * FROM gsnap_asof(NULL::\"made's\", {s})")
    literal = e.value.diag.message_hint.split("gsnap_asof_dropped(")[1].split(f", {s})")[0]
    assert conn.execute(f"SELECT count(*) FROM gsnap_asof_dropped({literal}, {s}) AS t(id int)").fetchone()[0] == 0
    # Renamed: the table still exists, under its new name.
    with pytest.raises(psycopg.errors.UndefinedTable) as e:
        conn.execute(f"SELECT * FROM gsnap_asof(NULL::renamed_away, {s})")
    assert "named public.renamed_now now" in e.value.diag.message_detail
    assert f"gsnap_asof(NULL::public.renamed_now, {s})" in e.value.diag.message_hint
    assert conn.execute(f"SELECT * FROM gsnap_asof(NULL::public.renamed_now, {s})").fetchall() == [(7,)]
    # A table the snapshot never held under any table of its name: the plain error.
    conn.execute("CREATE TABLE never_held (id int) USING gsnap")
    with pytest.raises(psycopg.errors.UndefinedTable) as e:
        conn.execute(f"SELECT * FROM gsnap_asof(NULL::never_held, {s})")
    assert e.value.diag.message_detail is None and "gsnap_snapshot_tables" in e.value.diag.message_hint


def test_a_time_before_the_first_snapshot_names_its_time_in_the_session_zone(conn):
    first = conn.execute("SELECT min(snap_id) FROM gsnap_snapshots() WHERE state = 'committed'").fetchone()[0]
    if first is None:
        first = snapshot(conn)
    conn.execute("CREATE TABLE timed (id int) USING gsnap")
    for zone in ("UTC", "Asia/Kolkata"):
        conn.execute(f"SET TimeZone = '{zone}'")
        taken = conn.execute("SELECT taken_at::text FROM gsnap_snapshots() WHERE snap_id = %s", (first,)).fetchone()[0]
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            conn.execute("SELECT * FROM gsnap_asof(NULL::timed, '1999-01-01'::timestamptz)")
        assert e.value.diag.message_hint == f"The first readable snapshot, {first}, was taken at {taken}."
    conn.execute("RESET TimeZone")
