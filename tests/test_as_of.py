"""`SET gsnap.as_of`: a session that reads every gsnap table as of one snapshot.

Every query of the session (views, joins, subqueries, CTEs, partitioned tables, PL/pgSQL,
prepared statements, cursors, CREATE TABLE AS) reads what the explicit `gsnap_asof` calls
return at that snapshot; heap and temporary tables are read live; what cannot be done to a
snapshot is refused with a clean error; the privileges and row-level security are those of a
read of the live table; changing the setting re-plans cached plans; gsnap's own statements
(restore, undrop) keep reading and writing the live tables.
"""

import psycopg
import pytest

from cluster import gsnap_cluster, rows, snapshot


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("as_of", ["max_parallel_workers_per_gather = 0"])


@pytest.fixture(scope="module")
def setup(cluster):
    """Two snapshots of accounts, customers, a partitioned table and a heap table, each
    table changed between them and after the second."""
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, cust int, bal int, note text) USING gsnap")
        c.execute("CREATE TABLE cust (id int PRIMARY KEY, name text) USING gsnap")
        c.execute("CREATE TABLE pt (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (500) USING gsnap")
        c.execute("CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (500) TO (1000) USING gsnap")
        c.execute("CREATE TABLE h (id int, v text)")
        c.execute("INSERT INTO acc SELECT g, g % 10, g * 10, 'n' || g FROM generate_series(1, 2000) g")
        c.execute("INSERT INTO cust SELECT g, 'c' || g FROM generate_series(0, 9) g")
        c.execute("INSERT INTO pt SELECT g, g FROM generate_series(1, 999) g")
        c.execute("INSERT INTO h VALUES (1, 'heap')")
        s1 = c.execute("SELECT gsnap_snapshot(label => 'month end')").fetchone()[0]
        c.execute("UPDATE acc SET bal = bal + 1 WHERE id % 3 = 0")
        c.execute("DELETE FROM acc WHERE id > 1900")
        c.execute("UPDATE cust SET name = name || '*' WHERE id < 5")
        c.execute("UPDATE pt SET v = -v WHERE id % 7 = 0")
        s2 = snapshot(c)
        c.execute("UPDATE acc SET bal = 0 WHERE id <= 100")
        c.execute("INSERT INTO acc VALUES (5000, 1, 1, 'new')")
        c.execute("DELETE FROM pt WHERE id > 900")
        c.execute("UPDATE h SET v = 'heap now'")
        c.execute("CREATE VIEW acc_by_cust AS SELECT c.name, count(*) AS n, sum(a.bal) AS total "
                  "FROM acc a JOIN cust c ON c.id = a.cust GROUP BY c.name")
        c.execute("CREATE FUNCTION acc_total() RETURNS bigint LANGUAGE plpgsql AS "
                  "$$BEGIN RETURN (SELECT sum(bal) FROM acc); END$$")
        # SQL functions, which the planner would inline after the query was rewritten
        c.execute("CREATE FUNCTION accs() RETURNS SETOF acc LANGUAGE sql STABLE AS 'SELECT * FROM acc'")
        c.execute("CREATE FUNCTION acc_sum() RETURNS bigint LANGUAGE sql STABLE AS 'SELECT sum(bal) FROM acc'")
        yield {"s1": s1, "s2": s2}


def as_of(conn, snap) -> None:
    conn.execute("SELECT set_config('gsnap.as_of', %s, false)", (str(snap),))


QUERIES = [
    # (the query over the tables, the same query over explicit gsnap_asof calls at {s})
    ("SELECT * FROM acc", "SELECT * FROM gsnap_asof(NULL::acc, {s})"),
    ("SELECT * FROM acc_by_cust",
     "SELECT c.name, count(*), sum(a.bal) FROM gsnap_asof(NULL::acc, {s}) a "
     "JOIN gsnap_asof(NULL::cust, {s}) c ON c.id = a.cust GROUP BY c.name"),
    ("SELECT a.id, a.bal, h.v FROM acc a JOIN h USING (id)",
     "SELECT a.id, a.bal, h.v FROM gsnap_asof(NULL::acc, {s}) a JOIN h USING (id)"),
    ("SELECT id, (SELECT name FROM cust WHERE cust.id = acc.cust) FROM acc WHERE id < 50",
     "SELECT id, (SELECT name FROM gsnap_asof(NULL::cust, {s}) c WHERE c.id = a.cust) "
     "FROM gsnap_asof(NULL::acc, {s}) a WHERE id < 50"),
    ("WITH big AS (SELECT * FROM acc WHERE bal > 15000) SELECT count(*), sum(bal) FROM big",
     "SELECT count(*), sum(bal) FROM gsnap_asof(NULL::acc, {s}) WHERE bal > 15000"),
    ("SELECT * FROM acc WHERE id IN (3, 7, 1950)",
     "SELECT * FROM gsnap_asof(NULL::acc, {s}) WHERE id IN (3, 7, 1950)"),
    ("SELECT * FROM pt", "SELECT * FROM gsnap_asof(NULL::pt, {s})"),
    ("SELECT * FROM pt2 WHERE v < 0", "SELECT * FROM gsnap_asof(NULL::pt2, {s}) WHERE v < 0"),
    ("SELECT c.id, l.n FROM cust c, LATERAL (SELECT count(*) AS n FROM acc WHERE acc.cust = c.id) l",
     "SELECT c.id, l.n FROM gsnap_asof(NULL::cust, {s}) c, "
     "LATERAL (SELECT count(*) AS n FROM gsnap_asof(NULL::acc, {s}) a WHERE a.cust = c.id) l"),
    ("SELECT id FROM acc EXCEPT SELECT id FROM pt",
     "SELECT id FROM gsnap_asof(NULL::acc, {s}) EXCEPT SELECT id FROM gsnap_asof(NULL::pt, {s})"),
    ("SELECT acc_total()", "SELECT sum(bal) FROM gsnap_asof(NULL::acc, {s})"),
    ("SELECT id, bal FROM accs() WHERE id % 5 = 0",
     "SELECT id, bal FROM gsnap_asof(NULL::acc, {s}) WHERE id % 5 = 0"),
    ("SELECT acc_sum()", "SELECT sum(bal) FROM gsnap_asof(NULL::acc, {s})"),
    ("SELECT t FROM cust t", "SELECT t FROM gsnap_asof(NULL::cust, {s}) t"),
]


def test_every_query_reads_the_snapshot_the_session_names(cluster, setup):
    s1, s2 = setup["s1"], setup["s2"]
    with cluster.connect() as c:
        c.autocommit = True
        live = [rows(c, q) for q, _ in QUERIES]
        taken_at = c.execute("SELECT taken_at FROM gsnap_snapshots() WHERE snap_id = %s", (s2,)).fetchone()[0]
        assert c.execute("SELECT gsnap_as_of()").fetchone()[0] is None
        for setting, s in [(s1, s1), ("month end", s1), (taken_at.isoformat(), s2), (s2, s2)]:
            as_of(c, setting)
            assert c.execute("SELECT gsnap_as_of()").fetchone()[0] == s
            for q, explicit in QUERIES:
                c.execute("SET gsnap.as_of = ''")
                want = rows(c, explicit.format(s=s))
                as_of(c, setting)
                assert rows(c, q) == want, (setting, q)
            # The snapshots differ from each other and from the live tables.
            assert rows(c, "SELECT * FROM acc") != live[0]
        c.execute("RESET gsnap.as_of")
        assert [rows(c, q) for q, _ in QUERIES] == live
        # A heap table is read live; so is a temporary gsnap table (never snapshotted).
        c.execute("CREATE TEMP TABLE tmp_g (id int) USING gsnap")
        c.execute("INSERT INTO tmp_g VALUES (1)")
        as_of(c, s1)
        assert c.execute("SELECT v FROM h").fetchone()[0] == "heap now"
        assert c.execute("SELECT count(*) FROM tmp_g").fetchone()[0] == 1
        # EXPLAIN shows the AS OF scans, key lookups included.
        plan = "\n".join(r[0] for r in c.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM acc WHERE id = 7"))
        assert "Custom Scan (gsnap AS OF)" in plan and "Key Map: 1 candidate blocks" in plan, plan
        # CREATE TABLE AS and COPY (query) read it too; a cursor as well.
        c.execute("CREATE TABLE acc_then AS SELECT * FROM acc")
        c.execute("RESET gsnap.as_of")
        assert rows(c, "SELECT * FROM acc_then") == rows(c, f"SELECT * FROM gsnap_asof(NULL::acc, {s1})")
        as_of(c, s1)
        with c.cursor().copy("COPY (SELECT sum(bal) FROM acc) TO STDOUT") as copy:
            copied = b"".join(copy)
        assert int(copied) == c.execute(f"SELECT sum(bal) FROM gsnap_asof(NULL::acc, {s1})").fetchone()[0]
        # COPY of the table itself (psql's \copy), which plans no query: the snapshot too.
        def copy_out(sql):
            with c.cursor().copy(sql) as copy:
                return sorted(tuple(line.split("\t")) for line in
                              b"".join(copy).decode().splitlines())

        def text_rows(q):
            return sorted(tuple("\\N" if v is None else str(v) for v in r)
                          for r in c.execute(q).fetchall())

        assert copy_out("COPY acc TO STDOUT") == text_rows(f"SELECT * FROM gsnap_asof(NULL::acc, {s1})")
        assert copy_out("COPY public.acc (bal, id) TO STDOUT") == text_rows(
            f"SELECT bal, id FROM gsnap_asof(NULL::acc, {s1})")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="cannot be written"):
            with c.cursor().copy("COPY acc FROM STDIN") as copy:
                copy.write("1\t1\t1\tx\n")
        c.execute("RESET gsnap.as_of")
        assert copy_out("COPY acc TO STDOUT") == text_rows("SELECT * FROM acc")
        as_of(c, s1)
        c.execute("BEGIN")
        c.execute("DECLARE cur CURSOR FOR SELECT id FROM acc WHERE id > 1890 ORDER BY id")
        fetched = [r[0] for r in c.execute("FETCH ALL FROM cur")]
        c.execute("COMMIT")
        assert fetched == list(range(1891, 2001))


def test_cached_plans_follow_the_setting(cluster, setup):
    """A prepared statement and a PL/pgSQL function planned under one setting read what the
    current one says at their next execution."""
    s1 = setup["s1"]
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("SET plan_cache_mode = force_generic_plan")
        c.execute("PREPARE tot AS SELECT sum(bal) FROM acc")
        live = c.execute("SELECT sum(bal) FROM acc").fetchone()[0]
        then = c.execute(f"SELECT sum(bal) FROM gsnap_asof(NULL::acc, {s1})").fetchone()[0]
        assert live != then
        for _ in range(3):
            assert c.execute("EXECUTE tot").fetchone()[0] == live
            assert c.execute("SELECT acc_total()").fetchone()[0] == live
            as_of(c, s1)
            assert c.execute("EXECUTE tot").fetchone()[0] == then
            assert c.execute("SELECT acc_total()").fetchone()[0] == then
            c.execute("RESET gsnap.as_of")
        # SET LOCAL: back to live when the transaction ends.
        c.execute("BEGIN")
        c.execute("SET LOCAL gsnap.as_of = 'month end'")
        assert c.execute("EXECUTE tot").fetchone()[0] == then
        c.execute("COMMIT")
        assert c.execute("EXECUTE tot").fetchone()[0] == live


def test_what_cannot_be_done_to_a_snapshot_is_refused(cluster, setup):
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE TABLE h_ref (acc_id int REFERENCES acc, x int)")
        as_of(c, setup["s1"])
        for q in ["UPDATE acc SET bal = 1 WHERE id = 1", "DELETE FROM acc WHERE id = 1",
                  "INSERT INTO acc VALUES (9999, 1, 1, 'x')", "INSERT INTO pt VALUES (5, 5)",
                  "SELECT * FROM acc WHERE id = 1 FOR UPDATE", "SELECT * FROM cust FOR SHARE",
                  "INSERT INTO h_ref VALUES (1, 1)",  # the foreign key locks acc's row
                  "MERGE INTO acc USING h ON acc.id = h.id WHEN MATCHED THEN UPDATE SET bal = 0"]:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                c.execute(q)
            assert "gsnap.as_of is set" in str(e.value) and "RESET gsnap.as_of" in e.value.diag.message_hint, q
        for table in ("acc", "pt"):  # COPY FROM too, into a table or a partitioned table
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="cannot be written"):
                with c.cursor().copy(f"COPY {table} (id) FROM STDIN") as copy:
                    copy.write("950\n")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="system column ctid"):
            c.execute("SELECT ctid, * FROM acc")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="system column xmin"):
            c.execute("SELECT (SELECT count(*) FROM cust WHERE cust.xmin = acc.xmin) FROM acc")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="TABLESAMPLE"):
            c.execute("SELECT * FROM acc TABLESAMPLE SYSTEM (10)")
        # A heap table that gsnap tables inherit from would read them live through it.
        c.execute("RESET gsnap.as_of")
        c.execute("CREATE TABLE heap_parent (id int)")
        c.execute("CREATE TABLE gsnap_child () INHERITS (heap_parent) USING gsnap")
        as_of(c, setup["s1"])
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="gsnap_child"):
            c.execute("SELECT * FROM heap_parent")
        assert c.execute("SELECT count(*) FROM ONLY heap_parent").fetchone()[0] == 0
        # A gsnap table that tables inherit from: a query of it means their rows too, which
        # the snapshot holds as each one's own; reading it alone would miss them.
        c.execute("RESET gsnap.as_of")
        c.execute("CREATE TABLE inh_parent (id int) USING gsnap")
        c.execute("CREATE TABLE inh_child (x int) INHERITS (inh_parent) USING gsnap")
        c.execute("INSERT INTO inh_parent VALUES (1), (2)")
        c.execute("INSERT INTO inh_child VALUES (3, 30)")
        snap = c.execute("SELECT gsnap_snapshot()").fetchone()[0]
        c.execute("INSERT INTO inh_child VALUES (4, 40)")
        as_of(c, snap)
        for q in ["SELECT * FROM inh_parent", "SELECT count(*) FROM (SELECT id FROM inh_parent) p"]:
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                c.execute(q)
            assert "table inh_parent would be read with the tables that inherit from it " \
                   "(inh_child)" in e.value.diag.message_primary, e.value.diag.message_primary
            assert "FROM ONLY inh_parent" in e.value.diag.message_hint
        assert sorted(c.execute("SELECT id FROM ONLY inh_parent UNION ALL SELECT id FROM inh_child")
                      .fetchall()) == [(1,), (2,), (3,)]
        as_of(c, setup["s1"])
        # Writing other tables goes on, with what the snapshot held.
        c.execute("CREATE TABLE acc_copy (LIKE acc)")
        c.execute("INSERT INTO acc_copy SELECT * FROM acc WHERE id <= 10")
        c.execute("UPDATE h SET v = a.note FROM acc a WHERE a.id = h.id")
        # A name that is no snapshot, a time before the first, a table made since.
        c.execute("CREATE TABLE made_since (id int) USING gsnap")
        for value, state in [("no such label", "22023"), ("1999-01-01", "22023"), ("-3", "22023")]:
            as_of(c, value)
            for q in ("SELECT count(*) FROM acc", "SELECT gsnap_as_of()"):
                with pytest.raises(psycopg.Error) as e:
                    c.execute(q)
                assert e.value.sqlstate == state, (value, q, e.value)
        as_of(c, setup["s1"])
        with pytest.raises(psycopg.errors.UndefinedTable, match="not in snapshot"):
            c.execute("SELECT * FROM made_since")
        c.execute("RESET gsnap.as_of")
        assert rows(c, "SELECT * FROM acc_copy") == rows(
            c, f"SELECT * FROM gsnap_asof(NULL::acc, {setup['s1']}) WHERE id <= 10")
        assert c.execute("SELECT v FROM h").fetchone()[0] == "n1"
        c.execute("UPDATE h SET v = 'heap now'")


def test_privileges_and_row_security_are_those_of_the_live_table(cluster, setup):
    s1 = setup["s1"]
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE ROLE ao_reader LOGIN")
        c.execute("CREATE ROLE ao_none LOGIN")
        c.execute("GRANT SELECT (id, bal) ON acc TO ao_reader")
        c.execute("GRANT SELECT ON acc_by_cust TO ao_none")
        c.execute("CREATE TABLE secret (id int, owner text, v int) USING gsnap")
        c.execute("INSERT INTO secret VALUES (1, 'ao_reader', 10), (2, 'someone', 20)")
        c.execute("ALTER TABLE secret ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY mine ON secret FOR SELECT USING (owner = current_user)")
        c.execute("GRANT SELECT ON secret TO ao_reader")
        s3 = snapshot(c)
        c.execute("UPDATE secret SET v = 0")
        view_then = rows(c, f"SELECT c.name, count(*), sum(a.bal) FROM gsnap_asof(NULL::acc, {s1}) a "
                            f"JOIN gsnap_asof(NULL::cust, {s1}) c ON c.id = a.cust GROUP BY c.name")
    with cluster.connect(user="ao_reader") as r:
        r.autocommit = True
        as_of(r, s1)
        # The columns granted, and no others (as for the live table).
        assert r.execute("SELECT sum(bal) FROM acc").fetchone()[0] == \
            sum(10 * g for g in range(1, 2001))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            r.execute("SELECT note FROM acc")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            r.execute("SELECT * FROM cust")
        # Row-level security: the reader's own rows, with their values at the snapshot.
        as_of(r, s3)
        assert r.execute("SELECT id, v FROM secret").fetchall() == [(1, 10)]
    with cluster.connect(user="ao_none") as n:
        n.autocommit = True
        # A view reads as its owner, who may read the tables.
        as_of(n, s1)
        assert rows(n, "SELECT * FROM acc_by_cust") == view_then
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            n.execute("SELECT count(*) FROM acc")


def test_restore_and_undrop_work_on_the_live_tables_while_it_is_set(cluster, setup):
    """gsnap's own statements read and write the live tables, whatever the setting says."""
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE TABLE rst (id int PRIMARY KEY, v int) USING gsnap")
        c.execute("INSERT INTO rst SELECT g, g FROM generate_series(1, 100) g")
        s = snapshot(c)
        c.execute("UPDATE rst SET v = 0 WHERE id <= 10")
        c.execute("DELETE FROM rst WHERE id > 90")
        s_after = snapshot(c)
        c.execute("CREATE TABLE gone (id int) USING gsnap")
        c.execute("INSERT INTO gone SELECT generate_series(1, 7)")
        s_gone = snapshot(c)
        c.execute("DROP TABLE gone")
        # Set to the later snapshot: a restore to s must still compare s with the live rows.
        as_of(c, s_after)
        assert c.execute(f"SELECT * FROM gsnap_restore('rst', {s})").fetchone() == (0, 10, 10)
        assert c.execute(f"SELECT * FROM gsnap_restore_tables(ARRAY['rst'], {s})").fetchone()[1:] == (0, 0, 0)
        assert c.execute(f"SELECT gsnap_undrop('public.gone', {s_gone})").fetchone()[0] == 7
        c.execute("RESET gsnap.as_of")
        assert rows(c, "SELECT * FROM rst") == rows(c, f"SELECT * FROM gsnap_asof(NULL::rst, {s})")
        assert c.execute("SELECT count(*) FROM gone").fetchone()[0] == 7


def test_a_statement_reads_one_snapshot_though_one_commits_while_it_runs(cluster, setup):
    """A time names the same snapshot for every scan of a statement, as statement_timestamp()
    is fixed for it: with gsnap.as_of = 'infinity' (the latest snapshot), a snapshot taken in
    the middle of a statement is not read by its later scans; the next statement reads it."""
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE TABLE one (id int PRIMARY KEY, v int) USING gsnap")
        c.execute("INSERT INTO one SELECT g, 1 FROM generate_series(1, 100) g")
        snapshot(c)
        for setting in ("infinity", "2999-01-01"):
            c.execute("RESET gsnap.as_of")
            c.execute("UPDATE one SET v = v + 1")  # not in any snapshot yet
            live = c.execute("SELECT sum(v) FROM one").fetchone()[0]
            as_of(c, setting)
            before, _, after = c.execute(
                "SELECT (SELECT sum(v) FROM one), (SELECT gsnap_snapshot()), (SELECT sum(v) FROM one)"
            ).fetchone()
            assert before == after == live - 100, (setting, before, after, live)
            assert c.execute("SELECT sum(v) FROM one").fetchone()[0] == live
        c.execute("RESET gsnap.as_of")
        c.execute("UPDATE one SET v = v + 1")
        # The explicit calls naming one time in one statement read one snapshot too.
        before, _, after = c.execute(
            "SELECT (SELECT sum(v) FROM gsnap_asof(NULL::one, 'infinity')), (SELECT gsnap_snapshot()), "
            "(SELECT sum(v) FROM gsnap_asof(NULL::one, 'infinity'::timestamptz))").fetchone()
        assert before == after == 300


def test_pg_dump_of_a_table_as_of_a_snapshot(cluster, setup):
    """`PGOPTIONS='-c gsnap.as_of=...' pg_dump -t t`: pg_dump copies tables with `COPY t TO`,
    which the setting makes a read of the snapshot: a dump of the table as it was, loadable
    into another table."""
    s1 = setup["s1"]
    dump = cluster.run("pg_dump", "--data-only", "-t", "public.acc", "-d", "postgres",
                       env={"PGOPTIONS": "-c gsnap.as_of=month\\ end"}).stdout
    assert "COPY public.acc" in dump
    with cluster.connect() as c:
        c.autocommit = True
        c.execute("CREATE TABLE acc_restored (LIKE acc)")
    loaded = cluster.run("psql", "-v", "ON_ERROR_STOP=1", "-d", "postgres",
                         input=dump.replace("COPY public.acc ", "COPY public.acc_restored "))
    assert loaded.returncode == 0, loaded.stderr
    with cluster.connect() as c:
        assert rows(c, "SELECT * FROM acc_restored") == rows(c, f"SELECT * FROM gsnap_asof(NULL::acc, {s1})")
        assert rows(c, "SELECT * FROM acc_restored") != rows(c, "SELECT * FROM acc")


def test_materialized_views_and_maintenance_under_the_setting(cluster, setup):
    """CREATE and REFRESH MATERIALIZED VIEW run their query: under the setting they hold the
    snapshot's rows, refreshed with it reset the live ones; DDL and maintenance (CREATE
    INDEX, VACUUM, ANALYZE, CLUSTER) work on the live table while it is set."""
    s1 = setup["s1"]
    q = "SELECT cust, count(*) AS n, sum(bal) AS total FROM acc GROUP BY cust"
    with cluster.connect() as c:
        c.autocommit = True
        at_s1 = rows(c, f"SELECT cust, count(*), sum(bal) FROM gsnap_asof(NULL::acc, {s1}) GROUP BY cust")
        live = rows(c, q)
        assert at_s1 != live
        as_of(c, s1)
        c.execute(f"CREATE MATERIALIZED VIEW acc_mv AS {q}")
        assert rows(c, "SELECT * FROM acc_mv") == at_s1
        c.execute("RESET gsnap.as_of")
        assert rows(c, "SELECT * FROM acc_mv") == at_s1  # a table now: what it was filled with
        c.execute("REFRESH MATERIALIZED VIEW acc_mv")
        assert rows(c, "SELECT * FROM acc_mv") == live
        as_of(c, s1)
        c.execute("REFRESH MATERIALIZED VIEW acc_mv")
        c.execute("RESET gsnap.as_of")
        assert rows(c, "SELECT * FROM acc_mv") == at_s1
        as_of(c, s1)
        c.execute("CREATE INDEX acc_bal_idx ON acc (bal)")
        c.execute("VACUUM ANALYZE acc")
        c.execute("CLUSTER acc USING acc_pkey")
        c.execute("RESET gsnap.as_of")
        assert rows(c, q) == live
        assert c.execute("SELECT count(*) FROM acc WHERE bal = 0").fetchone()[0] == 100
        c.execute("DROP INDEX acc_bal_idx")
        c.execute("DROP MATERIALIZED VIEW acc_mv")
